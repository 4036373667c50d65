"""COCO's files of universal segmentation: panoptic PNGs (segment ids stored as RGB, id =
R + 256 G + 256² B, as cocodataset/panopticapi's `rgb2id` / `id2rgb` read and write them)
with their `segments_info`, and instance results entries with RLE masks (what
`COCO.loadRes` reads).

Predictions carry contiguous class indices 0..K-1; files carry the dataset's category ids.
`category_id` is the one mapping between them on the way out (`category_ids[label]`, or
label + 1 for a dataset without ids, as `DetectionResult.rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pycocotools import mask as mask_utils

from vitdense.types import InstanceMasks, PanopticSegments


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


def _numpy(values: torch.Tensor | np.ndarray) -> np.ndarray:
    """A tensor's values as NumPy (fp32 for reduced-precision floats), or the array as it is:
    predictions arrive as tensors, results (`vitdense.mask_results`) hold arrays."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu()
        return (values.float() if values.is_floating_point() else values).numpy()
    return np.asarray(values)


def category_id(label: int, category_ids: Sequence[int] | None) -> int:
    """The dataset's category id of contiguous class `label` (label + 1 without ids)."""
    if category_ids is None:
        return int(label) + 1
    if not 0 <= label < len(category_ids):
        raise ValueError(f"class index {label} has no category id: category_ids has {len(category_ids)} entries")
    return int(category_ids[label])


def panoptic_png(
    segments: PanopticSegments, is_thing: Sequence[bool] | None, category_ids: Sequence[int] | None = None
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One image's panoptic prediction as COCO panoptic files hold it.

    Args:
        segments: the prediction (`PanopticSegments`, contiguous labels).
        is_thing: K flags, True for thing classes (None: no `isthing` key).
        category_ids: the dataset's category id of each class (None: label + 1).

    Returns:
        ([H, W, 3] uint8 RGB of the PNG (`id2rgb` of the id map), `segments_info`: per segment
        that covers a pixel, in `ids` order, {"id", "category_id", "isthing", "area"} (area in
        pixels); a listed segment without pixels is left out, as panopticapi refuses it).
    """
    id_map = _numpy(segments.id_map)
    ids, labels = _numpy(segments.ids).tolist(), _numpy(segments.labels).tolist()
    if len(ids) != len(labels):
        raise ValueError(f"PanopticSegments has {len(ids)} ids for {len(labels)} labels")
    present, counts = np.unique(id_map, return_counts=True)
    area = dict(zip(present.tolist(), counts.tolist(), strict=True))
    if stray := sorted(set(area) - set(ids) - {0}):
        raise ValueError(f"PanopticSegments.id_map has segment ids {stray[:5]} that are not in its ids")
    info = [
        {
            "id": int(i),
            "category_id": category_id(label, category_ids),
            "area": int(area[i]),
            **({"isthing": int(bool(is_thing[label]))} if is_thing is not None else {}),
        }
        for i, label in zip(ids, labels, strict=True)
        if area.get(i, 0) > 0
    ]
    return id2rgb(id_map), info


def instance_results(
    instances: InstanceMasks, image_id: int, category_ids: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """One image's instances as COCO results entries (for `COCO.loadRes` and COCOeval with
    iouType "segm"), best first: {"image_id", "category_id" (the dataset's), "segmentation"
    (RLE {"size": [H, W], "counts": str}), "score"}.

    Args:
        instances: `InstanceMasks` at the image's original size.
        image_id: the image's id in the dataset.
        category_ids: the dataset's category id of each class (None: label + 1).
    """
    masks = _numpy(instances.masks)
    if masks.ndim != 3:
        raise ValueError(f"InstanceMasks.masks must be [k, H, W]; got shape {masks.shape}")
    rles = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8))) if len(masks) else []
    return [
        {
            "image_id": image_id,
            "category_id": category_id(label, category_ids),
            "segmentation": {"size": [int(s) for s in rle["size"]], "counts": rle["counts"].decode("ascii")},
            "score": score,
        }
        for rle, label, score in zip(
            rles, _numpy(instances.labels).tolist(), _numpy(instances.scores).astype(float).tolist(), strict=True
        )
    ]
