"""Masking and corruption: MAE's random masking (equal to MAE's own `random_masking` on the
same noise: `mim_reference.pt`, made by a throwaway script from facebookresearch/mae's
models_mae.py), exact per-image ratios on padded batches, the paper's 50% / 80-10-10
corruption over many draws, and reproducibility from the seed."""

from pathlib import Path

import pytest
import torch

from vitdense.pretrain import corrupt_tokens, random_masking
from vitdense.pretrain.masking import keep_counts, masking_from_noise, valid_tokens
from vitdense.types import ImageSizes

REFERENCE = Path(__file__).with_name("mim_reference.pt")

#: a padded batch at the token stride: grids 4x5 (the padded grid), 3x5, 2x2 and 4x1
MIXED = ImageSizes.of([(4, 5), (3, 5), (2, 2), (4, 1)])


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE, weights_only=True)


def test_masking_equals_mae_random_masking_on_the_same_noise(ref):
    noise, x = ref["noise"], ref["x"]
    sizes = ImageSizes.full(2, (4, 4))
    m = masking_from_noise(noise, valid_tokens(sizes), keep_counts(sizes, 0.75))
    visible = torch.gather(x, 1, m.ids_keep[..., None].expand(-1, -1, x.shape[-1]))
    torch.testing.assert_close(visible, ref["x_masked"], rtol=0, atol=0)
    torch.testing.assert_close(m.masked.float(), ref["mask"], rtol=0, atol=0)
    torch.testing.assert_close(m.ids_restore, ref["ids_restore"], rtol=0, atol=0)
    assert m.filled and m.keep_valid.all()


def test_mask_ratio_is_exact_per_image_and_padding_is_neither_kept_nor_hidden():
    valid = valid_tokens(MIXED)
    counts = valid.sum(1).tolist()
    assert counts == [20, 15, 4, 4]
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        m = random_masking(MIXED, 0.75, generator)
        assert m.num_keep == tuple(int(n * 0.25) for n in counts) == (5, 3, 1, 1)
        assert m.masked.sum(1).tolist() == [n - k for n, k in zip(counts, m.num_keep, strict=True)]
        assert not (m.masked & ~valid).any()
        assert m.keep_valid.sum(1).tolist() == list(m.num_keep)
        kept = torch.zeros_like(valid)
        for b in range(len(counts)):
            kept[b, m.ids_keep[b][m.keep_valid[b]]] = True
        assert not (kept & ~valid).any() and not (kept & m.masked).any()
        assert ((kept | m.masked) == valid).all()  # every image token is either visible or a target


def test_masks_are_reproducible_from_the_seed():
    a = random_masking(MIXED, 0.75, torch.Generator().manual_seed(3))
    b = random_masking(MIXED, 0.75, torch.Generator().manual_seed(3))
    c = random_masking(MIXED, 0.75, torch.Generator().manual_seed(4))
    assert torch.equal(a.masked, b.masked) and torch.equal(a.ids_keep, b.ids_keep)
    assert not torch.equal(a.masked, c.masked)
    torch.manual_seed(5)
    d = corrupt_tokens(MIXED)
    torch.manual_seed(5)
    e = corrupt_tokens(MIXED)
    assert all(torch.equal(x, y) for x, y in zip(d, e, strict=True))


def test_corruption_is_half_of_each_image_then_80_10_10_over_many_draws():
    sizes = ImageSizes.of([(14, 14)] * 300 + [(9, 14)] * 100)  # 400 images, some padded
    valid = valid_tokens(sizes)
    c = corrupt_tokens(sizes, generator=torch.Generator().manual_seed(0))
    counts = valid.sum(1)
    assert torch.equal(c.corrupted.sum(1), counts - torch.div(counts, 2, rounding_mode="floor"))
    assert not (c.corrupted & ~valid).any()
    n = c.corrupted.sum().item()  # 34,200 corrupted tokens
    replaced, randomized = c.replaced.sum().item() / n, c.randomized.sum().item() / n
    kept = (c.corrupted & ~c.replaced & ~c.randomized).sum().item() / n
    # binomial standard error at n = 34,200: 0.0022 (80%) and 0.0016 (10%); 4 sigma
    assert abs(replaced - 0.8) < 0.009 and abs(randomized - 0.1) < 0.0065 and abs(kept - 0.1) < 0.0065
    assert not (c.replaced & c.randomized).any() and not ((c.replaced | c.randomized) & ~c.corrupted).any()
    # a random replacement copies a real token of some image of the batch, never padding
    assert valid.flatten()[c.source[c.randomized]].all()
    sources = c.source[c.randomized]
    assert len(set((sources // valid.shape[1]).tolist())) > 300  # from all over the batch


def test_bad_ratios_are_refused():
    with pytest.raises(ValueError, match="mask_ratio"):
        random_masking(MIXED, 1.0)
    with pytest.raises(ValueError, match="mask_prob"):
        corrupt_tokens(MIXED, mask_prob=0.95, random_prob=0.1)
