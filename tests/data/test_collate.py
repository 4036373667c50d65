"""pad_collate: images and label maps of different sizes in one batch."""

from functools import partial

import pytest
import torch
from torch.utils.data import DataLoader

from vitdense.data import SegmentedImages, pad_collate
from vitdense.types import ImageSizes


def sample(index, image_hw, mask_hw):
    image = torch.full((3, *image_hw), float(index + 1))
    mask = torch.full(mask_hw, index, dtype=torch.int64)
    return SegmentedImages(image, mask, index, image_sizes=image_hw, mask_sizes=mask_hw)


def test_pads_images_and_masks_to_their_own_maxima():
    # evaluation-style: the masks keep sizes that differ from the (resized) images
    samples = [sample(0, (4, 6), (8, 12)), sample(1, (5, 3), (10, 6)), sample(2, (2, 2), (3, 3))]
    batch = pad_collate(samples, ignore_index=255)
    assert isinstance(batch, SegmentedImages)
    assert batch.image.shape == (3, 3, 5, 6) and batch.mask.shape == (3, 10, 12)
    assert batch.mask.dtype == torch.int64
    assert batch.index.tolist() == [0, 1, 2]
    assert batch.image_sizes == ImageSizes(((4, 6), (5, 3), (2, 2)), (5, 6))
    assert batch.mask_sizes == ImageSizes(((8, 12), (10, 6), (3, 3)), (10, 12))
    pixel_padding = batch.image_sizes.mask()
    for i, s in enumerate(samples):
        h, w = s.image.shape[-2:]
        mh, mw = s.mask.shape
        assert (batch.image[i, :, :h, :w] == i + 1).all()
        assert batch.image[i].sum() == s.image.sum()  # zeros everywhere else
        assert not pixel_padding[i, :h, :w].any()
        assert pixel_padding[i].sum() == 5 * 6 - h * w
        assert (batch.mask[i, :mh, :mw] == i).all()
        assert (batch.mask[i] == 255).sum() == 10 * 12 - mh * mw


def test_same_sizes_need_no_padding_and_ignore_index_is_configurable():
    batch = pad_collate([sample(0, (4, 4), (4, 4)), sample(1, (4, 4), (2, 4))], ignore_index=-1)
    assert not batch.image_sizes.has_padding and not batch.image_sizes.mask().any()
    assert (batch.mask[1, 2:] == -1).all() and (batch.mask[1, :2] == 1).all()


def test_empty_batch_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        pad_collate([])


def test_works_as_a_loader_collate_fn():
    data = [sample(i, (4 + i, 5), (4 + i, 5)) for i in range(4)]
    loader = DataLoader(data, batch_size=2, collate_fn=partial(pad_collate, ignore_index=255))
    shapes = [tuple(b.image.shape) for b in loader]
    assert shapes == [(2, 3, 5, 5), (2, 3, 7, 5)]
