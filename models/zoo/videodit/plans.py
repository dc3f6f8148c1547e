"""xDiT's strategies for the video DiTs as ``trace-module`` plans (docs/videodit.md): each a TOML
plan over the models' module names (torch-free; ``plan_toml`` writes it).

* ``ulysses`` (1 x n): the video (and text) tokens split over the devices after the embeddings;
  each attention's q, k, v turned from a sequence split into a head split (an all-to-all each)
  and its output back (one more). A cross-attention's text keys and values are projected for
  the device's heads only (the text is on every device). The joint sequence of HunyuanVideo and
  CogVideoX is ordered as xDiT's ranks hold it (the factories' ``chunks`` = n). HunyuanVideo's
  token refiner runs whole on every device (its output pinned), as in xDiT.
* ``ring`` (1 x n): ring attention: the tokens split as under Ulysses, each attention's key/value
  blocks passed around the ring (a collective-permute each per step; the factories' ``ring`` =
  n); a cross-attention's text keys and values whole on every device (as xDiT keeps them).
* ``usp`` (1 x r x u, r = 2, u = n / 2): Ulysses within groups of u, ring attention across r:
  q, k, v exchanged from the token split to (ring blocks, heads) and back.
* ``tp`` (1 x n): Megatron tensor parallelism in the blocks: q/k/v (or fused QKV) and the MLP's
  up projection split by output features, the attention output and the MLP's down projection
  by input features, their outputs all-reduced (HunyuanVideo's single-stream block: the two
  halves of its fused output projection, each all-reduced).
* ``cfg`` (2 x 1): classifier-free guidance parallel: the two branches (the batch of two) on two
  devices; nothing is exchanged in the loop.
* ``cfg_ulysses`` (2 x n): the branches on x, Ulysses over y within each.
* ``pipefusion`` (P x 1): PipeFusion, one tick of the pipeline in SPMD form (docs/videodit.md):
  the P stages' current patches stacked on the batch and split over x (``pipefusion_inputs``
  writes the inputs: the latents one patch of M high, the K/V buffers ``stale_k``/``stale_v``
  of the full video, stage-split), every stage running its blocks on its patch, attention over
  the buffer with the patch's fresh K/V in its slot, and handing its activation to the next
  stage (``handoff``: a collective-permute over x); the factories' ``stages`` = P.
* ``pipefusion_ulysses`` (2 x n): two PipeFusion stages, Ulysses over y within each (the K/V
  buffers split by heads, as the attention holds them after its all-to-all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STRATEGIES = ("ulysses", "ring", "usp", "tp", "cfg", "cfg_ulysses")
#: PipeFusion's plans: their inputs are a tick's (``pipefusion_inputs``), not one call's.
PIPEFUSION_STRATEGIES = ("pipefusion", "pipefusion_ulysses")


@dataclass(frozen=True)
class Names:
    """Where a model's plans mark: the token mark points, the attention cores whose keys and
    values come from the replicated text (cross-attention), and the tensor-parallel layers."""
    inputs: tuple[str, ...]
    tokens: tuple[str, ...]
    attention: str
    cross_attention: str | None
    column: str
    row: str
    row_outputs: str
    cfg: bool
    whole: tuple[str, ...] = ()  # modules whose output Ulysses keeps on every device
    handoff: str = r"handoff\.sent"  # PipeFusion's stage hand-offs (``layers.StageShift``)


NAMES = {
    "hunyuan_video": Names(("latents", "t", "text", "pooled", "guidance"), ("tokens", "text_tokens"),
                           r"(double|single)_blocks\.\d+\.attn", None, r"(double_blocks\.\d+\.(img|txt)|single_blocks\.\d+)\.(qkv|fc1|mlp\.fc1)",
                           r"(double_blocks\.\d+\.(img|txt)|single_blocks\.\d+)\.(proj|mlp\.fc2|fc2)",
                           r"(double_blocks\.\d+\.(img|txt)\.(proj|mlp\.fc2)|single_blocks\.\d+\.combined)",
                           cfg=False, whole=("txt_in",)),
    "wan21": Names(("latents", "t", "text"), ("tokens",), r"blocks\.\d+\.(self|cross)_attn\.core",
                   r"blocks\.\d+\.cross_attn\.core",
                   r"blocks\.\d+\.(self_attn|cross_attn)\.[qkv]_proj|blocks\.\d+\.mlp\.fc1",
                   r"blocks\.\d+\.(self_attn|cross_attn)\.o_proj|blocks\.\d+\.mlp\.fc2",
                   r"blocks\.\d+\.((self_attn|cross_attn)\.o_proj|mlp\.fc2)", cfg=True),
    "cogvideox": Names(("latents", "t", "text"), ("tokens", "text_tokens"),
                       r"blocks\.\d+\.attn", None, r"blocks\.\d+\.([qkv]_proj|mlp\.fc1)", r"blocks\.\d+\.(o_proj|mlp\.fc2)",
                       r"blocks\.\d+\.(o_proj|mlp\.fc2)", cfg=True,
                       handoff=r"(text_)?handoff\.sent"),
}

_N = '"none"'
#: The stages of ``pipefusion_ulysses`` (Ulysses over the degree within each).
PIPEFUSION_ULYSSES_STAGES = 2


def _spec(*entries: str | list[str] | None) -> str:
    def entry(e: str | list[str] | None) -> str:
        if e is None:
            return _N
        return f'"{e}"' if isinstance(e, str) else "[" + ", ".join(f'"{a}"' for a in e) + "]"

    return "[" + ", ".join(entry(e) for e in entries) + "]"


def _activation(module: str, spec: str, then: str | None = None) -> str:
    text = f"[[activations]]\nmodule = 're:{module}'\nspec = {spec}\n"
    return text + (f"then = {then}\n" if then else "") + "\n"


def _ulysses(names: Names, axis: str, batch: str | None = None) -> str:
    sequence3, sequence4 = _spec(batch, axis, None), _spec(batch, axis, None, None)
    heads4 = _spec(batch, None, axis, None)
    text = _tokens(names, sequence3, batch)
    if names.cross_attention:
        text += _activation(rf"{names.cross_attention}\.[kv]_in", heads4)
    text += _activation(rf"{names.attention}\.[qkv]_in", sequence4, heads4)
    return text + _activation(rf"{names.attention}\.out", heads4, sequence4)


def _tokens(names: Names, sequence3: str, batch: str | None) -> str:
    text = "".join(_activation(name, _spec(batch, None, None)) for name in names.whole)
    return text + "".join(_activation(name, sequence3) for name in names.tokens)


def _ring(names: Names) -> str:
    sequence4 = _spec(None, "y", None, None)
    text = _tokens(names, _spec(None, "y", None), None)
    if names.cross_attention:
        text += _activation(rf"{names.cross_attention}\.[kv]_in", _spec(None, None, None, None))
    text += _activation(rf"{names.attention}\.([qkv]_in|out)", sequence4)
    text += _activation(rf"{names.attention}\.ring_lse", sequence4)
    ring5 = _spec(None, "y", None, None, None)
    return (text + _activation(rf"{names.attention}\.ring_out", ring5)
            + _activation(rf"{names.attention}\.ring_kv", ring5))


def _usp(names: Names) -> str:
    sequence3, sequence4 = _spec(None, ["y", "z"], None), _spec(None, ["y", "z"], None, None)
    blocks = _spec(None, "y", "z", None)  # (B, L, H, D): ring blocks on y, heads on z
    text = _tokens(names, sequence3, None)
    if names.cross_attention:
        text += _activation(rf"{names.cross_attention}\.[kv]_in", _spec(None, None, "z", None))
    text += _activation(rf"{names.attention}\.[qkv]_in", sequence4, blocks)
    text += _activation(rf"{names.attention}\.out", blocks, sequence4)
    text += _activation(rf"{names.attention}\.ring_lse", _spec(None, "y", "z", None))
    ring5 = _spec(None, "y", None, "z", None)
    return (text + _activation(rf"{names.attention}\.ring_out", ring5)
            + _activation(rf"{names.attention}\.ring_kv", ring5))


def _tp(names: Names, axis: str) -> str:
    def parameter(pattern: str, spec: str) -> str:
        return f"[[parameters]]\npattern = 're:{pattern}'\nspec = {spec}\n\n"

    return (parameter(rf"({names.column})\.weight", _spec(axis, None))
            + parameter(rf"({names.column})\.bias", _spec(axis))
            + parameter(rf"({names.row})\.weight", _spec(None, axis))
            + _activation(names.row_outputs, _spec(None, None, None)))


def _cfg(names: Names) -> str:
    return "".join(f'[[inputs]]\nname = "{name}"\nspec = {_spec(*(["x"] + [None] * (rank - 1)))}\n\n'
                   for name, rank in zip(names.inputs, _RANKS[names.inputs]))


_RANKS = {("latents", "t", "text"): (5, 1, 3),
          ("latents", "t", "text", "pooled", "guidance"): (5, 1, 3, 2, 1)}


def _pipefusion(names: Names, ulysses: bool) -> str:
    heads = "y" if ulysses else None
    stale = "".join(f'[[inputs]]\nname = "{name}"\nspec = {_spec(None, "x", None, heads, None)}\n\n'
                    for name in ("stale_k", "stale_v"))
    body = _ulysses(names, "y", "x") if ulysses else ""
    return (_cfg(names) + stale + body
            + _activation(names.handoff, _spec("x", "y" if ulysses else None, None)))


def mesh(strategy: str, degree: int) -> tuple[int, ...]:
    """The mesh of a strategy at a sequence- or tensor-parallel degree (per CFG branch)."""
    if strategy == "usp":
        if degree % 2 or degree < 4:
            raise ValueError(f"usp: degree {degree} must be an even number of at least 4")
        return 1, 2, degree // 2
    return {"ulysses": (1, degree), "ring": (1, degree), "tp": (1, degree), "cfg": (2, 1),
            "cfg_ulysses": (2, degree), "pipefusion": (degree, 1),
            "pipefusion_ulysses": (PIPEFUSION_ULYSSES_STAGES, degree)}[strategy]


def factory_kwargs(strategy: str, degree: int) -> dict[str, int]:
    """The factory's layout arguments under a strategy: ``chunks``, the joint sequence's order
    (the sequence-parallel degree), ``ring``, the ring degree, and ``stages``, PipeFusion's."""
    ring = {"ring": degree, "usp": 2}.get(strategy, 1)
    sequence = ("ulysses", "cfg_ulysses", "ring", "usp", "pipefusion_ulysses")
    stages = {"pipefusion": degree, "pipefusion_ulysses": PIPEFUSION_ULYSSES_STAGES}
    return {"chunks": degree if strategy in sequence else 1, "ring": ring,
            "stages": stages.get(strategy, 1)}


def plan_toml(model: str, strategy: str, degree: int) -> str:
    """The plan of ``strategy`` for ``model`` (a key of NAMES) at ``degree`` devices per branch."""
    names = NAMES[model]
    if strategy not in STRATEGIES + PIPEFUSION_STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: expected one of "
                         f"{', '.join(STRATEGIES + PIPEFUSION_STRATEGIES)}")
    if strategy.startswith("cfg") and not names.cfg:
        raise ValueError(f"{model} uses embedded guidance (a batch of one): no CFG parallel")
    shape = mesh(strategy, degree)
    axes = ("x", "y", "z")[:len(shape)]
    head = (f"# {strategy} for {model} on {' x '.join(map(str, shape))} devices "
            "(models/zoo/videodit/plans.py)\n\n"
            f"[mesh]\nshape = {list(shape)}\naxes = {_spec(*axes)}\n\n")
    body = {"ulysses": lambda: _ulysses(names, "y"), "ring": lambda: _ring(names),
            "usp": lambda: _usp(names), "tp": lambda: _tp(names, "y"),
            "cfg": lambda: _cfg(names),
            "cfg_ulysses": lambda: _cfg(names) + _ulysses(names, "y", "x"),
            "pipefusion": lambda: _pipefusion(names, False),
            "pipefusion_ulysses": lambda: _pipefusion(names, True)}[strategy]()
    return head + body


def pipefusion_inputs(inputs: list[str], *, stages: int, patches: int, attentions: int,
                      heads: int, head_dim: int, video_tokens: int, row: int = 2) -> list[str]:
    """The ``--input`` specs of one PipeFusion tick from those of one call of the model
    (``NAME=SHAPE:DTYPE``, latents first, batch first, height second last): every input's
    batch times ``stages`` (stage-major: each stage's current patch), the latents' height cut
    to one patch of ``patches``: ``ceil(rows / patches)`` of the latent's token rows, ``row``
    latent rows each (note 000's height patches: the last patch padded), and the K/V buffers
    ``stale_k`` and ``stale_v`` (attentions, stages x batch, video tokens of the whole latent,
    heads, head_dim) in the latents' dtype."""
    specs = []
    for text in inputs:
        name, _, rest = text.partition("=")
        shape_text, _, dtype = rest.partition(":")
        shape = [int(size) for size in shape_text.split("x")]
        if name == "latents":
            token_rows = shape[-2] // row
            if not 1 <= patches <= token_rows:
                raise ValueError(f"latents {shape_text}: {patches} patches of {token_rows} "
                                 "token rows")
            shape[-2] = math.ceil(token_rows / patches) * row
            batch, latent_dtype = shape[0], dtype
        shape[0] *= stages
        specs.append(f"{name}={'x'.join(map(str, shape))}:{dtype}")
    stale = (attentions, stages * batch, video_tokens, heads, head_dim)
    return specs + [f"{name}={'x'.join(map(str, stale))}:{latent_dtype}"
                    for name in ("stale_k", "stale_v")]
