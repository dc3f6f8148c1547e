"""Model configurations of OpenSora v1.2 STDiT3: the released size (`full`), a test size (`tiny`),
or any other read from a TOML file.

A TOML file holds the fields of `STDiT3Config` at top level, e.g.::

    hidden_size = 128
    depth = 4
    num_heads = 8
    caption_channels = 64
    model_max_length = 16

Fields left out take the `full` value. This module does not need torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from hlo_trace.documents import load_toml
from models.opensora.errors import ConfigError

__all__ = ["CONFIGS", "STDiT3Config", "get_config"]


@dataclass(frozen=True)
class STDiT3Config:
    """Sizes of one STDiT3 backbone. Defaults are OpenSora v1.2 (STDiT3-XL/2)."""

    hidden_size: int = 1152
    depth: int = 28  # number of (spatial, temporal) block pairs
    num_heads: int = 16
    mlp_ratio: float = 4.0
    patch_size: tuple[int, int, int] = (1, 2, 2)  # (time, height, width)
    in_channels: int = 4  # VAE latent channels
    out_channels: int = 8  # 2 * in_channels: the model predicts noise and a learned sigma
    caption_channels: int = 4096  # T5-XXL feature size
    model_max_length: int = 300  # caption tokens per sample (TOKEN)
    qk_norm: bool = True  # RMSNorm over the head dim on q and k of the self-attentions
    norm_eps: float = 1e-6
    frequency_embedding_size: int = 256  # sinusoidal width of the timestep / fps embedders
    input_sq_size: int = 512  # pixel side the 2-D position embedding is calibrated for
    vae_downsample: int = 8  # pixels per latent cell along H and W

    def __post_init__(self) -> None:
        _check_field_types(self)
        # A TOML list arrives as a list: freeze it so the config stays hashable.
        object.__setattr__(self, "patch_size", tuple(self.patch_size))
        problems = []
        for name in ("hidden_size", "depth", "num_heads", "in_channels", "out_channels",
                     "caption_channels", "model_max_length", "frequency_embedding_size",
                     "input_sq_size", "vae_downsample"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be positive")
        if not (self.mlp_ratio > 0 and self.norm_eps > 0):
            problems.append(f"mlp_ratio={self.mlp_ratio} and norm_eps={self.norm_eps} must be positive")
        if len(self.patch_size) != 3 or min(self.patch_size) <= 0:
            problems.append(f"patch_size={self.patch_size} must be 3 positive ints")
        if problems:  # the checks below divide by these sizes
            raise ConfigError("invalid STDiT3 config: " + "; ".join(problems))
        if self.hidden_size % self.num_heads:
            problems.append(
                f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}")
        if self.head_dim % 2:
            problems.append(f"head_dim={self.head_dim} must be even (rotary embedding)")
        if self.frequency_embedding_size % 2:
            problems.append(
                f"frequency_embedding_size={self.frequency_embedding_size} must be even")
        if self.hidden_size % 4:
            problems.append(
                f"hidden_size={self.hidden_size} must be a multiple of 4 (2-D sin/cos embedding)")
        if self.mlp_hidden != self.mlp_ratio * self.hidden_size:
            problems.append(f"mlp_ratio={self.mlp_ratio} * hidden_size is not an integer")
        if problems:
            raise ConfigError("invalid STDiT3 config: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def token_num(self) -> int:
        """Caption tokens per sample (the notes call it TOKEN)."""
        return self.model_max_length

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    @property
    def final_out_features(self) -> int:
        """Width of the final linear layer: one value per output channel per patch cell."""
        return self.patch_volume * self.out_channels

    def to_dict(self) -> dict:
        """Plain JSON-able fields (for dump sidecars and cache keys)."""
        d = dataclasses.asdict(self)
        d["patch_size"] = list(self.patch_size)
        return d


#: Largest size a field may hold: an int32 dimension (torch's sizes beyond it fit no memory).
MAX_SIZE = 2**31 - 1


def _check_field_types(config: STDiT3Config) -> None:
    """Each field has the type of its default: an int is an int (never a bool, never a float
    that would be truncated), a float is a finite number, ``patch_size`` is 3 ints."""
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        default = spec.default
        if isinstance(default, bool):
            ok = isinstance(value, bool)
            expected = "true or false"
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SIZE
            expected = f"an integer up to {MAX_SIZE}"
        elif isinstance(default, float):
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value))
            expected = "a finite number"
        else:  # patch_size
            ok = (isinstance(value, (list, tuple)) and len(value) == 3
                  and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_SIZE
                          for v in value))
            expected = "a list of 3 integers"
        if not ok:
            raise ConfigError(f"invalid STDiT3 config: {spec.name}={value!r}: expected {expected}")


CONFIGS: dict[str, STDiT3Config] = {
    "full": STDiT3Config(),
    "tiny": STDiT3Config(hidden_size=64, depth=2, num_heads=4, caption_channels=32,
                         model_max_length=8),
}


def get_config(name_or_path: str | Path) -> STDiT3Config:
    """`full`, `tiny`, or the path of a TOML file with `STDiT3Config` fields."""
    key = str(name_or_path)
    if key in CONFIGS:
        return CONFIGS[key]
    path = Path(key)
    if path.suffix != ".toml" or not path.is_file():
        raise ConfigError(
            f"unknown model config {key!r}: expected one of {sorted(CONFIGS)} or an existing .toml file")
    data = load_toml(path, "a model config (TOML of STDiT3Config fields)")
    known = {f.name for f in dataclasses.fields(STDiT3Config)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"model config {key}: unknown keys {unknown}; expected some of {sorted(known)}")
    try:
        return STDiT3Config(**data)
    except TypeError as exc:
        raise ConfigError(f"model config {key}: {exc}") from None
