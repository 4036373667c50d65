"""DETR's sine positions, computed from the batch's sizes, equal DETR's definition from a mask."""

import math

import torch

from vitdense.heads.detr import sine_position_embedding
from vitdense.types import ImageSizes


def detr_position_embedding_sine(mask: torch.Tensor, num_pos_feats: int, temperature: float = 10000.0):
    """DETR's PositionEmbeddingSine(normalize=True) as its paper's code defines it: cumulative
    sums of the unpadded area (mask True on padding), normalised by their last value."""
    not_mask = (~mask).float()
    y_embed, x_embed = not_mask.cumsum(1), not_mask.cumsum(2)
    eps, scale = 1e-6, 2 * math.pi
    y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
    x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    pos_x, pos_y = x_embed[:, :, :, None] / dim_t, y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3)  # [B, h, w, 2 * num_pos_feats]


def test_positions_equal_detr_on_every_image_token():
    sizes = ImageSizes.of([(64, 80), (37, 50), (96, 33)]).at_stride(16)
    ours = sine_position_embedding(sizes, 16).reshape(3, *sizes.grid, 32)
    mask = sizes.mask()
    reference = detr_position_embedding_sine(mask, 16)
    torch.testing.assert_close(ours[~mask], reference[~mask], rtol=0, atol=1e-6)
    # an image alone gets the same positions as inside the batch
    alone = sine_position_embedding(ImageSizes.full(1, (37, 50)).at_stride(16), 16).reshape(1, 3, 4, 32)
    torch.testing.assert_close(ours[1, :3, :4], alone[0], rtol=0, atol=0)
