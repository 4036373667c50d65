"""SegmentationFolderDataset, the segmentation DataModules and data_scripts/ade20k.py on tiny
folders in ADE20K's layout (JPEG images, PNG label maps with 0 = "other")."""

import importlib.util
import logging
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitdense.data import (
    ADE20K_CLASSES,
    ADE20K_PALETTE,
    ADE20KDataModule,
    LoaderConfig,
    SegmentationDataModule,
    SegmentationFolderDataset,
    SegmentedImages,
    segmentation_eval_transforms,
)

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
#: (height, width) of the images of each split; none a multiple of 16, none square
SIZES = {"training": [(40, 56), (48, 36), (44, 60)], "validation": [(36, 50), (52, 40)]}


def label_map(height, width, seed, num_labels=5) -> np.ndarray:
    """Vertical stripes of labels 0..num_labels-1 (0 = "other" in ADE20K), shifted per seed."""
    return ((np.arange(width)[None, :] // 6 + seed) % num_labels).repeat(height, 0).astype(np.uint8)


def write_pair(root: Path, split: str, name: str, labels: np.ndarray, palette: bool = False) -> None:
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations" / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    image = rng.integers(0, 256, (*labels.shape, 3), dtype=np.uint8)
    Image.fromarray(image).save(root / "images" / split / f"{name}.jpg")
    mask = Image.fromarray(labels)  # mode L
    if palette:
        mask = mask.convert("P")  # indices are the grey values; the palette shows colours
        mask.putpalette([c for rgb in ADE20K_PALETTE[:85] for c in rgb])
    mask.save(root / "annotations" / split / f"{name}.png")


@pytest.fixture
def ade(tmp_path) -> Path:
    """ADEChallengeData2016-like folder; the first training label map is a palette PNG."""
    root = tmp_path / "ADEChallengeData2016"
    for split, sizes in SIZES.items():
        prefix = "train" if split == "training" else "val"
        for i, (h, w) in enumerate(sizes):
            write_pair(root, split, f"ADE_{prefix}_{i:08d}", label_map(h, w, i), palette=split == "training" and i == 0)
    return root


def dataset(root: Path, split="training", **kwargs) -> SegmentationFolderDataset:
    kwargs = {"num_classes": 150, "reduce_zero_label": True} | kwargs
    # eval transforms with the short side of the smallest image leave masks untouched
    transform = segmentation_eval_transforms(short_side=32, mean=MEAN, std=STD)
    return SegmentationFolderDataset(root / "images" / split, root / "annotations" / split, transform, **kwargs)


def test_classes_and_palette_match_mmseg():
    assert len(ADE20K_CLASSES) == len(set(ADE20K_CLASSES)) == 150
    assert ADE20K_CLASSES[:5] == ("wall", "building", "sky", "floor", "tree")
    assert ADE20K_CLASSES[7] == "bed"  # mmseg spells it "bed " with a stray space
    assert ADE20K_CLASSES[-2:] == ("clock", "flag")
    assert len(ADE20K_PALETTE) == 150 and all(len(c) == 3 and all(0 <= v <= 255 for v in c) for c in ADE20K_PALETTE)
    assert ADE20K_PALETTE[0] == (120, 120, 120) and ADE20K_PALETTE[-1] == (92, 0, 255)


def test_reduce_zero_label_and_palette_png(ade):
    ds = dataset(ade)
    assert len(ds) == 3 and [p.stem for p, _ in ds.samples] == [f"ADE_train_{i:08d}" for i in range(3)]
    assert Image.open(ds.samples[0][1]).mode == "P"
    for index, (h, w) in enumerate(SIZES["training"]):
        sample = ds[index]
        assert isinstance(sample, SegmentedImages) and sample.index == index
        raw = torch.from_numpy(label_map(h, w, index).astype(np.int64))
        expected = torch.where(raw == 0, 255, raw - 1)  # 0 ("other") ignored, k -> k - 1
        assert sample.mask.dtype == torch.int64 and torch.equal(sample.mask, expected)
        assert sample.mask_sizes == (h, w)
        assert sample.image_sizes == tuple(sample.image.shape[-2:]) and min(sample.image_sizes) == 32
    # without reduction the label map is read as stored, palette indices included
    raw0 = dataset(ade, num_classes=5, reduce_zero_label=False)[0].mask
    assert torch.equal(raw0, torch.from_numpy(label_map(*SIZES["training"][0], 0).astype(np.int64)))


def test_ignore_value_in_file_stays_ignored(ade):
    labels = label_map(40, 40, 0)
    labels[:4] = 255
    write_pair(ade, "training", "ADE_train_00000009", labels)
    mask = dataset(ade)[3].mask
    assert (mask[:4] == 255).all() and set(mask[4:].unique().tolist()) == {255, 0, 1, 2, 3}


def test_unpaired_files_are_named(ade):
    (ade / "annotations" / "training" / "ADE_train_00000001.png").unlink()
    write_pair(ade, "training", "ADE_train_00000077", label_map(8, 8, 0))
    (ade / "images" / "training" / "ADE_train_00000077.jpg").unlink()
    with pytest.raises(ValueError, match=r"ADE_train_00000001\.png.*ADE_train_00000077\.jpg"):
        dataset(ade)


def test_other_files_are_counted_not_silently_dropped(ade, caplog):
    (ade / "images" / "training" / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING):
        assert len(dataset(ade)) == 3
    assert "skipped 1 files" in caplog.text


def test_bad_labels_name_the_file_and_values(ade):
    labels = label_map(40, 40, 0)
    labels[0, :3] = [151, 200, 200]
    write_pair(ade, "training", "ADE_train_00000005", labels)
    ds = dataset(ade)
    with pytest.raises(ValueError, match=r"ADE_train_00000005\.png: label values \[151, 200\]"):
        ds[3]
    # 150 is the last ADE20K class and fine
    labels[0, :3] = 150
    write_pair(ade, "training", "ADE_train_00000005", labels)
    assert ds[3].mask[0, 0] == 149


def test_colour_masks_and_size_mismatches_are_errors(ade):
    ds = dataset(ade)
    Image.new("RGB", (56, 40), (4, 200, 3)).save(ds.samples[0][1])
    with pytest.raises(ValueError, match=r"ADE_train_00000000\.png: label map in PIL mode 'RGB'"):
        ds[0]
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(ds.samples[1][1])
    with pytest.raises(ValueError, match=r"ADE_train_00000001\.jpg is 48x36.*is 10x10"):
        ds[1]


def test_missing_folders_name_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"images/training: no such directory.*annotations"):
        dataset(tmp_path)


def test_datamodule_attributes_before_setup(ade):
    dm = SegmentationDataModule(root=str(ade), class_names=["a", "b", "c", "d"], crop_size=32, reduce_zero_label=True)
    assert dm.num_classes == 4 and dm.class_names == ["a", "b", "c", "d"]
    assert dm.img_size == 32 and dm.ignore_index == 255 and dm.train_dataset is None
    assert dm.mean == (0.485, 0.456, 0.406)
    dm = SegmentationDataModule(root=str(ade), class_names=["a", "b"], backbone="vit_base_patch16_224.augreg_in21k")
    assert dm.mean == (0.5, 0.5, 0.5) and "backbone" not in dm.hparams
    with pytest.raises(ValueError, match="ignore_index=1 is also class 'b'"):
        SegmentationDataModule(root=str(ade), class_names=["a", "b"], ignore_index=1)
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such directory.*annotations/<split>"):
        SegmentationDataModule(root=str(ade / "nowhere"), class_names=["a"])


def test_datamodule_loaders(ade):
    dm = SegmentationDataModule(
        root=str(ade), class_names=["a", "b", "c", "d"], reduce_zero_label=True, crop_size=32, scale=(128, 32),
        eval_short_side=32, mean=MEAN, std=STD, loader=LoaderConfig(batch_size=2, eval_batch_size=2),
    )  # fmt: skip
    dm.setup("fit")
    train = list(dm.train_dataloader())
    assert len(train) == 1  # 3 images, the partial batch dropped
    batch = train[0]
    assert isinstance(batch, SegmentedImages)
    assert batch.image.shape == (2, 3, 32, 32) and batch.mask.shape == (2, 32, 32)
    assert batch.mask.dtype == torch.int64 and not batch.image_sizes.has_padding
    assert set(batch.mask.unique().tolist()) <= {0, 1, 2, 3, 255}
    val = next(iter(dm.val_dataloader()))
    # 36x50 -> 32x44 and 52x40 -> 42x32: padded to 42x44; masks at their original 36x50 and 52x40
    assert val.image_sizes.sizes == ((32, 44), (42, 32)) and val.image.shape == (2, 3, 42, 44)
    assert val.mask_sizes.sizes == ((36, 50), (52, 40)) and val.mask.shape == (2, 52, 50)
    padding = val.image_sizes.mask()
    assert padding[0, 32:].all() and not padding[0, :32, :44].any()
    assert (val.mask[0, 36:] == 255).all()
    dm.setup("predict")
    assert [b.index.tolist() for b in dm.predict_dataloader()] == [[0, 1]]
    with pytest.raises(ValueError, match="test_split"):
        dm.setup("test")


def test_train_split_smaller_than_a_batch_is_an_error(ade):
    dm = SegmentationDataModule(
        root=str(ade), class_names=["a", "b", "c", "d"], reduce_zero_label=True, loader=LoaderConfig(batch_size=8)
    )
    dm.setup("fit")
    with pytest.raises(ValueError, match=f"{ade / 'images' / 'training'}: 3 training images but batch_size=8"):
        dm.train_dataloader()


def test_ade20k_datamodule(ade):
    dm = ADE20KDataModule(
        root=str(ade), crop_size=32, scale=(128, 32), loader=LoaderConfig(batch_size=2, num_workers=0)
    )
    assert dm.num_classes == 150 and dm.class_names == list(ADE20K_CLASSES) and dm.reduce_zero_label
    assert dm.img_size == 32 and dm.ignore_index == 255
    # hparams hold this signature only, so a checkpoint can rebuild it
    assert "class_names" not in dm.hparams and "reduce_zero_label" not in dm.hparams
    assert ADE20KDataModule(**dm.hparams).hparams == dm.hparams
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch.mask.unique().tolist()) <= {0, 1, 2, 3, 255}


def test_ade20k_missing_root_says_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        ADE20KDataModule(root=str(tmp_path / "ade"))
    message = str(err.value)
    assert str(tmp_path / "ade") in message
    assert "ADEChallengeData2016" in message and "images/{training,validation}" in message
    assert "annotations/{training,validation}" in message and "data_scripts/" in message


def load_script():
    path = Path(__file__).parents[2] / "data_scripts" / "ade20k.py"
    spec = importlib.util.spec_from_file_location("ade20k_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_data_script_verify_reports_counts_and_pairs(ade, capsys):
    script = load_script()
    (ade / "images" / "validation" / "ADE_val_00000001.jpg").unlink()
    problems = script.verify(ade, deep=True)
    assert any("3 .jpg images, expected 20210" in p for p in problems)
    assert any("annotations/validation" not in p and "1 images missing (ADE_val_00000001)" in p for p in problems)
    assert script.main(["--verify", str(ade)]) == 1
    assert "PROBLEM" in capsys.readouterr().err
    assert script.verify(ade / "nowhere") == [
        f"{ade / 'nowhere'}: no such directory; expected the extracted {script.FOLDER} folder"
    ]
