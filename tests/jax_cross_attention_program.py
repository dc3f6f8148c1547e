"""OpenSora's flattened cross-attention in JAX, on one device; run as a script it writes the
lowered StableHLO text to the path given.

    x (B*N, h), y (B*TOKEN, h) with B = 2 samples, N = 1024 queries and TOKEN = 512 caption
    tokens per sample, h = 64, 2 heads of 32, float32
    q = x @ Wq; k, v = split(y @ Wkv); scores = q k^T / sqrt(32) + block-diagonal mask (each
    query sees only its own sample's TOKEN keys); out = softmax(scores) v; out @ Wo

As in OpenSora (and the brief), the score matrix covers all B*N x B*TOKEN pairs and the mask
removes the cross terms.
"""

from __future__ import annotations

import os
import sys

SAMPLES, QUERIES, TOKENS, WIDTH, HEADS = 2, 1024, 512, 64, 2
HEAD_DIM = WIDTH // HEADS


def main(out_path: str) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    def cross_attention(x, y, wq, wkv, wo):
        # (1, heads, length, head_dim), as OpenSora's MultiHeadCrossAttention
        q = (x @ wq).reshape(1, SAMPLES * QUERIES, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
        kv = (y @ wkv).reshape(1, SAMPLES * TOKENS, 2, HEADS, HEAD_DIM).transpose(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        query_sample = jnp.arange(SAMPLES * QUERIES) // QUERIES
        key_sample = jnp.arange(SAMPLES * TOKENS) // TOKENS
        mask = jnp.where(query_sample[:, None] == key_sample[None, :], 0.0, -1e9)
        scores = q @ k.swapaxes(-1, -2) / HEAD_DIM ** 0.5 + mask
        out = jax.nn.softmax(scores, axis=-1) @ v
        return out.transpose(0, 2, 1, 3).reshape(SAMPLES * QUERIES, WIDTH) @ wo

    f32 = jnp.float32
    args = [jax.ShapeDtypeStruct(shape, f32) for shape in
            ((SAMPLES * QUERIES, WIDTH), (SAMPLES * TOKENS, WIDTH), (WIDTH, WIDTH),
             (WIDTH, 2 * WIDTH), (WIDTH, WIDTH))]
    text = jax.jit(cross_attention).lower(*args).as_text()
    with open(out_path, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main(sys.argv[1])
