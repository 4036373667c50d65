"""Depth's plain model: `DPT` (depth or inverse depth [B, 1, H, W]; `estimate` runs each size
unpadded), and how it predicts from a checkpoint without its task (`DPTInference`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.backbone.one_pass import EncoderRequest
from vitdense.core.errors import ConfigError
from vitdense.results.depth import DepthResult
from vitdense.types import ImageSizes, Size
from vitdense.types.depth import DepthImages, DepthPrediction

#: what a depth head's output is: metric depth itself, or inverse depth (DPT's, MiDaS's)
DepthOutputKind = Literal["metric", "inverse"]


class DPT(nn.Module):
    """DPT's monocular depth model (Ranftl et al., ICCV 2021; isl-org/DPT `DPTDepthModel`):
    a ViT and a `DPTHead` reading four of its blocks.

    Args:
        backbone: the encoder (plain or hybrid).
        head: a `DPTHead` (its `hooks` are the blocks, and for DPT-Hybrid the CNN stages, read).
        output: what the head predicts: "metric" depth (metres), or "inverse" depth; with
            "inverse", `depth()` is 1 / (scale * x + shift) as DPT's `invert=True` (its NYU
            model: scale 0.000305, shift 0.1378; KITTI: 0.00006016, 0.00579).
        scale, shift: that affine map of inverse depth.
        relative: the inverse depth is relative (trained scale- and shift-invariant, MiDaS's
            loss): it has no metric scale, `depth()` is not defined, and evaluation aligns it
            to the ground truth first.

    Padding: DPT is not padding-invariant (see `DPTHead`): `estimate` therefore runs the
    images of a batch in groups of one size, each unpadded, so an image padded into a batch
    gives what it gives alone; training batches are crops of one size (no padding).
    """

    def __init__(
        self,
        backbone: VisionTransformer,
        head: nn.Module,
        output: DepthOutputKind = "metric",
        scale: float = 1.0,
        shift: float = 0.0,
        relative: bool = False,
    ) -> None:
        super().__init__()
        if output not in ("metric", "inverse"):
            raise ConfigError(f"DPT output={output!r}: expected 'metric' (depth) or 'inverse' (inverse depth)")
        if relative and output != "inverse":
            raise ConfigError(
                "DPT relative=True: relative depth is learned as inverse depth (MiDaS); set output='inverse'"
            )
        self.backbone = backbone
        self.head = head
        self.output = output
        self.scale = scale
        self.shift = shift
        self.relative = relative
        #: the graph's output: metric depth, or the relative inverse depth (no scale to make it metres)
        self.export_names = ("inverse_depth",) if relative else ("depth",)

    @property
    def encoder_request(self) -> EncoderRequest:
        """What the head reads off the encoder (a shared pass computes it: `one_pass`)."""
        return EncoderRequest(intermediates=tuple(self.head.block_hooks), stem_stages=tuple(self.head.stage_hooks))

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
        """images [B, 3, H, W] -> the head's output [B, 1, H, W] fp32 (metric or inverse depth,
        as `output`), at the input's pixels.

        DPT predicts at 16 times the patch grid (the input for a patch-16 ViT); another
        token stride (a hybrid's stride 8) is resized to the grid's pixels (bilinear), and the
        right/bottom beyond the input (the backbone pads to whole patches) cropped."""
        head = self.head
        features = self.backbone(images, image_sizes, intermediates=head.block_hooks, stem_stages=head.stage_hooks)
        out = self.head(features).float()
        rh, rw = self.backbone.patch_size
        size = (features.grid_size[0] * rh, features.grid_size[1] * rw)
        if tuple(out.shape[-2:]) != size:
            out = F.interpolate(out, size=size, mode="bilinear", align_corners=False)
        return out[..., : images.shape[-2], : images.shape[-1]]

    def depth(self, raw: torch.Tensor) -> torch.Tensor:
        """Metric depth from the head's output: itself ("metric"), or 1 / (scale * x + shift)
        with the denominator at least 1e-8 ("inverse", DPT's `invert`)."""
        if self.relative:
            raise ValueError("DPT(relative=True) predicts relative inverse depth: no metric depth without alignment")
        if self.output == "metric":
            return raw
        return 1.0 / (self.scale * raw + self.shift).clamp(min=1e-8)

    @torch.no_grad()
    def estimate(
        self, images: torch.Tensor, image_sizes: ImageSizes | None = None, out_sizes: Sequence[Size] | None = None
    ) -> list[torch.Tensor]:
        """Per image, the head's output [h, w] fp32 at its `out_sizes` entry (default: its
        own size), resized bilinearly (DPT's evaluation resizes with bicubic; bilinear keeps
        a non-negative map non-negative).

        Images of one size run together, unpadded (DPT has no padding contract)."""
        if image_sizes is None:
            image_sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        out_sizes = out_sizes or image_sizes.sizes
        groups: dict[Size, list[int]] = {}
        for i, size in enumerate(image_sizes.sizes):
            groups.setdefault(tuple(size), []).append(i)
        out: list[torch.Tensor | None] = [None] * images.shape[0]
        for (h, w), members in groups.items():
            raw = self(images[members, :, :h, :w])
            for j, i in enumerate(members):
                size = tuple(out_sizes[i])
                x = raw[j : j + 1]
                if tuple(x.shape[-2:]) != size:
                    x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
                out[i] = x[0, 0]
        return out

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """depth [B, 1, H, W] in metres at the input's pixels (`export_names` "depth"), or a
        relative model's inverse depth (`"inverse_depth"`)."""
        raw = self(images)
        return (raw if self.relative else self.depth(raw),)


@dataclass(frozen=True)
class DPTInference:
    """How `DepthTask` predicts, as plain data a checkpoint records (`vitdense.models`): its
    `DPT` (the head reading the blocks `hooks`, its output `output` mapped to depth by
    `scale` and `shift`, or `relative` inverse depth), and each image's depth (a relative
    model's inverse depth) at its own size, written as PNGs of `png_scale` units per metre."""

    hooks: Sequence[int]
    output: DepthOutputKind = "metric"
    scale: float = 1.0
    shift: float = 0.0
    relative: bool = False
    png_scale: float = 1000.0

    result_type: ClassVar[type] = DepthResult

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> DPT:
        module = head(backbone.embed_dim, 1)
        module.hooks = tuple(int(i) for i in self.hooks)  # (the task's: DPT's rule for this backbone, or the YAML's)
        return DPT(backbone, module, self.output, self.scale, self.shift, self.relative)

    def sample(self, image: torch.Tensor, size: Size, index: int) -> DepthImages:
        return DepthImages.unlabeled(image, size, index)

    def predict(self, model: DPT, batch: Any) -> DepthPrediction:
        raws = model.estimate(batch.image, batch.image_sizes, batch.depth_sizes.sizes)
        depths = raws if model.relative else [model.depth(r) for r in raws]
        return DepthPrediction(batch.index, depths, model.relative, self.png_scale)
