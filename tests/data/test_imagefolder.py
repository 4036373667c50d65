"""ImageFolderDataset and ImageFolderDataModule on tiny folders in the ImageNet layout."""

import logging
from pathlib import Path

import pytest
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN

from vitdense.data import (
    ImageFolderDataModule,
    ImageFolderDataset,
    LabeledImages,
    LoaderConfig,
    classification_eval_transforms,
)

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
#: one constant colour per class, so every label can be read back from the pixels
COLOURS = {"bird": (255, 0, 0), "cat": (0, 255, 0), "dog": (0, 0, 255)}


def write_image(path: Path, colour, size=(20, 14), mode="RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).convert(mode).save(path)


def make_split(root: Path, classes, per_class=3) -> None:
    """`root/<class>/` with a .jpg, a .png and an upper-case .JPEG (and more .png) per class."""
    for name in classes:
        names = ["a.jpg", "b.png", "C.JPEG"] + [f"x{i}.png" for i in range(per_class - 3)]
        for file in names[:per_class]:
            write_image(root / name / file, COLOURS[name])


@pytest.fixture
def imagenet(tmp_path) -> Path:
    make_split(tmp_path / "train", ["cat", "dog", "bird"], per_class=4)
    make_split(tmp_path / "val", ["dog", "bird"])
    write_image(tmp_path / "train" / "cat" / "gray.png", (128, 128, 128), mode="L")
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    return tmp_path


def dataset(root, **kwargs) -> ImageFolderDataset:
    # crop_pct=1 and a square size: every image is resized whole, so its colour survives exactly
    return ImageFolderDataset(root, classification_eval_transforms(16, MEAN, STD, crop_pct=1.0), **kwargs)


def normalised(colour) -> torch.Tensor:
    return (torch.tensor(colour) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)


def test_dataset_reads_classes_labels_and_pixels(imagenet, caplog):
    with caplog.at_level(logging.WARNING):
        ds = dataset(imagenet / "train")
    assert ds.class_names == ["bird", "cat", "dog"]
    assert len(ds) == 13 and ds.targets == [0] * 4 + [1] * 5 + [2] * 4
    assert "skipped 1 files" in caplog.text  # notes.txt, counted rather than dropped silently
    assert any(path.endswith("C.JPEG") for path, _ in ds.samples)
    for index in range(len(ds)):
        sample = ds[index]
        assert isinstance(sample, LabeledImages) and sample.index == index
        assert sample.image.shape == (3, 16, 16) and sample.image.dtype == torch.float32
        path = ds.samples[index][0]
        colour = (128, 128, 128) if path.endswith("gray.png") else COLOURS[ds.class_names[sample.label]]
        # JPEG is lossy, even on a flat colour
        atol = 0.1 if path.lower().endswith((".jpg", ".jpeg")) else 1e-5
        torch.testing.assert_close(
            sample.image, normalised(colour)[:, None, None].expand_as(sample.image), atol=atol, rtol=0
        )


def test_val_split_uses_the_train_class_list(imagenet):
    train = dataset(imagenet / "train")
    val = dataset(imagenet / "val", class_names=train.class_names)
    assert val.class_names == ["bird", "cat", "dog"]
    # sorted on its own, val would call dog 1; with train's list it is 2
    assert val.targets == [0] * 3 + [2] * 3
    assert [train.class_names[label] for label in val.targets] == [Path(p).parent.name for p, _ in val.samples]


def test_val_class_missing_from_train_is_named(imagenet):
    make_split(imagenet / "val", ["cat"])
    write_image(imagenet / "val" / "fox" / "a.png", (1, 2, 3))
    with pytest.raises(ValueError, match=r"\['fox'\]"):
        dataset(imagenet / "val", class_names=["bird", "cat", "dog"])


def test_layout_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'nowhere'}.*<class>/<image>"):
        dataset(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=rf"{tmp_path / 'empty'}: no class folders"):
        dataset(tmp_path / "empty")
    make_split(tmp_path / "split", ["cat"])
    (tmp_path / "split" / "dog").mkdir()
    (tmp_path / "split" / "dog" / "readme.txt").write_text("no images here")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'split' / 'dog'}: class folder without images"):
        dataset(tmp_path / "split")


def test_corrupt_image_is_named_when_read(imagenet):
    (imagenet / "train" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    ds = dataset(imagenet / "train")
    index = next(i for i, (path, _) in enumerate(ds.samples) if path.endswith("broken.jpg"))
    with pytest.raises(ValueError, match=r"broken\.jpg.*corrupt"):
        ds[index]


def test_datamodule_knows_its_classes_before_setup(imagenet):
    dm = ImageFolderDataModule(
        root=str(imagenet),
        img_size=16,
        backbone="vit_base_patch16_224.augreg_in21k",
        loader=LoaderConfig(num_workers=0),
    )
    assert dm.num_classes == 3 and dm.class_names == ["bird", "cat", "dog"] and dm.img_size == 16
    assert dm.mean == (0.5, 0.5, 0.5) and dm.std == (0.5, 0.5, 0.5)
    assert dm.train_dataset is None  # nothing read yet
    dm = ImageFolderDataModule(root=str(imagenet), mean=(0.1, 0.2, 0.3))
    assert dm.mean == (0.1, 0.2, 0.3) and dm.std != dm.mean  # explicit mean wins, std from the default
    assert ImageFolderDataModule(root=str(imagenet)).mean == IMAGENET_DEFAULT_MEAN
    with pytest.raises(FileNotFoundError, match="nothere"):
        ImageFolderDataModule(root=str(imagenet), train_split="nothere")


def test_datamodule_loaders(imagenet):
    dm = ImageFolderDataModule(
        root=str(imagenet), img_size=16, mean=MEAN, std=STD, loader=LoaderConfig(batch_size=4, num_workers=0)
    )
    dm.setup("fit")
    train = list(dm.train_dataloader())
    assert len(train) == 3  # 13 images, the partial batch dropped
    batch = train[0]
    assert isinstance(batch, LabeledImages)
    assert batch.image.shape == (4, 3, 16, 16) and batch.image.dtype == torch.float32
    assert batch.label.dtype == torch.int64 and batch.index.dtype == torch.int64
    seen = torch.cat([b.index for b in train])
    assert len(seen.unique()) == 12 and not torch.equal(seen, torch.arange(12))  # shuffled

    val = list(dm.val_dataloader())
    assert [len(b.label) for b in val] == [4, 2]
    assert torch.cat([b.label for b in val]).tolist() == [0, 0, 0, 2, 2, 2]
    assert torch.cat([b.index for b in val]).tolist() == list(range(6))

    with pytest.raises(ValueError, match="test_split"):
        dm.setup("test")
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == 6  # the val split by default
    too_big = ImageFolderDataModule(root=str(imagenet), img_size=16)  # its default batch of 64
    too_big.setup("fit")
    with pytest.raises(ValueError, match=f"{imagenet / 'train'}: .* training images but batch_size=64"):
        too_big.train_dataloader()


def test_datamodule_test_split(imagenet):
    make_split(imagenet / "test", ["cat"])
    dm = ImageFolderDataModule(
        root=str(imagenet), img_size=16, test_split="test", loader=LoaderConfig(batch_size=2, num_workers=0)
    )
    dm.setup("test")
    assert torch.cat([b.label for b in dm.test_dataloader()]).tolist() == [1, 1, 1]
    assert dm.test_dataloader().dataset.class_names == dm.class_names


def test_the_run_seed_reproduces_the_training_batches(imagenet, monkeypatch):
    def first_batch(seed):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))  # what seed_everything sets
        dm = ImageFolderDataModule(root=str(imagenet), img_size=16, loader=LoaderConfig(batch_size=4, num_workers=0))
        dm.setup("fit")
        return next(iter(dm.train_dataloader()))

    a, b, c = first_batch(1), first_batch(1), first_batch(2)
    assert torch.equal(a.image, b.image) and torch.equal(a.index, b.index)
    assert not torch.equal(a.image, c.image)


def test_validation_on_a_held_out_part_of_the_training_split(imagenet):
    def splits(seed):
        data = ImageFolderDataModule(
            root=str(imagenet), img_size=16, val_fraction=0.25, seed=seed, test_split="val", mean=MEAN, std=STD
        )
        data.setup("fit")
        return data, [p for p, _ in data.train_dataset.samples], [p for p, _ in data.val_dataset.samples]

    data, train, val = splits(0)
    whole = [p for p, _ in ImageFolderDataset(imagenet / "train", lambda image: {"image": image}).samples]
    assert len(val) == 3 and sorted(train + val) == sorted(whole) and not set(train) & set(val)
    assert all("/train/" in p for p in val)  # never the val folder, which `test` reports on
    assert [int(s.index) for s in data.val_dataset] == [0, 1, 2]  # re-indexed: per-sample keys stay unique
    assert splits(0)[2] == val and splits(1)[2] != val  # the seed fixes it
    data.setup("test")
    assert all("/val/" in p for p, _ in data.test_dataset.samples)
