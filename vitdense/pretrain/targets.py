"""What a masked image model predicts for each hidden patch, from the patch's pixels.

Patches are MAE's `patchify` layout, kept 4-d: [B, N, P * P, C], pixels row-major inside
the patch, channels last (MAE's flattened [B, N, P * P * C] is `.flatten(2)` of it). A
patch of the batch's last row or column may cover part image, part padding; `valid`
[B, N, P * P] says which pixels are image, and every target is computed from those only.

    MeanColorTarget()          the paper's: the 3-bit mean colour, one of 512 classes
    MeanColorTarget(cells=4)   the paper's second: 4 x 4 cells of the patch, 16 x 512 classes
    PixelTarget()              the paper's third (L2 on the full patch) and MAE's
    PixelTarget(norm_pix=True) MAE's `norm_pix_loss`: each patch normalised by its mean and variance
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vitdense.types import ImageSizes


def patchify(images: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
    """[B, C, H, W] -> [B, h * w, ph * pw, C] (zero-padded right and bottom to whole patches,
    as `PatchEmbed` pads)."""
    ph, pw = patch_size
    b, c, height, width = images.shape
    images = F.pad(images, (0, -width % pw, 0, -height % ph))
    h, w = images.shape[-2] // ph, images.shape[-1] // pw
    x = images.reshape(b, c, h, ph, w, pw)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(b, h * w, ph * pw, c)


def unpatchify(patches: torch.Tensor, grid: tuple[int, int], patch_size: tuple[int, int]) -> torch.Tensor:
    """[B, h * w, ph * pw, C] -> [B, C, h * ph, w * pw]: `patchify` undone."""
    (h, w), (ph, pw) = grid, patch_size
    b, _, _, c = patches.shape
    x = patches.reshape(b, h, w, ph, pw, c)
    return torch.einsum("nhwpqc->nchpwq", x).reshape(b, c, h * ph, w * pw)


def pixel_validity(image_sizes: ImageSizes, patch_size: tuple[int, int], device=None) -> torch.Tensor:
    """[B, N, ph * pw] bool, True on the pixels of each patch that belong to the image
    (`image_sizes` in pixels: its `ImageSizes` at stride 1)."""
    pixels = ~image_sizes.at_stride(1).mask(device)  # [B, H, W]
    return patchify(pixels[:, None].float(), patch_size)[..., 0] > 0.5


class PatchTarget(nn.Module):
    """A prediction target per patch: what the objective's predictor outputs, the targets
    of a batch, the loss on the hidden patches, and how to show a prediction as pixels.

    Subclasses implement `num_outputs`, `forward` (the targets), `loss` and `render`; those
    with scores worth logging (an accuracy) name them in `score_names` and return them from
    `scores`."""

    #: scores that `scores` returns, logged as `{stage}/{name}`
    score_names: ClassVar[tuple[str, ...]] = ()
    #: the target drawn as pixels differs from the image (a 3-bit colour does, pixels do not)
    draws_truth: ClassVar[bool] = False

    def num_outputs(self, patch_size: tuple[int, int], channels: int) -> int:
        raise NotImplementedError

    def forward(
        self,
        patches: torch.Tensor,
        valid: torch.Tensor,
        patch_size: tuple[int, int],
        mean: torch.Tensor,
        std: torch.Tensor,
    ) -> tuple:
        """The targets of normalised patches [B, N, P * P, C] with their pixel validity
        [B, N, P * P]; `mean`, `std` [C] undo the data's normalisation."""
        raise NotImplementedError

    def loss(self, pred: torch.Tensor, target: tuple, hidden: torch.Tensor) -> torch.Tensor:
        """The loss of predictions [B, N, num_outputs] on the `hidden` [B, N] patches."""
        raise NotImplementedError

    def scores(self, pred: torch.Tensor, target: tuple, hidden: torch.Tensor) -> dict[str, tuple]:
        """{name: (value, weight)} for `score_names`, each a mean over `weight` items."""
        return {}

    def render(self, pred: torch.Tensor | None, target: tuple, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Predictions [B, N, num_outputs] (None: the target itself) as patches
        [B, N, P * P, C] of un-normalised pixels in [0, 1]."""
        raise NotImplementedError


class ColorBins(NamedTuple):
    """bins [B, N, cells * cells] int64 colour classes (-100 where a cell is all padding),
    and the patch size they came from."""

    bins: torch.Tensor
    patch_size: tuple[int, int]


class MeanColorTarget(PatchTarget):
    """The paper's masked patch prediction target: the mean colour of a patch, quantised to
    `bits` bits per channel (3: 8 levels, 512 colours), as one class of 2^(bits * C).

    The mean is taken in the un-normalised image, pixel values in [0, 1], over the image's
    pixels of the patch (never its padding); a channel's level is floor(mean * 2^bits), the
    last level including 1.0, and the class is r * 64 + g * 8 + b for 3 bits. With
    `cells` > 1 the patch is cut into cells x cells equal cells (the paper's second variant:
    "a 4 x 4 downsized version of the 16 x 16 patch", 16 parallel 512-way predictions) and
    each cell's mean colour is a class of its own; a cell that is all padding has none.
    The loss is cross-entropy averaged over the cells of the hidden patches.
    """

    score_names = ("color_acc",)
    draws_truth = True

    def __init__(self, bits: int = 3, cells: int = 1) -> None:
        super().__init__()
        if bits < 1 or cells < 1:
            raise ValueError(f"MeanColorTarget(bits={bits}, cells={cells}): both must be at least 1")
        self.bits, self.cells = bits, cells
        self.levels = 2**bits

    def num_outputs(self, patch_size: tuple[int, int], channels: int) -> int:
        if patch_size[0] % self.cells or patch_size[1] % self.cells:
            raise ValueError(f"MeanColorTarget(cells={self.cells}) needs patches divisible by it, not {patch_size}")
        return self.cells**2 * self.levels**channels

    def place_values(self, channels: int, device: torch.device) -> torch.Tensor:
        """[C] weight of each channel's level in the class index, the first channel most
        significant (r * 64 + g * 8 + b for 3 bits)."""
        return self.levels ** torch.arange(channels - 1, -1, -1, device=device)

    def cell_view(self, x: torch.Tensor, patch_size: tuple[int, int]) -> torch.Tensor:
        """[B, N, ph * pw, ...] -> [B, N, cells * cells, pixels per cell, ...]."""
        (ph, pw), k = patch_size, self.cells
        b, n, rest = x.shape[0], x.shape[1], x.shape[3:]
        x = x.reshape(b, n, k, ph // k, k, pw // k, *rest).transpose(3, 4)
        return x.reshape(b, n, k * k, (ph // k) * (pw // k), *rest)

    @torch.no_grad()
    def forward(
        self,
        patches: torch.Tensor,
        valid: torch.Tensor,
        patch_size: tuple[int, int],
        mean: torch.Tensor,
        std: torch.Tensor,
    ) -> ColorBins:
        pixels = patches.float() * std + mean  # un-normalised, [0, 1]
        weights = self.cell_view(valid.float(), patch_size)  # [B, N, cells^2, pixels per cell]
        total = weights.sum(-1)
        colour = (self.cell_view(pixels, patch_size) * weights[..., None]).sum(-2) / total.clamp(min=1)[..., None]
        levels = (colour * self.levels).floor().long().clamp(0, self.levels - 1)  # [B, N, cells^2, C]
        bins = (levels * self.place_values(levels.shape[-1], levels.device)).sum(-1)
        return ColorBins(bins.masked_fill(total == 0, -100), patch_size)

    def logits(self, pred: torch.Tensor) -> torch.Tensor:
        """[B, N, cells^2 * classes] -> [B, N, cells^2, classes]."""
        return pred.unflatten(-1, (self.cells**2, -1))

    def loss(self, pred: torch.Tensor, target: ColorBins, hidden: torch.Tensor) -> torch.Tensor:
        bins = target.bins.masked_fill(~hidden[..., None], -100)
        return F.cross_entropy(self.logits(pred).flatten(0, 2).float(), bins.flatten(), ignore_index=-100)

    def scores(self, pred: torch.Tensor, target: ColorBins, hidden: torch.Tensor) -> dict[str, tuple]:
        counted = hidden[..., None] & (target.bins >= 0)
        right = (self.logits(pred).argmax(-1) == target.bins) & counted
        total = counted.sum()
        return {"color_acc": (right.sum() / total.clamp(min=1), total)}

    def render(
        self, pred: torch.Tensor | None, target: ColorBins, mean: torch.Tensor, std: torch.Tensor
    ) -> torch.Tensor:
        bins = target.bins.clamp(min=0) if pred is None else self.logits(pred).argmax(-1)  # [B, N, cells^2]
        channels = mean.numel()
        colour = (
            (bins[..., None] // self.place_values(channels, bins.device)) % self.levels + 0.5
        ) / self.levels  # [B, N, cells^2, C], level centres
        (ph, pw), k = target.patch_size, self.cells
        b, n = bins.shape[:2]
        cells = colour.reshape(b, n, k, 1, k, 1, channels).expand(b, n, k, ph // k, k, pw // k, channels)
        return cells.reshape(b, n, ph * pw, channels)


class PixelTargets(NamedTuple):
    """values [B, N, P * P * C] (normalised per patch with `norm_pix`); weights [B, N, P * P * C]
    (1 on image pixels, 0 on padding); the per-patch mean and std [B, N, 1] that `norm_pix`
    took out (0 and 1 without); the patch size."""

    values: torch.Tensor
    weights: torch.Tensor
    patch_mean: torch.Tensor
    patch_std: torch.Tensor
    patch_size: tuple[int, int]


class PixelTarget(PatchTarget):
    """The patch's pixels themselves (normalised as the data normalises them), regressed
    with L2: the paper's third variant and MAE's target.

    The loss is MAE's: the squared error averaged over a patch's values, then over the
    hidden patches; here the average inside a patch skips its padding pixels. With
    `norm_pix`, MAE's `norm_pix_loss`: each patch's target is (x - mean) / sqrt(var + 1e-6)
    with the mean and unbiased variance of its own values (image pixels only).
    """

    def __init__(self, norm_pix: bool = False, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm_pix, self.eps = norm_pix, eps

    def num_outputs(self, patch_size: tuple[int, int], channels: int) -> int:
        return patch_size[0] * patch_size[1] * channels

    @torch.no_grad()
    def forward(
        self,
        patches: torch.Tensor,
        valid: torch.Tensor,
        patch_size: tuple[int, int],
        mean: torch.Tensor,
        std: torch.Tensor,
    ) -> PixelTargets:
        values = patches.float().flatten(2)  # [B, N, P * P * C], MAE's patchify order
        weights = valid[..., None].expand_as(patches).flatten(2).float()
        if not self.norm_pix:
            zeros = values.new_zeros(values.shape[:2] + (1,))
            return PixelTargets(values, weights, zeros, zeros + 1, patch_size)
        count = weights.sum(-1, keepdim=True)
        patch_mean = (values * weights).sum(-1, keepdim=True) / count.clamp(min=1)
        var = ((values - patch_mean) ** 2 * weights).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
        patch_std = (var + self.eps).sqrt()
        return PixelTargets((values - patch_mean) / patch_std * weights, weights, patch_mean, patch_std, patch_size)

    def loss(self, pred: torch.Tensor, target: PixelTargets, hidden: torch.Tensor) -> torch.Tensor:
        squared = (pred.float() - target.values) ** 2 * target.weights
        per_patch = squared.sum(-1) / target.weights.sum(-1).clamp(min=1)  # [B, N]
        hidden = hidden.float()
        return (per_patch * hidden).sum() / hidden.sum().clamp(min=1)

    def render(
        self, pred: torch.Tensor | None, target: PixelTargets, mean: torch.Tensor, std: torch.Tensor
    ) -> torch.Tensor:
        values = target.values if pred is None else pred.float()
        values = values * target.patch_std + target.patch_mean  # MAE's visualisation of norm_pix predictions
        patches = values.unflatten(-1, (-1, mean.numel()))
        return (patches * std + mean).clamp(0, 1)
