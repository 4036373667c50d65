"""The types every family shares: the sizes a padded batch carries (`ImageSizes`) and the
losses a task returns (`Losses`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

Size = tuple[int, int]


def _int(value: int | torch.SymInt) -> int:
    # sizes traced symbolically (torch.export with dynamic height/width) stay symbolic
    return value if isinstance(value, torch.SymInt) else int(value)


def _pair(value: int | Sequence[int]) -> Size:
    return (_int(value), _int(value)) if isinstance(value, (int, torch.SymInt)) else (_int(value[0]), _int(value[1]))


def _ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive ints, also symbolic ones (no float in between)."""
    return -(-a // b)


class SameSize:
    """The sizes of `count` images of one `size` where `count` is symbolic (`torch.export`
    with a dynamic batch): `ImageSizes.full`'s `sizes` then, since a tuple of B sizes needs
    B as a Python int, and reading it would fix the graph's batch to the example's.

    Whatever looks at the images one by one (len, iteration, indexing) cannot be traced for
    any batch: it raises here, and the export falls back to a batch of 1, saying why."""

    def __init__(self, size: Size, count: torch.SymInt) -> None:
        self.size = size
        self.count = count

    def _refuse(self, *_) -> None:
        raise TypeError(
            "ImageSizes of a symbolic batch (torch.export with a dynamic batch) cannot be read image by image: "
            "use ImageSizes.batch, has_padding, grids_tensor() or mask()"
        )

    __len__ = __iter__ = __getitem__ = _refuse

    def __repr__(self) -> str:
        return f"SameSize({self.size}, count={self.count})"


class ImageSizes(NamedTuple):
    """The padding contract: the size of every image of a batch padded right and bottom.

    Sizes are Python ints (no device tensor is read back to the host to learn them). The
    same object describes the batch at any stride: `at_stride(16)` is the view of a ViT
    with 16 x 16 patches, where a token is padding if it covers only padding pixels (the
    last row of an image whose height is not a multiple of 16 is part image, part padding,
    and counts as image, as when the image is encoded alone).

    Attributes:
        sizes: (H_i, W_i) of each image in pixels, before padding; a `SameSize` for images of
            one size whose number is symbolic (an export with a dynamic batch).
        padded: (H, W) of the padded batch in pixels.
        stride: pixels per position (h, w) of the level this object describes (1: pixels).
    """

    sizes: tuple[Size, ...] | SameSize
    padded: Size
    stride: Size = (1, 1)

    @classmethod
    def of(cls, sizes: Sequence[Sequence[int]]) -> ImageSizes:
        """The sizes of images padded to the largest height and width among them."""
        pairs = tuple(_pair(s) for s in sizes)
        if not pairs:
            raise ValueError("ImageSizes.of needs at least one size")
        return cls(pairs, (max(h for h, _ in pairs), max(w for _, w in pairs)))

    @classmethod
    def full(cls, batch: int | torch.SymInt, size: Sequence[int]) -> ImageSizes:
        """`batch` images of the same size: no padding. A symbolic `batch` (torch.export)
        stays symbolic: the sizes are then a `SameSize`."""
        if isinstance(batch, torch.SymInt):
            return cls(SameSize(_pair(size), batch), _pair(size))
        return cls((_pair(size),) * batch, _pair(size))

    @property
    def batch(self) -> int | torch.SymInt:
        """The number of images (symbolic in an export with a dynamic batch)."""
        return self.sizes.count if isinstance(self.sizes, SameSize) else len(self.sizes)

    def at_stride(self, stride: int | Sequence[int]) -> ImageSizes:
        """The same batch seen at `stride` pixels per position (e.g. a ViT's patch size)."""
        return self._replace(stride=_pair(stride))

    @property
    def grids(self) -> tuple[Size, ...] | SameSize:
        """Each image's extent in positions at this stride: (ceil(H_i / s_h), ceil(W_i / s_w))."""
        sh, sw = self.stride
        if isinstance(self.sizes, SameSize):
            (h, w), count = self.sizes.size, self.sizes.count
            return SameSize((_ceil_div(h, sh), _ceil_div(w, sw)), count)
        return tuple((_ceil_div(h, sh), _ceil_div(w, sw)) for h, w in self.sizes)

    @property
    def grid(self) -> Size:
        """The padded batch's extent in positions at this stride."""
        return _ceil_div(self.padded[0], self.stride[0]), _ceil_div(self.padded[1], self.stride[1])

    @property
    def has_padding(self) -> bool:
        """Whether any position at this stride is padding."""
        grids = self.grids
        if isinstance(grids, SameSize):
            return grids.size != self.grid
        return any(g != self.grid for g in grids)

    def grids_tensor(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
        """`grids` as a tensor [B, 2] (rows, cols), int64 unless `dtype` says otherwise; built by
        tensor ops for a symbolic batch (it stays symbolic in an exported graph)."""
        grids = self.grids
        if isinstance(grids, SameSize):
            return torch.tensor([grids.size], dtype=dtype, device=device).expand(grids.count, 2)
        return torch.tensor(grids, dtype=dtype, device=device)

    def mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[B, h, w] bool at this stride, True on padding positions."""
        h, w = self.grid
        limits = self.grids_tensor(device=device)  # [B, 2]
        rows = torch.arange(h, device=device)[None, :, None] >= limits[:, 0, None, None]
        cols = torch.arange(w, device=device)[None, None, :] >= limits[:, 1, None, None]
        return rows | cols

    def valid_ratios(self, device: torch.device | str | None = None) -> torch.Tensor:
        """[B, 2] float: each image's share of the padded grid along (h, w) at this stride
        (Deformable DETR's valid ratios)."""
        grid = torch.tensor(self.grid, dtype=torch.float32, device=device)
        return self.grids_tensor(torch.float32, device) / grid


class LossSum(NamedTuple):
    """A batch's share of a loss that is normalised by something other than its images:
    the loss summed over the batch (numerator) and what that sum is divided by
    (denominator: labelled pixels, target boxes, the class weights of the queries), both
    on this process and batch, scalars (tensors or floats)."""

    numerator: torch.Tensor | float
    denominator: torch.Tensor | float


class Losses(NamedTuple):
    """What `BaseTask.compute_loss` returns: the total that is optimised and its named
    terms (already weighted, e.g. `loss_ce`, `loss_bbox`, `loss_giou`, `loss_ce_0`), each a
    scalar tensor. The base logs the total as `{stage}/loss` and each term as `{stage}/{name}`.

    `sums` makes the evaluation losses the dataset's (`vitdense.metrics.LossMeans`): per
    name ("loss" for the total, or a term's), the batch's `LossSum`; the figure logged is
    then the split's summed numerators over its summed denominators, whatever the batches
    and processes. A loss without one is a mean over the batch's images. When `sums` has
    every term but not "loss", the total is the sum of the terms (DETR's), and so is its
    dataset figure.
    """

    total: torch.Tensor
    terms: dict[str, torch.Tensor] = {}
    sums: dict[str, LossSum] = {}
