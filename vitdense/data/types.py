"""Typed samples and batches (the default collate keeps NamedTuples as they are)."""

from __future__ import annotations

from typing import NamedTuple

import torch


class LabeledImages(NamedTuple):
    """An image with its class, or a batch of them.

    Attributes:
        image: [3, H, W] normalised image, or [B, 3, H, W] once collated.
        label: class index (int), or [B] int64 once collated.
        index: position of the sample in its dataset (-1 if unknown); lets a linear probe
            cache features per sample.
    """

    image: torch.Tensor
    label: torch.Tensor | int
    index: torch.Tensor | int = -1
