"""What inference needs from the data a model was trained on, as two small records that a
checkpoint carries: `Preprocess` (how an image becomes the model's input) and `LabelInfo`
(how predicted labels are shown and written). `vitdense.load`, `python -m vitdense serve`
and `export` build from these alone: no DataModule, dataset module or albumentations is
imported to predict.

    Preprocess(resize="short_side", size=800, max_size=1333, mean=..., std=...)(pixels)
        [H, W, 3] uint8 RGB -> [3, H', W'] float32, normalised

The resize rules are those of the DataModules' evaluation transforms (the same cv2 calls
and the same normalisation arithmetic, so the numbers are equal; tested against them):

    center_crop   timm's eval: shorter side to int(size / crop_pct) (bicubic), centre size x size
    short_side    DETR's: shorter side `size`, lowered so the longer stays <= `max_size`
    rescale       mmseg's keep-ratio bound (`max_size`, `size`): long <= max_size, short <= size
    square        RF-DETR's: size x size, the aspect ratio not kept
    none          as given
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np
import torch

from vitdense.core.errors import ConfigError

Resize = Literal["center_crop", "short_side", "rescale", "square", "none"]
RESIZES: tuple[str, ...] = ("center_crop", "short_side", "rescale", "square", "none")
#: cv2's interpolation flags by name (cv2.INTER_LINEAR == 1, cv2.INTER_CUBIC == 2)
INTERPOLATIONS = {"bilinear": 1, "bicubic": 2}

#: where a checkpoint keeps the records (beside Lightning's own keys)
CHECKPOINT_KEY = "vitdense_inference"


def short_side_size(height: int, width: int, short_side: int, max_size: int | None) -> tuple[int, int]:
    """DETR's `get_size_with_aspect_ratio`: (H', W') with the shorter side `short_side`,
    lowered so that the longer side stays <= `max_size`."""
    if max_size is not None:
        low, high = min(height, width), max(height, width)
        if high / low * short_side > max_size:
            short_side = int(round(max_size * low / high))
    if width < height:
        return int(short_side * height / width), short_side
    return short_side, int(short_side * width / height)


def rescale_size(height: int, width: int, scale: tuple[int, int]) -> tuple[int, int]:
    """(new_height, new_width) of an image rescaled to fit `scale`, keeping its aspect ratio.

    mmcv's `rescale_size` rule: the long side ends up <= max(scale) and the short side <=
    min(scale), whichever binds first, each side rounded half up. The order of `scale` does
    not matter: (2048, 512) and (512, 2048) are the same bound.
    """
    factor = min(max(scale) / max(height, width), min(scale) / min(height, width))
    # a sliver such as 1 x 4000 px would otherwise round to 0 and break cv2.resize
    return max(1, int(height * factor + 0.5)), max(1, int(width * factor + 0.5))


@dataclass(frozen=True)
class Preprocess:
    """A DataModule's evaluation preprocessing of one image, as plain data.

    Args:
        resize: the rule (module docstring).
        size: the rule's side: crop side, shorter side, short bound or square side.
        max_size: the longer side's bound (`short_side`: None for none; `rescale`: required).
        crop_pct: `center_crop`'s fraction (1: the whole shorter side).
        mean, std: per channel in [0, 1] units (timm's).
        interpolation: "bilinear" or "bicubic" (cv2's).
    """

    resize: Resize
    size: int | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    max_size: int | None = None
    crop_pct: float = 1.0
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"

    def __post_init__(self) -> None:
        if self.resize not in RESIZES:
            raise ConfigError(f"Preprocess resize={self.resize!r}: expected one of {', '.join(RESIZES)}")
        if self.resize != "none" and (self.size is None or self.size < 1):
            raise ConfigError(f"Preprocess resize={self.resize!r} needs a positive size, not {self.size}")
        if self.resize == "rescale" and self.max_size is None:
            raise ConfigError("Preprocess resize='rescale' needs max_size (the long side's bound)")
        if not 0 < self.crop_pct <= 1:
            raise ConfigError(
                f"crop_pct={self.crop_pct}: the centre crop is a fraction of the resized image, in (0, 1]"
            )
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={self.interpolation!r}: expected one of {', '.join(INTERPOLATIONS)}")
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(H', W') of the model's input for an image of (height, width) before any crop."""
        if self.resize == "short_side":
            return short_side_size(height, width, self.size, self.max_size)
        if self.resize == "rescale":
            return rescale_size(height, width, (self.max_size, self.size))
        if self.resize == "square":
            return self.size, self.size
        if self.resize == "center_crop":
            # albumentations' SmallestMaxSize: both sides scaled, each rounded (Python's round)
            scale = int(self.size / self.crop_pct) / min(height, width)
            return max(1, round(height * scale)), max(1, round(width * scale))
        return height, width

    def __call__(self, pixels: np.ndarray) -> torch.Tensor:
        """[H, W, 3] uint8 RGB -> [3, H', W'] float32 normalised (contiguous)."""
        import cv2  # (here: importing the module costs nothing until an image is processed)

        height, width = pixels.shape[:2]
        target = self.output_size(height, width)
        if target != (height, width):
            pixels = cv2.resize(pixels, target[::-1], interpolation=INTERPOLATIONS[self.interpolation])
        if self.resize == "center_crop":
            h, w = pixels.shape[:2]
            top, left = (h - self.size) // 2, (w - self.size) // 2
            pixels = pixels[top : top + self.size, left : left + self.size]
        # albumentations' Normalize on uint8: a float32 table per channel, (v - 255 mean) / (255 std)
        mean = np.asarray(self.mean, dtype=np.float32) * 255.0
        scale = np.reciprocal(np.asarray(self.std, dtype=np.float32) * 255.0)
        table = (np.arange(256, dtype=np.float32)[None, :] - mean[:, None]) * scale[:, None]  # [3, 256]
        image = np.stack([table[c][pixels[..., c]] for c in range(3)])  # [3, H', W']
        return torch.from_numpy(np.ascontiguousarray(image))

    def as_data(self) -> dict[str, Any]:
        """Plain data (a checkpoint's `weights_only` load reads it back)."""
        data = asdict(self)
        data["mean"], data["std"] = list(self.mean), list(self.std)
        return data

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Preprocess:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class LabelInfo:
    """How predicted labels are shown and written, from the data trained on.

    Args:
        palette: [K, 3] class colours (0..255), or None (a fixed random palette).
        category_ids: the dataset's own id of each class (COCO's 1..90), or None.
        file_offset: added to a class index where label maps are written to files (1 for
            ADE20K, which stores classes as 1..150 and 0 as unlabelled).
        keypoints: the objects' keypoints (names, skeleton, flips, OKS sigmas) for a model
            trained on a keypoint dataset, as plain data (`KeypointSchema.to_dict()`), else None.
    """

    palette: tuple[tuple[int, int, int], ...] | None = None
    category_ids: tuple[int, ...] | None = None
    file_offset: int = 0
    keypoints: dict[str, Any] | None = None

    def colours(self, num_classes: int) -> np.ndarray:
        """[K, 3] uint8: the palette, or `default_palette(num_classes)`."""
        from vitdense.core.draw import default_palette

        return np.asarray(self.palette, dtype=np.uint8) if self.palette is not None else default_palette(num_classes)

    def as_data(self) -> dict[str, Any]:
        return {
            "palette": [list(map(int, c)) for c in self.palette] if self.palette is not None else None,
            "category_ids": list(self.category_ids) if self.category_ids is not None else None,
            "file_offset": self.file_offset,
            "keypoints": self.keypoints,
        }

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> LabelInfo:
        palette = data.get("palette")
        ids = data.get("category_ids")
        return cls(
            tuple(tuple(int(v) for v in c) for c in palette) if palette is not None else None,
            tuple(int(i) for i in ids) if ids is not None else None,
            int(data.get("file_offset", 0)),
            data.get("keypoints") or None,
        )

    @classmethod
    def of(cls, datamodule: Any) -> LabelInfo:
        """What a DataModule says of its labels (`palette`, `category_ids`, `reduce_zero_label`)."""
        palette = getattr(datamodule, "palette", None)
        ids = getattr(datamodule, "category_ids", None)
        return cls(
            tuple(tuple(int(v) for v in c) for c in np.asarray(palette).tolist()) if palette is not None else None,
            tuple(int(i) for i in ids) if ids else None,
            1 if getattr(datamodule, "reduce_zero_label", False) else 0,
            schema.to_dict() if (schema := getattr(datamodule, "keypoint_schema", None)) is not None else None,
        )


@dataclass(frozen=True)
class InferenceData:
    """Both records, as a checkpoint keeps them under `CHECKPOINT_KEY`."""

    preprocess: Preprocess
    labels: LabelInfo = LabelInfo()

    def as_data(self) -> dict[str, Any]:
        return {"preprocess": self.preprocess.as_data(), "labels": self.labels.as_data()}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> InferenceData:
        return cls(Preprocess.from_data(data["preprocess"]), LabelInfo.from_data(data.get("labels") or {}))

    @classmethod
    def of(cls, datamodule: Any) -> InferenceData | None:
        """A DataModule's records, or None where it declares no `preprocess()`."""
        preprocess = getattr(datamodule, "preprocess", None)
        made = preprocess() if callable(preprocess) else None
        return cls(made, LabelInfo.of(datamodule)) if made is not None else None


@dataclass(frozen=True)
class PredictSample:
    """An image to predict on as its task takes it: `make(preprocess(pixels), (H0, W0),
    index)`, where `make` is the task's `predict_sample` and (H0, W0) the image's own size.
    The one route from pixels to a sample, for `vitdense.load` and for `python -m vitdense
    predict` on a folder alike, so that a task predicting on a sample of its own kind gets
    it from both (a dataclass of a bound method and plain data: it pickles into loader
    workers).

    Args:
        make: `make(image [3, H, W] preprocessed, (H0, W0), index)` -> the sample.
        preprocess: the evaluation preprocessing ([H, W, 3] uint8 -> [3, H', W'] float).
    """

    make: Any
    preprocess: Any

    def __call__(self, pixels: np.ndarray, index: int) -> Any:
        return self.make(self.preprocess(pixels), tuple(pixels.shape[:2]), index)
