"""Matplotlib figures of `vitdense.viz.analysis` results, in the style of the ViT and DETR
papers. Each function returns a `matplotlib.figure.Figure` (no pyplot state, no display
needed); `save` writes it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

#: colour map of attention and similarity maps
CMAP = "inferno"


def save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    return path


def _overlay(ax, image: np.ndarray, heat: np.ndarray | None, title: str, alpha: float = 0.6) -> None:
    """`heat` (any grid) stretched over `image` [H, W, 3], normalised to its own range."""
    h, w = image.shape[:2]
    ax.imshow(image)
    if heat is not None:
        ax.imshow(heat, cmap=CMAP, alpha=alpha, extent=(0, w, h, 0), interpolation="bilinear")
    ax.set_title(title, fontsize=9)
    ax.axis("off")


def _grid(count: int, columns: int, size: float = 2.2) -> tuple[Figure, np.ndarray]:
    rows = max(1, -(-count // columns))
    columns = min(columns, count)
    figure = Figure(figsize=(size * columns, size * rows + 0.3))
    axes = np.atleast_1d(figure.subplots(rows, columns, squeeze=False)).reshape(-1)
    for ax in axes[count:]:
        ax.axis("off")
    return figure, axes


def attention_maps(image: np.ndarray, maps: torch.Tensor, titles: Sequence[str], columns: int = 6) -> Figure:
    """The image, then each map [k, h, w] stretched over it."""
    figure, axes = _grid(len(titles) + 1, columns)
    _overlay(axes[0], image, None, "image")
    for ax, heat, title in zip(axes[1 : 1 + len(maps)], maps.float().cpu().numpy(), titles, strict=True):
        _overlay(ax, image, heat, title)
    return figure


def attention_distance(distances: torch.Tensor, patch_size: int, img_size: int, title: str) -> Figure:
    """Mean attention distance [layers, heads] in pixels: one dot per head at each layer's
    depth (the paper's Figure 7, right)."""
    layers, heads = distances.shape
    figure = Figure(figsize=(5, 4))
    ax = figure.subplots()
    for head in range(heads):
        ax.scatter(np.arange(1, layers + 1), distances[:, head].cpu().numpy(), s=14, label=f"head {head + 1}")
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_ylim(0, img_size)
    ax.set_xticks(np.arange(1, layers + 1))
    ax.set_title(f"{title}\n{img_size} px inputs, {patch_size} px patches", fontsize=9)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    return figure


def pos_embed_similarity(similarity: torch.Tensor, title: str) -> Figure:
    """[h, w, h, w] cosine similarities as a grid of grids: the tile at (row i, column j)
    shows how position (i, j)'s embedding resembles every other (the paper's Figure 7,
    centre)."""
    h, w = similarity.shape[:2]
    figure = Figure(figsize=(min(12, 0.6 * w + 1.5), min(12, 0.6 * h + 0.8)))
    axes = figure.subplots(h, w, squeeze=False, gridspec_kw={"wspace": 0.05, "hspace": 0.05})
    image = None
    for i in range(h):
        for j in range(w):
            ax = axes[i, j]
            image = ax.imshow(similarity[i, j].cpu().numpy(), cmap="viridis", vmin=-1, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(str(i + 1), fontsize=7, rotation=0, labelpad=8)
            if i == h - 1:
                ax.set_xlabel(str(j + 1), fontsize=7)
    figure.supxlabel("input patch column", fontsize=9)
    figure.supylabel("input patch row", fontsize=9)
    figure.suptitle(f"position embedding similarity\n{title}", fontsize=9)
    figure.colorbar(image, ax=axes, shrink=0.6, label="cosine similarity")
    return figure


def filters(components: torch.Tensor, explained: torch.Tensor, title: str, columns: int = 7) -> Figure:
    """Principal components [k, C, P, P] of the patch-embedding filters, each scaled to its
    own range (RGB when C = 3, else the channels' mean), in order of explained variance
    (the paper's Figure 7, left)."""
    figure, axes = _grid(len(components), columns, size=1.1)
    for ax, component, share in zip(axes, components.cpu().numpy(), explained.tolist(), strict=False):
        picture = component.transpose(1, 2, 0) if component.shape[0] == 3 else component.mean(0)
        picture = (picture - picture.min()) / max(picture.max() - picture.min(), 1e-12)
        ax.imshow(picture, cmap=None if picture.ndim == 3 else "gray", interpolation="nearest")
        ax.set_title(f"{100 * share:.1f}%", fontsize=7)
        ax.axis("off")
    figure.suptitle(f"principal components of the patch embedding filters\n{title}", fontsize=9)
    return figure


def decoder_attention(
    image: np.ndarray,
    maps: torch.Tensor,
    boxes: torch.Tensor,
    captions: Sequence[str],
    columns: int = 4,
) -> Figure:
    """Each object query's cross-attention [q, h, w] over the image with its box (x1, y1,
    x2, y2 pixels of `image`), as in DETR's Figure 6."""
    figure, axes = _grid(len(captions) + 1, columns, size=2.6)
    _overlay(axes[0], image, None, "image")
    for ax, heat, box, text in zip(
        axes[1 : 1 + len(maps)], maps.float().cpu().numpy(), boxes.tolist(), captions, strict=True
    ):
        _overlay(ax, image, heat, text)
        ax.add_patch(Rectangle(box[:2], box[2] - box[0], box[3] - box[1], fill=False, edgecolor="cyan", lw=1.5))
    return figure


def class_masks(image: np.ndarray, masks: torch.Tensor, labels: torch.Tensor, titles: Sequence[str]) -> Figure:
    """The argmax label map over the image, then each class's mask [k, h, w] (its
    probability per patch, before the argmax)."""
    figure, axes = _grid(len(titles) + 1, 5, size=2.4)
    h, w = image.shape[:2]
    axes[0].imshow(image)
    axes[0].imshow(labels.cpu().numpy(), cmap="tab20", alpha=0.5, extent=(0, w, h, 0), interpolation="nearest")
    axes[0].set_title("argmax", fontsize=9)
    axes[0].axis("off")
    for ax, mask, title in zip(axes[1 : 1 + len(masks)], masks.float().cpu().numpy(), titles, strict=True):
        ax.imshow(image)
        ax.imshow(mask, cmap=CMAP, alpha=0.6, vmin=0, vmax=1, extent=(0, w, h, 0), interpolation="bilinear")
        ax.set_title(title, fontsize=9)
        ax.axis("off")
    return figure
