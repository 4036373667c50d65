"""Semantic segmentation's result: a label map [H, W] of class indices, its overlay; masks/<name>.png."""

from __future__ import annotations

import base64
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from vitdense.core.draw import blend
from vitdense.results.common import Origin, ResultContext, Size, WriteOptions

_logger = logging.getLogger(__name__)


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
