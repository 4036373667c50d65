"""CIFARDataModule on a fake CIFAR in the real on-disk format (no download)."""

import hashlib
import pickle
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets.cifar as tv_cifar
from torchvision.datasets import CIFAR10, CIFAR100

from vitdense.data import CIFAR10_CLASSES, CIFAR100_CLASSES, CIFARDataModule, LabeledImages, LoaderConfig

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def write_fake_cifar(root: Path, monkeypatch, variant: str, per_batch: int, class_names=None) -> dict[str, np.ndarray]:
    """Pickled batches as in the official archive; returns {file name: [N, 32, 32, 3] images}.

    The official files are Python 2 pickles whose str keys torchvision reads back as str
    ("data", "labels"/"fine_labels"); Python 3 str keys unpickle the same way. torchvision
    checks every file against the official md5, so the dataset class's file lists are
    patched, for this test only, to carry the fake files' md5s: the real integrity check
    still runs.
    """
    cls, names = (CIFAR10, CIFAR10_CLASSES) if variant == "cifar10" else (CIFAR100, CIFAR100_CLASSES)
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "labels" if variant == "cifar10" else "fine_labels"
    rng = np.random.default_rng(0)
    images = {}

    def dump(name, obj):
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
        return [name, hashlib.md5((folder / name).read_bytes()).hexdigest()]

    def batch(name, offset):
        hwc = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        hwc[0] = (10, 200, 60)  # a constant colour, to check the normalisation
        images[name] = hwc
        labels = [(offset + i) % len(names) for i in range(per_batch)]
        # the official rows are channel-major: 1024 red, 1024 green, 1024 blue values
        return dump(name, {"data": hwc.transpose(0, 3, 1, 2).reshape(per_batch, 3072), label_key: labels})

    monkeypatch.setattr(cls, "train_list", [batch(name, i * per_batch) for i, (name, _) in enumerate(cls.train_list)])
    monkeypatch.setattr(cls, "test_list", [batch(name, 0) for name, _ in cls.test_list])
    meta = {**cls.meta}
    meta["md5"] = dump(meta["filename"], {meta["key"]: list(class_names or names)})[1]
    monkeypatch.setattr(cls, "meta", meta)
    return images


def labels_of(loader) -> list[int]:
    return torch.cat([b.label for b in loader]).tolist()


def test_classes_are_known_without_data(tmp_path):
    dm = CIFARDataModule(root=str(tmp_path / "nowhere"), variant="cifar100", download=False)
    assert dm.num_classes == 100 and dm.class_names == sorted(dm.class_names) and len(set(dm.class_names)) == 100
    assert dm.class_names[:3] == ["apple", "aquarium_fish", "baby"] and dm.class_names[-1] == "worm"
    dm = CIFARDataModule(root=str(tmp_path / "nowhere"), variant="cifar10", backbone="deit_tiny_patch16_224")
    assert dm.num_classes == 10 and dm.class_names[0] == "airplane" and dm.mean[0] == pytest.approx(0.485)
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(ValueError, match="val_fraction"):
        CIFARDataModule(root=str(tmp_path), val_fraction=1.0)


def test_cifar100_validates_on_the_test_set(tmp_path, monkeypatch):
    images = write_fake_cifar(tmp_path, monkeypatch, "cifar100", per_batch=12)
    dm = CIFARDataModule(
        root=str(tmp_path),
        variant="cifar100",
        img_size=48,
        mean=MEAN,
        std=STD,
        loader=LoaderConfig(batch_size=4, num_workers=0),
    )
    dm.prepare_data()  # everything is there and passes the md5 check: no download
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, LabeledImages)
    assert batch.image.shape == (4, 3, 48, 48) and batch.image.dtype == torch.float32
    assert len(dm.train_dataloader()) == 3

    val = dm.val_dataset[0]
    assert val.image.shape == (3, 48, 48) and val.label == 0 and val.index == 0
    colour = (torch.tensor((10, 200, 60)) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    torch.testing.assert_close(val.image, colour[:, None, None].expand(3, 48, 48), rtol=0, atol=1e-5)
    assert labels_of(dm.val_dataloader()) == list(range(12))
    # at img_size=32 evaluation resizes nothing: every pixel, in its channel, comes back as written
    same = CIFARDataModule(
        root=str(tmp_path), variant="cifar100", img_size=32, mean=MEAN, std=STD, loader=LoaderConfig(num_workers=0)
    )
    same.setup("validate")
    source = torch.from_numpy(images["test"][5]).permute(2, 0, 1) / 255
    expected = (source - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    torch.testing.assert_close(same.val_dataset[5].image, expected, rtol=0, atol=1e-5)

    dm.setup("test")
    assert labels_of(dm.test_dataloader()) == list(range(12))
    assert labels_of(dm.predict_dataloader()) == list(range(12))


def test_cifar10_holds_out_a_seeded_part_of_train(tmp_path, monkeypatch):
    write_fake_cifar(tmp_path, monkeypatch, "cifar10", per_batch=4)

    def split(seed):
        dm = CIFARDataModule(
            root=str(tmp_path),
            variant="cifar10",
            img_size=32,
            val_fraction=0.25,
            seed=seed,
            loader=LoaderConfig(batch_size=2, num_workers=0),
        )
        dm.setup("fit")
        return dm

    dm = split(seed=0)
    train_idx, val_idx = dm.train_dataset.indices, dm.val_dataset.indices
    assert len(train_idx) == 15 and len(val_idx) == 5 and not set(train_idx) & set(val_idx)
    assert labels_of(dm.val_dataloader()) == [i % 10 for i in val_idx]  # labels follow the held-out images
    assert np.array_equal(split(seed=0).val_dataset.indices, val_idx)
    assert not np.array_equal(split(seed=1).val_dataset.indices, val_idx)


def test_missing_data_names_the_root_and_the_fix(tmp_path, monkeypatch):
    dm = CIFARDataModule(root=str(tmp_path), variant="cifar100", download=False)
    dm.prepare_data()
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'cifar-100-python'}.*download=true.*cifar-100-python"):
        dm.setup("fit")

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(tv_cifar, "download_and_extract_archive", offline)
    with pytest.raises(FileNotFoundError, match=r"could not be downloaded .*unreachable.*extract it into"):
        CIFARDataModule(root=str(tmp_path), variant="cifar100", download=True).prepare_data()


def test_corrupt_or_foreign_files_are_refused(tmp_path, monkeypatch):
    write_fake_cifar(tmp_path / "a", monkeypatch, "cifar10", per_batch=2, class_names=[f"c{i}" for i in range(10)])
    with pytest.raises(ValueError, match=r"batches\.meta.*re-download"):
        CIFARDataModule(root=str(tmp_path / "a"), variant="cifar10", loader=LoaderConfig(num_workers=0)).setup("test")
    monkeypatch.undo()
    write_fake_cifar(tmp_path / "b", monkeypatch, "cifar10", per_batch=2)
    with open(tmp_path / "b" / "cifar-10-batches-py" / "test_batch", "ab") as f:
        f.write(b"tampered")
    with pytest.raises(FileNotFoundError, match="md5"):
        CIFARDataModule(
            root=str(tmp_path / "b"), variant="cifar10", download=False, loader=LoaderConfig(num_workers=0)
        ).setup("test")
