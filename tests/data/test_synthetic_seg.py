"""SyntheticSegmentation: deterministic scenes whose label maps match the drawn shapes."""

import numpy as np
import pytest
import torch

from vitdense.data import LoaderConfig, SegmentedImages, SyntheticSegmentation, SyntheticSegmentationDataModule


def test_samples_are_a_function_of_seed_and_index():
    a, b = SyntheticSegmentation(8, seed=3), SyntheticSegmentation(8, seed=3)
    for i in range(4):
        assert torch.equal(a[i].image, b[i].image) and torch.equal(a[i].mask, b[i].mask)
        # the sample's label map is the drawn scene's, unchanged (no transform given)
        assert torch.equal(a[i].mask, torch.from_numpy(a.scene(i)[1].astype(np.int64)))
    other = SyntheticSegmentation(8, seed=4)
    assert not all(torch.equal(a[i].mask, other[i].mask) for i in range(4))
    sample = a[0]
    assert isinstance(sample, SegmentedImages) and sample.index == 0
    assert sample.image.shape == (3, 64, 64) and sample.image.dtype == torch.float32
    assert sample.mask.shape == (64, 64) and sample.mask.dtype == torch.int64
    assert sample.image_sizes == sample.mask_sizes == (64, 64)


def test_label_maps_match_the_drawn_shapes():
    ds = SyntheticSegmentation(40, num_classes=7, seed=0)
    seen = set()
    for index in range(len(ds)):
        image, labels = ds.scene(index)
        seen |= set(np.unique(labels).tolist())
        shapes = labels > 0
        assert shapes.any()
        # a shape is painted with one bright colour; the last one drawn owns the overlap, so
        # every colour on a labelled pixel belongs to exactly one label
        colours = {}
        for colour, label in zip(map(tuple, image[shapes]), labels[shapes], strict=True):
            assert colours.setdefault(colour, label) == label
        assert 1 <= len(colours) <= 3 and min(min(c) for c in colours) >= 0.65
        # the background is textured noise, never one of the shape colours
        background = {tuple(c) for c in image[~shapes]}
        assert not background & colours.keys()
    assert seen == set(range(7))


def test_normalisation():
    ds = SyntheticSegmentation(2, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    image, _ = ds.scene(1)
    expected = torch.from_numpy((image.astype(np.float32) - 0.5) / 0.25).permute(2, 0, 1)
    torch.testing.assert_close(ds[1].image, expected)


def test_class_count_is_checked():
    with pytest.raises(ValueError, match="2 to 7 classes"):
        SyntheticSegmentation(4, num_classes=8)


def test_datamodule():
    dm = SyntheticSegmentationDataModule(
        num_classes=4, train_size=32, val_size=16, loader=LoaderConfig(batch_size=8, eval_batch_size=5)
    )
    # known on construction, before setup: the CLI links them into the task
    assert dm.class_names == ["background", "circle", "square", "triangle"]
    assert dm.num_classes == 4 and dm.img_size == 64 and dm.ignore_index == 255
    dm.setup("fit")
    assert [len(b.index) for b in dm.val_dataloader()] == [5, 5, 5, 1]  # evaluation keeps every sample
    train = list(dm.train_dataloader())
    assert len(train) == 4 and train[0].image.shape == (8, 3, 64, 64) and not train[0].image_sizes.has_padding
    val = next(iter(dm.val_dataloader()))
    # images resized to a short side of 64; labels at their drawn 48..80 px, rarely patch multiples
    image_sizes, mask_sizes = torch.tensor(val.image_sizes.sizes), torch.tensor(val.mask_sizes.sizes)
    assert (image_sizes.min(1).values == 64).all()
    assert mask_sizes.min() >= 48 and mask_sizes.max() <= 80
    assert (mask_sizes % 16 != 0).any() and (image_sizes != mask_sizes).any()
    assert val.image_sizes.has_padding  # several aspect ratios in one batch
    assert set(val.mask.unique().tolist()) <= {0, 1, 2, 3, 255}
    # splits differ, and predict is the validation split
    assert not torch.equal(train[0].mask[0], val.mask[0, :64, :64])
    assert torch.equal(next(iter(dm.predict_dataloader())).mask, val.mask)
