"""What every family's transforms share: `SharedRandomCompose` (one seeded random stream),
the normalisation a backbone expects (`normalization`, `resolve_normalization`) and the
seeding of augmentations per process and loader worker. The pipelines themselves are each
family's, one module each beside this one: `classification`, `segmentation`, `detection`,
`universal` (depth's own are in `vitdense.data.depth`).
"""

from __future__ import annotations

import random

import albumentations as A
import numpy as np
import timm
import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.fabric.utilities.seed import pl_worker_init_function
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from vitdense.backbone.pretrained import check_model_name
from vitdense.core.errors import DataError

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
