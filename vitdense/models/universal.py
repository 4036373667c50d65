"""Universal segmentation's plain model: `EoMT` (class and mask logits per query: semantic,
instance, panoptic).

Post-processing of mask classification (Mask2Former, EoMT): per-query class logits
[Q, K + 1] (the last class "no object") and mask logits [Q, H, W] turned into a semantic
score map, a panoptic segmentation or ranked instance masks.

Each function is Mask2Former's (`semantic_inference`, `panoptic_inference`,
`instance_inference` of `mask2former/maskformer_model.py`), which EoMT uses unchanged
(`to_per_pixel_logits_semantic`, `to_per_pixel_preds_panoptic` and the instance eval step of
tue-mps/eomt `training/`); the tests hold numbers computed with their own code. The mask
logits are at the size the result is wanted (the caller resizes, unpads and stitches sliding
windows first); the arithmetic is in float32 whatever the logits' dtype, as theirs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.core.errors import ConfigError
from vitdense.heads.eomt import padding_valid
from vitdense.models.windows import segment_batch
from vitdense.results.segmentation import SegmentationResult
from vitdense.results.universal import InstanceResult, PanopticResult
from vitdense.types import (
    ImageSizes,
    InstanceMasks,
    InstancePrediction,
    MaskClassOutput,
    PanopticImages,
    PanopticPrediction,
    PanopticSegments,
    SegmentationPrediction,
    SegmentedImages,
    Size,
)
from vitdense.types.common import _ceil_div

#: what a universal segmentation model evaluates and predicts
Segmentation = Literal["panoptic", "instance", "semantic"]


def semantic_inference(class_logits: torch.Tensor, mask_logits: torch.Tensor) -> torch.Tensor:
    """Per-pixel class scores: sum over queries of P(class) x P(pixel in mask).

    Args:
        class_logits: [..., Q, K + 1], the last class "no object" (dropped after the softmax).
        mask_logits: [..., Q, H, W] (leading dims as `class_logits`', e.g. a batch [B, ...]).

    Returns:
        [..., K, H, W] float32 scores (not normalised over classes; argmax gives the label map).
    """
    _check_pair(class_logits, mask_logits)
    probs = class_logits.float().softmax(-1)[..., :-1]
    return torch.einsum("...qc,...qhw->...chw", probs, mask_logits.float().sigmoid())


@torch.no_grad()
def panoptic_inference(
    class_logits: torch.Tensor,
    mask_logits: torch.Tensor,
    is_thing: torch.Tensor | Sequence[bool],
    score_threshold: float = 0.8,
    overlap_threshold: float = 0.8,
) -> PanopticSegments:
    """One image's panoptic segmentation, as Mask2Former's `panoptic_inference`.

    A query is kept when its best class is a real one (not "no object") with probability
    above `score_threshold`. Each pixel goes to the kept query with the largest class
    probability x mask probability; a query then keeps the pixels it won that its own mask
    covers (probability >= 0.5), and is dropped when it won less than `overlap_threshold` of
    its own mask's area (or nothing). Stuff queries of one class merge into one segment (the
    first kept query of the class makes it); every thing query is a segment of its own.

    Args:
        class_logits: [Q, K + 1], the last class "no object".
        mask_logits: [Q, H, W] at the output size.
        is_thing: [K] bool (tensor or sequence), True for thing classes.
        score_threshold: class probability a query must exceed (EoMT's `mask_thresh`).
        overlap_threshold: share of its mask a query must win (EoMT's `overlap_thresh`).

    Returns:
        `PanopticSegments`: id_map [H, W] int64 (0: no segment), ids 1..n in the order of
        the queries that made them, their labels, and as score the class probability of the
        query that made each segment.
    """
    _check_pair(class_logits, mask_logits)
    num_classes = class_logits.shape[-1] - 1
    is_thing = torch.as_tensor(is_thing, dtype=torch.bool, device=mask_logits.device)
    if is_thing.shape != (num_classes,):
        raise ValueError(
            f"panoptic_inference: is_thing has shape {tuple(is_thing.shape)}, expected ({num_classes},): one flag "
            f"per class of class_logits [Q, K + 1] (without 'no object')"
        )
    device = mask_logits.device
    scores, labels = class_logits.float().softmax(-1).max(-1)
    keep = labels.ne(num_classes) & (scores > score_threshold)
    scores, labels, probs = scores[keep], labels[keep], mask_logits[keep].float().sigmoid()  # [k], [k], [k, H, W]
    empty = PanopticSegments(
        torch.zeros(mask_logits.shape[-2:], dtype=torch.int64, device=device),
        torch.zeros(0, dtype=torch.int64, device=device),
        torch.zeros(0, dtype=torch.int64, device=device),
        torch.zeros(0, device=device),
    )
    if len(labels) == 0:
        return empty

    winner = (scores[:, None, None] * probs).argmax(0)  # [H, W] (the first query on ties)
    covered = probs >= 0.5  # [k, H, W]
    won = winner == torch.arange(len(labels), device=device)[:, None, None]
    won_area, own_area, final_area = won.sum((1, 2)), covered.sum((1, 2)), (won & covered).sum((1, 2))
    # Mask2Former: `mask_area / original_area < overlap_threshold` -> dropped (float64 division there too)
    ratio = won_area.double() / own_area.clamp(min=1).double()
    kept = (won_area > 0) & (own_area > 0) & (final_area > 0) & (ratio >= overlap_threshold)

    # the segment of each kept query: stuff queries of one class share their first one's
    k = len(labels)
    key = torch.where(is_thing[labels], num_classes + torch.arange(k, device=device), labels)
    same = (key[:, None] == key[None, :]) & kept[None, :] & kept[:, None]  # [k, k]
    first = torch.where(same.any(1), same.int().argmax(1), -1)  # first kept query with the same key
    starts = kept & (first == torch.arange(k, device=device))
    number = torch.cumsum(starts.long(), 0)  # segment id of each starting query
    segment_of = torch.where(kept, number[first.clamp(min=0)], 0)  # [k]

    own_pixel = covered.gather(0, winner[None])[0]  # the winner's mask covers the pixel
    id_map = torch.where(own_pixel, segment_of[winner], 0)
    n = int(starts.sum())
    if n == 0:
        return empty
    return PanopticSegments(id_map, torch.arange(1, n + 1, device=device), labels[starts], scores[starts])


@torch.no_grad()
def instance_inference(
    class_logits: torch.Tensor,
    mask_logits: torch.Tensor,
    top_k: int = 100,
    is_thing: torch.Tensor | Sequence[bool] | None = None,
) -> InstanceMasks:
    """One image's instances, as Mask2Former's `instance_inference`: the `top_k` best
    (query, class) pairs of the Q x K class probabilities, each with its query's mask
    (logit > 0) and the score P(class) x the mean mask probability inside the mask. A model
    with stuff classes (panoptic) keeps the pairs of thing classes among the `top_k`, as
    Mask2Former's with `panoptic_on`: its instances are its things, evaluated against the
    things of the ground truth (COCO's instances JSON).

    Args:
        class_logits: [Q, K + 1], the last class "no object".
        mask_logits: [Q, H, W] at the output size.
        top_k: (query, class) pairs taken (all Q x K pairs when fewer); 100 for COCO.
        is_thing: [K] bool, True for thing classes; None: every class is one.

    Returns:
        `InstanceMasks`, best first: masks [k, H, W] bool, labels [k], scores [k] float32
        (k <= top_k: fewer where stuff pairs were among the best).
    """
    _check_pair(class_logits, mask_logits)
    num_queries, num_classes = class_logits.shape[0], class_logits.shape[-1] - 1
    probs = class_logits.float().softmax(-1)[:, :-1]  # [Q, K]
    top_scores, top = probs.flatten().topk(min(top_k, num_queries * num_classes))
    labels = top % num_classes
    if is_thing is not None:
        thing = torch.as_tensor(is_thing, dtype=torch.bool, device=labels.device)
        if thing.shape != (num_classes,):
            raise ValueError(
                f"instance_inference: is_thing has shape {tuple(thing.shape)}, expected ({num_classes},): one "
                f"flag per class of class_logits [Q, K + 1] (without 'no object')"
            )
        # after the top k, not before: Mask2Former's order (a panoptic model keeps fewer than top_k)
        keep = thing[labels]
        top_scores, top, labels = top_scores[keep], top[keep], labels[keep]
    logits = mask_logits[top // num_classes].float()  # [k, H, W]
    masks = (logits > 0).float()
    # Mask2Former's expression, op for op (its 1e-6 included)
    mask_scores = (logits.sigmoid().flatten(1) * masks.flatten(1)).sum(1) / (masks.flatten(1).sum(1) + 1e-6)
    scores = top_scores * mask_scores
    order = scores.argsort(descending=True, stable=True)
    return InstanceMasks(masks[order].bool(), labels[order], scores[order])


def _check_pair(class_logits: torch.Tensor, mask_logits: torch.Tensor) -> None:
    if class_logits.dim() < 2 or mask_logits.dim() != class_logits.dim() + 1:
        raise ValueError(
            f"class_logits [..., Q, K + 1] and mask_logits [..., Q, H, W] expected; got shapes "
            f"{tuple(class_logits.shape)} and {tuple(mask_logits.shape)}"
        )
    if class_logits.shape[:-1] != mask_logits.shape[:-2]:
        raise ValueError(
            f"class_logits {tuple(class_logits.shape)} and mask_logits {tuple(mask_logits.shape)} disagree on the "
            f"queries: [..., Q, K + 1] and [..., Q, H, W] with the same leading dims and Q"
        )
    if class_logits.shape[-1] < 2:
        raise ValueError(f"class_logits needs K + 1 >= 2 classes (the last is 'no object'); got {class_logits.shape}")


class EoMT(nn.Module):
    """EoMT (Kerssies et al., CVPR 2025): a plain ViT segments by itself. Learned queries
    join the token sequence before the last `head.num_blocks` blocks; class and mask logits
    are read off the queries before each of those blocks (the previous prediction's masks
    restrict the queries' attention in the next block: masked attention, annealed away in
    training) and after the last. One model for semantic, instance and panoptic
    segmentation: the post-processing decides (`vitdense.models.universal`).

    Args:
        backbone: the encoder; the joined blocks must attend globally.
        head: an `EoMTHead` (queries, class and mask heads, upscaling).
    """

    def __init__(self, backbone: VisionTransformer, head: nn.Module) -> None:
        super().__init__()
        if head.num_blocks > backbone.depth:
            raise ConfigError(
                f"EoMT joins its queries to {head.num_blocks} blocks, but the backbone has {backbone.depth}"
            )
        windowed = backbone.window_size is not None or backbone.num_windows is not None
        joined = range(backbone.depth - head.num_blocks, backbone.depth)
        if windowed and (local := [i for i in joined if i not in backbone.global_attn_indexes]):
            raise ConfigError(
                f"EoMT's queries attend the whole image, but blocks {local} of the backbone attend within windows: "
                "list them in backbone.global_attn_indexes or lower the head's num_blocks"
            )
        self.backbone = backbone
        self.head = head

    @property
    def mask_stride(self) -> int:
        """Input pixels per mask logit (EoMT: 4 for patch 16)."""
        return self.backbone.patch_size[0] // self.head.mask_stride

    def forward(self, images: torch.Tensor, image_sizes: ImageSizes | None = None) -> MaskClassOutput:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> `MaskClassOutput`: class
        logits [B, Q, K + 1] and mask logits [B, Q, H', W'] on the padded patch grid times
        the head's `mask_stride`; the earlier blocks' predictions in `aux` in training (and
        in evaluation while masked attention applies, since the masks need them)."""
        backbone, head = self.backbone, self.head
        tokens, sizes = backbone.embed(images, image_sizes)
        grid = (tokens.shape[1], tokens.shape[2])
        x = backbone.add_pos_embed(tokens, sizes)
        keys = backbone.key_mask(sizes, x.device)
        rope = backbone.rotary(sizes, x.device)  # of the patches: the queries, joined in front, are not rotated
        valid = padding_valid(sizes, x.device)
        window = backbone.window_for(grid)
        p, start = backbone.num_prefix_tokens, backbone.depth - head.num_blocks
        attn_mask = keys[:, None, None, :] if keys is not None else None
        aux = []
        for i in range(backbone.depth):
            if i == start:
                x = torch.cat([head.q.weight.to(x.dtype).expand(x.shape[0], -1, -1), x], 1)
                if keys is not None:  # queries are keys for every token
                    keys = F.pad(keys, (head.num_queries, 0), value=True)
                    attn_mask = keys[:, None, None, :]
            if i >= start and head.masks_in_block(i - start):
                class_logits, mask_logits = head.predict(backbone.norm(x), grid, p, valid)
                aux.append((class_logits, mask_logits))
                attn_mask = head.attention_mask(mask_logits, grid, p, keys, i - start)
            elif i >= start:
                attn_mask = keys[:, None, None, :] if keys is not None else None
            x, _ = backbone.run_block(i, x, attn_mask, window if i < start else None, rope=rope)
        class_logits, mask_logits = head.predict(backbone.norm(x), grid, p, valid)
        return MaskClassOutput(class_logits, mask_logits, tuple(aux))

    def image_logits(
        self, output: MaskClassOutput, image_sizes: ImageSizes, out_sizes: Sequence[Size] | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per image, class logits [Q, K + 1] and fp32 mask logits [Q, h, w] at its
        `out_sizes` entry (default: its own size in the batch): its part of the mask grid,
        upsampled to its pixels (bilinear), cropped to its size and resized (EoMT's
        evaluation), as if it had run alone."""
        out_sizes = out_sizes or image_sizes.sizes
        patch = self.backbone.patch_size
        stride = self.mask_stride
        out = []
        for i, ((h, w), size) in enumerate(zip(image_sizes.sizes, out_sizes, strict=True)):
            gh, gw = _ceil_div(h, patch[0]) * patch[0], _ceil_div(w, patch[1]) * patch[1]
            masks = output.mask_logits[i : i + 1, :, : gh // stride, : gw // stride].float()
            masks = F.interpolate(masks, size=(gh, gw), mode="bilinear")[..., :h, :w]
            if (h, w) != tuple(size):
                masks = F.interpolate(masks, size=tuple(size), mode="bilinear")
            out.append((output.class_logits[i].float(), masks[0]))
        return out

    def semantic(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores [B, K, H, W] of unpadded images [B, 3, H, W]: per pixel, the sum over
        queries of class probability (no object left out) times mask probability (EoMT's
        and Mask2Former's semantic inference); what sliding windows average."""
        output = self(images)
        sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        return torch.stack([semantic_inference(c, m) for c, m in self.image_logits(output, sizes)])

    @torch.no_grad()
    def segment(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None,
        out_sizes: Sequence[Size] | None,
        window: int,
        stride: int,
        window_batch_size: int = 4,
    ) -> list[torch.Tensor]:
        """Semantic scores of whole images in sliding windows of `window` every `stride`
        pixels (EoMT's semantic evaluation): per image, [1, K, h, w] at its `out_sizes`
        entry (default: its own size)."""
        num_classes = self.head.class_head.out_features - 1
        return segment_batch(
            self.semantic, images, image_sizes, out_sizes, window, stride, num_classes, batch_size=window_batch_size
        )

    export_names: ClassVar[tuple[str, ...]] = ("class_probs", "mask_logits")

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Class probabilities [B, Q, K + 1] (softmax, the last "no object") and mask logits
        [B, Q, H, W] at the input's pixels: what semantic, instance and panoptic
        post-processing (`vitdense.models.universal`) start from."""
        output = self(images)
        h, w = images.shape[-2:]
        masks = F.interpolate(output.mask_logits.float(), scale_factor=self.mask_stride, mode="bilinear")
        return output.class_logits.float().softmax(-1), masks[..., :h, :w]


@dataclass(frozen=True)
class EoMTInference:
    """How `UniversalSegmentationTask` predicts, as plain data a checkpoint records
    (`vitdense.models`): its `EoMT`, and each image's `segmentation` at its own size, post-
    processed with the task's settings: panoptic segments (`score_threshold`,
    `overlap_threshold`, things and stuff from `is_thing`; None: things only), the things
    among the `top_k` best (query, class) pairs as instances, or semantic label maps from
    sliding windows (`window`, `stride`, `window_batch_size`)."""

    num_classes: int
    window: int
    stride: int
    segmentation: Segmentation = "panoptic"
    is_thing: Sequence[bool] | None = None
    score_threshold: float = 0.8
    overlap_threshold: float = 0.8
    top_k: int = 100
    ignore_index: int = 255
    window_batch_size: int = 4

    @property
    def result_type(self) -> type:
        return {"panoptic": PanopticResult, "instance": InstanceResult, "semantic": SegmentationResult}[
            self.segmentation
        ]

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> EoMT:
        return EoMT(backbone, head(backbone.embed_dim, self.num_classes, backbone.patch_size[0]))

    def sample(self, image: torch.Tensor, size: Size, index: int) -> PanopticImages | SegmentedImages:
        if self.segmentation == "semantic":
            return SegmentedImages.unlabeled(image, size, index, self.ignore_index)
        return PanopticImages.unlabeled(image, size, index)

    def thing_flags(self, device: torch.device) -> torch.Tensor:
        """[K] bool, True for thing classes (all of them when `is_thing` is not known)."""
        return torch.tensor(self.is_thing or [True] * self.num_classes, device=device)

    def predict(self, model: EoMT, batch: Any) -> SegmentationPrediction | InstancePrediction | PanopticPrediction:
        if isinstance(batch, SegmentedImages):
            scores = model.segment(
                batch.image, batch.image_sizes, batch.mask_sizes.sizes, self.window, self.stride, self.window_batch_size
            )
            return SegmentationPrediction(batch.index, [s[0].argmax(0) for s in scores])
        logits = model.image_logits(model(batch.image, batch.image_sizes), batch.image_sizes, batch.orig_sizes)
        if self.segmentation == "instance":
            found = [instance_inference(c, m, self.top_k, self.thing_flags(c.device)) for c, m in logits]
            return InstancePrediction(batch.index, found)
        found = [
            panoptic_inference(c, m, self.thing_flags(c.device), self.score_threshold, self.overlap_threshold)
            for c, m in logits
        ]
        return PanopticPrediction(batch.index, found)
