"""A small convolutional classifier: ``conv1`` 3x3 (stride 1, padding 1), ReLU, ``conv2`` 3x3
(stride 2, padding 1), ReLU, ``conv3`` 3x3 (stride 2, padding 1), ReLU, global average pool, a
linear ``fc``. Strided convolutions instead of max pooling (torch-xla lowers
``max_pool2d_with_indices`` to a loop).

Input: images (B, channels, image, image) float; output: logits (B, classes).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class ConvNet(nn.Module):
    def __init__(self, channels: int, widths: tuple[int, int, int], classes: int) -> None:
        super().__init__()
        first, second, third = widths
        self.conv1 = nn.Conv2d(channels, first, 3, padding=1)
        self.conv2 = nn.Conv2d(first, second, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(second, third, 3, stride=2, padding=1)
        self.fc = nn.Linear(third, classes)

    def forward(self, images: Tensor) -> Tensor:
        x = F.relu(self.conv1(images))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.fc(x.mean(dim=(2, 3)))


def convnet(channels: int = 3, widths: tuple[int, int, int] | list[int] = (16, 32, 64),
            classes: int = 10) -> ConvNet:
    """A three-convolution classifier (tiny by default: widths 16, 32, 64)."""
    return ConvNet(channels, tuple(widths), classes)
