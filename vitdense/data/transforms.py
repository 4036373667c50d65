"""Albumentations pipelines for classification, the normalisation a backbone expects, image decoding.

The pipelines follow timm's ImageNet recipe (`timm.data.transforms_factory`): a random
resized crop with bicubic interpolation, a horizontal flip and colour jitter for training;
resize the shorter side to `img_size / crop_pct` and centre-crop for evaluation. They take
a [H, W, 3] uint8 RGB array (`decode_image`) and return a [3, img_size, img_size] float32
tensor normalised per channel.
"""

from __future__ import annotations

import random

import albumentations as A
import cv2
import numpy as np
import timm
import torch
from albumentations.pytorch import ToTensorV2
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.seed import pl_worker_init_function
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.backbone.pretrained import check_model_name
from vitdense.errors import DataError

Triple = tuple[float, float, float]


class SharedRandomCompose(A.Compose):
    """`A.Compose` whose transforms draw from one shared random stream once seeded.

    `A.Compose.set_random_seed(seed)` gives every transform its own generator seeded with
    the same number, so the n-th draw of every transform is the same value: with two
    p=0.5 transforms, either both apply or neither does. Sharing one generator (what
    albumentations does when no seed is given) keeps the draws independent and seeded.
    """

    def set_random_seed(self, seed: int | None) -> None:
        self.seed = seed
        self.set_random_state(np.random.default_rng(seed), random.Random(seed))


def classification_train_transforms(
    img_size: int,
    mean: Triple,
    std: Triple,
    scale: tuple[float, float] = (0.08, 1.0),
    hflip: float = 0.5,
    color_jitter: float = 0.4,
) -> A.Compose:
    """Training augmentation: [H, W, 3] uint8 -> [3, img_size, img_size] float32, normalised.

    Args:
        img_size: side of the square output.
        mean, std: per-channel normalisation of pixel values scaled to [0, 1].
        scale: range of the crop's area as a fraction of the image's (Inception crop).
        hflip: probability of a horizontal flip.
        color_jitter: strength of brightness, contrast and saturation jitter; 0 turns it off.
    """
    transforms: list[A.BasicTransform] = [
        A.RandomResizedCrop(size=(img_size, img_size), scale=scale, interpolation=cv2.INTER_CUBIC),
        A.HorizontalFlip(p=hflip),
    ]
    if color_jitter > 0:
        # timm jitters every image and leaves the hue alone; albumentations' defaults differ on both
        transforms.append(
            A.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter, hue=0.0, p=1.0)
        )
    transforms += [A.Normalize(mean=mean, std=std, max_pixel_value=255.0), ToTensorV2()]
    return SharedRandomCompose(transforms)


def classification_eval_transforms(img_size: int, mean: Triple, std: Triple, crop_pct: float = 0.875) -> A.Compose:
    """Evaluation preprocessing: [H, W, 3] uint8 -> [3, img_size, img_size] float32, normalised.

    The shorter side is resized to `int(img_size / crop_pct)` and the centre `img_size`
    square is kept; `crop_pct=1` resizes a square image straight to `img_size`.
    """
    if not 0 < crop_pct <= 1:
        raise DataError(f"crop_pct={crop_pct}: the centre crop is a fraction of the resized image, in (0, 1]")
    return SharedRandomCompose(
        [
            A.SmallestMaxSize(max_size=int(img_size / crop_pct), interpolation=cv2.INTER_CUBIC),
            A.CenterCrop(height=img_size, width=img_size),
            A.Normalize(mean=mean, std=std, max_pixel_value=255.0),
            ToTensorV2(),
        ]
    )


def normalization(backbone: str | None) -> tuple[Triple, Triple]:
    """(mean, std) that the pretrained weights of a timm model name were trained with.

    Args:
        backbone: timm model name, optionally with a pretrained tag
            ("vit_base_patch16_224.augreg_in21k"); without a tag timm's default tag is used.
            None gives ImageNet's mean and std.

    Raises:
        ValueError: timm knows no pretrained weights under that name.
    """
    if backbone is None:
        return tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)
    check_model_name(backbone)  # a typo gets the closest names, not a registry error
    try:
        # a registry lookup: no model is built and nothing is downloaded
        cfg = timm.models.get_pretrained_cfg(backbone, allow_unregistered=False)
    except RuntimeError as err:
        raise DataError(
            f"backbone {backbone!r}: timm has no pretrained config for it ({err}); "
            "use a name from timm.list_pretrained('vit_*'), or pass mean and std explicitly"
        ) from err
    return tuple(cfg.mean), tuple(cfg.std)


def resolve_normalization(backbone: str | None, mean: Triple | None, std: Triple | None) -> tuple[Triple, Triple]:
    """(mean, std): explicit values win, each on its own; the rest comes from `normalization(backbone)`."""
    default_mean, default_std = normalization(backbone) if mean is None or std is None else (mean, std)
    return (tuple(mean) if mean is not None else default_mean), (tuple(std) if std is not None else default_std)


def process_seed() -> int:
    """A seed for this process's augmentations: torch's seed (it follows `seed_everything`)
    mixed with the global rank, so that the processes of a multi-GPU run draw different
    crops instead of the same ones."""
    return (torch.initial_seed() + 1_000_003 * (rank_zero_only.rank or 0)) % 2**32


def seed_worker_transforms(worker_id: int) -> None:
    """DataLoader `worker_init_fn` that gives each worker its own albumentations random state.

    An albumentations `Compose` draws from its own generator, which every worker inherits
    unchanged from the main process: without this, all workers apply the same sequence of
    crops and flips. Lightning's own worker seeding (torch, numpy, random per worker and
    rank) runs first, as it would without a custom `worker_init_fn`; the dataset's
    `transform` is then seeded from the resulting torch seed.
    """
    pl_worker_init_function(worker_id)
    info = torch.utils.data.get_worker_info()
    transform = getattr(info.dataset, "transform", None) if info is not None else None
    if isinstance(transform, A.BaseCompose):
        transform.set_random_seed(torch.initial_seed() % 2**32)
