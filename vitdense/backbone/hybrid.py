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
        return self.forward_stages(x, image_sizes)[0]

    def stage_channels(self, stage: int) -> int:
        """Channels of the output of the CNN's stage `stage` (R50: 256, 512, 1024)."""
        return self._stage_info(stage)["num_chs"]

    def _stage_info(self, stage: int) -> dict:
        stages = getattr(self.backbone, "stages", ())
        if not 0 <= stage < len(stages):
            raise ValueError(f"the hybrid's CNN has {len(stages)} stages; stage {stage} does not exist")
        return self.backbone.feature_info[stage + 1]  # (entry 0 is the stem's)

    def forward_stages(
        self, x: torch.Tensor, image_sizes: ImageSizes | None = None, stages: Sequence[int] = ()
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The tokens of `forward` and the outputs of the CNN's `stages` (DPT-Hybrid reads
        stages 0 and 1 of its ResNet-50: 256 channels at stride 4, 512 at stride 8).

        Args:
            x: [B, C, H, W] images, zero-padded right/bottom as `image_sizes` says (None: none is).
            stages: indices into the CNN's `stages`, in the order wanted.

        Returns:
            tokens [B, h, w, D]; per stage a map [B, C_s, ceil(H / s), ceil(W / s)] at the
            stage's stride s, each image's computed alone (as its tokens) and zero beyond it.
        """
        reductions = [self._stage_info(i)["reduction"] for i in stages]
        if image_sizes is not None and (
            image_sizes.batch != x.shape[0] or tuple(image_sizes.padded) != tuple(x.shape[-2:])
        ):
            raise ValueError(
                f"image_sizes describe {image_sizes.batch} images padded to {tuple(image_sizes.padded)}, "
                f"but the batch is {x.shape[0]} images of {x.shape[-2]} x {x.shape[-1]}"
            )
        if image_sizes is None or not image_sizes.has_padding:
            return self._run(x, stages)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, size in enumerate(image_sizes.sizes):
            groups.setdefault(size, []).append(i)
        gh, gw = image_sizes.at_stride(self.reduction).grid
        out: torch.Tensor | None = None
        maps: list[torch.Tensor | None] = [None] * len(stages)
        for (h, w), members in groups.items():
            tokens, parts = self._run(x[members, :, :h, :w], stages)  # [n, h_i, w_i, D], [n, C_s, h_s, w_s]
            if out is None:
                out = tokens.new_zeros(x.shape[0], gh, gw, tokens.shape[-1])
            out[members, : tokens.shape[1], : tokens.shape[2]] = tokens
            for k, (part, s) in enumerate(zip(parts, reductions, strict=True)):
                if maps[k] is None:
                    size = image_sizes.at_stride((s, s)).grid
                    maps[k] = part.new_zeros(x.shape[0], part.shape[1], *size)
                maps[k][members, :, : part.shape[-2], : part.shape[-1]] = part
        return out, tuple(maps)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] unpadded images -> [B, ceil(H/r), ceil(W/r), D]."""
        return self._run(x, ())[0]

    def _run(self, x: torch.Tensor, stages: Sequence[int]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """[B, C, H, W] unpadded images -> (tokens [B, ceil(H/r), ceil(W/r), D], the maps of `stages`)."""
        if stages:  # timm's ResNetV2.forward_features (stem, stages, norm), keeping stage outputs
            cnn, kept = self.backbone, {}
            x = cnn.stem(x)
            for i, stage in enumerate(cnn.stages):
                x = kept[i] = stage(x)
            x = cnn.norm(x)
            maps = tuple(kept[i] for i in stages)
        else:
            x, maps = self.backbone(x), ()
        ph, pw = self.patch_size
        pad_h, pad_w = -x.shape[-2] % ph, -x.shape[-1] % pw
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        return self.proj(x).permute(0, 2, 3, 1), maps
