"""Reading image files the way a user's camera or scanner wrote them, and predicting on a
folder of them.

`decode_image` turns any file Pillow reads into a [H, W, 3] uint8 RGB array:

- EXIF orientation is applied, so a phone photo is upright as every viewer shows it
  (`orientation` and `apply_orientation` let a label map follow its image);
- high-bit-depth pixels (16-bit PNG/TIFF, 32-bit integer, float) are scaled to 8 bits,
  not clipped (Pillow's own conversion clips 16-bit values, turning most pixels white);
- grayscale, palette, CMYK, RGBA and LA images are converted to RGB (alpha is dropped, as
  timm's and torchvision's loaders drop it).

`ImageFiles` is the dataset of unlabelled images every DataModule predicts on when given
`predict_dir`.
"""

from __future__ import annotations

import io
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from vitdense.core.errors import DataError

_logger = logging.getLogger(__name__)

#: file endings read as images (compared case-insensitively)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
#: EXIF tag 0x0112
_ORIENTATION_TAG = 274
#: Pillow modes of one channel wider than 8 bits, with the value that maps to 255
_WIDE_MODES = {"I;16": 65535, "I;16B": 65535, "I;16L": 65535, "I;16N": 65535, "I": 65535}


def orientation(img: Image.Image) -> int:
    """The EXIF orientation (1..8) of an opened image; 1 (upright) when it has none."""
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a malformed EXIF block must not make the image unreadable
        return 1
    return value if value in range(1, 9) else 1


def apply_orientation(array: np.ndarray, code: int) -> np.ndarray:
    """`array` ([H, W] or [H, W, C]) turned upright for EXIF orientation `code`, as
    `PIL.ImageOps.exif_transpose` turns the image (2: mirrored, 3: rotated 180, 6: rotated 90
    clockwise, ...)."""
    if code == 2:
        out = array[:, ::-1]
    elif code == 3:
        out = array[::-1, ::-1]
    elif code == 4:
        out = array[::-1]
    elif code == 5:
        out = array.swapaxes(0, 1)
    elif code == 6:
        out = np.rot90(array, -1)
    elif code == 7:
        out = array[::-1, ::-1].swapaxes(0, 1)
    elif code == 8:
        out = np.rot90(array, 1)
    else:
        return array
    return np.ascontiguousarray(out)


def to_rgb8(img: Image.Image) -> np.ndarray:
    """[H, W, 3] uint8 RGB pixels of an opened image, high bit depths scaled to 8 bits."""
    mode = img.mode
    if mode in _WIDE_MODES or mode == "F":
        values = np.asarray(img, dtype=np.float64)
        if mode == "F":  # float images: [0, 1] when they fit in it, else 8-bit-like values
            scale = 255.0 if values.max(initial=0.0) <= 1.0 else 1.0
        elif mode == "I" and values.max(initial=0) <= 255:  # 32-bit container of 8-bit values
            scale = 1.0
        else:
            scale = 255.0 / _WIDE_MODES[mode]
        gray = np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # (Pillow warns when a palette's transparency is dropped directly)
    return np.asarray(img.convert("RGB"))


def read_image(path: str | Path) -> tuple[np.ndarray, int]:
    """The pixels of an image file as stored ([H, W, 3] uint8 RGB, not yet oriented) and its
    EXIF orientation code.

    Raises:
        FileNotFoundError: no such file.
        DataError: the file is empty, corrupt, truncated or not an image; it is named so it
            can be replaced or deleted rather than silently skipped.
    """
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise DataError(f"{path}: empty file (0 bytes); replace or delete it")
        with Image.open(path) as img:
            # open() only reads the header; decoding happens here, so truncation surfaces here
            return to_rgb8(img), orientation(img)
    except (FileNotFoundError, DataError):
        raise
    except _UNREADABLE as err:
        raise DataError(f"{path}: corrupt or unreadable image ({err}); replace or delete the file") from err


def image_size(path: str | Path) -> tuple[int, int]:
    """(H, W) of an image file as `decode_image` returns it (upright by its EXIF orientation),
    read from the header alone (nothing is decoded).

    Raises:
        DataError: the file is not an image Pillow reads.
    """
    try:
        with Image.open(path) as img:
            width, height = img.size
            turned = orientation(img) in (5, 6, 7, 8)  # transposed or rotated a quarter turn
    except _UNREADABLE as err:
        raise DataError(f"{path}: corrupt or unreadable image ({err}); replace or delete the file") from err
    return (width, height) if turned else (height, width)


#: what Pillow raises for bytes that are not a whole image it can read
_UNREADABLE = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class ImageTooLarge(DataError):
    """An image of more pixels than the reader was allowed to decode."""


def decode_image_bytes(data: bytes, max_pixels: int | None = None) -> np.ndarray:
    """An encoded image (a file's bytes: JPEG, PNG, ...) as an upright [H, W, 3] uint8 RGB
    array, read as `decode_image` reads files.

    Raises:
        ImageTooLarge: its header declares more than `max_pixels` pixels (checked before decoding).
        DataError: empty, corrupt, truncated or not an image.
    """
    if not data:
        raise DataError("empty image (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLarge(f"an image of {width} x {height} pixels is over the limit of {max_pixels} pixels")
            return apply_orientation(to_rgb8(img), orientation(img))
    except DataError:
        raise
    except _UNREADABLE as err:
        why = "not a format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
        raise DataError(f"not an image that can be decoded ({why}); send a JPEG, PNG, TIFF, WebP or BMP file") from err


def decode_image(path: str | Path) -> np.ndarray:
    """Read an image file as an upright [H, W, 3] uint8 RGB array (see the module docstring)."""
    pixels, code = read_image(path)
    return apply_orientation(pixels, code)


def find_images(root: str | Path) -> list[Path]:
    """The image files under `root` (recursively, by `IMAGE_SUFFIXES`, hidden ones left out),
    sorted; other files are counted in the log, never silently passed over.

    Raises:
        FileNotFoundError: `root` is not a folder.
        DataError: it holds no image.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such folder of images to predict on (data.predict_dir)")
    images, others = [], []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        (images if path.suffix.lower() in IMAGE_SUFFIXES else others).append(path)
    if not images:
        raise DataError(f"{root}: no image files in it (looked for {', '.join(IMAGE_SUFFIXES)})")
    if others:
        shown = ", ".join(p.name for p in others[:5]) + (", ..." if len(others) > 5 else "")
        _logger.warning("%s: %d files that are not images left out (%s)", root, len(others), shown)
    return images


def unique_output_names(relative_paths: list[PurePath]) -> list[str]:
    """What `predict` names each image's outputs: its path (relative to its folder) without
    the suffix, so that outputs mirror the folder (sub/x.jpg -> sub/x.png); the suffix stays in
    the name where two images would share one (x.jpg and x.png -> x_jpg, x_png), so that no
    prediction overwrites another."""
    stems = [p.with_suffix("") for p in relative_paths]
    repeated = {s for s, n in Counter(stems).items() if n > 1}
    return [
        s.as_posix() if s not in repeated else f"{s.as_posix()}_{p.suffix.lstrip('.').lower()}"
        for s, p in zip(stems, relative_paths, strict=True)
    ]


class ImageFiles(Dataset):
    """Unlabelled images of any size and format from a folder, for prediction.

    Args:
        root: folder searched recursively (`find_images`).
        to_sample: `to_sample(image [H, W, 3] uint8, index)` -> the sample the task's
            `predict_step` takes; the DataModule supplies it with its evaluation transform.
    """

    def __init__(self, root: str | Path, to_sample: Callable[[np.ndarray, int], Any]) -> None:
        self.root = Path(root)
        self.image_paths = find_images(self.root)
        self.to_sample = to_sample
        #: each image's path relative to the folder (COCO results' `file_name` for a folder)
        self.file_names = [p.relative_to(self.root).as_posix() for p in self.image_paths]
        self.output_names = unique_output_names([p.relative_to(self.root) for p in self.image_paths])

    def __len__(self) -> int:
        return len(self.image_paths)

    def __getitem__(self, index: int) -> Any:
        return self.to_sample(decode_image(self.image_paths[index]), index)
