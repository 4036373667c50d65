"""Detection's result: boxes [k, 4] (x1, y1, x2, y2) in pixels, scores and labels; detections.json
(COCO results) and drawn/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from vitdense.core.draw import default_palette, draw_boxes
from vitdense.results.common import Origin, ResultContext, Size, WriteOptions


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

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[DetectionResult]:
        """`Detections` (per image boxes [k, 4] xyxy at its original size, scores, labels) -> B results."""
        names = list(context.class_names)
        ids = context.labels.category_ids
        palette = context.labels.colours(len(names))
        return [
            cls(
                boxes.float().cpu().numpy(),
                scores.float().cpu().numpy(),
                labels.cpu().numpy(),
                names,
                tuple(size),
                list(ids) if ids else None,
                palette=palette,
                **context.origin(i),
            )
            for i, (boxes, scores, labels, size) in enumerate(
                zip(prediction.boxes, prediction.scores, prediction.labels, context.sizes, strict=True)
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
        return replace(self, boxes=self.boxes[keep], scores=self.scores[keep], labels=self.labels[keep])

    def draw(self, image: np.ndarray | Image.Image, palette: np.ndarray | None = None) -> np.ndarray:
        """[H, W, 3] uint8: `image` with the boxes drawn, named and scored (filter first with `above`)."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        colours = palette if palette is not None else self.palette
        colours = colours if colours is not None else default_palette(len(self.class_names))
        return draw_boxes(pixels, self.boxes, self.labels.tolist(), self.class_names, colours, self.scores.tolist())

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
        `category_id` (1..K without ids), `bbox` [x, y, width, height] pixels, `score`; and
        the image's `file_name` when it came from a folder."""
        ids = self.category_ids or list(range(1, len(self.class_names) + 1))
        named = {"file_name": self.file_name} if self.file_name is not None else {}
        xywh = np.concatenate([self.boxes[:, :2], self.boxes[:, 2:] - self.boxes[:, :2]], axis=1)
        return [
            {"image_id": self.image_id, "category_id": ids[label], "bbox": box, "score": score, **named}
            for box, score, label in zip(xywh.tolist(), self.scores.tolist(), self.labels.tolist(), strict=True)
        ]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        path.write_text(json.dumps(rows))

    def to_dict(self) -> dict[str, Any]:
        detections = []
        for box, score, label in zip(self.boxes.tolist(), self.scores.tolist(), self.labels.tolist(), strict=True):
            found = {"box": box, "score": score, "class": label, "name": self.class_names[label]}
            if self.category_ids is not None:
                found["category_id"] = self.category_ids[label]
            detections.append(found)
        return {"task": "detection", "size": list(self.size), "source": self.source, "detections": detections}
