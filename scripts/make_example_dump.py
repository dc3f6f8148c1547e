"""Write the small bundled example dump that the analyzer's quick start and tests use.

A patch-embedding convolution followed by a Megatron-sharded MLP, traced with torch-xla SPMD on a
2x2 mesh of virtual CPU devices (mesh axes ``x`` = data parallel, ``y`` = tensor parallel):

    img (8, 4, 2, 2)  --conv Wc (16, 4, 2, 2), stride 2-->  (8, 16, 1, 1) -> x (8, 16)
    x @ W1 (16, 64) + b1   W1, b1 column-split on y    -> (8, 64)
    GELU(tanh)
    @ W2 (64, 16) + b2     W2 row-split on y           -> (8, 16), one all-reduce over y
    the batch (8) is split on x everywhere.

Writes into ``hlo_trace/examples/`` (or ``--out``), the package data that
:func:`hlo_trace.examples.example_dump` serves: ``example_mlp_megatron_2x2.hlo.txt`` (XLA's
after_spmd-partitioning HLO text), ``.stablehlo.mlir``, ``.mhlo.mlir`` and a ``.json`` sidecar
that says what the program is, with its per-device FLOPs derived by hand.

Run:  python3 scripts/make_example_dump.py [--out hlo_trace/examples] [--force]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tracing import capture  # noqa: E402  (needs the path above; imports no torch)

NAME = "example_mlp_megatron_2x2"
MESH_SHAPE = (2, 2)
MESH_AXES = ("x", "y")
BATCH, IN_CHANNELS, PATCH, HIDDEN, FFN = 8, 4, 2, 16, 64


def per_device_flops() -> dict[str, int]:
    """FLOPs of one device, derived from the shapes and shardings above (not measured)."""
    dp, tp = MESH_SHAPE
    local_batch = BATCH // dp  # 4 rows per device
    local_ffn = FFN // tp  # 32 columns of W1 / rows of W2 per device
    conv = 2 * (local_batch * HIDDEN * 1 * 1) * (PATCH * PATCH) * IN_CHANNELS  # 2048
    fc1 = 2 * local_batch * HIDDEN * local_ffn  # 4096: (4,16) @ (16,32)
    fc2 = 2 * local_batch * local_ffn * HIDDEN  # 4096: (4,32) @ (32,16), partial sums
    return {"convolution": conv, "fc1_dot": fc1, "fc2_dot": fc2, "dot_total": fc1 + fc2,
            "gemm_total": conv + fc1 + fc2}


def expected_collectives() -> list[dict[str, object]]:
    """The one collective Megatron needs: sum fc2's partial products over the tp group."""
    dp, tp = MESH_SHAPE
    # Device ids are laid out row-major over (x, y): y groups are {0,1} and {2,3}.
    groups = [[x * tp + y for y in range(tp)] for x in range(dp)]
    return [{"kind": "all-reduce", "shape": [BATCH // dp, HIDDEN], "dtype": "f32",
             "replica_groups": groups, "bytes": (BATCH // dp) * HIDDEN * 4}]


def trace() -> tuple[str, dict[str, object]]:
    """Trace the program and return (after-spmd-partitioning HLO text, facts for the sidecar)."""
    session = capture.prepare_process(MESH_SHAPE[0] * MESH_SHAPE[1])
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
        import torch_xla
        import torch_xla.distributed.spmd as xs

        capture.enable_spmd()
        mesh = xs.Mesh(np.arange(MESH_SHAPE[0] * MESH_SHAPE[1]), MESH_SHAPE, MESH_AXES)
        device = torch_xla.device()
        generator = torch.Generator().manual_seed(0)

        def param(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(device)

        img = param(BATCH, IN_CHANNELS, PATCH, PATCH)
        conv_w = param(HIDDEN, IN_CHANNELS, PATCH, PATCH)
        w1, b1 = param(HIDDEN, FFN), param(FFN)
        w2, b2 = param(FFN, HIDDEN), param(HIDDEN)
        shardings = {
            "img": ("x", None, None, None),
            "conv_w": (None, None, None, None),
            "w1": (None, "y"), "b1": ("y",),
            "w2": ("y", None), "b2": (None,),
        }
        for name, tensor in (("img", img), ("conv_w", conv_w), ("w1", w1), ("b1", b1),
                             ("w2", w2), ("b2", b2)):
            xs.mark_sharding(tensor, mesh, shardings[name])

        x = F.conv2d(img, conv_w, stride=PATCH).reshape(BATCH, HIDDEN)
        hidden = F.gelu(x @ w1 + b1, approximate="tanh")
        xs.mark_sharding(hidden, mesh, ("x", "y"))
        out = hidden @ w2 + b2
        xs.mark_sharding(out, mesh, ("x", None))

        hlo_text = capture.capture_partitioned_hlo(session, [out], finish_compile=True)
        facts = {
            "mesh": {"shape": list(MESH_SHAPE), "axes": list(MESH_AXES),
                     "device_ids": list(range(MESH_SHAPE[0] * MESH_SHAPE[1]))},
            "devices": capture.device_count(),
            "dtype": "float32",
            "tensors": {
                "img": {"shape": list(img.shape), "sharding": shardings["img"]},
                "conv_w": {"shape": list(conv_w.shape), "sharding": shardings["conv_w"],
                           "stride": PATCH},
                "w1": {"shape": list(w1.shape), "sharding": shardings["w1"]},
                "b1": {"shape": list(b1.shape), "sharding": shardings["b1"]},
                "w2": {"shape": list(w2.shape), "sharding": shardings["w2"]},
                "b2": {"shape": list(b2.shape), "sharding": shardings["b2"]},
                "hidden": {"shape": [BATCH, FFN], "sharding": ("x", "y")},
                "out": {"shape": list(out.shape), "sharding": ("x", None)},
            },
            "versions": capture.tool_versions(),
        }
        return hlo_text, facts
    finally:
        capture.release(session)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO_ROOT / "hlo_trace" / "examples"),
                        help="output directory (default: hlo_trace/examples/ of the repository)")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)

    from hlo_analyzer.mlir import hlo_text_to_mlir_text
    from hlo_trace.atomic import atomic_write
    from hlo_trace.errors import UsageError
    from tracing.cli import portable_locations

    out_dir = Path(args.out)
    suffixes = (".hlo.txt", ".stablehlo.mlir", ".mhlo.mlir", ".json")
    existing = [out_dir / f"{NAME}{suffix}" for suffix in suffixes
                if (out_dir / f"{NAME}{suffix}").exists()]
    if existing and not args.force:
        # Checked up front so that a refusal never leaves a mixed old/new set of files.
        raise UsageError(f"{existing[0]}: already exists; pass --force to overwrite it")
    started = time.perf_counter()
    hlo_text, facts = trace()
    stablehlo_text = portable_locations(hlo_text_to_mlir_text(hlo_text, "stablehlo", origin=NAME))
    mhlo_text = portable_locations(hlo_text_to_mlir_text(hlo_text, "mhlo", origin=NAME))
    hlo_text = portable_locations(hlo_text)  # no path of this machine in a bundled dump
    sidecar = {
        "name": NAME,
        "description": ("patch-embedding conv + Megatron MLP (fc1 column-split, GELU tanh, "
                        "fc2 row-split) with the batch split on x, on a 2x2 virtual CPU mesh"),
        "program": "after_spmd-partitioning HLO of torch-xla (per device, unfused)",
        **facts,
        "flops_per_device": per_device_flops(),
        "expected_collectives": expected_collectives(),
        "files": {"hlo": f"{NAME}.hlo.txt", "stablehlo": f"{NAME}.stablehlo.mlir",
                  "mhlo": f"{NAME}.mhlo.mlir"},
        "regenerate": "python3 scripts/make_example_dump.py --force",
    }
    written = [
        atomic_write(out_dir / f"{NAME}.hlo.txt", hlo_text, force=args.force),
        atomic_write(out_dir / f"{NAME}.stablehlo.mlir", stablehlo_text, force=args.force),
        atomic_write(out_dir / f"{NAME}.mhlo.mlir", mhlo_text, force=args.force),
        atomic_write(out_dir / f"{NAME}.json",
                     json.dumps(sidecar, indent=2, sort_keys=True) + "\n", force=args.force),
    ]
    print(f"wrote {', '.join(str(path) for path in written)} "
          f"in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from hlo_trace.errors import UsageError

    try:
        sys.exit(main())
    except UsageError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(2)
