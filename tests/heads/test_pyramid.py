"""Feature levels from a plain ViT: shapes and strides per level, padding that never leaks
into an image's features, and the layer structure of the modules they follow."""

import pytest
import torch

from vitdense.backbone import VisionTransformer
from vitdense.heads.pyramid import MultiLevelProjector, SimpleFeaturePyramid
from vitdense.types import ImageSizes

SIZES = [(56, 40), (33, 50)]  # padded to (56, 50): 7 x 7 patches of 8; the second image 5 x 7, the first 7 x 5


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, reg_tokens=1).eval()


def encode(vit, images, sizes, blocks=(0, 2)):
    return vit(images, sizes, intermediates=blocks, norm_intermediates=True)


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(1)
    sizes = ImageSizes.of(SIZES)
    images = torch.zeros(2, 3, *sizes.padded)
    for i, (h, w) in enumerate(SIZES):
        images[i, :, :h, :w] = torch.randn(3, h, w)
    return images, sizes


NECKS = {
    "projector": lambda: MultiLevelProjector(
        32, 16, feature_indexes=(0, 2), scale_factors=(2.0, 1.0, 0.5), num_blocks=2
    ),
    "sfp": lambda: SimpleFeaturePyramid(32, 16, scale_factors=(4.0, 2.0, 1.0, 0.5), top_block=True),
}


@pytest.mark.parametrize("name", list(NECKS))
def test_levels_are_the_same_alone_and_padded(vit, batch, name):
    """Each image's levels on its own valid area equal those of the image encoded alone, and
    every level's map is as large as its `ImageSizes` says, padding zero."""
    torch.manual_seed(2)
    neck = NECKS[name]().eval()
    for p in neck.parameters():  # LayerNorm's 1 / 0 would hide a leak through the affine part
        torch.nn.init.normal_(p, std=0.2)
    images, sizes = batch
    with torch.no_grad():
        together = neck(encode(vit, images, sizes))
        assert len(together.maps) == neck.num_levels
        for i, (h, w) in enumerate(SIZES):
            alone = neck(encode(vit, images[i : i + 1, :, :h, :w], ImageSizes.of([(h, w)])))
            levels = zip(together.maps, alone.maps, together.image_sizes, alone.image_sizes, strict=True)
            for big, small, big_sizes, small_sizes in levels:
                assert tuple(big.shape[-2:]) == big_sizes.grid and tuple(small.shape[-2:]) == small_sizes.grid
                gh, gw = big_sizes.grids[i]
                assert small_sizes.grids[0] == (gh, gw)
                # (alone, a map may still be larger than the image: the ViT pads it to whole patches)
                torch.testing.assert_close(big[i, :, :gh, :gw], small[0, :, :gh, :gw], rtol=1e-4, atol=1e-5)
                assert big[i][:, big_sizes.mask()[i]].abs().sum() == 0


def test_strides_of_each_level(vit, batch):
    images, sizes = batch
    with torch.no_grad():
        levels = NECKS["sfp"]()(encode(vit, images, sizes))
    assert [s.stride for s in levels.image_sizes] == [(2, 2), (4, 4), (8, 8), (16, 16), (32, 32)]
    assert [tuple(m.shape[-2:]) for m in levels.maps] == [(28, 28), (14, 14), (7, 7), (4, 4), (2, 2)]
    with torch.no_grad():
        levels = NECKS["projector"]()(encode(vit, images, sizes))
    assert [s.stride for s in levels.image_sizes] == [(4, 4), (8, 8), (16, 16)]
    assert all(m.shape[1] == 16 for m in levels.maps)


def test_projector_has_rf_detrs_layers():
    """RF-DETR's `MultiScaleProjector(in_channels=[384] * 4, out_channels=256,
    scale_factors=[2.0, 1.0, 0.5], layer_norm=True)` has 10,629,888 parameters (with
    RF-DETR base's single P4 level, 1,444,864): 4 transposed
    convolutions (384 -> 192), 4 strided 3x3 ConvX (384 -> 384) and a C2f of 3 bottlenecks +
    LayerNorm per level (counted from its code with those arguments)."""
    neck = MultiLevelProjector(384, 256, feature_indexes=(2, 5, 8, 11), scale_factors=(2.0, 1.0, 0.5), num_blocks=3)
    assert sum(p.numel() for p in neck.parameters()) == 10_629_888
    p4 = MultiLevelProjector(384, 256, feature_indexes=(2, 5, 8, 11), scale_factors=(1.0,), num_blocks=3)
    assert sum(p.numel() for p in p4.parameters()) == 1_444_864


def test_sfp_has_vitdets_layers():
    """detectron2's `SimpleFeaturePyramid(net with embed_dim 768, out_channels=256,
    scale_factors=(4.0, 2.0, 1.0, 0.5), top_block=LastLevelMaxPool(), norm="LN")` has
    5,560,000 parameters (its layers as its code lists them, counted)."""
    neck = SimpleFeaturePyramid(768, 256, top_block=True)
    assert sum(p.numel() for p in neck.parameters()) == 5_560_000


def test_missing_intermediates_are_named(vit, batch):
    images, sizes = batch
    with pytest.raises(ValueError, match="intermediates=neck.feature_indexes"):
        NECKS["projector"]()(vit(images, sizes))
