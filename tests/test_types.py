"""The padding contract: `ImageSizes` derives every mask, grid and ratio from the sizes."""

import torch

from vitdense.types import ImageSizes


def test_sizes_give_the_pixel_mask_the_token_masks_and_the_valid_ratios():
    sizes = ImageSizes.of([(64, 80), (37, 50), (96, 33)])
    assert sizes.padded == (96, 80) and sizes.stride == (1, 1) and sizes.has_padding
    pixels = sizes.mask()
    assert pixels.shape == (3, 96, 80) and pixels.dtype == torch.bool
    for i, (h, w) in enumerate(sizes.sizes):
        assert not pixels[i, :h, :w].any() and pixels[i].sum() == 96 * 80 - h * w

    tokens = sizes.at_stride(16)
    assert tokens.sizes == sizes.sizes and tokens.grid == (6, 5)
    assert tokens.grids == ((4, 5), (3, 4), (6, 3))  # a token that covers any image pixel is image
    # a token is padding exactly when all of its 16 x 16 pixels are padding
    from_pixels = pixels.reshape(3, 6, 16, 5, 16).all(4).all(2)
    assert torch.equal(tokens.mask(), from_pixels)
    torch.testing.assert_close(tokens.valid_ratios(), torch.tensor([[4 / 6, 1.0], [3 / 6, 4 / 5], [1.0, 3 / 5]]))


def test_no_padding_at_a_stride_that_hides_it():
    sizes = ImageSizes.of([(64, 64), (60, 64)])
    assert sizes.has_padding and not sizes.at_stride(16).has_padding
    assert ImageSizes.full(2, (32, 48)) == ImageSizes(((32, 48), (32, 48)), (32, 48))
    assert not ImageSizes.full(2, 32).has_padding


def test_rectangular_strides():
    sizes = ImageSizes.of([(30, 50), (17, 9)]).at_stride((8, 16))
    assert sizes.grid == (4, 4) and sizes.grids == ((4, 4), (3, 1))
    assert sizes.mask().sum(dim=(1, 2)).tolist() == [0, 16 - 3]
