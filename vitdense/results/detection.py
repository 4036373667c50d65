"""Detection's result: boxes [k, 4] (x1, y1, x2, y2) in pixels, scores and labels, and with a
keypoint model each detection's keypoints; detections.json (COCO results, keypoint results
with keypoints) and drawn/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from vitdense.core.draw import default_palette, draw_boxes, draw_keypoints
from vitdense.results.common import Origin, ResultContext, Size, WriteOptions
from vitdense.types.keypoints import KeypointSchema


def keypoints_table(path: Path) -> Path:
    """Where a keypoint model's COCO keypoint results go beside its detections table `path`:
    detections.json -> detections.keypoints.json (each process's own, as its table)."""
    return path.with_name(f"{path.stem}.keypoints{path.suffix}")


@dataclass(frozen=True)
class DetectionResult(Origin):
    """The detections of one image, best first.

    Attributes:
        boxes: [k, 4] float32 absolute (x1, y1, x2, y2) pixels of the image as given.
        scores: [k] float32.
        labels: [k] int64 class indices 0..K-1.
        class_names: names of the K classes.
        size: the image's (H, W) as given (upright).
        category_ids: the dataset's own id of each class (COCO's 1..90), when it has them.
        palette: [K, 3] uint8 class colours for `draw` (None: fixed random ones).
        keypoints: with a keypoint model, [k, K, 3] float32 per detection and keypoint: (x,
            y) pixels of the image as given and the keypoint's score (its probability of
            being placed, "findable"); else None.
        keypoint_schema: the keypoints' names and skeleton (with `keypoints`).
        (and `Origin`'s source, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "detections.json"
    files_folder: ClassVar[str | None] = "drawn"

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    size: Size
    category_ids: list[int] | None = None
    palette: np.ndarray | None = field(default=None, kw_only=True, repr=False)
    keypoints: np.ndarray | None = field(default=None, kw_only=True)
    keypoint_schema: KeypointSchema | None = field(default=None, kw_only=True, repr=False)

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[DetectionResult]:
        """`Detections` (per image boxes [k, 4] xyxy at its original size, scores, labels, and
        keypoints [k, K, 3] or None) -> B results."""
        names = list(context.class_names)
        ids = context.labels.category_ids
        palette = context.labels.colours(len(names))
        keypoints = getattr(prediction, "keypoints", None) or [None] * len(prediction.boxes)
        recorded = context.labels.keypoints
        schema = KeypointSchema.from_dict(recorded) if recorded else None
        return [
            cls(
                boxes.float().cpu().numpy(),
                scores.float().cpu().numpy(),
                labels.cpu().numpy(),
                names,
                tuple(size),
                list(ids) if ids else None,
                palette=palette,
                keypoints=points.float().cpu().numpy() if points is not None else None,
                keypoint_schema=schema if points is not None else None,
                **context.origin(i),
            )
            for i, (boxes, scores, labels, points, size) in enumerate(
                zip(prediction.boxes, prediction.scores, prediction.labels, keypoints, context.sizes, strict=True)
            )
        ]

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def names(self) -> list[str]:
        return [self.class_names[k] for k in self.labels.tolist()]

    def above(self, threshold: float) -> DetectionResult:
        """The detections scoring at least `threshold`."""
        keep = self.scores >= threshold
        keypoints = self.keypoints[keep] if self.keypoints is not None else None
        return replace(
            self, boxes=self.boxes[keep], scores=self.scores[keep], labels=self.labels[keep], keypoints=keypoints
        )

    def draw(self, image: np.ndarray | Image.Image, palette: np.ndarray | None = None) -> np.ndarray:
        """[H, W, 3] uint8: `image` with the boxes drawn, named and scored, and their keypoints
        scoring at least 0.5 joined by the skeleton (filter first with `above`)."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        colours = palette if palette is not None else self.palette
        colours = colours if colours is not None else default_palette(len(self.class_names))
        drawn = draw_boxes(pixels, self.boxes, self.labels.tolist(), self.class_names, colours, self.scores.tolist())
        if self.keypoints is None:
            return drawn
        skeleton = self.keypoint_schema.skeleton if self.keypoint_schema is not None else ()
        return draw_keypoints(drawn, self.keypoints, skeleton, colours[self.labels % len(colours)])

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """With `options.pictures`, `<name>.jpg`: the image with its boxes from
        `options.score_threshold` on."""
        image = self.picture_of_source() if options.pictures else None
        if image is None:
            return
        path = folder / f"{name}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.above(options.score_threshold).draw(image)).save(path)

    def rows(self) -> list[dict[str, Any]]:
        """COCO results entries (what `COCO.loadRes` reads): `image_id`, the dataset's
        `category_id` (1..K without ids), `bbox` [x, y, width, height] pixels, `score`, with
        a keypoint model `keypoints` [x1, y1, s1, x2, ...] (COCO's keypoint results; COCOeval
        reads x and y, the third is each keypoint's score); and the image's `file_name` when
        it came from a folder."""
        ids = self.category_ids or list(range(1, len(self.class_names) + 1))
        named = {"file_name": self.file_name} if self.file_name is not None else {}
        xywh = np.concatenate([self.boxes[:, :2], self.boxes[:, 2:] - self.boxes[:, :2]], axis=1)
        rows = [
            {"image_id": self.image_id, "category_id": ids[label], "bbox": box, "score": score, **named}
            for box, score, label in zip(xywh.tolist(), self.scores.tolist(), self.labels.tolist(), strict=True)
        ]
        if self.keypoints is not None:
            for row, points in zip(rows, self.keypoints.reshape(len(rows), -1).tolist(), strict=True):
                row["keypoints"] = points
        return rows

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        """`path` (detections.json): the rows as they are; with keypoints also
        detections.keypoints.json beside it (`keypoints_table`), COCO's keypoint results
        (`image_id`, `category_id`, `keypoints`, `score`): without the `bbox`, which
        `COCO.loadRes` would otherwise read first, taking each detection's area from its box
        rather than from its keypoints' extent as COCO's own keypoint evaluation does (so
        AP_medium / AP_large would differ)."""
        path.write_text(json.dumps(rows))
        if rows and "keypoints" in rows[0]:
            keypoint_rows = [{k: v for k, v in row.items() if k != "bbox"} for row in rows]
            keypoints_table(path).write_text(json.dumps(keypoint_rows))

    def to_dict(self) -> dict[str, Any]:
        detections = []
        for i, (box, score, label) in enumerate(
            zip(self.boxes.tolist(), self.scores.tolist(), self.labels.tolist(), strict=True)
        ):
            found = {"box": box, "score": score, "class": label, "name": self.class_names[label]}
            if self.category_ids is not None:
                found["category_id"] = self.category_ids[label]
            if self.keypoints is not None:
                found["keypoints"] = self.keypoints[i].tolist()  # K x [x, y, score]
            detections.append(found)
        out = {"task": "detection", "size": list(self.size), "source": self.source, "detections": detections}
        if self.keypoint_schema is not None:
            out["keypoint_names"] = list(self.keypoint_schema.names)
        return out
