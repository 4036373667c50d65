"""Classification pipelines, backbone normalisation, image decoding."""

import albumentations as A
import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset

from vitdense.data import (
    classification_eval_transforms,
    classification_train_transforms,
    decode_image,
    normalization,
    seed_worker_transforms,
)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def expected(colour, mean=MEAN, std=STD) -> torch.Tensor:
    """[3] normalised value of a uint8 RGB colour."""
    return (torch.tensor(colour) / 255 - torch.tensor(mean)) / torch.tensor(std)


def test_normalization_follows_the_pretrained_tag():
    assert normalization("vit_base_patch16_224.augreg_in21k") == ((0.5,) * 3, (0.5,) * 3)
    assert normalization("deit_tiny_patch16_224") == (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    assert normalization(None) == (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    for name in ("vit_nonexistent_patch16_224", "vit_base_patch16_224.no_such_tag"):
        with pytest.raises(ValueError, match=name):
            normalization(name)


def test_train_pipeline_shapes_and_normalises_a_constant_image():
    colour = (200, 30, 90)
    image = np.broadcast_to(np.array(colour, np.uint8), (50, 70, 3)).copy()
    out = classification_train_transforms(32, MEAN, STD, color_jitter=0.0)(image=image)["image"]
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    # crops, flips and bicubic resizing leave a constant image constant
    torch.testing.assert_close(out, expected(colour)[:, None, None].expand(3, 32, 32), rtol=0, atol=1e-5)


def test_train_pipeline_jitters_like_timm_and_can_skip_it():
    def jitters(pipeline):
        return [t for t in pipeline.transforms if isinstance(t, A.ColorJitter)]

    assert not jitters(classification_train_transforms(32, MEAN, STD, color_jitter=0.0))
    (jitter,) = jitters(classification_train_transforms(32, MEAN, STD, color_jitter=0.4))
    assert jitter.p == 1 and tuple(jitter.hue) == (0, 0) and tuple(jitter.brightness) == pytest.approx((0.6, 1.4))
    image = np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    pipeline = classification_train_transforms(24, MEAN, STD, scale=(0.2, 0.5), hflip=0.0)
    assert pipeline(image=image)["image"].shape == (3, 24, 24)


def test_eval_pipeline_resizes_the_shorter_side_then_crops_the_centre():
    # left third red, middle third green, right third blue: a centre crop of a wide image is green
    image = np.zeros((60, 180, 3), np.uint8)
    image[:, :60, 0] = image[:, 60:120, 1] = image[:, 120:, 2] = 255
    out = classification_eval_transforms(32, MEAN, STD, crop_pct=0.8)(image=image)["image"]
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    # shorter side 40 -> width 120; the centre 32 columns lie well inside the green band
    torch.testing.assert_close(out[:, 16, 16], expected((0, 255, 0)), rtol=0, atol=1e-5)
    assert torch.equal(out, classification_eval_transforms(32, MEAN, STD, crop_pct=0.8)(image=image)["image"])
    with pytest.raises(ValueError, match="crop_pct"):
        classification_eval_transforms(32, MEAN, STD, crop_pct=1.5)


@pytest.mark.parametrize("mode", ["L", "RGBA", "CMYK", "P"])
def test_decode_image_gives_rgb_uint8(tmp_path, mode):
    path = tmp_path / f"img_{mode}.{'jpg' if mode == 'CMYK' else 'png'}"
    Image.new("RGB", (7, 5), (10, 120, 250)).convert(mode).save(path)
    out = decode_image(path)
    assert out.shape == (5, 7, 3) and out.dtype == np.uint8
    if mode == "L":
        assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()


def test_decode_image_names_a_corrupt_file(tmp_path):
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match=r"garbage\.jpg.*corrupt"):
        decode_image(garbage)
    truncated = tmp_path / "truncated.jpg"
    Image.effect_noise((64, 64), 50).convert("RGB").save(tmp_path / "whole.jpg")
    truncated.write_bytes((tmp_path / "whole.jpg").read_bytes()[:300])
    with pytest.raises(ValueError, match=r"truncated\.jpg.*corrupt"):
        decode_image(truncated)
    with pytest.raises(FileNotFoundError):
        decode_image(tmp_path / "missing.jpg")


class SameImage(Dataset):
    def __init__(self, transform):
        self.transform = transform
        self.image = np.random.default_rng(0).integers(0, 256, (48, 48, 3), dtype=np.uint8)

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return self.transform(image=self.image)["image"]


def test_workers_draw_different_augmentations():
    dataset = SameImage(classification_train_transforms(16, MEAN, STD))
    # batch_size=1: samples 0 and 1 come from workers 0 and 1, each one's first draw
    first, second, *_ = DataLoader(dataset, num_workers=2, worker_init_fn=seed_worker_transforms)
    assert not torch.equal(first, second)


def test_augmentation_seed_differs_between_ranks(monkeypatch):
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from vitdense.data.transforms.common import process_seed

    torch.manual_seed(0)
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    rank0 = process_seed()
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert process_seed() != rank0  # same seed_everything, different crops per GPU
    torch.manual_seed(0)
    assert process_seed() == (0 + 1_000_003) % 2**32
