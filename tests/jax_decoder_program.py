"""A Llama-style decoder in JAX, tensor parallel over 4 virtual CPU devices; run as a script it
writes XLA's module after SPMD partitioning (HLO text) to the path given.

    x (2, 32, 128) f32 replicated; 2 layers of
    h = RMSNorm(x); q = h @ Wq (128, 128), k = h @ Wk (128, 64), v = h @ Wv (128, 64): 8 query
    heads and 4 key/value heads of 16 (grouped-query: each k/v head serves 2 query heads);
    causal softmax(q k^T / 4) v; x = x + o @ Wo (128, 128)
    h = RMSNorm(x); x = x + (silu(h @ Wg (128, 256)) * (h @ Wu (128, 256))) @ Wd (256, 128)

Megatron: Wq, Wk, Wv, Wg, Wu split by columns, Wo and Wd by rows over the 4 devices (2 query and
1 key/value head each); two all-reduces per layer.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile

BATCH, SEQ, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 2, 32, 128, 8, 4, 16, 256, 2
DEVICES = 4


def main(out_path: str) -> None:
    dump_dir = tempfile.mkdtemp(prefix="jax_decoder_")
    os.environ["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={DEVICES} "
                               f"--xla_dump_to={dump_dir} --xla_dump_hlo_pass_re=spmd-partitioning")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_use_shardy_partitioner", False)  # device-id replica groups
    mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("tp",))

    def rms_norm(x):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)

    def layer(x, wq, wk, wv, wo, wg, wu, wd):
        b, s, _ = x.shape
        h = rms_norm(x)
        q = (h @ wq).reshape(b, s, HEADS, HEAD_DIM)
        k = jnp.repeat((h @ wk).reshape(b, s, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, axis=2)
        v = jnp.repeat((h @ wv).reshape(b, s, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        causal = jnp.tril(jnp.ones((s, s), bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, WIDTH) @ wo
        h = rms_norm(x)
        return x + (jax.nn.silu(h @ wg) * (h @ wu)) @ wd

    def model(x, weights):
        for layer_weights in weights:
            x = layer(x, *layer_weights)
        return x

    def arg(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    column, row = P(None, "tp"), P("tp", None)
    weights = [(arg((WIDTH, HEADS * HEAD_DIM), column), arg((WIDTH, KV_HEADS * HEAD_DIM), column),
                arg((WIDTH, KV_HEADS * HEAD_DIM), column), arg((HEADS * HEAD_DIM, WIDTH), row),
                arg((WIDTH, FFN), column), arg((WIDTH, FFN), column), arg((FFN, WIDTH), row))
               for _ in range(LAYERS)]
    jax.jit(model).lower(arg((BATCH, SEQ, WIDTH), P()), weights).compile()
    found = glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt"))
    if len(found) != 1:
        raise SystemExit(f"expected one partitioned module in {dump_dir}, found {len(found)}")
    shutil.copyfile(found[0], out_path)
    shutil.rmtree(dump_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
