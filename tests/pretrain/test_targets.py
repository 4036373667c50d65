"""Patch targets against references: MAE's `patchify`, `norm_pix_loss` targets and
`forward_loss`, and its decoder's sine-cosine table, from MAE's own code; the paper's 3-bit
mean colour from its definition (numpy, float64, a loop over each patch of each image alone).
All in `mim_reference.pt` (see test_masking.py)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitdense.backbone.pos_embed import sincos_2d
from vitdense.pretrain import MeanColorTarget, PixelTarget, patchify, unpatchify
from vitdense.pretrain.targets import ColorBins, pixel_validity
from vitdense.types import ImageSizes

REFERENCE = Path(__file__).with_name("mim_reference.pt")


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE, weights_only=True)


def targets_of(target, images, sizes, p, mean, std):
    return target(patchify(images, (p, p)), pixel_validity(sizes, (p, p)), (p, p), mean, std)


def test_patchify_is_mae_patchify_and_unpatchify_undoes_it(ref):
    p = ref["patch_size"]
    patches = patchify(ref["imgs"], (p, p))
    torch.testing.assert_close(patches.flatten(2), ref["target"], rtol=0, atol=0)
    torch.testing.assert_close(unpatchify(patches, (4, 4), (p, p)), ref["imgs"], rtol=0, atol=0)


@pytest.mark.parametrize("norm_pix", [False, True])
def test_pixel_targets_and_loss_equal_mae(ref, norm_pix):
    p, imgs = ref["patch_size"], ref["imgs"]
    target = PixelTarget(norm_pix=norm_pix)
    t = targets_of(target, imgs, ImageSizes.full(2, (32, 32)), p, torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(t.values, ref["target_norm" if norm_pix else "target"], rtol=1e-5, atol=1e-5)
    loss = target.loss(ref["pred"], t, ref["mask"].bool())
    torch.testing.assert_close(loss, ref["loss_norm" if norm_pix else "loss"], rtol=1e-6, atol=1e-6)


def test_pixel_targets_of_a_padded_patch_use_its_image_pixels_only(ref):
    p, imgs = ref["patch_size"], ref["imgs"].clone()
    sizes = ImageSizes.of([(32, 32), (20, 27)])  # image 1's last patch row and column are part padding
    imgs[1, :, 20:], imgs[1, :, :, 27:] = 0, 0
    noisy = imgs.clone()
    noisy[1, :, 20:], noisy[1, :, :, 27:] = 5.0, -3.0  # whatever the padding holds
    target = PixelTarget(norm_pix=True)
    a = targets_of(target, imgs, sizes, p, torch.zeros(3), torch.ones(3))
    b = targets_of(target, noisy, sizes, p, torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)
    # the patch at row 2, column 3 (20 x 27 px: rows 16..19, columns 24..26 are image): its own statistics
    pixels = imgs[1, :, 16:20, 24:27].permute(1, 2, 0).reshape(-1)
    expected = (pixels - pixels.mean()) / (pixels.var() + 1e-6).sqrt()
    values = a.values[1, 2 * 4 + 3].reshape(8, 8, 3)[:4, :3].reshape(-1)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
    assert a.weights[1, 2 * 4 + 3].sum() == 4 * 3 * 3
    # the loss averages a patch over its image values only: a prediction wrong on padding costs nothing
    pred = a.values.clone()
    pred[1, :, :][a.weights[1] == 0] = 100.0
    hidden = torch.ones(2, 16, dtype=torch.bool)
    assert target.loss(pred, a, hidden) == 0


def test_mean_colour_bins_equal_the_papers_definition(ref):
    p = ref["patch_size"]
    images = ref["colour_images"]  # two normalised images, 32 x 32 and 20 x 27
    sizes = ImageSizes.of([tuple(i.shape[-2:]) for i in images])
    batch = torch.stack([F.pad(i, (0, 32 - i.shape[-1], 0, 32 - i.shape[-2])) for i in images])
    valid = ~sizes.at_stride(p).mask().flatten(1)
    for cells, key in ((1, "bins1"), (4, "bins4")):
        target = MeanColorTarget(bits=3, cells=cells)
        bins = targets_of(target, batch, sizes, p, ref["colour_mean"], ref["colour_std"]).bins
        for i, expected in enumerate(ref[key]):
            assert torch.equal(bins[i][valid[i]], expected), (cells, i)
            assert (bins[i][~valid[i]] == -100).all()
        assert target.num_outputs((p, p), 3) == cells * cells * 512


def test_mean_colour_loss_is_cross_entropy_on_the_hidden_patches_and_renders_level_centres():
    target = MeanColorTarget()
    bins = torch.tensor([[0, 511, 73, -100]])
    t = ColorBins(bins[..., None], (2, 2))  # four 2 x 2 patches, one cell each
    pred = torch.randn(1, 4, 512)
    hidden = torch.tensor([[True, False, True, True]])
    expected = F.cross_entropy(pred[0, [0, 2]], bins[0, [0, 2]])
    torch.testing.assert_close(target.loss(pred, t, hidden), expected)
    ((acc, weight),) = target.scores(pred, t, hidden).values()
    assert weight == 2 and acc == ((pred[0, [0, 2]].argmax(-1) == bins[0, [0, 2]]).float().mean())
    colours = target.render(None, t, torch.zeros(3), torch.ones(3))  # [1, 4, 4, 3]
    torch.testing.assert_close(colours[0, 1, 0], torch.full((3,), 7.5 / 8))  # 511: the top level of r, g, b
    torch.testing.assert_close(colours[0, 2, 0], torch.tensor([1.5, 1.5, 1.5]) / 8)  # 73 = 1 * 64 + 1 * 8 + 1


def test_sincos_table_is_maes_and_absolute_by_index(ref):
    torch.testing.assert_close(sincos_2d(16, (4, 4)), ref["pos"][1:], rtol=0, atol=1e-6)
    wide = sincos_2d(16, (5, 7)).reshape(5, 7, 16)
    torch.testing.assert_close(sincos_2d(16, (3, 4)).reshape(3, 4, 16), wide[:3, :4])
