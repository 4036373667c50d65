"""What a predictor (`vitdense.load`) returns for one image: typed results at the image's
original size, with class names, each convertible to plain JSON (`to_dict`, what
`python -m vitdense serve` answers).

    ClassificationResult  top-k classes, names, probabilities
    SegmentationResult    label map [H, W] (class indices), names, `overlay`, PNG for JSON
    DetectionResult       boxes [k, 4] (x1, y1, x2, y2) pixels, scores, labels, names

It imports nothing of Lightning: a result is plain NumPy and Python values.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from vitdense.draw import blend, default_palette, draw_boxes

Size = tuple[int, int]


@dataclass(frozen=True)
class ClassificationResult:
    """The `k` most probable classes of one image, best first.

    Attributes:
        classes: class indices [k].
        names: their names [k] (the indices as text where the checkpoint has no names).
        probs: their softmax probabilities [k].
        size: the image's (H, W) as given (upright).
        source: the file it came from (None for arrays, tensors and PIL images).
    """

    classes: list[int]
    names: list[str]
    probs: list[float]
    size: Size
    source: str | None = None

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


@dataclass(frozen=True)
class SegmentationResult:
    """The label map of one image at its original size.

    Attributes:
        label_map: [H, W] int64 class indices 0..K-1 (for ADE20K, the file convention is
            these + 1: `python -m vitdense predict` writes that; this is the class index).
        class_names: names of the K classes.
        palette: [K, 3] uint8 class colours (the dataset's, or fixed random ones).
        source: the file it came from (None for arrays, tensors and PIL images).
    """

    label_map: np.ndarray
    class_names: list[str]
    palette: np.ndarray = field(repr=False)
    source: str | None = None

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

    def png(self) -> bytes:
        """The label map as a PNG: palette colours over class indices (8-bit), or 16-bit
        grey indices beyond 256 classes."""
        buffer = io.BytesIO()
        if len(self.class_names) > 256:
            Image.fromarray(self.label_map.astype(np.uint16)).save(buffer, format="PNG")
        else:
            picture = Image.fromarray(self.label_map.astype(np.uint8))
            picture.putpalette(self.palette.reshape(-1).tolist())
            picture.save(buffer, format="PNG")
        return buffer.getvalue()

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
class DetectionResult:
    """The detections of one image, best first.

    Attributes:
        boxes: [k, 4] float32 absolute (x1, y1, x2, y2) pixels of the image as given.
        scores: [k] float32.
        labels: [k] int64 class indices 0..K-1.
        class_names: names of the K classes.
        size: the image's (H, W) as given (upright).
        category_ids: the dataset's own id of each class (COCO's 1..90), when it has them.
        source: the file it came from (None for arrays, tensors and PIL images).
    """

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    size: Size
    category_ids: list[int] | None = None
    source: str | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def names(self) -> list[str]:
        return [self.class_names[k] for k in self.labels.tolist()]

    def above(self, threshold: float) -> DetectionResult:
        """The detections scoring at least `threshold`."""
        keep = self.scores >= threshold
        return DetectionResult(
            self.boxes[keep], self.scores[keep], self.labels[keep], self.class_names, self.size, self.category_ids,
            self.source,
        )  # fmt: skip

    def draw(self, image: np.ndarray | Image.Image, palette: np.ndarray | None = None) -> np.ndarray:
        """[H, W, 3] uint8: `image` with the boxes drawn, named and scored (filter first with `above`)."""
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        colours = palette if palette is not None else default_palette(len(self.class_names))
        return draw_boxes(pixels, self.boxes, self.labels.tolist(), self.class_names, colours, self.scores.tolist())

    def to_dict(self) -> dict[str, Any]:
        detections = []
        for box, score, label in zip(self.boxes.tolist(), self.scores.tolist(), self.labels.tolist(), strict=True):
            found = {"box": box, "score": score, "class": label, "name": self.class_names[label]}
            if self.category_ids is not None:
                found["category_id"] = self.category_ids[label]
            detections.append(found)
        return {"task": "detection", "size": list(self.size), "source": self.source, "detections": detections}


Result = ClassificationResult | SegmentationResult | DetectionResult
