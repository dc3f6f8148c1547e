"""Peak GPU memory of one OpenSora v1.2 generation on one GPU, as its gradio demo runs it (the
setting of the README's published table: docs/gpu.md).

What a generation holds at its peak is every model's weights, resident for the whole run, plus
the activations of its largest phase::

    peak = T5 + STDiT3 + VAE weights + max(STDiT3 step, VAE decode)

**Weights** (``gradio/app.py`` ``build_models``, tag v1.2.0): the T5 encoder stays in float32
("T5 must be fp32"; ``opensora/models/text_encoder/t5.py``'s ``T5Encoder`` defaults to
``torch.float``), STDiT3 and the whole VAE (encoders too: ``OpenSoraVAE_V1_2`` builds both) are
moved to bfloat16. Parameter counts:

* T5 v1.1 XXL encoder (``DeepFloyd/t5-v1_1-xxl`` loaded as transformers' ``T5EncoderModel``):
  the token embedding, 24 layers of a self-attention (q, k, v, o without bias, 64 heads of 64)
  and a gated-GELU MLP (``wi_0``, ``wi_1``, ``wo`` of width 10240), an RMS norm (weight only)
  before each, the relative position bias of the first layer (32 buckets x 64 heads) and the
  final norm: :func:`t5_encoder_parameters`, 4,762,310,656 (sizes: :data:`T5_V1_1_XXL`);
* STDiT3-XL/2: ``models.opensora.flops.parameter_count`` of the ``full`` config;
* the VAE: :data:`TEMPORAL_VAE_PARAMETERS` + :data:`SPATIAL_VAE_PARAMETERS`, 393,341,007
  (docs/sources.md says how they were counted; the decoders' shares equal
  ``models.opensora.vae``'s modules: tests/test_generation_memory.py).

**The STDiT3 step** (:func:`stdit_step_activation_bytes`): under ``torch.inference_mode`` PyTorch
frees a tensor when its last reference goes, so a block holds what its Python names still hold.
With ``X`` the bytes of one residual-stream tensor (B x N x hidden in bfloat16, B = 2 for
classifier-free guidance), one block of the official ``STDiT3Block.forward`` (text-to-video: the
temporal-mask path) holds at its two largest points:

* the MLP (``x_m = self.mlp(x_m)``): 6 X live around the call (the block's input, kept by the
  caller's ``x``; the residual stream ``x``; the MLP's input ``x_m``; ``x_m_zero``, the unselected
  modulation; ``x_m_s`` and ``x_m_s_zero``, the gated attention outputs, all still bound) plus
  fc1's output and the GELU's output, 4 X each, while the GELU runs: **14 X**;
* the temporal attention's float32 softmax (``attn.softmax(dim=-1)`` on ``attn.to(float32)``):
  3 X around the call (the block's input, ``x_m_zero``, the rearranged ``x_m``), the qkv
  projection (3 X, held by the ``v`` view), q and k after their norm and RoPE (X each), and the
  scores twice in float32: **8 X + 4 A**, with ``A`` the scores' bytes in bfloat16,
  B x S x heads x T x T x 2 (``A = X * heads * T / hidden``: 1.67 X at 408 frames).

The other points are lower (the q/k RMSNorm's float32 temporaries 11 X, RoPE's 12 X, the flash
spatial attention 11 X, the cross-attention 9 X). Small tensors (timestep embeddings, the caption
embedding, the latent) are left out.

**The VAE decode** (:func:`vae_decode_activation_bytes`): the spatial decoder runs 4 frames a call
and keeps each call's output in a list that ``torch.cat`` joins at the end
(``VideoAutoencoderKL.decode``): the decoded video ``V`` (frames x 3 x H x W in bfloat16) is held
once while the last call runs and twice while it is joined, so the phase peaks at
``max(V + one spatial call, 2 V)`` (the temporal decoder's calls, on the latent's height and
width, are smaller). One call's peak is the traced call's memory analysis
(``hlo_analyzer.memory``'s peak live bytes of ``trace-vae-decode --part spatial``): the unfused
program's liveness, an upper bound of what the eager call holds.

Not modelled: the CUDA context and library workspaces, the caching allocator's reserved but free
blocks (what ``nvidia-smi`` shows beyond the tensors), and saving the video (which holds about
3 V). No torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.opensora.config import STDiT3Config, get_config
from models.opensora.flops import parameter_count
from models.opensora.inputs import geometry, parse_shape
from models.opensora.vae_config import FULL_VAE, VAEConfig, decode_plan

__all__ = [
    "CFG_BATCH",
    "GENERATION_PHASES",
    "GIB",
    "SPATIAL_VAE_PARAMETERS",
    "SPATIAL_VAE_PARTS",
    "T5_V1_1_XXL",
    "TEMPORAL_VAE_PARAMETERS",
    "TEMPORAL_VAE_PARTS",
    "PeakMemory",
    "generation_peak",
    "stdit_step_activation_bytes",
    "t5_encoder_parameters",
    "vae_decode_activation_bytes",
]

GIB = 2**30
#: The phases of one generation as the demo runs it, in order (``models.opensora.generation``):
#: loading aside, the weights held, the sampling loop, the VAE decode, the save's normalisation.
GENERATION_PHASES = ("weights", "loop", "decode", "save")

#: T5 v1.1 XXL (google-research/t5x ``t5x/examples/t5/t5_1_1/xxl.gin`` over ``base.gin``:
#: vocab_size 32128, emb_dim 4096, num_heads 64, head_dim 64, num_encoder_layers 24, mlp_dim
#: 10240, mlp_activations ("gelu", "linear"): a gated MLP with two input projections);
#: 32 relative-attention buckets (transformers' ``T5Config.relative_attention_num_buckets``).
T5_V1_1_XXL = {"vocab": 32128, "d_model": 4096, "heads": 64, "head_dim": 64, "layers": 24, "d_ff": 10240,
               "gated_inputs": 2, "relative_buckets": 32}

#: Parameters of ``VAE_Temporal_SD`` and of the SDXL VAE's ``AutoencoderKL`` by part, counted by
#: building the official modules on the meta device (docs/sources.md, "OpenSora v1.2").
TEMPORAL_VAE_PARTS = {"encoder": 144_421_128, "quant_conv": 72, "post_quant_conv": 20, "decoder": 165_265_924}
SPATIAL_VAE_PARTS = {"encoder": 34_163_592, "quant_conv": 72, "post_quant_conv": 20, "decoder": 49_490_179}
TEMPORAL_VAE_PARAMETERS = sum(TEMPORAL_VAE_PARTS.values())   # 309,687,144
SPATIAL_VAE_PARAMETERS = sum(SPATIAL_VAE_PARTS.values())     # 83,653,863

#: Bytes per value: T5 in float32, STDiT3, the VAE and the activations in bfloat16 (the inference
#: config's ``dtype = "bf16"``; gradio/app.py).
T5_BYTES, MODEL_BYTES, ACTIVATION_BYTES = 4, 2, 2
#: Classifier-free guidance runs the conditional and the unconditional sample as one batch of 2.
CFG_BATCH = 2
#: Live residual-stream-sized tensors at the two largest points of a block (module docstring).
MLP_POINT_X = 6          # around the MLP call; plus fc1's and the GELU's outputs
SOFTMAX_POINT_X = 8      # around the temporal softmax (3 + qkv 3 + q + k); plus 4 A
SOFTMAX_POINT_SCORES = 4  # the scores in float32 twice (input and output of the softmax)
#: Channels of a decoded frame (RGB).
IMAGE_CHANNELS = 3


def t5_encoder_parameters(sizes: dict[str, int] = T5_V1_1_XXL) -> int:
    """Parameters of transformers' ``T5EncoderModel`` with these sizes (module docstring)."""
    d, inner = sizes["d_model"], sizes["heads"] * sizes["head_dim"]
    layer = 4 * d * inner + (sizes["gated_inputs"] + 1) * d * sizes["d_ff"] + 2 * d
    return sizes["vocab"] * d + sizes["layers"] * layer + sizes["relative_buckets"] * sizes["heads"] + d


def stdit_step_activation_bytes(shape: str, config: STDiT3Config | None = None, batch: int = CFG_BATCH) -> int:
    """The largest live activations of one STDiT3 forward (module docstring): the larger of the
    MLP point (14 X) and the temporal softmax point (8 X + 4 A)."""
    config = config or get_config("full")
    geo = geometry(config, shape)
    x = batch * geo.N * config.hidden_size * ACTIVATION_BYTES
    mlp = MLP_POINT_X * x + 2 * batch * geo.N * config.mlp_hidden * ACTIVATION_BYTES
    scores = batch * geo.S * config.num_heads * geo.T * geo.T * ACTIVATION_BYTES
    softmax = SOFTMAX_POINT_X * x + SOFTMAX_POINT_SCORES * scores
    return max(mlp, softmax)


def vae_decode_activation_bytes(shape: str, spatial_call_peak_bytes: int, config: VAEConfig = FULL_VAE) -> int:
    """The decode's peak: ``max(V + one spatial call, 2 V)`` (module docstring)."""
    plan = decode_plan(shape, config)
    # the decoded size: the latent's x 8 (480p's 854 pixels decode to 848)
    height, width = plan.latent_height * config.spatial_factor, plan.latent_width * config.spatial_factor
    decoded = plan.frames * IMAGE_CHANNELS * height * width * ACTIVATION_BYTES
    return max(decoded + spatial_call_peak_bytes, 2 * decoded)


@dataclass(frozen=True)
class PeakMemory:
    """The parts of a generation's peak memory, in bytes."""

    shape: str
    t5_weight_bytes: int
    stdit_weight_bytes: int
    vae_weight_bytes: int
    stdit_activation_bytes: int
    vae_activation_bytes: int

    @property
    def weight_bytes(self) -> int:
        return self.t5_weight_bytes + self.stdit_weight_bytes + self.vae_weight_bytes

    @property
    def phase(self) -> str:
        """The largest phase: ``STDiT3 step`` or ``VAE decode``."""
        return "STDiT3 step" if self.stdit_activation_bytes >= self.vae_activation_bytes else "VAE decode"

    @property
    def activation_bytes(self) -> int:
        return max(self.stdit_activation_bytes, self.vae_activation_bytes)

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.activation_bytes


def generation_peak(shape: str, spatial_call_peak_bytes: int) -> PeakMemory:
    """The peak memory of one generation of ``shape`` (module docstring); the spatial decoder
    call's peak comes from its traced call's memory analysis."""
    return PeakMemory(
        shape=str(parse_shape(shape)),
        t5_weight_bytes=t5_encoder_parameters() * T5_BYTES,
        stdit_weight_bytes=parameter_count(get_config("full")) * MODEL_BYTES,
        vae_weight_bytes=(TEMPORAL_VAE_PARAMETERS + SPATIAL_VAE_PARAMETERS) * MODEL_BYTES,
        stdit_activation_bytes=stdit_step_activation_bytes(shape),
        vae_activation_bytes=vae_decode_activation_bytes(shape, spatial_call_peak_bytes),
    )
