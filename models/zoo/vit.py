"""A ViT encoder: a patch convolution (kernel = stride = patch), a class token and learned
position embeddings, pre-norm encoder blocks (LayerNorm, self-attention with a fused ``qkv`` and
``proj``, no mask; LayerNorm, GELU MLP ``fc1``, ``fc2``), a final LayerNorm and a linear
``head`` on the class token.

Input: images (B, channels, image, image) float; output: logits (B, classes). The sequence is
(image / patch)^2 + 1 tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.zoo.layers import FusedSelfAttention, GeluMlp, LayerNorm


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn = FusedSelfAttention(dim, heads, causal=False)
        self.norm2 = LayerNorm(dim)
        self.mlp = GeluMlp(dim, mlp_ratio * dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, channels: int, hidden: int, layers: int,
                 heads: int, mlp_ratio: int, classes: int) -> None:
        super().__init__()
        if image % patch or hidden % heads:
            raise ValueError(f"image {image} must be a multiple of patch {patch}, hidden "
                             f"{hidden} of heads {heads}")
        tokens = (image // patch) ** 2 + 1
        self.patch_embed = nn.Conv2d(channels, hidden, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, mlp_ratio) for _ in range(layers))
        self.norm = LayerNorm(hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # (B, patches, hidden)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def vit(image: int = 32, patch: int = 8, channels: int = 3, hidden: int = 64, layers: int = 2,
        heads: int = 4, mlp_ratio: int = 4, classes: int = 10) -> ViT:
    """A ViT encoder (tiny by default: 32x32 images in 8x8 patches, 17 tokens, 2 layers of
    width 64, 4 heads)."""
    return ViT(image, patch, channels, hidden, layers, heads, mlp_ratio, classes)
