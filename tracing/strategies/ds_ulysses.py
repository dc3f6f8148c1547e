"""DeepSpeed-Ulysses sequence parallelism on an (X, Y) mesh: batch on X, sequence on Y.

Video tokens are split along the sequence (N = T*S, frame-major, so each device holds whole
frames) over Y, and the guidance batch over X; weights are replicated.  Why the batch goes on X:
every Linear flattens (B, N, h) to (B*N, h), and a split N under an unsplit B is not a
contiguous tile of B*N, so GSPMD would all-gather around every Linear.

With whole frames on each device, the spatial self-attention (sequence S, batch B*T) is local.
The temporal self-attention has its sequence T split, so Ulysses exchanges the sequence split for
a head split with all-to-alls before it (q, k, v) and back after it (the output); GSPMD inserts
them only if both q/k/v (head-split) and the output (sequence-split) are marked.  The
cross-attention's queries are split along the flattened B*N sequence while every device holds
all caption keys/values, so it needs no exchange either.
"""

from __future__ import annotations

from tracing.strategies.base import Reshard, Spec, Strategy, register
from tracing.strategies.kernels import einsum_attention

TOKENS = ("x", "y")  # a flattened batch-major token axis (B*T, B*N): batch on x, sequence on y
X_SEQ = ("x", "y", None)  # (B, N, h) and (B*S, T, h): batch on x, sequence on y


class SequenceParallel(Strategy):
    """Shared layout of the sequence-parallel strategies (batch on x, sequence on y)."""

    def validate(self) -> None:
        x_devices, y_devices = self.layout.mesh_shape
        self.require_divisible("batch", self.layout.batch, x_devices, "axis x")
        self.require_divisible("temporal tokens T", self.layout.geometry.T, y_devices, "axis y")

    def input_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        if name == "x":
            return X_SEQ
        if name in ("z", "t", "t_mlp"):
            return ("x",) + (None,) * (len(shape) - 1)
        return None

    def output_spec(self, name: str, shape: tuple[int, ...]) -> Spec | None:
        return X_SEQ if name == "x" else None

    def token_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        """Specs of the points outside the self-attention kernel, shared by the strategies."""
        if point in ("x", "mlp_hidden"):
            return X_SEQ
        if point in ("attn_in", "attn_out", "proj_out"):
            return X_SEQ if temporal else (TOKENS, None, None)
        if point == "cross_q":  # (1, heads, B*N, hd)
            return (None, None, TOKENS, None)
        if point in ("cross_k", "cross_v"):  # every caption on every device
            return (None, None, None, None)
        if point == "cross_out":  # (1, B*N, h)
            return (None, TOKENS, None)
        return None


@register
class DeepSpeedUlysses(SequenceParallel):
    name = "ds_ulysses"
    summary = "sequence parallel (batch on x, sequence on y); all-to-all to heads around the temporal attention"

    def validate(self) -> None:
        super().validate()
        self.require_divisible("heads", self.layout.model.num_heads, self.layout.mesh_shape[1],
                               "axis y")

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("q", "k", "v"):
            # temporal: (B*S, heads, T, hd) heads on y (the all-to-all); spatial: local.
            if temporal:  # sequence-split as computed, then all-to-all to heads
                return Reshard(before=("x", None, "y", None), after=("x", "y", None, None))
            return (TOKENS, None, None, None)
        return self.token_spec(point, shape, temporal)

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention  # heads split on y: keep (batch, heads) apart
