"""Predicted vs measured: one STDiT3 block pair run eagerly in PyTorch on a CUDA GPU.

    python3 benchmarks/gpu_validate.py [--hw h100-sxm] [--shapes 204_640_360,...] [--out results/gpu_validation]

For each reference shape it builds one spatial and one temporal block of the full OpenSora v1.2
config (bf16, B = 2, the official path; attention through ``F.scaled_dot_product_attention``
restricted to FlashAttention-2, the kernels of the flash-attn package the official code calls,
the cross-attention one sample's queries against its own caption keys as xformers'
block-diagonal mask runs it), warms up, then runs the pair once under ``torch.profiler`` and
takes, for every top-level ATen op, the GPU time of the kernels it launched, beside its own
ATen-level estimate on the GPU's chip description (one kernel per framework op: matmuls as GEMMs,
SDPA as flash attention, every other op a memory-bound kernel reading its inputs and writing an
output as large as its largest input, every tensor taken as bf16; the tool's prediction of the
traced program is ``scripts/gpu_predictions.py``'s). It also times the pair's wall clock outside
the profiler and whole STDiT3 forwards (every pair, the embedders, the final layer: the residual
stream in the layout the patch embedding leaves it), whose 30 make the sampling loop. It prints
and writes (``results/gpu_validation/<device>.md``, ``.csv`` and ``_ops.csv``) the tables with
the device name, driver, CUDA and torch versions.

Without CUDA it says so in one line and exits 0. The table logic (:func:`summarize`,
:func:`render_markdown`) needs neither torch nor a GPU and is tested on synthetic timings.

    python3 benchmarks/gpu_validate.py --quick     # what CI runs: seconds, writes nothing

``--quick`` runs the whole path (model blocks, profiler, ATen op -> tool op, table) on one pair of
the tiny config, on the GPU if there is one, else on the CPU (CPU times: no validation).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hardware import Op, OpType, load_chip, map_op  # noqa: E402
from hardware.spec import ChipSpec  # noqa: E402
from hlo_trace.atomic import atomic_write  # noqa: E402

#: Kernel classes of the table, in order: those of ``analyze-hlo --exec torch`` (docs/gpu.md).
KINDS = ("gemm", "flash_attention", "layer_norm", "softmax", "gelu", "copy", "elementwise")
#: ATen ops run as one GEMM kernel (cuBLAS): (input index of the activation, of the weight).
GEMM_OPS = {"aten::linear": (0, 1), "aten::addmm": (1, 2), "aten::mm": (0, 1), "aten::matmul": (0, 1),
            "aten::bmm": (0, 1)}
#: ATen ops of the memory-bound classes with an efficiency of their own ([kernel_model.vector_efficiency]).
VECTOR_CLASSES = {"aten::layer_norm": "layer_norm", "aten::native_layer_norm": "layer_norm",
                  "aten::softmax": "softmax", "aten::_softmax": "softmax", "aten::gelu": "gelu"}
#: ATen ops run as one fused attention kernel.
ATTENTION_OPS = ("aten::scaled_dot_product_attention",)
#: ATen ops under a view op that make it a copy kernel.
COPY_OPS = ("aten::clone", "aten::copy_", "aten::contiguous")
#: ATen ops that launch no kernel (views, metadata) and are skipped, unless they copy.
VIEW_OPS = ("aten::view", "aten::reshape", "aten::permute", "aten::transpose", "aten::unbind", "aten::chunk",
            "aten::expand", "aten::unflatten", "aten::flatten", "aten::select", "aten::slice", "aten::t",
            "aten::unsqueeze", "aten::split", "aten::empty", "aten::_unsafe_view", "aten::as_strided",
            "aten::detach", "aten::lift_fresh", "aten::alias")


@dataclass(frozen=True)
class KernelTiming:
    """One framework op of a block pair: its kind, measured GPU seconds and the tool's prediction."""

    shape: str
    op_name: str
    kind: str
    measured_s: float
    predicted_s: float


@dataclass(frozen=True)
class ErrorRow:
    """Totals of one (shape, kind) or one shape's whole pair (``kind == "pair"``)."""

    shape: str
    kind: str
    ops: int
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """``predicted / measured - 1`` (NaN when nothing was measured)."""
        return self.predicted_s / self.measured_s - 1 if self.measured_s > 0 else math.nan


def summarize(timings: Iterable[KernelTiming]) -> list[ErrorRow]:
    """Per shape: one row per op kind present, then the block pair's total."""
    by_shape: dict[str, list[KernelTiming]] = {}
    for timing in timings:
        by_shape.setdefault(timing.shape, []).append(timing)
    rows: list[ErrorRow] = []
    for shape, items in by_shape.items():
        for kind in KINDS:
            mine = [t for t in items if t.kind == kind]
            if mine:
                rows.append(ErrorRow(shape, kind, len(mine), sum(t.measured_s for t in mine), sum(t.predicted_s for t in mine)))
        rows.append(ErrorRow(shape, "pair", len(items), sum(t.measured_s for t in items), sum(t.predicted_s for t in items)))
    return rows


def render_markdown(rows: Sequence[ErrorRow], header: Sequence[str]) -> str:
    lines = ["# GPU validation: one STDiT3 block pair, eager PyTorch, bf16, B = 2", ""]
    lines += [f"- {line}" for line in header] + [""]
    lines += ["| shape | kind | ops | measured (ms) | predicted (ms) | error |", "|---|---|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row.shape} | {row.kind} | {row.ops} | {row.measured_s * 1e3:.3f} | {row.predicted_s * 1e3:.3f} | {row.error:+.1%} |")
    return "\n".join(lines) + "\n"


def render_walls(runs: Sequence[PairRun], pairs: int, steps: int) -> str:
    """The pair's wall-clock time beside the sum of its kernels, the sampling loop it implies
    (``pairs`` pairs a forward, ``steps`` forwards, the CFG batch of 2 inside each), and the loop
    of whole forwards where one was timed."""
    lines = ["", f"Wall-clock per pair (median of {WALL_RUNS} runs outside the profiler), the loop it implies "
             f"({pairs} pairs x {steps} steps), and {steps} whole forwards (every pair, embedders, final layer):", "",
             "| shape | kernels (ms) | pair wall (ms) | gaps | loop from the pair (s) | forward (ms) | loop (s) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        kernels = sum(t.measured_s for t in run.timings)
        gaps = run.wall_s / kernels - 1 if kernels > 0 else math.nan
        forward = ("| |" if run.forward_s is None else
                   f"| {run.forward_s * 1e3:.1f} | {run.forward_s * steps:.2f} |")
        lines.append(f"| {run.shape} | {kernels * 1e3:.3f} | {run.wall_s * 1e3:.3f} | {gaps:+.1%} | "
                     f"{run.wall_s * pairs * steps:.2f} {forward}")
    return "\n".join(lines) + "\n"


def render_csv(rows: Sequence[ErrorRow]) -> str:
    lines = ["shape,kind,ops,measured_s,predicted_s,error"]
    lines += [f"{r.shape},{r.kind},{r.ops},{r.measured_s:.9g},{r.predicted_s:.9g},{r.error:.6g}" for r in rows]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Framework op -> the tool's Op (eager execution model)
# --------------------------------------------------------------------------------------------


def _elements(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def op_from_aten(name: str, index: int, input_shapes: Sequence[Sequence[int]], bytes_per_element: int = 2,
                 *, launched: bool = False) -> Op | None:
    """The tool's Op for one top-level ATen op with these input shapes (None: launches nothing).
    ``launched``: the op ran a kernel on the device, so a view op (``reshape`` of a permuted
    tensor) is a copy. A memory-bound op is named after its kernel class, which picks its
    in-model efficiency (``KernelModel.hbm_efficiency_for``)."""
    shapes = [tuple(s) for s in input_shapes if s]
    label = f"{index:03d}_{name.removeprefix('aten::')}"
    if (name in VIEW_OPS and not launched) or not shapes:
        return None
    if name in GEMM_OPS:
        a_at, w_at = GEMM_OPS[name]
        a, w = tuple(input_shapes[a_at]), tuple(input_shapes[w_at])
        k = a[-1]
        n = w[0] if name == "aten::linear" else w[-1]  # linear keeps the weight as (N, K)
        m = _elements(a[:-1])
        return Op(label, OpType.GEMM, ((m, k),), (k, n), (m, n), 2 * m * k * n, bytes_per_element)
    if name in ATTENTION_OPS:
        q, k = tuple(input_shapes[0]), tuple(input_shapes[1])
        batch = _elements(q[:-3]) if len(q) > 3 else 1
        heads, s_q, dim = q[-3], q[-2], q[-1]
        s_kv = k[-2]
        qs, ks = (batch, heads, s_q, dim), (batch, heads, s_kv, dim)
        return Op(label, OpType.FLASH_ATTENTION, (qs, ks, ks), None, qs, 4 * batch * heads * s_q * s_kv * dim,
                  bytes_per_element, vector_flops=batch * heads * s_q * s_kv)
    largest = max(shapes, key=_elements)
    rows = _elements(largest[:-1]) if len(largest) > 1 else 1
    out = (rows, largest[-1])
    flat = tuple((_elements(s[:-1]) if len(s) > 1 else 1, s[-1]) for s in shapes)
    kernel_class = "copy" if name in VIEW_OPS else VECTOR_CLASSES.get(name, "elementwise")
    return Op(kernel_class, OpType.VECTOR, flat, None, out, _elements(largest), bytes_per_element)


def kernel_class(op: Op) -> str:
    """The class of the table an Op of :func:`op_from_aten` belongs to."""
    if op.op_type is OpType.GEMM:
        return "gemm"
    if op.op_type is OpType.FLASH_ATTENTION:
        return "flash_attention"
    return op.name


def predict(op: Op, chip: ChipSpec) -> float:
    return map_op(op, chip).latency_s


# --------------------------------------------------------------------------------------------
# The CUDA run
# --------------------------------------------------------------------------------------------


def _chip_for(device_name: str, override: str | None) -> str:
    if override:
        return override
    for key, chip in (("H200", "h200-sxm"), ("H100", "h100-sxm"), ("A100", "a100-sxm")):
        if key in device_name:
            return chip
    raise SystemExit(f"Error: no bundled chip for {device_name!r}; pass --hw NAME|FILE")


@dataclass(frozen=True)
class PairRun:
    """One shape's block pair: its profiled framework ops, and the pair's wall-clock seconds
    (median of timed runs outside the profiler: kernels plus the gaps between their launches)."""

    shape: str
    timings: tuple[KernelTiming, ...]
    wall_s: float
    #: one whole forward's wall seconds (:func:`measure_forward`), when measured
    forward_s: float | None = None


#: Timed runs of the pair outside the profiler (their median is the pair's wall-clock time).
WALL_RUNS = 5


def measure_forward(shape: str, torch, runs: int = 3, *, config_name: str = "full", device: str = "cuda") -> float:  # noqa: ANN001
    """Median wall seconds of one whole STDiT3 forward (every pair, the embedders and the final
    layer) of ``config_name`` at ``shape``, official path, bf16, the CFG batch of 2."""
    from models.opensora.config import get_config
    from models.opensora.inputs import make_inputs
    from models.opensora.official import flash_attention_2, official_kernels
    from models.opensora.stdit3 import STDiT3

    config = get_config(config_name)
    on_gpu = device == "cuda"
    model = STDiT3(config).to(device, torch.bfloat16).eval()
    official_kernels(model, config)
    inputs = make_inputs(config, shape, dtype=torch.bfloat16, device=device)
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    seconds = []
    with torch.no_grad(), flash_attention_2(on_gpu):
        for index in range(runs + 1):
            synchronize()
            start = time.perf_counter()
            model(**inputs, official=True)
            synchronize()
            if index:  # the first is a warm-up
                seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure_pair(shape: str, chip: ChipSpec, torch, warmup: int = 2, *, config_name: str = "full",  # noqa: ANN001 - torch is imported lazily
                 device: str = "cuda") -> PairRun:
    """One spatial + temporal block pair of ``config_name`` at ``shape``, profiled on ``device``
    (``cuda``: the GPU time of each op's kernels; ``cpu``: its CPU time, for ``--quick``), run as
    OpenSora's official code runs it (docs/gpu.md): the text-to-video path (an all-ones temporal
    mask, the timestep-0 modulation) with the library kernels of ``models.opensora.official.official_kernels``; the
    self-attentions the official code runs without flash run the plain product as it does."""
    from torch.profiler import ProfilerActivity, profile

    from models.opensora.config import get_config
    from models.opensora.inputs import geometry
    from models.opensora.official import flash_attention_2, official_kernels
    from models.opensora.stdit3 import STDiT3Block

    config = get_config(config_name)
    on_gpu = device == "cuda"
    geo = geometry(config, shape)
    h, batch = config.hidden_size, 2
    blocks = [STDiT3Block(config, temporal=t).to(device, torch.bfloat16).eval() for t in (False, True)]
    for block in blocks:
        official_kernels(block, config)
    x = torch.randn(batch, geo.T * geo.S, h, device=device, dtype=torch.bfloat16)
    y = torch.randn(1, batch * config.model_max_length, h, device=device, dtype=torch.bfloat16)
    t_mlp = torch.randn(batch, 6 * h, device=device, dtype=torch.bfloat16)
    t0_mlp = torch.randn(batch, 6 * h, device=device, dtype=torch.bfloat16)
    x_mask = torch.ones(batch, geo.T, device=device, dtype=torch.bool)
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]

    def run() -> None:
        out = x
        for block in blocks:
            out = block(out, y, t_mlp, geo.T, geo.S, x_mask=x_mask, t0_mlp=t0_mlp)

    with torch.no_grad(), flash_attention_2(on_gpu):
        for _ in range(warmup):
            run()
        synchronize()
        with profile(activities=activities, record_shapes=True) as prof:
            run()
            synchronize()
        walls = []
        for _ in range(WALL_RUNS):
            start = time.perf_counter()
            run()
            synchronize()
            walls.append(time.perf_counter() - start)
    timings = []
    for index, event in enumerate(e for e in prof.events() if e.name.startswith("aten::")):
        parent = event.cpu_parent
        if parent is not None and parent.name.startswith("aten::"):
            continue
        measured = (event.device_time_total if on_gpu else event.cpu_time_total) * 1e-6
        op = op_from_aten(event.name, index, event.input_shapes or [], launched=_copies(event))
        if op is None or measured <= 0:
            continue
        timings.append(KernelTiming(shape, f"{index:03d}_{event.name.removeprefix('aten::')}", kernel_class(op),
                                    measured, predict(op, chip)))
    return PairRun(shape, tuple(timings), statistics.median(walls))


def _copies(event) -> bool:  # noqa: ANN001 - a torch.autograd.profiler FunctionEvent
    """True when a view op (``reshape`` of a permuted tensor) had to copy its input."""
    return any(child.name in COPY_OPS for child in event.cpu_children)


def _versions(torch) -> list[str]:  # noqa: ANN001
    import subprocess

    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return [f"device: {torch.cuda.get_device_name(0)}", f"driver: {driver}", f"CUDA: {torch.version.cuda}",
            f"torch: {torch.__version__}", f"cuDNN: {torch.backends.cudnn.version()}"]


def quick(torch, hardware: str | None) -> int:  # noqa: ANN001
    """``--quick``: the whole path on one pair of the tiny config; prints the table, writes nothing."""
    from hlo_analyzer.mapping.apply import DIFFUSION_STEPS
    from models.opensora.config import get_config
    from plans.config import default_shape

    on_gpu = torch.cuda.is_available()
    device_name = torch.cuda.get_device_name(0) if on_gpu else "CPU"
    chip_name = _chip_for(device_name, hardware) if on_gpu else hardware or "h100-sxm"
    config = get_config("tiny")
    shape, device = default_shape("tiny"), "cuda" if on_gpu else "cpu"
    run = measure_pair(shape, load_chip(chip_name), torch, warmup=1, config_name="tiny", device=device)
    run = dataclasses.replace(run, forward_s=measure_forward(shape, torch, 1, config_name="tiny", device=device))
    timings = run.timings
    missing = [kind for kind in KINDS if kind not in {t.kind for t in timings}]
    if missing:
        print(f"gpu_validate --quick: no {', '.join(missing)} op measured in the pair", file=sys.stderr)
        return 1
    header = [f"device: {device_name}", f"predicted with: {chip_name}",
              "--quick: the tiny config, one pair" + ("" if on_gpu else "; CPU times, no validation")]
    print(render_markdown(summarize(timings), header) + render_walls([run], config.depth, DIFFUSION_STEPS))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from hlo_analyzer.mapping.apply import DIFFUSION_STEPS
    from models.opensora.config import get_config
    from models.opensora.inputs import REFERENCE_SHAPES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default=None, help="chip to predict with (default: from the device name)")
    parser.add_argument("--shapes", default=",".join(REFERENCE_SHAPES))
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu_validation"))
    parser.add_argument("--force", action="store_true", help="overwrite an existing table")
    parser.add_argument("--quick", action="store_true",
                        help="one tiny-config pair on the GPU, else the CPU; writes nothing (CI)")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_validate: torch is not installed; nothing to measure.")
        return 0
    if args.quick:
        return quick(torch, args.hw)
    if not torch.cuda.is_available():
        print("gpu_validate: no CUDA device on this machine; nothing to measure (the table logic is tested on CPU).")
        return 0
    device_name = torch.cuda.get_device_name(0)
    chip_name = _chip_for(device_name, args.hw)
    chip = load_chip(chip_name)
    runs = []
    for shape in args.shapes.split(","):
        pair = measure_pair(shape, chip, torch)
        torch.cuda.empty_cache()
        runs.append(dataclasses.replace(pair, forward_s=measure_forward(shape, torch)))
        torch.cuda.empty_cache()
        print(f"gpu_validate: {shape}: pair {pair.wall_s * 1e3:.2f} ms, forward {runs[-1].forward_s * 1e3:.1f} ms wall",
              file=sys.stderr, flush=True)
    timings = [t for run in runs for t in run.timings]
    rows = summarize(timings)
    header = [*_versions(torch), f"predicted with: {chip_name} (eager model: one kernel per framework op)"]
    text = render_markdown(rows, header) + render_walls(runs, get_config("full").depth, DIFFUSION_STEPS)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = device_name.replace(" ", "_")
    atomic_write(out / f"{stem}.md", text, force=args.force)
    atomic_write(out / f"{stem}.csv", render_csv(rows), force=args.force)
    per_op = "\n".join(f"{t.shape},{t.op_name},{t.kind},{t.measured_s:.9g},{t.predicted_s:.9g}" for t in timings)
    atomic_write(out / f"{stem}_ops.csv", "shape,op,kind,measured_s,predicted_s\n" + per_op + "\n", force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
