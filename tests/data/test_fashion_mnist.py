"""Fashion-MNIST's DataModules on tiny generated IDX files in the layout of Debian's
`dataset-fashion-mnist` (the same four file names, gzipped; or not, as torchvision's `raw/`):
the reader against torchvision's, the splits, the unlabelled variant pre-training reads, and
errors that name the file and the fix. Nothing here reads the installed package."""

import gzip
import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torchvision.datasets.mnist import read_sn3_pascalvincent_tensor

from vitdense.cli import main
from vitdense.core.errors import DataError
from vitdense.data import (
    FASHION_MNIST_CLASSES,
    FashionMNISTDataModule,
    FashionMNISTUnlabeledDataModule,
    LoaderConfig,
    read_idx,
)
from vitdense.data.fashion_mnist import IMAGES_MAGIC, LABELS_MAGIC
from vitdense.tasks import MaskedImageModelingTask

CONFIGS = Path(__file__).parents[2] / "configs"
SCRIPT = Path(__file__).parents[2] / "data_scripts" / "fashion_mnist.py"
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
SIZES = {"train": 12, "t10k": 6}


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An IDX file as LeCun's format defines it: big-endian magic and sizes, then the bytes."""
    header = magic.to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fashion_mnist(root: Path, gz: bool = True, labels: bool = True) -> dict[str, np.ndarray]:
    """The four files (train: 12 images, t10k: 6; label i % 10) under `root`; returns
    {"train"/"t10k": [N, 28, 28] images}."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    images = {}
    for prefix, count in SIZES.items():
        images[prefix] = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        files = {f"{prefix}-images-idx3-ubyte": idx_bytes(images[prefix], IMAGES_MAGIC)}
        if labels:
            files[f"{prefix}-labels-idx1-ubyte"] = idx_bytes(np.arange(count) % 10, LABELS_MAGIC)
        for name, content in files.items():
            if gz:
                (root / f"{name}.gz").write_bytes(gzip.compress(content))
            else:
                (root / name).write_bytes(content)
    return images


def classification(root: Path, **kwargs) -> FashionMNISTDataModule:
    return FashionMNISTDataModule(
        root=str(root), img_size=28, mean=MEAN, std=STD, loader=LoaderConfig(batch_size=4, num_workers=0), **kwargs
    )


def labels_of(loader) -> list[int]:
    return torch.cat([b.label for b in loader]).tolist()


def normalised(gray: np.ndarray) -> torch.Tensor:
    """[H, W] uint8 -> [3, H, W] as the DataModule should give it at the native size."""
    return ((torch.from_numpy(gray).float() / 255 - 0.5) / 0.25).expand(3, *gray.shape)


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "raw"])
def test_read_idx_equals_torchvisions_reader(tmp_path, gz):
    images = write_fashion_mnist(tmp_path, gz=False)
    raw = tmp_path / "train-images-idx3-ubyte"
    reference = read_sn3_pascalvincent_tensor(str(raw)).numpy()  # torchvision reads the raw file only
    labels_reference = read_sn3_pascalvincent_tensor(str(tmp_path / "train-labels-idx1-ubyte")).numpy()
    if gz:
        raw.with_suffix(".gz").write_bytes(gzip.compress(raw.read_bytes()))
        raw = raw.with_suffix(".gz")
    ours = read_idx(raw, IMAGES_MAGIC)
    assert ours.shape == (12, 28, 28) and ours.dtype == np.uint8
    assert np.array_equal(ours, reference) and np.array_equal(ours, images["train"])
    assert np.array_equal(read_idx(tmp_path / "train-labels-idx1-ubyte", LABELS_MAGIC), labels_reference)


def test_classification_trains_on_train_and_validates_on_the_test_split(tmp_path):
    images = write_fashion_mnist(tmp_path)
    dm = classification(tmp_path)
    assert dm.num_classes == 10 and dm.class_names == list(FASHION_MNIST_CLASSES)
    assert dm.class_names[0] == "T-shirt/top" and dm.class_names[9] == "Ankle boot"
    dm.setup("fit")
    assert len(dm.train_dataset) == 12 and len(dm.val_dataset) == 6
    batch = next(iter(dm.train_dataloader()))
    assert batch.image.shape == (4, 3, 28, 28) and batch.image.dtype == torch.float32
    assert torch.equal(batch.image[:, 0], batch.image[:, 2])  # grey: three equal channels
    assert sorted(labels_of(dm.train_dataloader())) == sorted(i % 10 for i in range(12))
    # evaluation at the native size resizes nothing: every pixel comes back as written, in each channel
    sample = dm.val_dataset[3]
    assert sample.label == 3 and sample.index == 3
    torch.testing.assert_close(sample.image, normalised(images["t10k"][3]), rtol=0, atol=1e-5)
    assert labels_of(dm.val_dataloader()) == [0, 1, 2, 3, 4, 5]
    dm.setup("test")
    assert labels_of(dm.test_dataloader()) == labels_of(dm.predict_dataloader()) == [0, 1, 2, 3, 4, 5]
    # resized to the ViT's input from raw files too (torchvision's raw/ layout)
    raw = FashionMNISTDataModule(root=str(tmp_path / "raw"), img_size=32, loader=LoaderConfig(num_workers=0))
    write_fashion_mnist(tmp_path / "raw", gz=False)
    raw.setup("validate")
    assert raw.val_dataset[0].image.shape == (3, 32, 32)


def test_val_fraction_holds_out_a_seeded_part_of_train(tmp_path):
    images = write_fashion_mnist(tmp_path)

    def split(seed):
        dm = classification(tmp_path, val_fraction=0.25, seed=seed)
        dm.setup("fit")
        return dm

    dm = split(0)
    train_idx, val_idx = dm.train_dataset.indices, dm.val_dataset.indices
    assert (len(train_idx), len(val_idx)) == (9, 3) and not set(train_idx) & set(val_idx)
    assert labels_of(dm.val_dataloader()) == [i % 10 for i in val_idx]  # labels follow the held-out images
    torch.testing.assert_close(dm.val_dataset[0].image, normalised(images["train"][val_idx[0]]), rtol=0, atol=1e-5)
    assert np.array_equal(split(0).val_dataset.indices, val_idx)
    assert not np.array_equal(split(1).val_dataset.indices, val_idx)
    dm.setup("test")  # the test split stays the official one
    assert len(dm.test_dataset) == 6


def test_unlabeled_reads_only_the_training_images(tmp_path):
    images = write_fashion_mnist(tmp_path, labels=False)  # no label file at all: none is opened
    dm = FashionMNISTUnlabeledDataModule(
        root=str(tmp_path), img_size=16, val_fraction=0.25, loader=LoaderConfig(batch_size=4, num_workers=0)
    )
    assert dm.num_classes is None and dm.class_names is None
    dm.setup("fit")
    train, val = dm.train_dataset, dm.val_dataset
    assert (len(train), len(val)) == (9, 3) and not set(train.indices) & set(val.indices)
    assert train.images is val.images and len(train.images) == 12  # both from the training images
    batch = next(iter(dm.train_dataloader()))
    assert batch.image.shape == (4, 3, 16, 16) and batch.label.tolist() == [-1] * 4
    assert dm.test_dataset is dm.val_dataset
    # MAE's crops, seeded from torch's seed as every training pipeline
    crops = []
    for _ in range(2):
        torch.manual_seed(7)
        again = FashionMNISTUnlabeledDataModule(root=str(tmp_path), img_size=16, val_fraction=0.25)
        again.setup("fit")
        crops.append(torch.stack([again.train_dataset[i].image for i in range(4)]))
    assert torch.equal(*crops)
    # val_fraction=0: every training image trains, validation on the test images (no labels either)
    whole = FashionMNISTUnlabeledDataModule(root=str(tmp_path), img_size=28, val_fraction=0.0, mean=MEAN, std=STD)
    whole.setup("fit")
    assert len(whole.train_dataset) == 12 and len(whole.val_dataset) == 6 and whole.val_dataset[2].label == -1
    torch.testing.assert_close(whole.val_dataset[2].image, normalised(images["t10k"][2]), rtol=0, atol=1e-5)


def test_hyperparameters_rebuild_the_datamodules(tmp_path):
    for dm in (classification(tmp_path, val_fraction=0.5), FashionMNISTUnlabeledDataModule(root=str(tmp_path))):
        buffer = io.BytesIO()
        torch.save(dict(dm.hparams), buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=True)
        rebuilt = type(dm)(**{**saved, "loader": LoaderConfig(**saved["loader"])})
        assert rebuilt.root == dm.root and rebuilt.val_fraction == dm.val_fraction and rebuilt.loader == dm.loader


def test_a_missing_folder_or_file_names_where_it_looked_and_the_fix(tmp_path):
    missing = tmp_path / "nowhere"
    dm = classification(missing)  # nothing is read on construction
    with pytest.raises(DataError, match=rf"{missing}: no such folder.*apt-get install dataset-fashion-mnist.*root"):
        dm.setup("fit")
    write_fashion_mnist(tmp_path / "partial")
    (tmp_path / "partial" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\[\.gz\]: missing from .*partial.*apt-get install"):
        classification(tmp_path / "partial").setup("test")


def test_damaged_files_are_refused_naming_the_file(tmp_path):
    write_fashion_mnist(tmp_path, gz=False)
    root = tmp_path
    images, labels = root / "t10k-images-idx3-ubyte", root / "t10k-labels-idx1-ubyte"
    good_images, good_labels = images.read_bytes(), labels.read_bytes()

    def refused(pattern: str) -> None:
        with pytest.raises(DataError, match=pattern):
            classification(root).setup("test")

    images.write_bytes(good_labels)  # swapped files
    refused(rf"{images}: magic number 2049 \(an IDX label file\), expected 2051.*swapped")
    images.write_bytes(good_images[:-5])
    refused(rf"{images}: truncated: the header says shape \[6, 28, 28\] \(4704 bytes of values\) but 4699")
    images.write_bytes(good_images + b"\0")
    refused(rf"{images}: longer than its header says")
    images.write_bytes(good_images[:10])
    refused(rf"{images}: truncated inside its 16-byte header")
    images.write_bytes(gzip.compress(good_images)[:-20])
    refused(rf"{images}: a damaged or truncated gzip file")
    images.write_bytes(good_images)
    labels.write_bytes(idx_bytes(np.arange(5), LABELS_MAGIC))
    refused(rf"{labels}: 5 labels but {images} holds 6 images")
    labels.write_bytes(idx_bytes(np.array([0, 1, 2, 3, 4, 10]), LABELS_MAGIC))
    refused(rf"{labels}: label 10 is out of range")
    labels.write_bytes(good_labels)
    classification(root).setup("test")  # restored: reads again


def test_mae_pretrains_on_the_unlabeled_images_through_the_command_line(tmp_path):
    """demo_pretrain.yaml with its data replaced: the task reads the batches as it reads any
    folder of images (labels -1, no classes linked), for two steps of a 1-block ViT."""
    write_fashion_mnist(tmp_path / "fmnist")
    cfg = yaml.safe_load((CONFIGS / "demo_pretrain.yaml").read_text())
    cfg["trainer"].update(
        max_steps=2, limit_val_batches=1, precision="32-true", logger=False, enable_progress_bar=False
    )
    cfg["trainer"].update(default_root_dir=str(tmp_path / "run"), enable_checkpointing=False, callbacks=[])
    cfg["model"]["init_args"]["backbone"].update(
        model_args={"patch_size": 4, "depth": 1, "embed_dim": 24, "num_heads": 2}
    )
    cfg["model"]["init_args"]["objective"]["init_args"].update(
        decoder_embed_dim=24, decoder_depth=1, decoder_num_heads=2
    )
    loader = {"batch_size": 4, "num_workers": 0}
    fmnist = {"root": str(tmp_path / "fmnist"), "img_size": 16, "val_fraction": 0.25, "loader": loader}
    cfg["data"] = {"class_path": "vitdense.data.FashionMNISTUnlabeledDataModule", "init_args": fmnist}
    (tmp_path / "pretrain.yaml").write_text(yaml.safe_dump(cfg))
    cli = main(["fit", "--config", str(tmp_path / "pretrain.yaml")])
    assert cli.trainer.global_step == 2 and isinstance(cli.model, MaskedImageModelingTask)
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_the_measurement_script_reads_a_copy(tmp_path, capsys):
    write_fashion_mnist(tmp_path)
    spec = importlib.util.spec_from_file_location("fashion_mnist_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.main(["--root", str(tmp_path), "--img-size", "16", "--batch-size", "4"])
    assert result["batches"] == 3  # 12 training images, full batches of 4
    out = capsys.readouterr().out
    assert "train: 12 images of 28x28 uint8" in out and "T-shirt/top 2, Trouser 2, Pullover 1" in out
