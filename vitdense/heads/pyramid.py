"""Feature levels from a plain ViT for multi-scale detection heads.

- `MultiLevelProjector` (LW-DETR / RF-DETR's `MultiScaleProjector`): several blocks'
  outputs, each resampled to every output stride (2x transposed convolution up, a strided
  3x3 convolution down), concatenated and fused by a C2f block per level.
- `SimpleFeaturePyramid` (Li et al., "ViTDet", ECCV 2022): the last block's map alone,
  transposed convolutions up, max pooling down, a 1x1 and a 3x3 convolution per level.

Both map `ViTFeatures` to `FeatureLevels`: the maps, finest first, each with the batch's
`ImageSizes` at its stride, from which the decoder reads the level's padding mask and valid
ratios. Padding never leaks into an image's features: padding positions are zeroed before
every convolution (as the zero border an image alone gets) and are -inf before max pooling;
norms are per position (channel LayerNorm), never over the batch. An image's levels are
therefore the same alone as padded into a batch (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from torch import nn

from vitdense.backbone import ViTFeatures
from vitdense.types import ImageSizes


class FeatureLevels(NamedTuple):
    """Feature maps of a batch at several strides, finest first.

    Attributes:
        maps: [B, d, h_l, w_l] per level; padding positions are zero.
        image_sizes: the batch's `ImageSizes` at each level's stride (its `grid` is the
            map's (h_l, w_l)).
    """

    maps: tuple[torch.Tensor, ...]
    image_sizes: tuple[ImageSizes, ...]


def level_sizes(sizes: ImageSizes, grid: tuple[int, int], scale: float) -> ImageSizes:
    """The batch at `scale` times the resolution of `sizes` (a map of `grid` at its stride):
    stride / scale, padded to whole positions of the finer of the two."""
    sh, sw = sizes.stride
    stride = (round(sh / scale), round(sw / scale))
    if stride[0] * scale != sh or stride[1] * scale != sw:
        raise ValueError(f"scale {scale} of a map at stride {sizes.stride} is not a whole stride")
    return ImageSizes(sizes.sizes, (grid[0] * sh, grid[1] * sw), stride)


def zero_padding(x: torch.Tensor, sizes: ImageSizes, value: float = 0.0) -> torch.Tensor:
    """x [B, C, h, w] with its padding positions (per `sizes`) set to `value`."""
    if not sizes.has_padding:
        return x
    return x.masked_fill(sizes.mask(x.device)[:, None], value)


def tokens_as_map(tokens: torch.Tensor, features: ViTFeatures) -> torch.Tensor:
    """A block's output [B, P + N, D] -> its patch tokens as a map [B, D, h, w], padding zeroed."""
    patches = tokens[:, features.prefix_tokens.shape[1] :]
    b, _, d = patches.shape
    return zero_padding(patches.transpose(1, 2).reshape(b, d, *features.grid_size), features.image_sizes)


class ConvNormAct(nn.Module):
    """Convolution (no bias), channel LayerNorm, activation; the input's padding zeroed first
    (RF-DETR's `ConvX` with `layer_norm=True`)."""

    def __init__(
        self, in_dim: int, out_dim: int, kernel: int = 3, stride: int = 1, act: type[nn.Module] = nn.SiLU
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel, stride, kernel // 2, bias=False)
        self.norm = LayerNorm2d(out_dim)
        self.act = act()

    def forward(self, x: torch.Tensor, sizes: ImageSizes) -> torch.Tensor:
        return self.act(self.norm(self.conv(zero_padding(x, sizes))))


class C2f(nn.Module):
    """YOLOv8's C2f as RF-DETR's projector uses it: a 1x1 convolution split in two halves, the
    second through `num_blocks` 3x3 bottlenecks (no shortcut), every intermediate
    concatenated and fused by a 1x1 convolution; SiLU and channel LayerNorm throughout."""

    def __init__(self, in_dim: int, out_dim: int, num_blocks: int = 3) -> None:
        super().__init__()
        self.hidden = out_dim // 2
        self.cv1 = ConvNormAct(in_dim, 2 * self.hidden, 1)
        self.blocks = nn.ModuleList(
            nn.ModuleList([ConvNormAct(self.hidden, self.hidden, 3), ConvNormAct(self.hidden, self.hidden, 3)])
            for _ in range(num_blocks)
        )
        self.cv2 = ConvNormAct((2 + num_blocks) * self.hidden, out_dim, 1)

    def forward(self, x: torch.Tensor, sizes: ImageSizes) -> torch.Tensor:
        parts = list(self.cv1(x, sizes).split(self.hidden, 1))
        for first, second in self.blocks:
            parts.append(second(first(parts[-1], sizes), sizes))
        return self.cv2(torch.cat(parts, 1), sizes)


class MultiLevelProjector(nn.Module):
    """LW-DETR / RF-DETR's multi-scale projector over several ViT blocks' outputs.

    For each output level (`scale_factors`, relative to the ViT's stride: 2.0 is P3 for a
    stride-16 ViT, 1.0 P4, 0.5 P5), every selected block's map is resampled — a 2x2
    transposed convolution to D/2 channels (2.0), as is (1.0), or a strided 3x3 convolution
    with LayerNorm and ReLU (0.5) —, the results are concatenated and fused by a C2f block and
    a channel LayerNorm.

    Args:
        embed_dim: D of the backbone.
        out_dim: channels of every level (the decoder width).
        feature_indexes: the blocks read, 0-based (RF-DETR nano to medium: (2, 5, 8, 11),
            its `out_feature_indexes` 3, 6, 9, 12 being 1-based stages; its base: (1, 4, 7,
            10) from 2, 5, 8, 11; LW-DETR-tiny reads every other); the detector asks the backbone for them,
            normalised by its final norm (as RF-DETR's DINOv2 backbone returns them).
        scale_factors: output levels relative to the ViT's stride (RF-DETR base: (1.0,),
            its large: (2.0, 0.5), LW-DETR: (2.0, 1.0, 0.5)).
        num_blocks: bottlenecks in each C2f (RF-DETR: 3).
    """

    def __init__(
        self,
        embed_dim: int,
        out_dim: int = 256,
        feature_indexes: Sequence[int] = (2, 5, 8, 11),
        scale_factors: Sequence[float] = (1.0,),
        num_blocks: int = 3,
    ) -> None:
        super().__init__()
        if not feature_indexes or not scale_factors:
            raise ValueError("feature_indexes and scale_factors: expected at least one each")
        if unknown := [s for s in scale_factors if s not in (2.0, 1.0, 0.5)]:
            raise ValueError(f"scale_factors {unknown}: expected 2.0, 1.0 or 0.5 (RF-DETR's P3, P4, P5)")
        self.feature_indexes = tuple(feature_indexes)
        self.scale_factors = tuple(float(s) for s in scale_factors)
        self.num_levels = len(self.scale_factors)
        n = len(self.feature_indexes)
        self.sampling = nn.ModuleList()
        self.fuse = nn.ModuleList()
        for scale in self.scale_factors:
            if scale == 2.0:
                samplers = [nn.ConvTranspose2d(embed_dim, embed_dim // 2, 2, 2) for _ in range(n)]
                width = n * (embed_dim // 2)
            elif scale == 0.5:
                samplers = [ConvNormAct(embed_dim, embed_dim, 3, 2, act=nn.ReLU) for _ in range(n)]
                width = n * embed_dim
            else:
                samplers = [nn.Identity() for _ in range(n)]
                width = n * embed_dim
            self.sampling.append(nn.ModuleList(samplers))
            self.fuse.append(nn.ModuleList([C2f(width, out_dim, num_blocks), LayerNorm2d(out_dim)]))

    def forward(self, features: ViTFeatures) -> FeatureLevels:
        """ViTFeatures with the intermediates of `feature_indexes` -> `FeatureLevels`."""
        if len(features.intermediates) != len(self.feature_indexes):
            raise ValueError(
                f"MultiLevelProjector reads blocks {self.feature_indexes} but got {len(features.intermediates)} "
                "intermediates: call the backbone with intermediates=neck.feature_indexes"
            )
        inputs = [tokens_as_map(t, features) for t in features.intermediates]
        sizes = features.image_sizes
        maps, level_sizes_ = [], []
        for scale, samplers, (c2f, norm) in zip(self.scale_factors, self.sampling, self.fuse, strict=True):
            grid = features.grid_size
            out_grid = {2.0: (2 * grid[0], 2 * grid[1]), 1.0: grid, 0.5: (-(-grid[0] // 2), -(-grid[1] // 2))}[scale]
            at_level = level_sizes(sizes, grid, scale)
            resampled = [
                s(x, sizes) if isinstance(s, ConvNormAct) else s(x) for s, x in zip(samplers, inputs, strict=True)
            ]
            fused = norm(c2f(torch.cat(resampled, 1), at_level))
            assert tuple(fused.shape[-2:]) == out_grid
            maps.append(zero_padding(fused, at_level))
            level_sizes_.append(at_level)
        return FeatureLevels(tuple(maps), tuple(level_sizes_))


class SimpleFeaturePyramid(nn.Module):
    """ViTDet's simple feature pyramid from the ViT's last map.

    Per level (`scale_factors` relative to the ViT's stride): 4.0 — 2x2 transposed conv to
    D/2, LayerNorm, GELU, 2x2 transposed conv to D/4; 2.0 — 2x2 transposed conv to D/2;
    1.0 — as is; 0.5 — 2x2 max pooling; then a 1x1 and a 3x3 convolution to `out_dim`, each
    with a channel LayerNorm. `top_block`: one more level, the last subsampled by 2 (ViTDet's
    `LastLevelMaxPool`, P6).

    Odd maps pool with `ceil_mode` (ViTDet's floor drops the last row or column, which
    would lose part of an image; at ViTDet's 1024 x 1024 the maps are even and the two agree).

    Args:
        embed_dim: D of the backbone.
        out_dim: channels of every level.
        scale_factors: ViTDet: (4.0, 2.0, 1.0, 0.5).
        top_block: add the P6 level.
    """

    def __init__(
        self,
        embed_dim: int,
        out_dim: int = 256,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        top_block: bool = False,
    ) -> None:
        super().__init__()
        if unknown := [s for s in scale_factors if s not in (4.0, 2.0, 1.0, 0.5)]:
            raise ValueError(f"scale_factors {unknown}: expected 4.0, 2.0, 1.0 or 0.5 (ViTDet's)")
        self.scale_factors = tuple(float(s) for s in scale_factors)
        self.top_block = top_block
        self.num_levels = len(self.scale_factors) + int(top_block)
        self.stages = nn.ModuleList()
        for scale in self.scale_factors:
            if scale == 4.0:
                sample = nn.Sequential(
                    nn.ConvTranspose2d(embed_dim, embed_dim // 2, 2, 2),
                    LayerNorm2d(embed_dim // 2),
                    nn.GELU(),
                    nn.ConvTranspose2d(embed_dim // 2, embed_dim // 4, 2, 2),
                )
                width = embed_dim // 4
            elif scale == 2.0:
                sample, width = nn.ConvTranspose2d(embed_dim, embed_dim // 2, 2, 2), embed_dim // 2
            else:
                sample, width = nn.Identity(), embed_dim  # (max pooling for 0.5 in forward)
            self.stages.append(
                nn.ModuleDict(
                    {
                        "sample": sample,
                        "lateral": nn.Sequential(nn.Conv2d(width, out_dim, 1, bias=False), LayerNorm2d(out_dim)),
                        "output": nn.Sequential(
                            nn.Conv2d(out_dim, out_dim, 3, padding=1, bias=False), LayerNorm2d(out_dim)
                        ),
                    }
                )
            )

    def forward(self, features: ViTFeatures) -> FeatureLevels:
        """ViTFeatures -> `FeatureLevels` from its (final-normed) patch tokens."""
        x = features.spatial()  # padding tokens are zero
        sizes, grid = features.image_sizes, features.grid_size
        maps, all_sizes = [], []
        for scale, stage in zip(self.scale_factors, self.stages, strict=True):
            at_level = level_sizes(sizes, grid, scale)
            if scale == 0.5:
                y = F.max_pool2d(zero_padding(x, sizes, float("-inf")), 2, 2, ceil_mode=True)
            elif scale == 4.0:
                # the inner norm and GELU make the padding non-zero: zero it before the second up-sampling
                up, norm, act, up2 = stage["sample"]
                y = up2(zero_padding(act(norm(up(x))), level_sizes(sizes, grid, 2.0)))
            else:
                y = stage["sample"](x)
            y = stage["lateral"](zero_padding(y, at_level))
            y = zero_padding(stage["output"](zero_padding(y, at_level)), at_level)
            maps.append(y)
            all_sizes.append(at_level)
        if self.top_block:
            last, last_sizes = maps[-1], all_sizes[-1]
            top_sizes = level_sizes(last_sizes, tuple(last.shape[-2:]), 0.5)
            maps.append(F.max_pool2d(last, 1, 2))
            all_sizes.append(top_sizes)
        return FeatureLevels(tuple(maps), tuple(all_sizes))
