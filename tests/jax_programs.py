"""Generate real JAX programs on 8 virtual CPU devices (2x4 mesh) in the four export forms.

Run as a script (a subprocess, so that the 8-device XLA flag never reaches the test process):
``python3 tests/jax_programs.py OUT_DIR`` writes, per program NAME,
``NAME.lowered.mlir`` (StableHLO before partitioning), ``NAME.lowered.hlo.txt`` (same, HLO text),
``NAME.compiled.hlo.txt`` (partitioned, optimized), ``NAME.spmd.hlo.txt`` (after the SPMD
partitioner, XLA's own dump) and ``NAME.json`` with XLA's HloCostAnalysis (flops) of each HLO
text form: ``compiled.cost_analysis()`` for the compiled one, ``hlo_module_cost_analysis`` for the
lowered (global) and after-partitioning (per-device) texts.
Exits 3 when jax cannot make 8 devices.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile


def main(out_dir: str) -> int:
    dump_dir = tempfile.mkdtemp(prefix="jaxdump")
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count=8 --xla_dump_to={dump_dir} "
                               "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    from jaxlib import _hlo, _jax

    if len(jax.devices()) < 8:
        return 3
    client = jax.devices()[0].client
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))

    def sharded(spec):
        return NamedSharding(mesh, spec)

    def arg(shape, spec, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharded(spec))

    programs = {}

    def mlp(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2
    programs["mlp"] = (mlp, (arg((16, 64), P("x", None)), arg((64, 128), P(None, "y")),
                             arg((128, 64), P("y", None))), sharded(P("x", None)))

    def attention(x, wq, wk, wv, wo):
        b, s, _ = x.shape
        q, k, v = ((x @ w).reshape(b, s, 4, 16) for w in (wq, wk, wv))
        p = jnp.tanh(jnp.einsum("bqhd,bkhd->bhqk", q, k))
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, 64)
        return o @ wo
    w_in = arg((64, 64), P(None, "y"))
    programs["attention"] = (attention, (arg((8, 16, 64), P("x", None, None)), w_in, w_in, w_in,
                                         arg((64, 64), P("y", None))), sharded(P("x", None, None)))

    def scan(x, ws):
        return lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]
    programs["scan"] = (scan, (arg((16, 64), P("x", None)), arg((6, 64, 64), P())),
                        sharded(P("x", None)))

    def fori(x, w):
        return lax.fori_loop(0, 5, lambda i, c: jnp.tanh(c @ w), x)
    programs["fori"] = (fori, (arg((16, 64), P("x", None)), arg((64, 64), P())),
                        sharded(P("x", None)))

    def cond(p, x, w):
        return lax.cond(p > 0, lambda a: (a @ w) @ w, lambda a: jnp.tanh(a), x)
    programs["cond"] = (cond, (arg((), P()), arg((16, 64), P("x", None)), arg((64, 64), P())),
                        sharded(P("x", None)))

    def shard_map_comm(x):
        def body(block):  # block: (8, 16) f32 per device
            a = lax.psum(block, "y")
            g = lax.all_gather(block, "y", tiled=True)  # (32, 16)
            r = lax.psum_scatter(g, "y", scatter_dimension=0, tiled=True)  # (8, 16)
            pp = lax.ppermute(block, "y", [(i, (i + 1) % 4) for i in range(4)])
            t = lax.all_to_all(block, "y", 0, 0, tiled=True)
            return a + r + pp + t
        return jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))(x)
    programs["collectives"] = (shard_map_comm, (arg((16, 64), P("x", "y")),),
                               sharded(P("x", "y")))

    def conv_grouped(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "VALID", feature_group_count=4)
    programs["conv_grouped"] = (conv_grouped, (arg((8, 8, 10, 10), P("x", None, None, None)),
                                               arg((16, 2, 3, 3), P())),
                                sharded(P("x", None, None, None)))

    def conv_padded(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), ((2, 2), (2, 2)), lhs_dilation=(2, 2))
    programs["conv_padded"] = (conv_padded, (arg((8, 4, 5, 5), P("x", None, None, None)),
                                             arg((6, 4, 3, 3), P())),
                               sharded(P("x", None, None, None)))

    os.makedirs(out_dir, exist_ok=True)
    for name, (function, args, out_sharding) in programs.items():
        shutil.rmtree(dump_dir, ignore_errors=True)
        lowered = jax.jit(function, out_shardings=out_sharding).lower(*args)
        compiled = lowered.compile()
        spmd = sorted(glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt")))
        texts = {"lowered.mlir": lowered.as_text(), "lowered.hlo.txt": lowered.as_text(dialect="hlo"),
                 "compiled.hlo.txt": compiled.as_text(), "spmd.hlo.txt": open(spmd[-1]).read()}
        for suffix, text in texts.items():
            with open(os.path.join(out_dir, f"{name}.{suffix}"), "w") as handle:
                handle.write(text)
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla = {"compiled.hlo.txt": cost.get("flops", 0.0)}
        for suffix in ("lowered.hlo.txt", "spmd.hlo.txt"):
            module = _hlo.hlo_module_from_text(texts[suffix])
            xla[suffix] = _jax.hlo_module_cost_analysis(client, module).get("flops", 0.0)
        xla["lowered.mlir"] = xla["lowered.hlo.txt"]  # the same program
        with open(os.path.join(out_dir, f"{name}.json"), "w") as handle:
            json.dump(xla, handle)
    shutil.rmtree(dump_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
