"""What a task predicts for one image, as a typed result: the one place where a task
family says how its prediction becomes something people use.

A result type (`Result`) declares, for its family:

    from_prediction(prediction, context)  the task's `predict_step` output -> one result per image
    to_dict()                             plain JSON (what `python -m vitdense serve` answers)
    write(folder, name, options)          the image's own files (`python -m vitdense predict`)
    rows() / write_table(rows, path)      its lines in the run's table (CSV, COCO JSON), if any

and a task names its type (`BaseTask.result_type`); `vitdense.load`, `predict`'s writer
(`vitdense.callbacks.ResultWriter`) and the server hold no list of task types. The export
graph's outputs are the plain model's (`export_outputs` in `vitdense.models`).

    ClassificationResult  top-k classes, names, probabilities          -> classes.csv
    SegmentationResult    label map [H, W] (class indices), `overlay`  -> masks/<name>.png
    DetectionResult       boxes [k, 4] (x1, y1, x2, y2) pixels, scores  -> detections.json, drawn/

It imports nothing of Lightning: a result is plain NumPy and Python values.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
from PIL import Image

from vitdense.draw import blend, default_palette, draw_boxes
from vitdense.preprocess import LabelInfo

Size = tuple[int, int]

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResultContext:
    """What turning a batch's prediction into results needs beyond the prediction.

    Attributes:
        class_names: names of the K classes.
        labels: palette, dataset category ids and file convention (`LabelInfo`).
        sizes: each image's (H0, W0) as given (upright), in the batch's order.
        sources: each image's file, or None (arrays, tensors, PIL images).
        indexes: each image's position in the dataset predicted on, or None.
        image_ids: each image's id in its dataset (COCO's `image_id`), or None.
        file_names: each image's file name relative to the folder predicted on, or None.
        output_names: the name each image's files are written under (`predict`), or None.
    """

    class_names: Sequence[str]
    labels: LabelInfo
    sizes: Sequence[Size]
    sources: Sequence[str | None] = ()
    indexes: Sequence[int | None] = ()
    image_ids: Sequence[int | None] = ()
    file_names: Sequence[str | None] = ()
    output_names: Sequence[str | None] = ()

    def origin(self, i: int) -> dict[str, Any]:
        """Image `i`'s source, id and file name, as a result's keyword fields."""

        def at(values: Sequence[Any]) -> Any:
            return values[i] if i < len(values) else None

        return {
            "source": at(self.sources),
            "index": at(self.indexes),
            "image_id": at(self.image_ids),
            "file_name": at(self.file_names),
            "output_name": at(self.output_names),
        }


@dataclass(frozen=True)
class WriteOptions:
    """How `Result.write` writes an image's files: `pictures` (overlays, drawn boxes),
    boxes drawn from `score_threshold` on, colours blended with weight `alpha`."""

    pictures: bool = True
    score_threshold: float = 0.5
    alpha: float = 0.5


class Result(Protocol):
    """The contract of a task family's result type (see the module docstring)."""

    #: the run's table under `predict`'s output folder (None: none), and the folder of the images' files
    table_name: ClassVar[str | None]
    files_folder: ClassVar[str | None]
    source: str | None

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[Result]: ...

    def to_dict(self) -> dict[str, Any]: ...

    def write(self, folder: Path, name: str, options: WriteOptions) -> None: ...

    def rows(self) -> list[dict[str, Any]]: ...

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None: ...


@dataclass(frozen=True)
class Origin:
    """Where an image came from (keyword fields every result type has).

    Attributes:
        source: the file (None for arrays, tensors and PIL images).
        index: its position in the dataset predicted on, or None.
        image_id: its id in the dataset predicted on (COCO's `image_id`), or None.
        file_name: its file name relative to the folder predicted on, or None.
        output_name: the name its files are written under by `predict` (`write`'s `name`;
            tables that refer to the files use it), or None.
    """

    source: str | None = field(default=None, kw_only=True)
    index: int | None = field(default=None, kw_only=True)
    image_id: int | None = field(default=None, kw_only=True)
    file_name: str | None = field(default=None, kw_only=True)
    output_name: str | None = field(default=None, kw_only=True, repr=False)

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """No files of its own (a family with a table only)."""

    def rows(self) -> list[dict[str, Any]]:
        return []

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        """No table."""

    def picture_of_source(self) -> np.ndarray | None:
        """The image predicted on as upright [H, W, 3] uint8 (read from `source`), or None."""
        if self.source is None:
            return None
        from vitdense.data.images import decode_image  # (lazily: only where pictures are written)

        return decode_image(Path(self.source))


@dataclass(frozen=True)
class ClassificationResult(Origin):
    """The `k` most probable classes of one image, best first.

    Attributes:
        classes: class indices [k].
        names: their names [k] (the indices as text where the checkpoint has no names).
        probs: their softmax probabilities [k].
        size: the image's (H, W) as given (upright).
        (and `Origin`'s source, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "classes.csv"
    files_folder: ClassVar[str | None] = None

    classes: list[int]
    names: list[str]
    probs: list[float]
    size: Size

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[ClassificationResult]:
        """A `ClassPrediction` (index [B], probs and classes [B, k]) -> B results."""
        names = context.class_names
        return [
            cls(classes, [names[k] for k in classes], probs, tuple(size), **context.origin(i))
            for i, (classes, probs, size) in enumerate(
                zip(prediction.classes.tolist(), prediction.probs.float().tolist(), context.sizes, strict=True)
            )
        ]

    @property
    def label(self) -> int:
        """The most probable class."""
        return self.classes[0]

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def prob(self) -> float:
        return self.probs[0]

    def to_dict(self) -> dict[str, Any]:
        top = [{"class": c, "name": n, "prob": p} for c, n, p in zip(self.classes, self.names, self.probs, strict=True)]
        return {"task": "classification", "size": list(self.size), "source": self.source, "top_k": top}

    def rows(self) -> list[dict[str, Any]]:
        """One CSV row: the image's index in its dataset, its file, its height and width as
        given, then class_i, prob_i."""
        row: dict[str, Any] = {"index": self.index if self.index is not None else -1, "path": self.source or ""}
        row["height"], row["width"] = self.size
        for i, (name, prob) in enumerate(zip(self.names, self.probs, strict=True), 1):
            row[f"class_{i}"], row[f"prob_{i}"] = name, f"{prob:.6f}"
        return [row]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        with path.open("w", newline="") as file:
            columns = list(rows[0]) if rows else ["index", "path"]
            writer = csv.DictWriter(file, columns)
            writer.writeheader()
            writer.writerows(rows)


@dataclass(frozen=True)
class SegmentationResult(Origin):
    """The label map of one image at its original size.

    Attributes:
        label_map: [H, W] int64 class indices 0..K-1 (for ADE20K, the file convention is
            these + 1: `python -m vitdense predict` writes that; this is the class index).
        class_names: names of the K classes.
        palette: [K, 3] uint8 class colours (the dataset's, or fixed random ones).
        file_offset: added to class indices in files (1 for ADE20K's 1..150, 0 unlabelled).
        (and `Origin`'s source, image_id, file_name)
    """

    table_name: ClassVar[str | None] = None
    files_folder: ClassVar[str | None] = "masks"

    label_map: np.ndarray
    class_names: list[str]
    palette: np.ndarray = field(repr=False)
    file_offset: int = field(default=0, kw_only=True)

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[SegmentationResult]:
        """A `SegmentationPrediction` (index [B], label maps [h, w] at each image's size) -> B results."""
        names = list(context.class_names)
        palette = context.labels.colours(len(names))
        return [
            cls(labels.cpu().numpy(), names, palette, file_offset=context.labels.file_offset, **context.origin(i))
            for i, labels in enumerate(prediction.labels)
        ]

    @property
    def size(self) -> Size:
        return int(self.label_map.shape[0]), int(self.label_map.shape[1])

    def pixels(self) -> dict[str, int]:
        """Pixel count of each class present, by name, most frequent first."""
        counts = np.bincount(self.label_map.ravel(), minlength=len(self.class_names))
        order = np.argsort(-counts, kind="stable")
        return {self.class_names[i]: int(counts[i]) for i in order if counts[i] > 0}

    def overlay(self, image: np.ndarray | Image.Image, alpha: float = 0.5) -> np.ndarray:
        """[H, W, 3] uint8: `image` (the one predicted on, RGB; resized to the label map if
        it differs) tinted by each pixel's class colour."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        return blend(pixels, self.label_map, self.palette, alpha)

    def png(self, offset: int = 0) -> bytes:
        """The label map as a PNG: palette colours over class indices (8-bit), or 16-bit
        grey indices beyond 256 values. `offset` is added to every index (the dataset's file
        convention, `file_offset`; value 0 then has no class and is drawn black)."""
        stored = self.label_map + offset
        buffer = io.BytesIO()
        if len(self.class_names) + offset > 256:
            Image.fromarray(stored.astype(np.uint16)).save(buffer, format="PNG")
        else:
            picture = Image.fromarray(stored.astype(np.uint8))  # mode L; putpalette turns it into P
            colours = np.concatenate([np.zeros((offset, 3), np.uint8), self.palette]) if offset else self.palette
            picture.putpalette(colours.reshape(-1).tolist())
            picture.save(buffer, format="PNG")
        return buffer.getvalue()

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """`<name>.png`, the label map as the dataset's files store them (class + `file_offset`),
        and with `options.pictures` `<name>_overlay.jpg`, the image tinted by class."""
        path = folder / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png(self.file_offset))
        if options.pictures:
            image = self.picture_of_source()
            if image is None:
                _logger.warning("no image file for %s: overlay skipped", name)
                return
            Image.fromarray(self.overlay(image, options.alpha)).save(folder / f"{name}_overlay.jpg")

    def to_dict(self) -> dict[str, Any]:
        """The label map as base64 PNG of class indices, and the class table."""
        counts = np.bincount(self.label_map.ravel(), minlength=len(self.class_names))
        classes = [
            {"class": k, "name": name, "color": self.palette[k].tolist(), "pixels": int(counts[k])}
            for k, name in enumerate(self.class_names)
        ]
        return {
            "task": "segmentation",
            "size": list(self.size),
            "source": self.source,
            "label_map_png": base64.b64encode(self.png()).decode("ascii"),
            "classes": classes,
        }


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
