"""The result of depth estimation (`vitdense.results`' contract): one image's depth map.

    DepthResult  depth [H, W] float32 metres (or relative inverse depth) -> depth/<name>.png
                 (16-bit), depth/<name>_color.jpg, depth.csv

The 16-bit PNG is the datasets' own convention: metres times `png_scale` (NYU Depth v2:
1000, millimetres; KITTI: 256), 0 where nothing is stored, so BTS's `eval_with_pngs.py`
and DPT's evaluation read it as they read ground truth. A relative model's inverse depth
has no unit: its PNG spans 0..65535 over the image's own range, as MiDaS's and DPT's
`write_depth` store relative predictions.
"""

from __future__ import annotations

import base64
import csv
import io
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from vitdense.core.draw import colourise, hstack, resize
from vitdense.results.common import Origin, ResultContext, Size, WriteOptions

_logger = logging.getLogger(__name__)

#: largest value of a 16-bit PNG
UINT16_MAX = 65535


@dataclass(frozen=True)
class DepthResult(Origin):
    """One image's depth at its original size.

    Attributes:
        depth: [H, W] float32: metric depth in metres, or relative inverse depth (`relative`).
        relative: the map is inverse depth up to an unknown scale and shift (a model trained
            with MiDaS's loss), not metres.
        png_scale: stored units per metre in `png()` (1000: millimetres, NYU's; 256: KITTI's).
        (and `Origin`'s source, index, image_id, file_name)
    """

    table_name: ClassVar[str | None] = "depth.csv"
    files_folder: ClassVar[str | None] = "depth"

    depth: np.ndarray
    relative: bool = False
    png_scale: float = 1000.0

    @classmethod
    def from_prediction(cls, prediction: Any, context: ResultContext) -> list[DepthResult]:
        """A `DepthPrediction` (index [B], depth maps [h, w] at each image's size) -> B results."""
        return [
            cls(d.float().cpu().numpy(), prediction.relative, prediction.png_scale, **context.origin(i))
            for i, d in enumerate(prediction.depths)
        ]

    @property
    def size(self) -> Size:
        return int(self.depth.shape[0]), int(self.depth.shape[1])

    def stored(self) -> np.ndarray:
        """[H, W] uint16 as the PNG holds it: round(depth * png_scale), clipped to 0..65535
        (65535 / 1000 = 65.5 m in millimetres; 256 m for KITTI's scale); for a relative map,
        its range stretched over 0..65535 (DPT's `write_depth`, a constant map all 0)."""
        if self.relative:
            low, high = float(self.depth.min()), float(self.depth.max())
            spread = high - low
            scaled = (self.depth - low) / spread * UINT16_MAX if spread > np.finfo(np.float32).eps else 0 * self.depth
            return np.round(scaled).astype(np.uint16)
        return np.clip(np.round(self.depth.astype(np.float64) * self.png_scale), 0, UINT16_MAX).astype(np.uint16)

    def png(self) -> bytes:
        """The 16-bit greyscale PNG of `stored()`."""
        buffer = io.BytesIO()
        Image.fromarray(self.stored()).save(buffer, format="PNG")
        return buffer.getvalue()

    def draw(self, image: np.ndarray | Image.Image | None = None) -> np.ndarray:
        """[H, W, 3] uint8 colourised depth (near red, far blue; for a relative map, high
        inverse depth red), beside `image` (resized to the map) when given."""
        values = -self.depth if self.relative else self.depth  # inverse depth: high is near
        low, high = np.percentile(values, (1, 99)) if values.size else (0.0, 1.0)
        coloured = colourise(values, float(low), float(high))
        if image is None:
            return coloured
        pixels = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
        return hstack([resize(pixels, self.size), coloured])

    def write(self, folder: Path, name: str, options: WriteOptions) -> None:
        """`<name>.png`, the 16-bit depth PNG, and with `options.pictures` `<name>_color.jpg`:
        the image (when its file is known) beside its colourised depth."""
        path = folder / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.png())
        if options.pictures:
            image = self.picture_of_source()
            if image is None:
                _logger.info("no image file for %s: depth drawn alone", name)
            Image.fromarray(self.draw(image)).save(folder / f"{name}_color.jpg")

    def summary(self) -> dict[str, float]:
        """min, median and max of the map (metres, or relative inverse depth)."""
        return {k: float(f(self.depth)) for k, f in (("min", np.min), ("median", np.median), ("max", np.max))}

    def rows(self) -> list[dict[str, Any]]:
        """One CSV row: the image's index and file, its PNG (`output_name`), the PNG's scale
        (empty for a relative map) and the map's min, median and max."""
        return [
            {
                "index": self.index if self.index is not None else -1,
                "path": self.source or "",
                "png": f"{self.output_name}.png" if self.output_name is not None else "",
                "png_scale": "" if self.relative else self.png_scale,
                **{k: f"{v:.6f}" for k, v in self.summary().items()},
            }
        ]

    @classmethod
    def write_table(cls, rows: list[dict[str, Any]], path: Path) -> None:
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, list(rows[0]) if rows else ["index", "path"])
            writer.writeheader()
            writer.writerows(rows)

    def to_dict(self) -> dict[str, Any]:
        """The map as base64 16-bit PNG (`png()`), its scale and summary."""
        return {
            "task": "depth",
            "size": list(self.size),
            "source": self.source,
            "relative": self.relative,
            "png_scale": None if self.relative else self.png_scale,
            **self.summary(),
            "depth_png": base64.b64encode(self.png()).decode("ascii"),
        }
