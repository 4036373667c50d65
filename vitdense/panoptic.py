"""COCO panoptic format: segment ids stored as RGB PNGs (id = R + 256 G + 256² B), as
cocodataset/panopticapi's `rgb2id` / `id2rgb` read and write them."""

from __future__ import annotations

import numpy as np


def rgb2id(rgb: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 RGB of a COCO panoptic PNG -> [H, W] int64 segment ids (0: void)."""
    if rgb.ndim != 3 or rgb.shape[-1] != 3:
        raise ValueError(f"a COCO panoptic PNG is RGB [H, W, 3]; got an array of shape {rgb.shape}")
    rgb = rgb.astype(np.int64)
    return rgb[..., 0] + 256 * rgb[..., 1] + 256 * 256 * rgb[..., 2]


def id2rgb(ids: np.ndarray) -> np.ndarray:
    """[H, W] integer segment ids (0 <= id < 256³) -> [H, W, 3] uint8 RGB for a COCO panoptic PNG."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= 256**3):
        raise ValueError(f"segment ids must lie in [0, 256**3) to be stored as RGB; got {ids.min()}..{ids.max()}")
    return np.stack([ids % 256, ids // 256 % 256, ids // 65536], axis=-1).astype(np.uint8)
