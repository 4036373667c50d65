"""Detection's plain model: `DETRDetector` (a `DetectionOutput`; `detect` gives boxes at each
image's original size) and `postprocess`, DETR's reading of boxes from the queries; how it
predicts from a checkpoint without its task (`DetectorInference`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torchvision.ops import box_convert

from vitdense.backbone import VisionTransformer
from vitdense.backbone.one_pass import EncoderRequest
from vitdense.core.errors import ConfigError
from vitdense.results.detection import DetectionResult
from vitdense.types import BoxTargets, DetectedImages, DetectionOutput, Detections, ImageSizes, Size

#: how detections are read from the queries: DETR's one per query, or the best (query, class) pairs
Selection = Literal["per_query", "top_k"]


def select(
    output: DetectionOutput, selection: Selection = "per_query", top_k: int = 100
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which (query, class) pairs are detections, best first (see `postprocess`): scores,
    queries and labels, each [B, N]."""
    probs = output.class_probs()  # [B, Q, K]
    b, q, k = probs.shape
    if selection == "per_query":
        scores, labels = probs.max(-1)  # [B, Q]
        scores, queries = scores.sort(dim=1, descending=True, stable=True)
        labels = labels.gather(1, queries)
    elif selection == "top_k":
        scores, flat = probs.flatten(1).topk(min(top_k, q * k), dim=1)
        queries, labels = flat // k, flat % k
    else:
        raise ConfigError(f"selection={selection!r}: expected 'per_query' (DETR's) or 'top_k'")
    return scores, queries, labels


def postprocess(
    output: DetectionOutput,
    orig_sizes: Sequence[tuple[int, int]],
    selection: Selection = "per_query",
    top_k: int = 100,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Detections from a DETR output, boxes as absolute (x1, y1, x2, y2) at the original
    (H0, W0), best first.

    Class probabilities are the softmax over the K + 1 logits with "no object" then left out,
    or a sigmoid head's per-class sigmoids (`DetectionOutput.sigmoid`; those heads are read
    with `"top_k"`, as Deformable DETR's `PostProcess`).

    - `"per_query"`: DETR's `PostProcess`: every query is one detection, labelled with its
      most probable real class and scored with that probability (Q per image).
    - `"top_k"`: the `top_k` (query, class) pairs of highest probability, so a query may
      give several detections of different classes (min(top_k, Q * K) per image).

    Args:
        output: logits [B, Q, K + 1], boxes [B, Q, 4] (cx, cy, w, h) in [0, 1].
        orig_sizes: B pairs (H0, W0).

    Returns:
        per-image lists, in fp32: boxes [k, 4], scores [k], labels [k] (sorted by score).
        (`read_detections` also reads keypoints.)
    """
    found = read_detections(output, orig_sizes, selection, top_k)
    return found.boxes, found.scores, found.labels


def keypoints_in_pixels(keypoints: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """A keypoint head's [..., K, 7] -> [..., K, 3] in fp32: (x, y) times `size` (W, H) and
    each keypoint's score, its findable probability (RF-DETR's reading)."""
    keypoints = keypoints.float()
    return torch.cat([keypoints[..., :2] * size, keypoints[..., 2:3].sigmoid()], -1)


def read_detections(
    output: DetectionOutput,
    orig_sizes: Sequence[tuple[int, int]],
    selection: Selection = "per_query",
    top_k: int = 100,
    index: torch.Tensor | None = None,
) -> Detections:
    """`postprocess` as `Detections` (`index` [B], default 0..B-1), with each detection's
    keypoints [k, K, 3] when the head predicts them: (x, y) at the original (H0, W0) and the
    keypoint's score, its findable probability (RF-DETR's reading)."""
    scores, queries, labels = select(output, selection, top_k)
    boxes_all, keypoints_all = [], []
    for i, (height, width) in enumerate(orig_sizes):
        xyxy = box_convert(output.boxes[i, queries[i]].float(), "cxcywh", "xyxy")
        scale = torch.tensor([width, height, width, height], dtype=torch.float32, device=xyxy.device)
        boxes_all.append(xyxy * scale)
        if output.keypoints is not None:
            keypoints_all.append(keypoints_in_pixels(output.keypoints[i, queries[i]], scale[:2]))
    index = torch.arange(len(orig_sizes)) if index is None else index
    return Detections(
        index, boxes_all, list(scores), list(labels), keypoints_all if output.keypoints is not None else None
    )


class DETRDetector(nn.Module):
    """A DETR-family detector on the ViT (Carion et al. 2020 and successors): images ->
    `DetectionOutput`, and `detect` -> boxes at each image's original size.

    Args:
        backbone: the encoder.
        head: `ViTFeatures` -> `DetectionOutput` (`DETRHead`, `LWDETRHead`); a head that
            names `feature_indexes` gets those blocks' normalised outputs as intermediates.
        selection: how `detect` reads detections from the queries (see `postprocess`).
        top_k: detections kept per image with `selection="top_k"`.
    """

    def __init__(
        self, backbone: VisionTransformer, head: nn.Module, selection: Selection = "per_query", top_k: int = 100
    ) -> None:
        super().__init__()
        if selection not in ("per_query", "top_k"):
            raise ConfigError(f"selection={selection!r}: expected 'per_query' (DETR's) or 'top_k'")
        self.backbone = backbone
        self.head = head
        self.selection = selection
        self.top_k = top_k

    @property
    def encoder_request(self) -> EncoderRequest:
        """What the head reads off the encoder (a shared pass computes it: `one_pass`)."""
        return EncoderRequest(intermediates=tuple(getattr(self.head, "feature_indexes", ())))

    def forward(
        self,
        images: torch.Tensor,
        image_sizes: ImageSizes | None = None,
        targets: Sequence[BoxTargets] | None = None,
    ) -> DetectionOutput:
        """images [B, 3, H, W] (padded, with their `ImageSizes`) -> logits [B, Q, K + 1] and
        boxes [B, Q, 4] (cx, cy, w, h) in [0, 1] of each unpadded image. `targets` reach a
        head that trains with denoising queries (`head.denoising`); others ignore them."""
        # a multi-level head names the blocks its neck reads (`feature_indexes`)
        blocks = getattr(self.head, "feature_indexes", ())
        features = self.backbone(images, image_sizes, intermediates=blocks, norm_intermediates=True)
        if targets is not None and getattr(self.head, "denoising", False):
            return self.head(features, targets)
        return self.head(features)

    def postprocess(
        self, output: DetectionOutput, orig_sizes: Sequence[Size]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Per image, boxes [k, 4] (x1, y1, x2, y2) at its (H0, W0), scores [k] and labels [k]."""
        return postprocess(output, orig_sizes, self.selection, self.top_k)

    def detections(self, output: DetectionOutput, orig_sizes: Sequence[Size], index: torch.Tensor) -> Detections:
        """`postprocess` as `Detections` of the images `index`, with keypoints if the head predicts them."""
        return read_detections(output, orig_sizes, self.selection, self.top_k, index)

    @torch.no_grad()
    def detect(
        self, images: torch.Tensor, image_sizes: ImageSizes | None = None, orig_sizes: Sequence[Size] | None = None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Detections of images [B, 3, H, W]: per image, boxes [k, 4] absolute (x1, y1, x2,
        y2) at its `orig_sizes` entry (default: its own size in the batch), scores [k] and
        labels [k], best first."""
        if image_sizes is None:
            image_sizes = ImageSizes.full(images.shape[0], images.shape[-2:])
        return self.postprocess(self(images, image_sizes), orig_sizes or image_sizes.sizes)

    @property
    def export_names(self) -> tuple[str, ...]:
        """The graph's outputs: boxes, scores, labels, and keypoints with a keypoint head."""
        return ("boxes", "scores", "labels") + (("keypoints",) if getattr(self.head, "num_keypoints", 0) else ())

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """boxes [B, N, 4] (x1, y1, x2, y2) pixels of the input, scores [B, N], labels [B, N],
        best first, and with a keypoint head keypoints [B, N, K, 3] (x, y pixels, score):
        `read_detections` as tensor operations, for the graph."""
        output = self(images)
        probs = output.class_probs()  # [B, Q, K]
        _, q, k = probs.shape
        if self.selection == "per_query":
            best, classes = probs.max(-1)
            scores, queries = best.topk(q, dim=1)  # every query, best first
            labels = classes.gather(1, queries)
        else:
            scores, flat = probs.flatten(1).topk(min(self.top_k, q * k), dim=1)
            queries, labels = flat // k, flat % k
        boxes = output.boxes.float().gather(1, queries[..., None].expand(-1, -1, 4))  # cx, cy, w, h in [0, 1]
        centre, extent = boxes[..., :2], boxes[..., 2:] / 2
        height, width = images.shape[-2], images.shape[-1]
        xyxy = torch.cat([centre - extent, centre + extent], -1)
        # the scale built from the sizes by tensor ops: symbolic sizes stay symbolic in the graph
        scale = torch.ones(4, device=images.device)
        scale = torch.cat([scale[:1] * width, scale[1:2] * height, scale[2:3] * width, scale[3:] * height])
        if output.keypoints is None:
            return xyxy * scale, scores, labels
        keypoints = output.keypoints.gather(1, queries[..., None, None].expand(-1, -1, *output.keypoints.shape[2:]))
        return xyxy * scale, scores, labels, keypoints_in_pixels(keypoints, scale[:2])


@dataclass(frozen=True)
class DetectorInference:
    """How `DetectionTask` predicts, as plain data a checkpoint records (`vitdense.models`):
    its `DETRDetector` (reading detections as `selection` / `top_k` say), and each image's
    boxes at its own size. (Sliced inference runs this on tiles: `vitdense.deploy.slicing`.)"""

    num_classes: int
    selection: Selection = "per_query"
    top_k: int = 100

    result_type: ClassVar[type] = DetectionResult

    def build(self, backbone: VisionTransformer, head: Callable[..., nn.Module]) -> DETRDetector:
        return DETRDetector(backbone, head(backbone.embed_dim, self.num_classes), self.selection, self.top_k)

    def sample(self, image: torch.Tensor, size: Size, index: int) -> DetectedImages:
        return DetectedImages.unlabeled(image, size, index)

    def predict(self, model: DETRDetector, batch: Any) -> Detections:
        return model.detections(model(batch.image, batch.image_sizes), batch.orig_sizes, batch.index)
