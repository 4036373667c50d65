"""Each family's augmentation pipelines (albumentations), one module per family
(`classification`, `segmentation`, `detection`, `universal`), and what they share
(`common`: the seeded random stream, normalisation, per-worker seeding)."""

from __future__ import annotations

from typing import Any

from vitdense.core.moved import moved_attribute

#: the names of the module this package replaced (until the next release)
_FORMERLY_HERE = {
    "Triple": "vitdense.data.transforms.common",
    "SharedRandomCompose": "vitdense.data.transforms.common",
    "normalization": "vitdense.data.transforms.common",
    "resolve_normalization": "vitdense.data.transforms.common",
    "process_seed": "vitdense.data.transforms.common",
    "seed_worker_transforms": "vitdense.data.transforms.common",
}


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, _FORMERLY_HERE, name)
