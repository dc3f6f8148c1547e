"""DeepSpeed-Ulysses sequence parallelism on an (X, Y) mesh: batch on X, sequence on Y.

Video tokens are split along the sequence (N = T*S) over Y, and the guidance batch over X;
weights are replicated.  Why the batch goes on X: every Linear flattens (B, N, h) to (B*N, h),
and a split N under an unsplit B is not a contiguous tile of B*N, so GSPMD would all-gather
around every Linear.

For the same reason only the major factor of N can be split: a device holds a contiguous range
of the token axis.  The split is chosen per layout (``choose_token_order``):

* T % Y == 0: frame-major tokens (token t*S + s), split T: each device holds whole frames;
* else S % Y == 0: space-major tokens (token s*T + t), split S: each device holds whole time
  series of S/Y spatial positions (OpenSora's own sequence parallelism splits S too);
* else: a StrategyError naming T, S and axis Y.

The four reference shapes have T = 60, 120, 15, 30 and S = 920 or 3600: on a 2x8 mesh only
T = 120 splits, every S does.  The attention over the split factor (temporal when T is split,
spatial when S is) has its sequence split; the other one is local (its sequence is whole on every
device, its batch B*S or B*T split over (X, Y)).  Around the split attention Ulysses exchanges
the sequence split for a head split with all-to-alls before it (q, k, v) and back after it (the
output); GSPMD inserts them only if both q/k/v (head-split) and the output (sequence-split) are
marked.  The cross-attention's queries are split along the flattened B*N sequence (batch-major,
in either token order) while every device holds all caption keys/values, so it needs no exchange
either.
"""

from __future__ import annotations

from models.opensora.token_order import FRAME_MAJOR, SPACE_MAJOR, TokenOrder, major_axis_is_temporal
from tracing.strategies.base import Layout, Reshard, Spec, Strategy, StrategyError, register
from tracing.strategies.kernels import einsum_attention

# A flattened batch-major token axis (B*N, or B*major, the batch of the local attention):
# batch on x, the rest on y.
TOKENS = ("x", "y")
# (B, N, h), and (B*minor, major, h) of the split attention: batch on x, sequence on y.
X_SEQ = ("x", "y", None)


class SequenceParallel(Strategy):
    """Shared layout of the sequence-parallel strategies (batch on x, sequence on y)."""

    @classmethod
    def choose_token_order(cls, layout: Layout) -> TokenOrder:
        """Split T (frame-major) when axis y divides it, else S (space-major) when y divides
        that; frame-major when neither, which ``validate`` rejects."""
        y_devices = layout.mesh_shape[1]
        if layout.geometry.T % y_devices and not layout.geometry.S % y_devices:
            return SPACE_MAJOR
        return FRAME_MAJOR

    def validate(self) -> None:
        x_devices, y_devices = self.layout.mesh_shape
        self.require_divisible("batch", self.layout.batch, x_devices, "axis x")
        T, S = self.layout.geometry.T, self.layout.geometry.S
        if T % y_devices and S % y_devices:
            raise StrategyError(
                f"strategy {self.name}: neither the temporal tokens T = {T} nor the spatial "
                f"tokens S = {S} are divisible by the {y_devices} devices of mesh axis y "
                f"(mesh {x_devices}x{y_devices}); the sequence split needs one of them")

    def sequence_split(self, temporal: bool) -> bool:
        """Whether the self-attention of a temporal (else spatial) block has its sequence split
        over y: the attention over the major factor of the token axis (T frame-major, S
        space-major)."""
        return temporal == major_axis_is_temporal(self.token_order)

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
            return X_SEQ if self.sequence_split(temporal) else (TOKENS, None, None)
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
    summary = ("sequence parallel (batch on x, T or S on y); all-to-all to heads around the "
               "attention whose sequence is split")

    def validate(self) -> None:
        super().validate()
        self.require_divisible("heads", self.layout.model.num_heads, self.layout.mesh_shape[1],
                               "axis y")

    def activation_spec(self, point: str, shape: tuple[int, ...], temporal: bool) -> Spec | None:
        if point in ("q", "k", "v"):
            # (B', heads, L, hd).  Split attention: heads on y (the all-to-all); other: local.
            if self.sequence_split(temporal):  # sequence-split as computed, then to heads
                return Reshard(before=("x", None, "y", None), after=("x", "y", None, None))
            return (TOKENS, None, None, None)
        return self.token_spec(point, shape, temporal)

    def attention_fn(self, mesh, temporal: bool):
        return einsum_attention  # heads split on y: keep (batch, heads) apart
