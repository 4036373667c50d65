"""Sliced inference for large images (SAHI's idea: Akyon et al., "Slicing Aided Hyper
Inference and Fine-tuning for Small Object Detection", ICIP 2022; obss/sahi).

A model trained at a few hundred pixels shrinks a 4000-pixel photo to its own size and loses
every object of a dozen pixels. Sliced inference cuts the image into overlapping tiles at the
scale the model learned, runs the tiles through the task in batches (each tile preprocessed
as a whole image would be), shifts what each tile finds back into the image's frame, adds
the whole image's own prediction (the large objects; SAHI's `perform_standard_pred`), and
merges the duplicates that the overlaps produce.

    predictor = vitdense.load("det.ckpt", slicing=Slicing(slice_height=512, overlap_height_ratio=0.2))

The options are SAHI's `get_sliced_prediction`'s, by the same names and defaults, and the
tile grid and the merging give SAHI's numbers on the same inputs (tests/test_slicing.py holds
them):

- the grid (`slice_boxes`, SAHI's `get_slice_bboxes`): tiles of slice_height x slice_width
  from the top left, each step `size - int(ratio * size)`, the last of a row or column
  shifted back inside the image (so it overlaps its neighbour more); an image no larger
  than a tile is one tile (the image itself);
- the merge (`merge_groups`, SAHI's `postprocess/combine.py`): candidates in order of score
  (ties: SAHI's order by x1, y1, x2, y2), overlap by box IOU or IOS (intersection over the
  smaller box's area) against `postprocess_match_threshold` (a match is >=), per class
  unless `postprocess_class_agnostic`. NMS keeps the best of each group; GREEDYNMM merges
  each keeper's matches into it (the union box, the highest score, the class of the
  higher-scored; each merge re-checked against the grown box, as SAHI does); NMM merges
  transitively (what a merged box matches joins its keeper). Instance masks are pasted
  into the image's frame and merged by OR (SAHI: the union of their polygons).

Where vitdense differs from SAHI, on purpose: SAHI's `confidence_threshold` belongs to its
model wrapper and here to `Slicing` (tiles' detections below it are dropped before the
merge, which is quadratic in their number); SAHI switches to NMS / IOU on its own when that
threshold is under 0.1, vitdense does what it is told. Semantic segmentation keeps its own
sliding windows (`SegmentationTask`'s window and stride), classification and depth have no
objects to slice: they are refused with a message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple, get_args

import numpy as np
import torch
from torchvision.ops import batched_nms, box_area, box_iou, clip_boxes_to_image

from vitdense.core.errors import ConfigError
from vitdense.types import Detections, InstanceMasks, InstancePrediction

Postprocess = Literal["GREEDYNMM", "NMM", "NMS"]
MatchMetric = Literal["IOS", "IOU"]


@dataclass(frozen=True)
class Slicing:
    """How an image is sliced and its tiles' predictions merged (SAHI's names and defaults).

    Attributes:
        slice_height, slice_width: tile size in pixels of the image as given (width None:
            the height). Each tile is then preprocessed as a whole image (the checkpoint's
            resize): tiles of the model's training size show objects at the scale it learned.
        overlap_height_ratio, overlap_width_ratio: overlap of neighbouring tiles, as a
            fraction of the tile (0 <= ratio < 1; None: the height's).
        perform_standard_pred: also predict on the whole image (its large objects), merged
            with the tiles' (only when there are several tiles).
        postprocess_type: "GREEDYNMM" (SAHI's default), "NMM" or "NMS".
        postprocess_match_metric: "IOS" (intersection over the smaller box; SAHI's default)
            or "IOU".
        postprocess_match_threshold: overlap from which two predictions are one.
        postprocess_class_agnostic: merge across classes (False: per class).
        confidence_threshold: predictions of a tile (and of the whole image) scoring below it
            are dropped before the merge, whose overlap matrix is N x N per class in the N
            predictions kept (SAHI has a sparse backend for very many; vitdense does not: with
            thousands of tiles, keep this threshold above 0).
        batch_size: tiles run through the model at once.
    """

    slice_height: int = 512
    slice_width: int | None = None
    overlap_height_ratio: float = 0.2
    overlap_width_ratio: float | None = None
    perform_standard_pred: bool = True
    postprocess_type: Postprocess = "GREEDYNMM"
    postprocess_match_metric: MatchMetric = "IOS"
    postprocess_match_threshold: float = 0.5
    postprocess_class_agnostic: bool = False
    confidence_threshold: float = 0.3
    batch_size: int = 16

    def __post_init__(self) -> None:
        for name in ("slice_height", "slice_width", "batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"slicing.{name}={value!r}: a positive number of pixels (tiles) is needed")
        for name in ("overlap_height_ratio", "overlap_width_ratio"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1:
                raise ConfigError(
                    f"slicing.{name}={value}: the overlap is a fraction of the tile, 0 <= ratio < 1 "
                    "(e.g. 0.2: neighbouring tiles share a fifth of their side)"
                )
        if self.postprocess_type not in get_args(Postprocess):
            raise ConfigError(
                f"slicing.postprocess_type={self.postprocess_type!r}: one of {', '.join(get_args(Postprocess))}"
            )
        if self.postprocess_match_metric not in get_args(MatchMetric):
            raise ConfigError(
                f"slicing.postprocess_match_metric={self.postprocess_match_metric!r}: {' or '.join(get_args(MatchMetric))}"
            )
        if not 0 <= self.postprocess_match_threshold <= 1:
            raise ConfigError(f"slicing.postprocess_match_threshold={self.postprocess_match_threshold}: in [0, 1]")

    @property
    def tile(self) -> tuple[int, int]:
        """(height, width) of a tile."""
        return self.slice_height, self.slice_width or self.slice_height

    @property
    def overlap(self) -> tuple[float, float]:
        """(height, width) overlap ratios."""
        ratio = self.overlap_width_ratio
        return self.overlap_height_ratio, self.overlap_height_ratio if ratio is None else ratio


def slice_boxes(
    height: int, width: int, slice_height: int, slice_width: int, overlap_height: float, overlap_width: float
) -> torch.Tensor:
    """The tiles of an image, row by row, as SAHI's `get_slice_bboxes` lays them out.

    Returns:
        [n, 4] int64 (x1, y1, x2, y2) pixels; the last tile of a row (a column) ends at the
        image's edge and starts `slice_width` (`slice_height`) before it, or at 0 when the
        image is smaller than a tile.
    """
    step_y = slice_height - int(overlap_height * slice_height)
    step_x = slice_width - int(overlap_width * slice_width)
    # SAHI's loop: starts advance by the step until a tile reaches the edge; that last tile is
    # moved back inside the image
    ys = _starts(height, slice_height, step_y)
    xs = _starts(width, slice_width, step_x)
    boxes = [
        [x, y, min(x + slice_width, width), min(y + slice_height, height)] for y in ys for x in xs
    ]  # (row by row, as SAHI)
    return torch.tensor(boxes, dtype=torch.int64)


def _starts(length: int, size: int, step: int) -> list[int]:
    starts, start = [], 0
    while True:
        if start + size >= length:
            starts.append(max(0, length - size))
            return starts
        starts.append(start)
        start += step


def overlap_matrix(boxes: torch.Tensor, metric: MatchMetric) -> torch.Tensor:
    """[N, N] IOU (torchvision's `box_iou`) or IOS (intersection over the smaller box's
    area) of boxes [N, 4] (x1, y1, x2, y2); 0 where the denominator is 0, as SAHI."""
    if metric == "IOU":
        return box_iou(boxes, boxes).nan_to_num(0.0)
    area = box_area(boxes)
    low = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    high = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (high - low).clamp(min=0).prod(-1)
    smaller = torch.minimum(area[:, None], area[None, :])
    return torch.where(smaller > 0, inter / smaller.clamp(min=1e-12), torch.zeros_like(inter))


def score_order(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Indices by score, best first; ties by x1, y1, x2, y2 ascending (SAHI's `np.lexsort`,
    so that equal scores merge in SAHI's order)."""
    b, s = boxes.double().cpu().numpy(), scores.double().cpu().numpy()
    return torch.from_numpy(np.lexsort((b[:, 3], b[:, 2], b[:, 1], b[:, 0], -s)).copy())


def merge_groups(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    labels: torch.Tensor,
    postprocess_type: Postprocess = "GREEDYNMM",
    match_metric: MatchMetric = "IOS",
    match_threshold: float = 0.5,
    class_agnostic: bool = False,
) -> list[tuple[int, list[int]]]:
    """Which predictions are one object: (keeper, [the predictions merged into it]) pairs,
    the keeper first in each, in SAHI's order (per class unless `class_agnostic`, then by score).

    NMS with IOU is torchvision's `batched_nms` (which suppresses above the threshold, SAHI
    at or above: they differ only on an exact tie); the rest follows SAHI's numpy backend.
    The merged predictions are candidates: `merge_boxes` re-checks each against the grown box.

    Args:
        boxes: [N, 4] (x1, y1, x2, y2) in one frame; scores [N]; labels [N].
    """
    if len(boxes) == 0:
        return []
    boxes, scores = boxes.float(), scores.float()
    if postprocess_type == "NMS" and match_metric == "IOU":
        keep = batched_nms(boxes, scores, torch.zeros_like(labels) if class_agnostic else labels, match_threshold)
        return [(int(k), []) for k in keep]
    groups: list[tuple[int, list[int]]] = []
    classes = [None] if class_agnostic else labels.unique().tolist()  # (SAHI: np.unique, ascending)
    for k in classes:
        index = torch.arange(len(boxes)) if k is None else torch.nonzero(labels == k).flatten()
        matrix = overlap_matrix(boxes[index], match_metric) >= match_threshold
        order = score_order(boxes[index], scores[index])
        found = _group(matrix, order, scores[index], boxes[index], postprocess_type)
        groups += [(int(index[keep]), [int(index[m]) for m in merged]) for keep, merged in found]
    if postprocess_type == "NMS" or not class_agnostic:
        groups.sort(key=lambda g: -float(scores[g[0]]))  # (SAHI's NMS: kept indices by score)
    return groups


def _group(
    match: torch.Tensor, order: torch.Tensor, scores: torch.Tensor, boxes: torch.Tensor, kind: Postprocess
) -> list[tuple[int, list[int]]]:
    """SAHI's `nms_from_matrix`, `greedy_nmm_from_matrix` and `nmm_from_matrix` on a boolean
    match matrix [n, n] and the score order [n]."""
    n = len(order)
    order_list = order.tolist()
    if kind in ("NMS", "GREEDYNMM"):
        taken = torch.zeros(n, dtype=torch.bool)
        groups = []
        for pos, i in enumerate(order_list):
            if taken[i]:
                continue
            later = order[pos + 1 :]
            merged = later[~taken[later] & match[i, later]]
            # NMS: a kept box suppresses every box it matches, also ones already suppressed
            taken |= match[i] if kind == "NMS" else torch.zeros(n, dtype=torch.bool).index_fill_(0, merged, True)
            taken[i] = True
            groups.append((i, [] if kind == "NMS" else merged.tolist()))
        return groups
    # NMM: i may claim j when j scores lower (or equal and sorts after i by coordinates)
    s = scores
    before = torch.zeros(n, n, dtype=torch.bool)
    equal = torch.ones(n, n, dtype=torch.bool)
    for col in range(4):
        before |= equal & (boxes[:, None, col] < boxes[None, :, col])
        equal &= boxes[:, None, col] == boxes[None, :, col]
    dominates = (s[:, None] > s[None, :]) | ((s[:, None] == s[None, :]) & ~before)
    dominates.fill_diagonal_(False)
    claims = dominates & match
    owner = [-1] * n
    merged_into: dict[int, list[int]] = {}
    for i in order_list:
        if owner[i] < 0:
            owner[i] = i
            merged_into[i] = []
        keep = owner[i]
        for j in torch.nonzero(claims[i]).flatten().tolist():
            if owner[j] < 0:
                merged_into[keep].append(j)
                owner[j] = keep
    return list(merged_into.items())


class Merged(NamedTuple):
    """Merged predictions, best first: boxes [k, 4], scores [k], labels [k], and for each the
    indices of the inputs it is made of (the keeper first)."""

    boxes: torch.Tensor
    scores: torch.Tensor
    labels: torch.Tensor
    members: list[list[int]]


def merge_boxes(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, slicing: Slicing) -> Merged:
    """The predictions of all tiles (and the whole image) as one set, as SAHI's
    `NMSPostprocess` / `GreedyNMMPostprocess` / `NMMPostprocess` make it.

    Merging (GREEDYNMM, NMM) grows the keeper: the union of the boxes, the highest score, the
    class of the higher-scored (of the merged one on a tie, as SAHI); each candidate is merged
    only if it still matches the grown box.

    Args:
        boxes: [N, 4] (x1, y1, x2, y2) pixels of the image; scores [N]; labels [N].
    """
    groups = merge_groups(
        boxes,
        scores,
        labels,
        slicing.postprocess_type,
        slicing.postprocess_match_metric,
        slicing.postprocess_match_threshold,
        slicing.postprocess_class_agnostic,
    )
    # (plain floats: one pair at a time, where tensors would cost more than the arithmetic)
    all_boxes, all_scores, all_labels = boxes.tolist(), scores.tolist(), labels.tolist()
    out_boxes, out_scores, out_labels, members = [], [], [], []
    for keep, candidates in groups:
        box, score, label, member = all_boxes[keep], all_scores[keep], all_labels[keep], [keep]
        for j in candidates:
            other = all_boxes[j]
            if _pair_overlap(box, other, slicing.postprocess_match_metric) < slicing.postprocess_match_threshold:
                continue
            if not score > all_scores[j]:
                label = all_labels[j]
            box = [min(box[0], other[0]), min(box[1], other[1]), max(box[2], other[2]), max(box[3], other[3])]
            score = max(score, all_scores[j])
            member.append(j)
        out_boxes.append(box)
        out_scores.append(score)
        out_labels.append(label)
        members.append(member)
    if not groups:
        return Merged(boxes[:0], scores[:0], labels[:0], [])
    merged_scores = torch.tensor(out_scores, dtype=scores.dtype)
    best = torch.argsort(merged_scores, descending=True, stable=True)
    return Merged(
        torch.tensor(out_boxes, dtype=boxes.dtype)[best],
        merged_scores[best],
        torch.tensor(out_labels, dtype=labels.dtype)[best],
        [members[i] for i in best.tolist()],
    )


def _pair_overlap(a: list[float], b: list[float], metric: MatchMetric) -> float:
    """IOU or IOS of two boxes (x1, y1, x2, y2); 0 where the denominator is 0 (SAHI's)."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    area_a, area_b = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
    denominator = area_a + area_b - inter if metric == "IOU" else min(area_a, area_b)
    return inter / denominator if denominator > 0 else 0.0


# ------------------------------------------------------------------ running tiles through a task
class SlicedImage:
    """One image to predict on in tiles: its pixels [H, W, 3] uint8 as given (upright), its
    index, and `to_sample(pixels, index)`, the task's preprocessed sample of a tile (the
    DataModule's or the predictor's, as for a whole image).

    (A plain class, not a tuple: Lightning moves the tensors of a batch's tuples and
    dataclasses to the device, and these pixels stay on the host until a tile is cut.)
    """

    def __init__(
        self, pixels: np.ndarray, index: int, to_sample: Callable[[np.ndarray, int], Any], slicing: Slicing
    ) -> None:
        self.pixels, self.index, self.to_sample, self.slicing = pixels, index, to_sample, slicing

    @classmethod
    def collate(cls, samples: Sequence[SlicedImage]) -> SlicedImages:
        """A batch of sliced images (`pad_collate` calls it): the tiles are cut, batched and
        padded only when the task predicts, a few at a time."""
        index = torch.tensor([int(s.index) for s in samples], dtype=torch.int64)
        return SlicedImages(list(samples), index, [tuple(s.pixels.shape[:2]) for s in samples])

    @classmethod
    def maker(cls, to_sample: Callable[[np.ndarray, int], Any], slicing: Slicing) -> Callable[[np.ndarray, int], Any]:
        """`f(pixels, index)` -> a `SlicedImage` (a DataModule's `predict_sample` when slicing)."""
        return _SlicedMaker(to_sample, slicing)


class _SlicedMaker:
    """(a class, not a closure: DataLoader workers pickle it)"""

    def __init__(self, to_sample: Callable[[np.ndarray, int], Any], slicing: Slicing) -> None:
        self.to_sample, self.slicing = to_sample, slicing

    def __call__(self, pixels: np.ndarray, index: int) -> SlicedImage:
        return SlicedImage(pixels, index, self.to_sample, self.slicing)


class SlicedImages(NamedTuple):
    """A batch of `SlicedImage`s: the images, their indexes [B] and original sizes (H0, W0)
    (what `predict`'s writer reads: `orig_sizes`)."""

    images: list[SlicedImage]
    index: torch.Tensor
    orig_sizes: list[tuple[int, int]]


def check_sliceable(task: Any, name: str | None = None) -> None:
    """Raises ConfigError unless `task` (a task, a checkpoint's `PlainTask` or its recorded
    inference, or a task class whose `result_type` is a class attribute) predicts boxes or
    instance masks. `name`: the task's, in the message (default: `task`'s own)."""
    from vitdense.results.detection import DetectionResult
    from vitdense.results.universal import InstanceResult

    kind = getattr(task, "result_type", None)
    if kind not in (DetectionResult, InstanceResult):
        made = getattr(kind, "__name__", "no result")
        name = (
            name
            or getattr(task, "task_name", None)
            or (task.__name__ if isinstance(task, type) else type(task).__name__)
        )
        raise ConfigError(
            f"slicing: {name} predicts {made}, not objects; sliced inference merges the boxes of "
            "detection (DetectionTask) and the instance masks of instance segmentation (UniversalSegmentationTask "
            "with segmentation='instance'). Semantic segmentation covers large images with its own sliding windows "
            "(the task's window and stride); leave slicing out for it, classification and depth"
        )


def check_checkpoint_sliceable(found: Any) -> None:
    """`check_sliceable` from a checkpoint (`vitdense.deploy.checkpoint.Checkpoint`) without
    loading its weights: from its recorded inference (`record_model`), else when its task
    class declares its result type (a task whose result type depends on its settings, e.g.
    universal segmentation's, is then checked once restored)."""
    name = found.task_class.rpartition(".")[2]
    inference = found.recorded_inference()
    if inference is not None:
        check_sliceable(inference, name)
        return
    task_class = found.task_type()
    if not isinstance(getattr(task_class, "result_type", None), property):
        check_sliceable(task_class)


@torch.no_grad()
def predict_sliced(task: Any, batch: SlicedImages) -> Detections | InstancePrediction:
    """The task's prediction of each image of `batch`, made from its tiles (and the whole
    image), merged as each image's `Slicing` says, in the frame of the image as given: what
    the task's `predict_step` returns for whole images (`Detections` or `InstancePrediction`)."""
    check_sliceable(task)
    found = [_predict_one(task, image) for image in batch.images]
    if all(isinstance(f, InstanceMasks) for f in found) and found:
        return InstancePrediction(batch.index, found)
    keypoints = [f[3] for f in found] if found and found[0][3] is not None else None
    return Detections(batch.index, [f[0] for f in found], [f[1] for f in found], [f[2] for f in found], keypoints)


def _predict_one(task: Any, image: SlicedImage) -> tuple[torch.Tensor, ...] | InstanceMasks:
    """One image's merged prediction: (boxes, scores, labels) or `InstanceMasks`."""
    return merge_tiles(predict_tiles(task, image), image.pixels.shape[:2], image.slicing)


def predict_tiles(task: Any, image: SlicedImage) -> list[tuple[Any, list[int]]]:
    """What the task finds in each tile of `image` (and in the whole image, last, when
    `perform_standard_pred`): [(its prediction of the tile as an image of its own, (x, y,
    width, height) of the tile)], the tiles run `slicing.batch_size` at a time."""
    from vitdense.types.collate import pad_collate

    s = image.slicing
    height, width = image.pixels.shape[:2]
    windows = slice_boxes(height, width, *s.tile, *s.overlap)
    crops = [image.pixels[y1:y2, x1:x2] for x1, y1, x2, y2 in windows.tolist()]
    places = [[x1, y1, x2 - x1, y2 - y1] for x1, y1, x2, y2 in windows.tolist()]
    if len(windows) > 1 and s.perform_standard_pred:
        crops.append(image.pixels)
        places.append([0, 0, width, height])
    parts = []
    for start in range(0, len(crops), s.batch_size):
        chunk = crops[start : start + s.batch_size]
        tiles = pad_collate([image.to_sample(np.ascontiguousarray(c), j) for j, c in enumerate(chunk)])
        tiles = task.transfer_batch_to_device(tiles, task.device, 0)
        out = task.predict_step(tiles, 0)
        parts += [(_one(out, j), places[start + j]) for j in range(len(chunk))]
    return parts


def merge_tiles(
    parts: list[tuple[Any, list[int]]], size: tuple[int, int], slicing: Slicing
) -> tuple[torch.Tensor, ...] | InstanceMasks:
    """`predict_tiles`' parts as one prediction of the image of `size` (H, W): (boxes [k, 4],
    scores [k], labels [k], keypoints [k, K, 3] or None) or `InstanceMasks`, merged as
    `slicing` says. A merged detection's keypoint is, of its members' (each tile's view of
    the object), the one scored highest: the tile that saw it whole, where a tile's border
    cut the object."""
    if parts and isinstance(parts[0][0], InstanceMasks):
        return _merge_instances(parts, size, slicing)
    boxes, scores, labels, keypoints = _gather_boxes(parts, slicing.confidence_threshold)
    merged = merge_boxes(boxes, scores, labels, slicing)
    if keypoints is None:
        return merged.boxes, merged.scores, merged.labels, None
    merged_keypoints = keypoints.new_zeros(len(merged.members), *keypoints.shape[1:])
    for k, member in enumerate(merged.members):
        views = keypoints[member]  # [m, K, 3]
        best = views[..., 2].argmax(0)  # per keypoint, the member scoring it highest
        merged_keypoints[k] = views.gather(0, best[None, :, None].expand(1, -1, 3))[0]
    return merged.boxes, merged.scores, merged.labels, merged_keypoints


def _one(prediction: Any, j: int) -> Any:
    if isinstance(prediction, InstancePrediction):
        return prediction.instances[j]
    if isinstance(prediction, Detections):
        keypoints = prediction.keypoints[j] if prediction.keypoints is not None else None
        return prediction.boxes[j], prediction.scores[j], prediction.labels[j], keypoints
    raise ConfigError(f"slicing: the task's predict_step returned {type(prediction).__name__}, not boxes or instances")


def _gather_boxes(
    parts: list, threshold: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Every tile's boxes scoring at least `threshold`, clipped to the tile (as SAHI's model
    wrappers clip them to the image they saw) and shifted into the image's frame, with their
    keypoints (shifted, not clipped: a predicted keypoint may lie beyond the tile) or None."""
    boxes, scores, labels, keypoints = [], [], [], []
    for (b, sc, lab, points), (x, y, width, height) in parts:
        keep = sc >= threshold
        clipped = clip_boxes_to_image(b[keep].float().cpu(), (height, width))
        boxes.append(clipped + torch.tensor([x, y, x, y], dtype=torch.float32))
        scores.append(sc[keep].float().cpu())
        labels.append(lab[keep].cpu())
        if points is not None:
            keypoints.append(points[keep].float().cpu() + torch.tensor([x, y, 0], dtype=torch.float32))
    return torch.cat(boxes), torch.cat(scores), torch.cat(labels), torch.cat(keypoints) if keypoints else None


def _merge_instances(parts: list, size: tuple[int, int], s: Slicing) -> InstanceMasks:
    """Instances of every tile, matched by their boxes (as SAHI matches masks) and merged by
    OR once pasted into the image's frame; masks stay tile-sized until a merged one is made."""
    from torchvision.ops import masks_to_boxes

    crops, boxes, scores, labels = [], [], [], []
    for found, (x, y, _, _) in parts:
        keep = (found.scores >= s.confidence_threshold) & found.masks.flatten(1).any(1)
        masks = found.masks[keep].cpu()
        crops += [(m, x, y) for m in masks]
        if len(masks):
            boxes.append(masks_to_boxes(masks).float() + torch.tensor([x, y, x + 1, y + 1], dtype=torch.float32))
        scores.append(found.scores[keep].float().cpu())
        labels.append(found.labels[keep].cpu())
    if not crops:
        return InstanceMasks(torch.zeros(0, *size, dtype=torch.bool), torch.zeros(0, dtype=torch.int64), scores[0][:0])
    merged = merge_boxes(torch.cat(boxes), torch.cat(scores), torch.cat(labels), s)
    masks = torch.zeros(len(merged.members), *size, dtype=torch.bool)
    for k, member in enumerate(merged.members):
        for j in member:
            m, x, y = crops[j]
            masks[k, y : y + m.shape[0], x : x + m.shape[1]] |= m
    return InstanceMasks(masks, merged.labels, merged.scores)


# ------------------------------------------------------------------ command-line options (serve, bench)
def add_slicing_arguments(parser: Any) -> None:
    """SAHI's command-line options (`sahi predict`'s names) on an argparse parser; slicing is
    on when `--slice_height` is given."""
    group = parser.add_argument_group("sliced inference (detection, instance segmentation; vitdense.deploy.slicing)")
    default = {f.name: f.default for f in fields(Slicing)}  # (one place for SAHI's defaults: the dataclass)
    group.add_argument(
        "--slice_height", type=int, default=None, help="tile height in pixels; slicing is off without it"
    )
    group.add_argument("--slice_width", type=int, default=None, help="tile width (default: the height)")
    group.add_argument(
        "--overlap_height_ratio",
        type=float,
        default=default["overlap_height_ratio"],
        help="overlap of neighbouring tiles, 0..<1",
    )
    group.add_argument("--overlap_width_ratio", type=float, default=None, help="(default: the height's)")
    group.add_argument("--no_standard_prediction", action="store_true", help="no whole-image pass beside the tiles")
    group.add_argument("--postprocess_type", default=default["postprocess_type"], choices=get_args(Postprocess))
    group.add_argument(
        "--postprocess_match_metric", default=default["postprocess_match_metric"], choices=get_args(MatchMetric)
    )
    group.add_argument("--postprocess_match_threshold", type=float, default=default["postprocess_match_threshold"])
    group.add_argument("--postprocess_class_agnostic", action="store_true", help="merge across classes")
    group.add_argument(
        "--confidence_threshold",
        type=float,
        default=default["confidence_threshold"],
        help="tiles' predictions below it dropped",
    )
    group.add_argument(
        "--slice_batch_size", type=int, default=default["batch_size"], help="tiles run through the model at once"
    )


def slicing_from_args(args: Any) -> Slicing | None:
    """The `Slicing` of `add_slicing_arguments`' options, or None without `--slice_height`."""
    if args.slice_height is None:
        return None
    return Slicing(
        slice_height=args.slice_height,
        slice_width=args.slice_width,
        overlap_height_ratio=args.overlap_height_ratio,
        overlap_width_ratio=args.overlap_width_ratio,
        perform_standard_pred=not args.no_standard_prediction,
        postprocess_type=args.postprocess_type,
        postprocess_match_metric=args.postprocess_match_metric,
        postprocess_match_threshold=args.postprocess_match_threshold,
        postprocess_class_agnostic=args.postprocess_class_agnostic,
        confidence_threshold=args.confidence_threshold,
        batch_size=args.slice_batch_size,
    )
