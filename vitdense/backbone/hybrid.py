"""The paper's hybrid stem: a ResNet (BiT's ResNetV2) feature map fed to the Transformer.

Section 3.1: "the patch embedding projection E is applied to patches extracted from a CNN
feature map ... the patches can have spatial size 1x1". R50+ViT-B/16 uses a ResNet-50 with
standardized convolutions and group norm, cut after its third stage (stride 16). We build
the CNN with timm's `ResNetV2` so that timm's hybrid weights load under their own names
(`patch_embed.backbone.stem.conv`, `patch_embed.backbone.stages.N...`, `patch_embed.proj`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import StdConv2dSame, to_2tuple
from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
from torch import nn

from vitdense.backbone.pos_embed import GridSize
from vitdense.types import ImageSizes


def resnetv2_stem(layers: Sequence[int], in_chans: int = 3) -> tuple[nn.Module, int, int]:
    """ResNetV2 as in the JAX hybrids: no pre-activation, 'SAME' padding, StdConv eps 1e-8.

    Args:
        layers: blocks per stage, e.g. (3, 4, 9) for R50 cut after stage 3 (stride 16),
            (2, 2, 2, 2) for R26 (stride 32), () for the stem alone (stride 4).

    Returns:
        (cnn, feature channels, stride of the feature map).
    """
    conv_layer = partial(StdConv2dSame, eps=1e-8)
    if layers:
        cnn = ResNetV2(
            layers=list(layers),
            num_classes=0,
            global_pool="",
            in_chans=in_chans,
            preact=False,
            stem_type="same",
            conv_layer=conv_layer,
        )
        return cnn, cnn.num_features, cnn.feature_info[-1]["reduction"]
    stem = create_resnetv2_stem(in_chans, stem_type="same", preact=False, conv_layer=conv_layer)
    return stem, stem.conv.out_channels, 4


class HybridEmbed(nn.Module):
    """CNN feature map -> P x P patches (P usually 1) -> linear projection to embed_dim.

    The CNN pads 'SAME' at each stride, so an H x W image gives a ceil(H/s) x ceil(W/s)
    map; the map is zero-padded right/bottom to a multiple of P.

    In a padded batch the CNN sees each image at its own size: its group norms take
    statistics over a whole feature map and its 'SAME' convolutions pad by the input's
    size, so the batch's padding would otherwise change every image's features. Images of
    equal size run together (a training batch of crops is one call); the token maps are
    then zero-padded to the batch's grid, whose padding tokens the encoder masks out.
    """

    def __init__(
        self,
        layers: Sequence[int] = (3, 4, 9),
        patch_size: int | tuple[int, int] = 1,
        in_chans: int = 3,
        embed_dim: int = 768,
    ) -> None:
        super().__init__()
        self.backbone, feature_dim, self.stride = resnetv2_stem(layers, in_chans)
        self.patch_size: tuple[int, int] = to_2tuple(patch_size)
        self.proj = nn.Conv2d(feature_dim, embed_dim, kernel_size=self.patch_size, stride=self.patch_size)

    @property
    def reduction(self) -> tuple[int, int]:
        return self.stride * self.patch_size[0], self.stride * self.patch_size[1]

    def grid_for(self, height: int, width: int) -> GridSize:
        fh, fw = -(-height // self.stride), -(-width // self.stride)  # ceil, in integers (also traced ones)
        return -(-fh // self.patch_size[0]), -(-fw // self.patch_size[1])

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if hasattr(self.backbone, "set_grad_checkpointing"):  # the stem-only CNN has none
            self.backbone.set_grad_checkpointing(enable)

    def forward(self, x: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """[B, C, H, W] images with their `ImageSizes` -> [B, h, w, D] tokens, each image
        encoded as if alone (h, w: the batch's grid)."""
        if image_sizes is None or not image_sizes.has_padding:
            return self._embed(x)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, size in enumerate(image_sizes.sizes):
            groups.setdefault(size, []).append(i)
        gh, gw = image_sizes.at_stride(self.reduction).grid
        out = None
        for (h, w), members in groups.items():
            tokens = self._embed(x[members, :, :h, :w])  # [n, h_i, w_i, D]
            if out is None:
                out = tokens.new_zeros(x.shape[0], gh, gw, tokens.shape[-1])
            out[members, : tokens.shape[1], : tokens.shape[2]] = tokens
        return out

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] unpadded images -> [B, ceil(H/r), ceil(W/r), D]."""
        x = self.backbone(x)
        ph, pw = self.patch_size
        pad_h, pad_w = -x.shape[-2] % ph, -x.shape[-1] % pw
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        return self.proj(x).permute(0, 2, 3, 1)
