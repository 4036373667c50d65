"""Pictures of a task's predictions beside the ground truth, as training logs them each
validation epoch (`vitdense.viz.callbacks.ValidationImages` calls each task's `draw_batch`):
one function per task, each returning [H, W, 3] uint8 arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitdense.core.draw import (
    GREEN,
    RED,
    blend,
    caption,
    display_size,
    draw_boxes,
    draw_keypoints,
    draw_segments,
    hstack,
    legend,
    resize,
    tile,
    vstack,
)
from vitdense.pretrain import MaskedImageObjective, MaskedImageOutput, patchify, unpatchify


def draw_classified(
    pixels: Sequence[np.ndarray],
    labels: Sequence[int],
    probs: torch.Tensor,
    class_names: Sequence[str],
    columns: int = 4,
    side: int = 192,
) -> np.ndarray:
    """A grid of the images, each captioned with its true class and the predicted one with
    its probability: green where the prediction is right, red where it is wrong.

    pixels: B images [h, w, 3] uint8; labels: B true classes; probs: [B, K] softmax.
    """
    confidence, predicted = probs.float().max(-1)
    cells = []
    for image, label, pred, p in zip(pixels, labels, predicted.tolist(), confidence.tolist(), strict=True):
        colour = GREEN if pred == label else RED
        cells.append(
            caption(
                resize(image, (side, side)),
                [(f"true: {class_names[label]}", (0, 0, 0)), (f"pred: {class_names[pred]} {p:.2f}", colour)],
            )
        )
    return tile(cells, columns)


def draw_segmented(
    image: np.ndarray,
    truth: np.ndarray,
    predicted: np.ndarray,
    palette: np.ndarray,
    class_names: Sequence[str],
    ignore_index: int = 255,
) -> np.ndarray:
    """Image | ground truth overlay | prediction overlay, with a legend of the classes in
    either (unlabelled pixels of the ground truth are left untinted).

    image [h, w, 3] uint8 (resized to the label maps' size); truth, predicted [H, W] int.
    """
    size = display_size(truth.shape[:2])
    image = resize(image, size)
    truth = np.asarray(_nearest(truth, size))
    predicted = np.asarray(_nearest(predicted, size))
    panels = [image, blend(image, truth, palette, ignore_index=ignore_index), blend(image, predicted, palette)]
    row = hstack(
        [caption(p, [(t, (0, 0, 0))]) for p, t in zip(panels, ("image", "ground truth", "prediction"), strict=True)]
    )
    present = sorted({int(c) for c in np.unique(np.concatenate([truth.ravel(), predicted.ravel()]))} - {ignore_index})
    entries = [(class_names[c], palette[c]) for c in present if 0 <= c < len(class_names)]
    return vstack([row, legend(entries, row.shape[1])])


def draw_detected(
    image: np.ndarray,
    truth_boxes: np.ndarray,
    truth_labels: Sequence[int],
    boxes: np.ndarray,
    scores: Sequence[float],
    labels: Sequence[int],
    palette: np.ndarray,
    class_names: Sequence[str],
    score_threshold: float = 0.3,
    truth_keypoints: np.ndarray | None = None,
    keypoints: np.ndarray | None = None,
    skeleton: Sequence[tuple[int, int]] = (),
) -> np.ndarray:
    """Ground-truth boxes | predicted boxes with class names and scores (those of at least
    `score_threshold`), over the image at the boxes' size; with keypoints ([n, K, 3] / [k,
    K, 3]: x, y, v or score) their skeletons too (labelled ones; predicted ones scoring at
    least 0.5).

    image [h, w, 3] uint8 resized to the boxes' image; boxes [n, 4] absolute x1, y1, x2, y2.
    """
    size = display_size(image.shape[:2])
    scale = size[0] / image.shape[0]
    shown = resize(image, size)
    keep = [i for i, s in enumerate(scores) if s >= score_threshold]
    truth = draw_boxes(shown, np.asarray(truth_boxes) * scale, list(truth_labels), class_names, palette)
    predicted = draw_boxes(
        shown,
        np.asarray(boxes)[keep] * scale,
        [labels[i] for i in keep],
        class_names,
        palette,
        scores=[scores[i] for i in keep],
    )
    if truth_keypoints is not None and keypoints is not None:
        at_scale = np.asarray([scale, scale, 1.0], dtype=np.float32)
        colours = palette[np.asarray(list(truth_labels), dtype=np.int64) % len(palette)]
        truth = draw_keypoints(truth, np.asarray(truth_keypoints) * at_scale, skeleton, colours, threshold=1)
        colours = palette[np.asarray([labels[i] for i in keep], dtype=np.int64) % len(palette)]
        predicted = draw_keypoints(predicted, np.asarray(keypoints)[keep] * at_scale, skeleton, colours)
    return hstack(
        [
            caption(truth, [(f"ground truth ({len(truth_labels)})", (0, 0, 0))]),
            caption(predicted, [(f"prediction (score >= {score_threshold}: {len(keep)})", (0, 0, 0))]),
        ]
    )


def masked_panels(
    objective: MaskedImageObjective, output: MaskedImageOutput, images: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The pictures of a pre-training batch, each [B, C, h * P, w * P] in [0, 1]: the input;
    the input with the hidden patches grey (MAE's masked, or the paper's corrupted patches);
    for targets that are not the pixels themselves (the 3-bit mean colour) the true target
    on the hidden patches; and the prediction on the hidden patches (MAE: the
    reconstruction). Visible patches show the input.

    images: the normalised padded batch [B, C, H, W] the output was computed on.
    """
    target, mean, std = objective.target, objective.pixel_mean, objective.pixel_std
    original = (patchify(images, objective.patch_size).float() * std + mean).clamp(0, 1)  # [B, N, P * P, C]
    hidden = output.hidden[..., None, None]
    panels = {"input": original, "hidden (grey)": torch.where(hidden, torch.full_like(original, 0.5), original)}
    if target.draws_truth:
        panels["true target"] = torch.where(hidden, target.render(None, output.target, mean, std), original)
    panels["prediction"] = torch.where(hidden, target.render(output.pred.detach(), output.target, mean, std), original)
    grid = output.image_sizes.grid
    return {name: unpatchify(x, grid, objective.patch_size) for name, x in panels.items()}


def draw_masked_patches(
    objective: MaskedImageObjective, output: MaskedImageOutput, images: torch.Tensor
) -> list[np.ndarray]:
    """Per image, `masked_panels` side by side, each cut to the image and captioned."""
    pictures = masked_panels(objective, output, images)
    drawn = []
    for i, (h, w) in enumerate(output.image_sizes.at_stride(1).sizes):
        size = display_size((h, w), min_side=128, max_side=256)
        row = []
        for name, picture in pictures.items():
            pixels = (picture[i, :, :h, :w].permute(1, 2, 0) * 255).round().to(torch.uint8).cpu().numpy()
            row.append(caption(resize(pixels, size), [(name, (0, 0, 0))]))
        drawn.append(hstack(row))
    return drawn


def _nearest(labels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A label map resized by nearest neighbour (class values kept)."""
    if labels.shape[:2] == tuple(size):
        return labels
    rows = (np.arange(size[0]) * labels.shape[0] / size[0]).astype(int)
    cols = (np.arange(size[1]) * labels.shape[1] / size[1]).astype(int)
    return labels[rows[:, None], cols[None, :]]


def draw_panoptic(
    image: np.ndarray,
    truth: tuple[np.ndarray, Sequence[int]],
    predicted: tuple[np.ndarray, Sequence[int]],
    palette: np.ndarray,
    class_names: Sequence[str],
) -> np.ndarray:
    """Image | ground-truth segments | predicted segments (panoptic segments or instances),
    each tinted by class with outlines, with a legend of the classes in either.

    image [h, w, 3] uint8; truth and predicted: (masks [n, H, W] bool, labels [n]) at the
    image's original size.
    """
    size = display_size(truth[0].shape[1:] if len(truth[0]) else image.shape[:2])
    shown = resize(image, size)
    panels = [shown]
    for masks, labels in (truth, predicted):
        masks = np.stack([_nearest(m.astype(np.uint8), size) for m in masks]).astype(bool) if len(masks) else masks
        panels.append(draw_segments(shown, masks if len(masks) else np.zeros((0, *size), bool), list(labels), palette))
    titles = ("image", f"ground truth ({len(truth[1])})", f"prediction ({len(predicted[1])})")
    row = hstack([caption(p, [(t, (0, 0, 0))]) for p, t in zip(panels, titles, strict=True)])
    present = sorted({int(c) for c in [*truth[1], *predicted[1]]})
    return vstack([row, legend([(class_names[c], palette[c]) for c in present], row.shape[1])])


def draw_depth(image: np.ndarray, truth: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Image | ground truth | prediction, depth colourised on one scale (the ground truth's
    measured range: near red, far blue; pixels without a measurement black), at the depth
    maps' size.

    image [h, w, 3] uint8; truth, predicted [H, W] float metres (truth 0: no measurement).
    """
    from vitdense.core.draw import colourise

    size = display_size(truth.shape[:2])
    valid = truth > 0
    low, high = (float(truth[valid].min()), float(truth[valid].max())) if valid.any() else (0.0, 1.0)
    truth_drawn = colourise(truth, low, high, valid)
    predicted_drawn = colourise(predicted, low, high)
    panels = [resize(image, size), resize(truth_drawn, size), resize(predicted_drawn, size)]
    titles = ("image", f"ground truth {low:.2f}-{high:.2f} m", "prediction")
    return hstack([caption(p, [(t, (0, 0, 0))]) for p, t in zip(panels, titles, strict=True)])
