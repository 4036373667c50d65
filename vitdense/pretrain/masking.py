"""Which patch tokens a pre-training objective hides, for padded batches of mixed sizes.

Both draws are per image and see only the image's own tokens: a padding token is never
hidden, never visible, never a target and never the source of a random replacement. Every
count is computed from the batch's `ImageSizes` (Python ints, no device read-back). The
draws use `generator` (None: torch's global generator, so `seed_everything` reproduces
them and a resumed run, whose RNG state the checkpoint restores, draws what the
uninterrupted one would have).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from vitdense.types import ImageSizes


class TokenMasking(NamedTuple):
    """MAE's random masking of a padded batch: per image, a random subset of its tokens stays
    visible, the rest are hidden (the loss targets).

    Attributes:
        ids_keep: [B, K] int64 positions (row-major on the padded grid) of the visible tokens,
            in shuffled order; K is the largest count of visible tokens in the batch.
        keep_valid: [B, K] bool, True where slot k of image b holds a visible token (an image
            with fewer tokens keeps fewer; its last slots are filler, never attended).
        ids_restore: [B, N] int64, the inverse of the shuffle (MAE's `ids_restore`): the slot
            in shuffled order of each position.
        masked: [B, N] bool, True on hidden tokens (never on padding).
        num_keep: visible tokens of each image (Python ints).
    """

    ids_keep: torch.Tensor
    keep_valid: torch.Tensor
    ids_restore: torch.Tensor
    masked: torch.Tensor
    num_keep: tuple[int, ...]

    @property
    def filled(self) -> bool:
        """Every slot holds a visible token (no image keeps fewer than K)."""
        return min(self.num_keep) == max(self.num_keep)


class Corruption(NamedTuple):
    """The paper's masked patch prediction corruption (section 4.6, appendix B.1.2).

    Attributes:
        corrupted: [B, N] bool, the tokens whose patch is predicted (never padding).
        replaced: [B, N] bool, corrupted tokens replaced by the [mask] embedding.
        randomized: [B, N] bool, corrupted tokens replaced by another patch's embedding.
        source: [B, N] int64 index into the batch's B * N tokens of the patch a randomized
            token copies (a valid token of a random image of the batch); meaningless elsewhere.
    """

    corrupted: torch.Tensor
    replaced: torch.Tensor
    randomized: torch.Tensor
    source: torch.Tensor


def valid_tokens(image_sizes: ImageSizes, device: torch.device | str | None = None) -> torch.Tensor:
    """[B, N] bool, True on the tokens that cover an image (`image_sizes` at the token stride)."""
    return ~image_sizes.mask(device).flatten(1)


def keep_counts(image_sizes: ImageSizes, mask_ratio: float) -> tuple[int, ...]:
    """Visible tokens per image: MAE's `int(L * (1 - mask_ratio))` of each image's L tokens."""
    if not 0 <= mask_ratio < 1:
        raise ValueError(f"mask_ratio={mask_ratio}: expected a fraction in [0, 1)")
    return tuple(int(h * w * (1 - mask_ratio)) for h, w in image_sizes.grids)


def masking_from_noise(noise: torch.Tensor, valid: torch.Tensor, num_keep: tuple[int, ...]) -> TokenMasking:
    """MAE's per-sample shuffle from given noise [B, N] in [0, 1): each image keeps the
    `num_keep` of its valid tokens with the smallest noise. Padding tokens are sorted last
    (noise 2), so they are never kept; on an unpadded batch this is MAE's `random_masking`."""
    noise = noise.masked_fill(~valid, 2.0)
    ids_shuffle = torch.argsort(noise, dim=1)  # ascending: small is kept, large is hidden
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    k = max(num_keep)
    counts = torch.tensor(num_keep, device=noise.device)
    ranks = torch.arange(noise.shape[1], device=noise.device)
    kept_in_order = ranks[None] < counts[:, None]  # [B, N] in shuffled order
    kept = torch.gather(kept_in_order, 1, ids_restore)
    return TokenMasking(
        ids_keep=ids_shuffle[:, :k],
        keep_valid=kept_in_order[:, :k],
        ids_restore=ids_restore,
        masked=valid & ~kept,
        num_keep=num_keep,
    )


def random_masking(
    image_sizes: ImageSizes,
    mask_ratio: float,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> TokenMasking:
    """MAE's random masking of `mask_ratio` of each image's tokens, exactly per image
    (`keep_counts`), for a batch described by `image_sizes` at the token stride."""
    valid = valid_tokens(image_sizes, device)
    noise = torch.rand(valid.shape, generator=generator, device=device)
    return masking_from_noise(noise, valid, keep_counts(image_sizes, mask_ratio))


def corrupt_tokens(
    image_sizes: ImageSizes,
    corrupt_ratio: float = 0.5,
    mask_prob: float = 0.8,
    random_prob: float = 0.1,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Corruption:
    """Choose the tokens to corrupt and how, as the paper's masked patch prediction does.

    Per image, exactly `corrupt_ratio` of its tokens (rounded as MAE's masking: the same
    per-sample shuffle) are corrupted; each corrupted token independently is replaced by the
    [mask] embedding with probability `mask_prob`, by a random other patch's embedding with
    `random_prob`, and kept as it is otherwise (BERT's 80/10/10). The random patch comes from
    a random image of the batch, at a random position inside that image (never padding).
    """
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
        raise ValueError(f"mask_prob={mask_prob}, random_prob={random_prob}: expected probabilities summing to <= 1")
    corrupted = random_masking(image_sizes, corrupt_ratio, generator, device).masked
    b, n = corrupted.shape
    u = torch.rand((b, n), generator=generator, device=device)
    replaced = corrupted & (u < mask_prob)
    randomized = corrupted & (u >= mask_prob) & (u < mask_prob + random_prob)
    # the source: an image of the batch, then a row and a column inside that image's own grid
    grids = torch.tensor(image_sizes.grids, device=device)  # [B, 2]
    image = torch.randint(b, (b, n), generator=generator, device=device)
    where = torch.rand((b, n, 2), generator=generator, device=device)
    extent = grids[image]  # [B, N, 2]
    row, col = (where * extent).long().minimum(extent - 1).unbind(-1)
    width = image_sizes.grid[1]
    source = image * n + row * width + col
    return Corruption(corrupted, replaced, randomized, source)
