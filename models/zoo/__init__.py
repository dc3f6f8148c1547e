"""A small model zoo for ``trace-module`` (docs/trace_module.md): models written here in plain
PyTorch with random weights and tiny default sizes, each a factory ``name(**kwargs) -> nn.Module``:

* ``models.zoo.gpt2:gpt2``       GPT-2-style decoder (LayerNorm, fused QKV, GELU MLP, causal mask);
* ``models.zoo.llama:llama``     Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU);
* ``models.zoo.vit:vit``         ViT encoder (patch convolution, class token, LayerNorm, GELU MLP);
* ``models.zoo.dit:dit``         DiT with adaLN-Zero blocks (timestep-modulated LayerNorms, gates);
* ``models.zoo.convnet:convnet`` a small convolutional classifier.

They follow the conventions that make a lazy torch-xla trace see every op (``models.zoo.layers``):
attention written out as ``softmax(q k^T * scale) v``, norms written out with ``rsqrt``, shapes
that depend only on input shapes. The module names follow the usual ones (``q_proj``,
``c_attn``, ``fc1``, ``down_proj`` ...), which ``trace-module``'s shorthand plans read.
"""
