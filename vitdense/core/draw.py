"""Pictures of images, label maps and boxes as uint8 arrays (Pillow): what training logs
and prediction writers save. Everything here takes and returns [H, W, 3] uint8 arrays.

It imports nothing of vitdense, so that tasks (`draw_batch`), prediction writers and
`vitdense.viz` can all draw with it."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

#: text of captions and legends (pixels)
FONT_SIZE = 12
GREEN, RED, WHITE, BLACK = (40, 180, 60), (220, 40, 40), (255, 255, 255), (0, 0, 0)


def default_palette(num_classes: int, seed: int = 0) -> np.ndarray:
    """[K, 3] uint8 colours: random but fixed, for datasets that ship no palette."""
    return np.random.default_rng(seed).integers(0, 256, (num_classes, 3), dtype=np.uint8)


@cache
def font(size: int = FONT_SIZE) -> ImageFont.ImageFont:
    """Pillow's bundled font at `size` (its fixed bitmap font where FreeType is missing)."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ImportError, OSError):  # Pillow < 10.1 or without FreeType
        return ImageFont.load_default()


def denormalize(
    images: torch.Tensor, image_sizes: Sequence[tuple[int, int]], mean: Sequence[float], std: Sequence[float]
) -> list[np.ndarray]:
    """A padded normalised batch [B, 3, H, W] back to B uint8 pictures [h, w, 3], each cut
    to its own size (mean and std in [0, 1] units, as timm gives them)."""
    mean_t = torch.tensor(mean, dtype=torch.float32, device=images.device)[:, None, None]
    std_t = torch.tensor(std, dtype=torch.float32, device=images.device)[:, None, None]
    pixels = ((images.float() * std_t + mean_t) * 255).round().clamp(0, 255).to(torch.uint8)
    return [pixels[i, :, :h, :w].permute(1, 2, 0).cpu().numpy() for i, (h, w) in enumerate(image_sizes)]


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[h, w, 3] uint8 to (H, W), bilinear."""
    if image.shape[:2] == tuple(size):
        return image
    return np.asarray(Image.fromarray(image).resize((size[1], size[0]), Image.BILINEAR))


def display_size(size: tuple[int, int], min_side: int = 256, max_side: int = 384) -> tuple[int, int]:
    """(H, W) scaled so that the longer side lies within [min_side, max_side] (small
    images are enlarged so that their captions fit; large ones shrunk)."""
    h, w = size
    scale = min(max(1.0, min_side / max(h, w)), max_side / max(h, w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def blend(image: np.ndarray, labels: np.ndarray, palette: np.ndarray, alpha: float = 0.5, ignore_index: int = 255):
    """The image with each pixel tinted by its class colour; `ignore_index` pixels (and any
    label beyond the palette) are left as they are.

    image [H, W, 3] uint8 (resized to the labels' size if it differs); labels [H, W] int.
    """
    image = resize(image, labels.shape[:2]).astype(np.float32)
    known = (labels != ignore_index) & (labels >= 0) & (labels < len(palette))
    colours = palette[np.where(known, labels, 0)].astype(np.float32)
    out = np.where(known[..., None], (1 - alpha) * image + alpha * colours, image)
    return out.round().astype(np.uint8)


def draw_boxes(
    image: np.ndarray,
    boxes: np.ndarray | Sequence[Sequence[float]],
    labels: Sequence[int],
    names: Sequence[str] | None,
    palette: np.ndarray,
    scores: Sequence[float] | None = None,
    width: int = 2,
) -> np.ndarray:
    """Boxes (x1, y1, x2, y2) pixels drawn over a copy of `image`, each in its class colour
    with its class name (and score)."""
    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    for i, (box, label) in enumerate(zip(np.asarray(boxes).reshape(-1, 4).tolist(), labels, strict=True)):
        colour = tuple(int(c) for c in palette[int(label) % len(palette)])
        draw.rectangle(box, outline=colour, width=width)
        text = names[label] if names else str(label)
        if scores is not None:
            text += f" {scores[i]:.2f}"
        left, top, right, bottom = draw.textbbox((box[0], box[1]), text, font=font())
        y = box[1] - (bottom - top) - 2 if box[1] >= bottom - top + 2 else box[1]  # above the box where it fits
        draw.rectangle((left, y, right + 2, y + bottom - top + 2), fill=colour)
        draw.text((box[0] + 1, y), text, fill=_ink(colour), font=font())
    return np.asarray(picture)


def draw_keypoints(
    image: np.ndarray,
    keypoints: np.ndarray,
    skeleton: Sequence[tuple[int, int]],
    colours: np.ndarray,
    threshold: float = 0.5,
    radius: int = 2,
) -> np.ndarray:
    """Each object's keypoints [n, K, 3] (x, y pixels, score or visibility) drawn over a copy
    of `image` as dots joined by its `skeleton` (0-based index pairs), object i in
    `colours[i]`; a keypoint scoring below `threshold` (or v = 0) is left out with its bones."""
    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    for points, colour in zip(
        np.asarray(keypoints).reshape(len(keypoints), -1, 3) if len(keypoints) else [], colours, strict=True
    ):
        colour = tuple(int(c) for c in colour)
        shown = points[:, 2] >= threshold
        for a, b in skeleton:
            if shown[a] and shown[b]:
                draw.line([tuple(points[a, :2]), tuple(points[b, :2])], fill=colour, width=max(1, radius - 1))
        for x, y, _ in points[shown]:
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=colour, outline=_ink(colour))
    return np.asarray(picture)


def _ink(colour: Sequence[int]) -> tuple[int, int, int]:
    """Black or white, whichever reads better on `colour`."""
    return BLACK if 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2] > 140 else WHITE


def caption(image: np.ndarray, lines: Sequence[tuple[str, tuple[int, int, int]]]) -> np.ndarray:
    """`image` with text lines, each in its colour, on a white band below it."""
    line_height = FONT_SIZE + 4
    band = Image.new("RGB", (image.shape[1], line_height * len(lines) + 2), WHITE)
    draw = ImageDraw.Draw(band)
    for i, (text, colour) in enumerate(lines):
        draw.text((2, 1 + i * line_height), text, fill=colour, font=font())
    return np.concatenate([image, np.asarray(band)], axis=0)


def legend(entries: Sequence[tuple[str, Sequence[int]]], width: int) -> np.ndarray:
    """A white band `width` pixels wide with a colour swatch and a name per entry, wrapped
    into as many rows as needed."""
    line_height, swatch = FONT_SIZE + 6, FONT_SIZE
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    placed, x, row = [], 2, 0
    for name, colour in entries:
        item = swatch + 4 + int(measure.textlength(name, font=font())) + 10
        if x + item > width and x > 2:
            x, row = 2, row + 1
        placed.append((x, row, name, colour))
        x += item
    band = Image.new("RGB", (width, line_height * (row + 1) + 2), WHITE)
    draw = ImageDraw.Draw(band)
    for x, row, name, colour in placed:
        y = 2 + row * line_height
        draw.rectangle((x, y, x + swatch, y + swatch), fill=tuple(int(c) for c in colour), outline=BLACK)
        draw.text((x + swatch + 4, y), name, fill=BLACK, font=font())
    return np.asarray(band)


def hstack(images: Sequence[np.ndarray], gap: int = 4) -> np.ndarray:
    """Images side by side, top-aligned, on white."""
    height = max(i.shape[0] for i in images)
    width = sum(i.shape[1] for i in images) + gap * (len(images) - 1)
    out = np.full((height, width, 3), 255, np.uint8)
    x = 0
    for image in images:
        out[: image.shape[0], x : x + image.shape[1]] = image
        x += image.shape[1] + gap
    return out


def vstack(images: Sequence[np.ndarray], gap: int = 0) -> np.ndarray:
    """Images one above the other, left-aligned, on white (hstack of the transposed images)."""
    stacked = hstack([image.transpose(1, 0, 2) for image in images], gap)
    return np.ascontiguousarray(stacked.transpose(1, 0, 2))


def tile(images: Sequence[np.ndarray], columns: int, gap: int = 4) -> np.ndarray:
    """Images in rows of `columns`."""
    rows = [hstack(images[i : i + columns], gap) for i in range(0, len(images), columns)]
    return vstack(rows, gap)


def draw_segments(
    image: np.ndarray, masks: np.ndarray, labels: Sequence[int], palette: np.ndarray, alpha: float = 0.5
) -> np.ndarray:
    """The image with each segment tinted by its class colour, instances of a class in
    shades of it, and every segment's outline dark, so that touching instances stay apart.

    image [H, W, 3] uint8 (resized to the masks' size if it differs); masks [n, H, W] bool
    (instances may overlap: later ones are drawn over earlier ones); labels [n] classes.
    """
    size = masks.shape[1:] if len(masks) else image.shape[:2]
    out = resize(image, tuple(size)).astype(np.float32)
    seen: dict[int, int] = {}
    for mask, label in zip(masks, labels, strict=True):
        k = seen[label] = seen.get(label, -1) + 1
        shade = 1.0 - 0.35 * ((k * 0.618) % 1.0)  # the golden ratio spreads the shades of many instances
        colour = palette[label % len(palette)].astype(np.float32) * shade
        out[mask] = (1 - alpha) * out[mask] + alpha * colour
        inner = mask.copy()
        inner[1:] &= mask[:-1]
        inner[:-1] &= mask[1:]
        inner[:, 1:] &= mask[:, :-1]
        inner[:, :-1] &= mask[:, 1:]
        out[mask & ~inner] *= 0.3
    return out.round().astype(np.uint8)


def colourise(values: np.ndarray, low: float, high: float, valid: np.ndarray | None = None) -> np.ndarray:
    """[H, W] values (depth) -> [H, W, 3] uint8 on matplotlib's "turbo_r" colour map over
    [low, high] (near red, far blue); pixels not `valid` (no measurement) are black."""
    from matplotlib import colormaps  # (lazily: only where depth is drawn)

    span = max(high - low, 1e-12)
    scaled = np.clip((np.nan_to_num(values.astype(np.float64), nan=high) - low) / span, 0, 1)
    lut = (colormaps["turbo_r"](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)
    pixels = lut[(scaled * 255).round().astype(np.int64)]
    if valid is not None:
        pixels[~valid] = 0
    return pixels
