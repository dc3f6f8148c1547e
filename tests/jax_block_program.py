"""A pre-LN transformer block in JAX, data parallel over 8 virtual CPU devices; run as a script
it writes XLA's module after SPMD partitioning (HLO text) to the path given.

    x (8, 64, 128) f32, batch split over 8 devices -> (1, 64, 128) per device
    h = LayerNorm(x); qkv = h @ Wqkv (128, 384); 8 heads of 16; softmax(q k^T / 4) v
    x = x + o @ Wo (128, 128); h = LayerNorm(x); x = x + GELU(h @ W1 (128, 512)) @ W2 (512, 128)

Weights are replicated, so the partitioned program has no collectives.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile

BATCH, SEQ, WIDTH, HEADS, FFN = 8, 64, 128, 8, 512
DEVICES = 8


def main(out_path: str) -> None:
    dump_dir = tempfile.mkdtemp(prefix="jax_block_")
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={DEVICES} "
                               f"--xla_dump_to={dump_dir} --xla_dump_hlo_pass_re=spmd-partitioning")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    # GSPMD prints replica groups as device-id lists, which the analyzer reads.
    jax.config.update("jax_use_shardy_partitioner", False)
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("dp",))

    def layernorm(x):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-6)

    def block(x, wqkv, wo, w1, w2):
        b = x.shape[0]
        qkv = jnp.einsum("bsd,de->bse", layernorm(x), wqkv).reshape(b, SEQ, 3, HEADS, WIDTH // HEADS)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(WIDTH // HEADS), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, SEQ, WIDTH) @ wo
        return x + jax.nn.gelu(layernorm(x) @ w1) @ w2

    f32 = jnp.float32
    args = [jnp.ones((BATCH, SEQ, WIDTH), f32), jnp.ones((WIDTH, 3 * WIDTH), f32),
            jnp.ones((WIDTH, WIDTH), f32), jnp.ones((WIDTH, FFN), f32), jnp.ones((FFN, WIDTH), f32)]
    specs = [P("dp"), P(), P(), P(), P()]
    jitted = jax.jit(block, in_shardings=[NamedSharding(mesh, s) for s in specs],
                     out_shardings=NamedSharding(mesh, P("dp")))
    jitted.lower(*args).compile()
    [partitioned] = glob.glob(os.path.join(dump_dir, "*jit_block*after_spmd-partitioning*.txt"))
    shutil.copyfile(partitioned, out_path)
    shutil.rmtree(dump_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
