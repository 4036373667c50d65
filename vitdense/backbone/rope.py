"""Rotary position embeddings of one patch grid, from timm's RoPE modules, in the layout
vitdense's attention takes, and traceable with symbolic sizes for `torch.export`."""

from __future__ import annotations

import math

import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3
from torch import nn

from vitdense.backbone.pos_embed import GridSize


def grid_rotary(rope: nn.Module, grid: GridSize) -> torch.Tensor:
    """`rope.get_embed` for a (h, w) grid as [L, h*w, heads or 1, 2 * head_dim] (sin | cos;
    L = depth for RoPE-Mixed's per-block frequencies, else 1).

    While exporting, DINOv3's embedding is built here: timm's divides the coordinates by
    `float(h)`, which fixes the exported grid; the tensor division below gives the same
    numbers for any size (checked against timm in tests/backbone/test_eva.py).
    """
    if torch.compiler.is_exporting() and isinstance(rope, RotaryEmbeddingDinoV3):
        emb = _dinov3_traced(rope, grid)
    else:
        emb = rope.get_embed(shape=[grid[0], grid[1]])  # [h*w, 2dh]; mixed: [depth, heads, h*w, 2dh]
    return emb[None, :, None] if emb.ndim == 2 else emb.transpose(1, 2)


def _dinov3_traced(rope: RotaryEmbeddingDinoV3, grid: GridSize) -> torch.Tensor:
    """RotaryEmbeddingDinoV3's evaluation embedding [h*w, 2 * head_dim]: coordinates
    (i + 0.5 + offset) / side over each side, mapped to [-1, 1], angles 2 pi c / period."""
    if rope.normalize_coords != "separate" or rope.grid_indexing != "ij":
        raise NotImplementedError("a dynamic export of DINOv3 RoPE with normalize_coords='separate', 'ij' only")
    axes = []
    for side in grid:
        size = torch.full((), side, dtype=torch.float32)  # (a tensor: float(side) would fix the size)
        axes.append((torch.arange(side, dtype=torch.float32) + 0.5 + rope.grid_offset) / size)
    coords = torch.stack(torch.meshgrid(axes, indexing="ij"), -1).flatten(0, 1)
    coords = (2.0 * coords - 1.0).to(rope.periods)
    angles = (2 * math.pi * coords[:, :, None] / rope.periods[None, None, :]).flatten(1)  # [h*w, dh / 2]
    sin, cos = angles.sin(), angles.cos()
    if rope.rotate_half:
        sin, cos = torch.cat([sin, sin], -1), torch.cat([cos, cos], -1)
    else:
        sin, cos = sin.repeat_interleave(2, -1), cos.repeat_interleave(2, -1)
    return torch.cat([sin, cos], -1)
