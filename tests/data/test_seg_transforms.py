"""Segmentation pipelines against mmseg's ADE20K rules, on small arrays."""

import albumentations as A
import numpy as np
import pytest
import torch

from vitdense.data.transforms.segmentation import (
    CatMaxRatioCrop,
    PhotoMetricDistortion,
    RescaleKeepRatio,
    SharedRandomCompose,
    rescale_size,
    segmentation_eval_transforms,
    segmentation_train_transforms,
)

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def random_pair(height, width, num_labels=5, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    mask = rng.integers(0, num_labels, (height, width)).astype(np.uint8)
    return image, mask


@pytest.mark.parametrize(
    ("size", "bound", "expected"),
    [
        # 640x480 at ratio 1: the short side binds, 640 * 512/480 = 682.67 rounds half up to 683
        ((480, 640), (2048, 512), (512, 683)),
        ((640, 480), (2048, 512), (683, 512)),
        ((480, 640), (512, 2048), (512, 683)),  # the bound's order does not matter
        # ratio 0.5 -> bound (1024, 256); ratio 2 -> bound (4096, 1024)
        ((480, 640), (1024, 256), (256, 341)),
        ((480, 640), (4096, 1024), (1024, 1365)),
        # a panorama: the long side binds at 2048 before the short side reaches 512
        ((100, 1000), (2048, 512), (205, 2048)),
        ((512, 512), (2048, 512), (512, 512)),
    ],
)
def test_rescale_size_follows_mmcv(size, bound, expected):
    assert rescale_size(*size, bound) == expected


def test_random_rescale_draws_the_bound_from_the_ratio_range():
    transform = A.Compose([RescaleKeepRatio(scale=(400, 100), ratio_range=(0.5, 2.0))], seed=0)
    image, mask = random_pair(100, 150)
    shorts = set()
    for _ in range(30):
        out = transform(image=image, mask=mask)
        assert out["image"].shape[:2] == out["mask"].shape
        short = min(out["image"].shape[:2])
        assert 50 <= short <= 200
        # keep ratio: the sides stay 2:3 up to rounding
        assert abs(out["image"].shape[1] - 1.5 * out["image"].shape[0]) <= 1
        shorts.add(short)
    assert len(shorts) > 10


def test_eval_resizes_the_image_but_not_the_mask():
    image, mask = random_pair(48, 64)
    out = segmentation_eval_transforms(short_side=32, mean=MEAN, std=STD)(image=image, mask=mask)
    # 64 * 32/48 = 42.67 -> 43
    assert out["image"].shape == (3, 32, 43) and out["image"].dtype == torch.float32
    assert out["mask"].dtype == torch.int64
    assert torch.equal(out["mask"], torch.from_numpy(mask).long())
    # mmseg's 640x480 example and the long-side cap at 4 x short side
    assert segmentation_eval_transforms()(image=np.zeros((480, 640, 3), np.uint8))["image"].shape == (3, 512, 683)
    assert segmentation_eval_transforms()(image=np.zeros((100, 1000, 3), np.uint8))["image"].shape == (3, 205, 2048)


def test_eval_normalises():
    image = np.full((16, 16, 3), 191, np.uint8)
    out = segmentation_eval_transforms(short_side=16, mean=MEAN, std=STD)(image=image)
    torch.testing.assert_close(out["image"], torch.full((3, 16, 16), (191 / 255 - 0.5) / 0.25))


def test_train_output_crop_and_labels():
    image, mask = random_pair(60, 90, num_labels=4)
    mask[:5] = 255
    transform = segmentation_train_transforms(crop_size=32, scale=(128, 32), mean=MEAN, std=STD)
    transform.set_random_seed(0)
    for _ in range(5):
        out = transform(image=image, mask=mask)
        assert out["image"].shape == (3, 32, 32) and out["image"].dtype == torch.float32
        assert out["mask"].shape == (32, 32) and out["mask"].dtype == torch.int64
        # nearest interpolation: no label is invented between two others
        assert set(out["mask"].unique().tolist()) <= {0, 1, 2, 3, 255}


def test_train_pads_right_and_bottom_with_zero_and_ignore_index():
    # 20x30 fits (32, 16) at 0.8 -> 16x24; the 24 crop keeps 16 rows and pads 8 more
    image, mask = random_pair(20, 30, num_labels=3)
    transform = segmentation_train_transforms(
        crop_size=24, scale=(32, 16), ratio_range=(1.0, 1.0), ignore_index=200, mean=MEAN, std=STD
    )
    out = transform(image=image, mask=mask)
    assert out["image"].shape == (3, 24, 24) and out["mask"].shape == (24, 24)
    assert (out["mask"][16:] == 200).all() and (out["mask"][:16] < 3).all()
    assert (out["image"][:, 16:] == 0).all() and (out["image"][:, :16] != 0).any()


def test_train_is_reproducible_from_its_seed():
    image, mask = random_pair(50, 70)
    first, second = (segmentation_train_transforms(crop_size=32, scale=(128, 32)) for _ in range(2))
    first.set_random_seed(3)
    second.set_random_seed(3)
    for _ in range(3):
        a, b = first(image=image, mask=mask), second(image=image, mask=mask)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])


def test_seeded_compose_draws_from_one_stream():
    # A.Compose.set_random_seed would give both flips the same stream: always both or neither
    transform = SharedRandomCompose([A.HorizontalFlip(p=0.5), A.VerticalFlip(p=0.5)])
    transform.set_random_seed(0)
    image = np.arange(4, dtype=np.uint8).reshape(2, 2)
    corners = {int(transform(image=image)["image"][0, 0]) for _ in range(40)}
    assert corners == {0, 1, 2, 3}  # no flip, h only, v only, both


def count_windows(crop: CatMaxRatioCrop, mask: np.ndarray) -> int:
    drawn = []
    original = crop._random_window

    def counting(*args):
        drawn.append(original(*args))
        return drawn[-1]

    crop._random_window = counting
    crop(image=np.zeros((*mask.shape, 3), np.uint8), mask=mask)
    return len(drawn)


def test_cat_max_ratio_retries_like_mmseg():
    crop = CatMaxRatioCrop(10, 10, cat_max_ratio=0.75, ignore_index=255)
    crop.set_random_seed(0)
    # one class everywhere: every crop fails; the 11th draw is kept unchecked (no endless loop)
    assert count_windows(crop, np.zeros((20, 20), np.uint8)) == 11
    # one class plus ignored pixels: the ignored ones do not count, still a single class
    half_ignored = np.zeros((20, 20), np.uint8)
    half_ignored[:, ::2] = 255
    assert count_windows(crop, half_ignored) == 11
    # a balanced mix passes at once
    assert count_windows(crop, np.indices((20, 20)).sum(0).astype(np.uint8) % 2) == 1
    # 1 turns the check off
    assert count_windows(CatMaxRatioCrop(10, 10, cat_max_ratio=1.0), np.zeros((20, 20), np.uint8)) == 1


def test_cat_max_ratio_steers_crops_away_from_a_dominant_class():
    # class 0 covers 91% of the image; only crops near the bottom-right 30x30 block of class 1 pass
    mask = np.zeros((100, 100), np.uint8)
    mask[70:, 70:] = 1
    image = np.zeros((100, 100, 3), np.uint8)

    def balanced_share(cat_max_ratio):
        crop = CatMaxRatioCrop(40, 40, cat_max_ratio=cat_max_ratio)
        crop.set_random_seed(0)
        passed = 0
        for _ in range(200):
            window = crop(image=image, mask=mask)["mask"]
            passed += (window == 0).mean() < 0.75
        return passed / 200

    unguided, guided = balanced_share(1.0), balanced_share(0.75)
    assert unguided < 0.2  # about 6% of offsets give a balanced crop
    assert guided > 0.4 and guided > 3 * unguided  # 1 - 0.94**11: about half


def test_crop_smaller_image_is_kept_whole():
    crop = CatMaxRatioCrop(32, 32, cat_max_ratio=1.0)
    out = crop(image=np.zeros((20, 40, 3), np.uint8), mask=np.zeros((20, 40), np.uint8))
    assert out["image"].shape == (20, 32, 3) and out["mask"].shape == (20, 32)


def test_photometric_steps_follow_mmseg():
    distort = PhotoMetricDistortion()
    image = np.array([[[10, 100, 250], [0, 128, 255]]], dtype=np.uint8)
    none = {"brightness": None, "contrast": None, "contrast_first": True, "saturation": None, "hue": None}
    assert np.array_equal(distort.apply(image, **none), image)
    # brightness adds, clips and truncates (10 + 20.7 -> 30, 250 + 20.7 -> 255)
    out = distort.apply(image, **{**none, "brightness": 20.7})
    assert out.tolist() == [[[30, 120, 255], [20, 148, 255]]]
    # contrast multiplies (no blending with the mean)
    out = distort.apply(image, **{**none, "contrast": 1.5, "contrast_first": False})
    assert out.tolist() == [[[15, 150, 255], [0, 192, 255]]]
    # saturation 0 leaves grey; hue is in OpenCV's half-degrees, so 60 turns red into green
    assert (np.ptp(distort.apply(image, **{**none, "saturation": 0.0}), axis=-1) == 0).all()
    red = np.array([[[255, 0, 0]]], dtype=np.uint8)
    assert distort.apply(red, **{**none, "hue": 60}).tolist() == [[[0, 255, 0]]]
    with pytest.raises(ValueError, match="uint8"):
        distort.apply(image.astype(np.float32), **none)


def test_photometric_draws_each_step_half_the_time():
    distort = PhotoMetricDistortion()
    distort.set_random_seed(0)
    draws = [distort.get_params() for _ in range(2000)]
    for step in ("brightness", "contrast", "saturation", "hue"):
        share = np.mean([d[step] is not None for d in draws])
        assert 0.45 < share < 0.55, step
    assert 0.45 < np.mean([d["contrast_first"] for d in draws]) < 0.55
    hues = {d["hue"] for d in draws if d["hue"] is not None}
    assert min(hues) == -18 and max(hues) == 17  # numpy's randint(-18, 18), as mmseg draws it
    assert max(abs(d["brightness"]) for d in draws if d["brightness"] is not None) <= 32
    contrasts = [d["contrast"] for d in draws if d["contrast"] is not None]
    assert 0.5 <= min(contrasts) and max(contrasts) <= 1.5
