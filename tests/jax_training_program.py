"""A JAX training step, data-parallel on 8 virtual CPU devices, with the sidecar that
``hlo_analyzer.training`` reads.

Run as a script (a subprocess, so that the 8-device XLA flag never reaches the test process):
``python3 tests/jax_training_program.py OUT_DIR`` writes ``step.spmd.hlo.txt`` (XLA's dump after
the SPMD partitioner) and ``step.spmd.hlo.json`` (the sidecar: every argument and output with its
class, shape, local shape and dtype; the scopes). Exits 3 when jax cannot make 8 devices.

The step: a 2-layer MLP (w1 (64, 128), w2 (128, 64), fp32, replicated), the batch (x, y) of 32
rows split over the 8 devices; the MSE loss under ``jax.named_scope("hlo_trace_forward")``,
``jax.value_and_grad``, then Adam (moments m, v, replicated) under
``jax.named_scope("hlo_trace_optimizer")``. JAX names the backward of a scope
``transpose(jvp(...))``: the sidecar says so (``scopes.backward``).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile

SHAPES = {"w1": (64, 128), "w2": (128, 64)}
BATCH, IN, OUT = 32, 64, 64
DEVICES = 8


def main(out_dir: str) -> int:
    dump_dir = tempfile.mkdtemp(prefix="jaxdump")
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={DEVICES} "
                               f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text "
                               "--xla_dump_hlo_pass_re=spmd-partitioning")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if len(jax.devices()) < DEVICES:
        return 3
    mesh = jax.make_mesh((DEVICES,), ("data",))
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data", None))

    def loss_fn(w1, w2, x, y):
        with jax.named_scope("hlo_trace_forward"):
            return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)

    def step(w1, w2, m1, m2, v1, v2, x, y):
        loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2, x, y)
        with jax.named_scope("hlo_trace_optimizer"):
            updated = []
            for w, g, m, v in ((w1, g1, m1, v1), (w2, g2, m2, v2)):
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                updated.append((w - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v))
        (w1, m1, v1), (w2, m2, v2) = updated
        return loss, w1, w2, m1, m2, v1, v2, g1, g2

    def arg(shape, sharding):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    weights = [arg(SHAPES[name], replicated) for name in ("w1", "w2")]
    args = (*weights, *weights, *weights, arg((BATCH, IN), rows), arg((BATCH, OUT), rows))
    out_shardings = (replicated,) + (replicated,) * 8
    jax.jit(step, out_shardings=out_shardings).lower(*args).compile()
    spmd = sorted(glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt")))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "step.spmd.hlo.txt"), "w") as handle:
        handle.write(open(spmd[-1]).read())
    shutil.rmtree(dump_dir, ignore_errors=True)

    def buffer(name, klass, shape, local=None):
        return {"name": name, "class": klass, "shape": list(shape),
                "local_shape": list(local or shape), "dtype": "float32"}

    arguments = ([buffer(name, "param", SHAPES[name]) for name in ("w1", "w2")]
                 + [buffer(f"{kind}_{name}", "optimizer_state", SHAPES[name])
                    for kind in ("m", "v") for name in ("w1", "w2")]
                 + [buffer("x", "input", (BATCH, IN), (BATCH // DEVICES, IN)),
                    buffer("y", "input", (BATCH, OUT), (BATCH // DEVICES, OUT))])
    outputs = ([buffer("loss", "output", ())]
               + [buffer(name, "param", SHAPES[name]) for name in ("w1", "w2")]
               + [buffer(f"{kind}_{name}", "optimizer_state", SHAPES[name])
                  for kind in ("m", "v") for name in ("w1", "w2")]
               + [buffer(f"{name}.grad", "grad", SHAPES[name]) for name in ("w1", "w2")])
    sidecar = {"training": {"scopes": {"forward": "hlo_trace_forward",
                                       "optimizer": "hlo_trace_optimizer",
                                       "backward": "transpose("},
                            "arguments": arguments, "outputs": outputs}}
    with open(os.path.join(out_dir, "step.spmd.hlo.json"), "w") as handle:
        json.dump(sidecar, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
