"""The results of universal segmentation (`vitdense.results`' contract): a panoptic
segmentation or an image's instances, with COCO's file formats.

    PanopticResult  segment ids [H, W] + segments   -> panoptic/<name>.png (COCO panoptic RGB ids), panoptic.json
    InstanceResult  masks [k, H, W] + scores        -> instances.json (COCO results, RLE, no bbox), drawn/<name>.jpg

`panoptic.json` is the `annotations` file of COCO's panoptic format and `panoptic/` its
PNG folder: panopticapi's `pq_compute(gt_json, "panoptic.json", gt_folder, "panoptic")`
reads them as they are; `instances.json` is what `COCO.loadRes` reads for COCOeval(segm).

COCO's files of universal segmentation: panoptic PNGs (segment ids stored as RGB, id =
R + 256 G + 256² B, as cocodataset/panopticapi's `rgb2id` / `id2rgb` read and write them)
with their `segments_info`, and instance results entries with RLE masks (what
`COCO.loadRes` reads).

Predictions carry contiguous class indices 0..K-1; files carry the dataset's category ids.
`category_id` is the one mapping between them on the way out (`category_ids[label]`, or
label + 1 for a dataset without ids, as `DetectionResult.rows`)."""

from __future__ import annotations

import base64
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from vitdense.core.draw import default_palette, draw_segments
from vitdense.results.common import Origin, ResultContext, Size, WriteOptions
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
    predictions arrive as tensors, results (`vitdense.results.universal`) hold arrays."""
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


_logger = logging.getLogger(__name__)


def mask_box(mask: np.ndarray) -> list[float]:
    """COCO's bbox [x, y, width, height] of a [H, W] bool mask ([0, 0, 0, 0] if empty)."""
    return rle_box(mask_utils.encode(np.asfortranarray(mask.astype(np.uint8))))


def rle_box(rle: dict[str, Any]) -> list[float]:
    """COCO's bbox [x, y, width, height] of a mask as COCO's RLE (counts as bytes or text)."""
    return [float(v) for v in mask_utils.toBbox(rle)]


@dataclass(frozen=True)
class PanopticResult(Origin):
    """One image's panoptic segmentation at its original size.

    Attributes:
        id_map: [H, W] int64 segment id of each pixel (0: no segment).
        ids, labels, scores: per segment [n]: its id (> 0), class index 0..K-1, score.
        class_names: names of the K classes.
        category_ids: the dataset's id of each class (COCO's 1..200), or None (1..K).
        palette: [K, 3] uint8 class colours.
        (and `Origin`'s source, index, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "panoptic.json"
    files_folder: ClassVar[str | None] = "panoptic"

    id_map: np.ndarray
    ids: np.ndarray
    labels: np.ndarray
    scores: np.ndarray
    class_names: list[str]
    category_ids: list[int] | None = None
    palette: np.ndarray | None = field(default=None, kw_only=True, repr=False)

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[PanopticResult]:
        """A `PanopticPrediction` (per image `PanopticSegments` at its original size) -> B results."""
        names = list(context.class_names)
        ids = context.labels.category_ids
        palette = context.labels.colours(len(names))
        return [
            cls(
                s.id_map.cpu().numpy(),
                s.ids.cpu().numpy(),
                s.labels.cpu().numpy(),
                s.scores.float().cpu().numpy(),
                names,
                list(ids) if ids else None,
                palette=palette,
                **context.origin(i),
            )
            for i, s in enumerate(prediction.segments)
        ]

    @property
    def size(self) -> Size:
        return int(self.id_map.shape[0]), int(self.id_map.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def masks(self) -> np.ndarray:
        """[n, H, W] bool, one per segment."""
        return self.id_map[None] == self.ids[:, None, None]

    def segments(self) -> PanopticSegments:
        return PanopticSegments(self.id_map, self.ids, self.labels, self.scores)

    @cached_property
    def coco(self) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """COCO panoptic's files of this image (`vitdense.results.universal.panoptic_png`): the PNG's RGB
        [H, W, 3] and the segments' id, category_id and area; made once (`predict` writes the
        PNG and the JSON row of each image)."""
        return panoptic_png(self.segments(), None, self.category_ids)

    def segments_info(self) -> list[dict[str, Any]]:
        """COCO panoptic `segments_info`: id, the dataset's category_id, area, and here also
        bbox and score (panopticapi ignores keys it does not know)."""
        _, info = self.coco
        scores = dict(zip(self.ids.tolist(), self.scores.tolist(), strict=True))
        masks = {int(i): m for i, m in zip(self.ids, self.masks(), strict=True)}
        return [{**s, "iscrowd": 0, "bbox": mask_box(masks[s["id"]]), "score": scores[s["id"]]} for s in info]

    def png(self) -> bytes:
        """The segment ids as COCO panoptic's RGB PNG (id = R + 256 G + 256² B)."""
        buffer = io.BytesIO()
        Image.fromarray(self.coco[0]).save(buffer, format="PNG")
        return buffer.getvalue()

    def draw(self, image: np.ndarray | Image.Image, alpha: float = 0.5) -> np.ndarray:
        """[H, W, 3] uint8: `image` with each segment tinted by class, instances in shades."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        palette = self.palette if self.palette is not None else default_palette(len(self.class_names))
        return draw_segments(pixels, self.masks(), self.labels.tolist(), palette, alpha)

    overlay = draw

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """`<name>.png`, the COCO panoptic PNG, and with `options.pictures` `<name>_overlay.jpg`."""
        path = folder / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png())
        if options.pictures:
            image = self.picture_of_source()
            if image is None:
                _logger.warning("no image file for %s: overlay skipped", name)
                return
            Image.fromarray(self.draw(image, options.alpha)).save(folder / f"{name}_overlay.jpg")

    def rows(self) -> list[dict[str, Any]]:
        """The image's COCO panoptic annotation: image_id, file_name (its PNG under the
        files folder, `output_name`), segments_info."""
        png = f"{self.output_name}.png" if self.output_name is not None else None
        return [{"image_id": self.image_id, "file_name": png, "segments_info": self.segments_info()}]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        """COCO panoptic's JSON of predictions: {"annotations": [...]}."""
        path.write_text(json.dumps({"annotations": rows}))

    def to_dict(self) -> dict[str, Any]:
        """Segments (id, class, name, category id, score, area, bbox) and the id map as
        base64 COCO panoptic PNG."""
        segments = [
            {**info, "class": int(label), "name": self.class_names[int(label)]}
            for info, label in zip(self.segments_info(), self.labels, strict=True)
        ]
        return {
            "task": "panoptic",
            "size": list(self.size),
            "source": self.source,
            "segments": segments,
            "id_map_png": base64.b64encode(self.png()).decode("ascii"),
        }


@dataclass(frozen=True)
class InstanceResult(Origin):
    """One image's instances at its original size, best first.

    Attributes:
        masks: [k, H, W] bool.
        scores: [k] float32.
        labels: [k] int64 class indices 0..K-1.
        class_names: names of the K classes.
        category_ids: the dataset's id of each class (COCO's 1..90), or None (1..K).
        palette: [K, 3] uint8 class colours.
        (and `Origin`'s source, index, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "instances.json"
    files_folder: ClassVar[str | None] = "drawn"

    masks: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    category_ids: list[int] | None = None
    palette: np.ndarray | None = field(default=None, kw_only=True, repr=False)

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[InstanceResult]:
        """An `InstancePrediction` (per image `InstanceMasks` at its original size) -> B results."""
        names = list(context.class_names)
        ids = context.labels.category_ids
        palette = context.labels.colours(len(names))
        return [
            cls(
                found.masks.cpu().numpy(),
                found.scores.float().cpu().numpy(),
                found.labels.cpu().numpy(),
                names,
                list(ids) if ids else None,
                palette=palette,
                **context.origin(i),
            )
            for i, found in enumerate(prediction.instances)
        ]

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def size(self) -> Size:
        return int(self.masks.shape[1]), int(self.masks.shape[2])

    def instances(self) -> InstanceMasks:
        return InstanceMasks(self.masks, self.labels, self.scores)

    def above(self, threshold: float) -> InstanceResult:
        """The instances scoring at least `threshold`."""
        keep = self.scores >= threshold
        return replace(self, masks=self.masks[keep], scores=self.scores[keep], labels=self.labels[keep])

    def draw(self, image: np.ndarray | Image.Image, alpha: float = 0.5) -> np.ndarray:
        """[H, W, 3] uint8: `image` with each instance tinted by class (filter first with `above`)."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        palette = self.palette if self.palette is not None else default_palette(len(self.class_names))
        # the best drawn last, on top
        return draw_segments(pixels, self.masks[::-1], self.labels[::-1].tolist(), palette, alpha)

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """With `options.pictures`, `<name>.jpg`: the image with its instances from
        `options.score_threshold` on."""
        image = self.picture_of_source() if options.pictures else None
        if image is None:
            return
        path = folder / f"{name}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.above(options.score_threshold).draw(image, options.alpha)).save(path)

    def rows(self) -> list[dict[str, Any]]:
        """COCO results entries (what `COCO.loadRes` reads): image_id, the dataset's
        category_id, segmentation (compressed RLE), score; and the image's file_name when it
        came from a folder.

        No bbox (`to_dict` has it): `loadRes` sets the area of entries that carry a box to the
        box's, overwriting any `area` given, and COCOeval(segm) would then put an unmatched
        mask in the small / medium / large range of its box, not of its pixels, which the
        reported figures count (detectron2 drops the box before mask evaluation for this
        reason). Without one, loadRes takes the mask's area and makes the box from the mask."""
        named = {"file_name": self.file_name} if self.file_name is not None else {}
        return [{**row, **named} for row in instance_results(self.instances(), self.image_id, self.category_ids)]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        path.write_text(json.dumps(rows))

    def to_dict(self) -> dict[str, Any]:
        """Instances (class, name, category id, score, bbox, RLE mask)."""
        instances = [
            {**row, "class": int(label), "name": self.class_names[int(label)], "bbox": rle_box(row["segmentation"])}
            for row, label in zip(
                instance_results(self.instances(), self.image_id, self.category_ids), self.labels, strict=True
            )
        ]
        return {"task": "instance", "size": list(self.size), "source": self.source, "instances": instances}
