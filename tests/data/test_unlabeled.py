"""UnlabeledImagesDataModule: a flat folder and ImageNet's layout (class folders ignored),
held-out or folder validation, MAE's seeded augmentation, and errors that name the fix."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.data.test_imagefolder import make_split
from vitdense.core.errors import DataError
from vitdense.data import LoaderConfig, UnlabeledImagesDataModule


def flat_folder(root: Path, count: int = 10) -> Path:
    rng = np.random.default_rng(0)
    (root / "nested").mkdir(parents=True)
    for i in range(count):
        folder = root / "nested" if i % 3 == 0 else root  # any tree of folders
        Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    (root / "readme.txt").write_text("not an image")
    return root


def module(root: Path, **kwargs) -> UnlabeledImagesDataModule:
    return UnlabeledImagesDataModule(root=str(root), img_size=16, loader=LoaderConfig(batch_size=4), **kwargs)


def test_a_flat_folder_is_split_into_train_and_held_out_validation(tmp_path):
    dm = module(flat_folder(tmp_path), val_fraction=0.2)
    dm.setup("fit")
    train, val = dm.train_dataset, dm.val_dataset
    assert (len(train), len(val)) == (8, 2) and not set(train.paths) & set(val.paths)
    assert dm.num_classes is None and dm.class_names is None
    sample = train[0]
    assert sample.image.shape == (3, 16, 16) and sample.label == -1 and sample.index == 0
    batch = next(iter(dm.train_dataloader()))
    assert batch.image.shape == (4, 3, 16, 16) and batch.label.tolist() == [-1] * 4


def test_imagenet_layout_ignores_the_class_folders(tmp_path):
    make_split(tmp_path / "train", ["cat", "dog"], per_class=4)
    make_split(tmp_path / "val", ["cat"], per_class=3)
    dm = module(tmp_path, train_dir="train", val_dir="val")
    dm.setup("fit")
    assert len(dm.train_dataset) == 8 and len(dm.val_dataset) == 3
    assert dm.val_dataset[0].image.shape == (3, 16, 16)
    dm.setup("test")
    assert dm.test_dataset.paths == dm.val_dataset.paths


def test_training_crops_are_seeded(tmp_path):
    root = flat_folder(tmp_path)
    batches = []
    for _ in range(2):
        torch.manual_seed(7)
        dm = module(root)
        dm.setup("fit")
        batches.append(torch.stack([dm.train_dataset[i].image for i in range(4)]))
    assert torch.equal(*batches)


def test_bad_settings_name_the_folder_or_key(tmp_path):
    with pytest.raises(DataError, match="val_fraction"):
        module(tmp_path, val_fraction=0.0)
    dm = module(tmp_path / "missing")
    with pytest.raises(DataError, match="missing.*no such folder"):
        dm.setup("fit")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no image files.*train_dir"):
        module(tmp_path / "empty", train_dir="train").setup("fit")
    flat_folder(tmp_path / "photos")
    with pytest.raises(DataError, match="val.*val_dir"):
        module(tmp_path / "photos", val_dir="val").setup("fit")
