"""The bad-input corpus: files, datasets and settings as users get them wrong, each with its
exact outcome — one clear message naming the file or setting and the fix, a conversion, or
(with `on_bad_sample: skip`) a skip that is logged and counted. Nothing is dropped silently.

More cases live beside the code they exercise (COCO JSON: tests/data/test_coco.py; ADE20K
pairing and labels: tests/data/test_ade20k.py; checkpoints: tests/test_checkpoints.py)."""

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.data.test_ade20k import label_map, write_pair
from vitdense.cli import main
from vitdense.core.errors import DataError
from vitdense.data import ADE20KDataModule, COCODataModule, ImageFolderDataModule, LoaderConfig, write_synthetic_coco

CONFIGS = Path(__file__).parents[1] / "configs"
RNG = np.random.default_rng(0)


def rgb(h: int = 24, w: int = 20) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def save(mode: str, suffix: str = ".png") -> Callable[[Path], None]:
    return lambda path: Image.fromarray(rgb()).convert(mode).save(path.with_suffix(suffix))


def exif_rotated(path: Path) -> None:
    exif = Image.Exif()
    exif[274] = 8
    Image.fromarray(rgb(16, 28)).save(path.with_suffix(".jpg"), exif=exif)


def truncated(path: Path) -> None:
    Image.fromarray(rgb(64, 64)).save(path.with_suffix(".jpg"))
    path.with_suffix(".jpg").write_bytes(path.with_suffix(".jpg").read_bytes()[:200])


#: an image file in an ImageFolder class folder: (what it is, how it is written, the error or None)
IMAGE_CASES = [
    ("zero-byte JPEG", lambda p: p.with_suffix(".jpg").write_bytes(b""), "empty file (0 bytes); replace or delete it"),
    ("truncated JPEG", truncated, "corrupt or unreadable image"),
    ("text named .jpg", lambda p: p.with_suffix(".jpg").write_text("hello"), "corrupt or unreadable image"),
    ("HTML error page named .png", lambda p: p.with_suffix(".png").write_text("<html>404</html>"), "corrupt"),
    ("CMYK JPEG", save("CMYK", ".jpg"), None),
    ("grayscale PNG", save("L"), None),
    ("bilevel PNG", save("1"), None),
    ("palette PNG", save("P"), None),
    ("RGBA PNG", save("RGBA"), None),
    ("LA PNG", save("LA"), None),
    ("16-bit PNG", lambda p: Image.fromarray(RNG.integers(0, 65536, (20, 20)).astype(np.uint16)).save(p), None),
    ("EXIF-rotated JPEG", exif_rotated, None),
    (
        "float TIFF",
        lambda p: Image.fromarray(RNG.random((20, 20)).astype(np.float32)).save(p.with_suffix(".tif")),
        None,
    ),
]


def image_folder(root: Path, write: Callable[[Path], None]) -> tuple[ImageFolderDataModule, Path]:
    """Two classes of good images in train and val; one val image written by `write`."""
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rgb()).save(root / split / name / f"{i}.png")
    write(root / "val" / "b" / "odd.png")
    (odd,) = (p for p in (root / "val" / "b").iterdir() if p.stem == "odd")
    return odd


def datamodule(root: Path, on_bad_sample: str = "raise", **kwargs) -> ImageFolderDataModule:
    loader = LoaderConfig(batch_size=2, num_workers=0, on_bad_sample=on_bad_sample)
    dm = ImageFolderDataModule(root=str(root), img_size=16, loader=loader, **kwargs)
    dm.setup("validate")
    return dm


def read_all(dm: ImageFolderDataModule) -> list:
    return [batch for batch in dm.val_dataloader() if batch is not None]


@pytest.mark.parametrize("what, write, error", IMAGE_CASES, ids=[c[0] for c in IMAGE_CASES])
def test_image_files_raise_by_default(what, write, error, tmp_path):
    odd = image_folder(tmp_path, write)
    dm = datamodule(tmp_path)
    if error is None:  # converted: every image arrives as 3 channels at the model's size
        batches = read_all(dm)
        assert sum(len(b.label) for b in batches) == 5
        assert all(b.image.shape[1:] == (3, 16, 16) for b in batches)
        assert dm.take_skipped("val") == 0
    else:
        with pytest.raises(DataError) as err:
            read_all(dm)
        assert str(err.value).startswith(f"{odd}: ") and error in str(err.value)


@pytest.mark.parametrize(
    "what, write, error", [c for c in IMAGE_CASES if c[2]], ids=[c[0] for c in IMAGE_CASES if c[2]]
)
def test_image_files_skipped_are_logged_and_counted(what, write, error, tmp_path, caplog):
    odd = image_folder(tmp_path, write)
    dm = datamodule(tmp_path, on_bad_sample="skip")
    with caplog.at_level(logging.WARNING):
        batches = read_all(dm)
    assert sum(len(b.label) for b in batches) == 4  # the 4 good images, the bad one left out
    assert dm.take_skipped("val") == 1 and dm.take_skipped("val") == 0
    assert f"skipped a bad sample (on_bad_sample=skip): {odd}: " in caplog.text


def test_sixteen_bit_is_scaled_not_clipped_through_the_datamodule(tmp_path):
    values = np.full((20, 20), 32896, np.uint16)  # mid-grey in 16 bits; clipping would make it white
    image_folder(tmp_path, lambda p: Image.fromarray(values).save(p))
    dm = datamodule(tmp_path, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    index = [Path(p).stem for p, _ in dm.val_dataset.samples].index("odd")
    pixels = dm.val_dataset[index].image
    assert torch.allclose(pixels, torch.full_like(pixels, 128 / 255), atol=1e-3)


# ------------------------------------------------------------------ segmentation pairs
def ade(tmp_path: Path) -> Path:
    root = tmp_path / "ADEChallengeData2016"
    for split, prefix in (("training", "train"), ("validation", "val")):
        for i in range(2):
            write_pair(root, split, f"ADE_{prefix}_{i:08d}", label_map(30, 40, i, num_labels=151))
    return root


def break_pair(root: Path, how: str) -> Path:
    """Spoil the first validation pair; returns the file the message must name."""
    image = root / "images" / "validation" / "ADE_val_00000000.jpg"
    labels = root / "annotations" / "validation" / "ADE_val_00000000.png"
    if how == "image without label map":
        labels.unlink()
        return labels.parent
    if how == "label map without image":
        image.unlink()
        return image.parent
    if how == "label map of another size":
        Image.fromarray(label_map(20, 40, 0, num_labels=151)).save(labels)
        return image
    if how == "label value beyond the classes":
        Image.fromarray(np.full((30, 40), 200, np.uint8)).save(labels)
        return labels
    if how == "colour label map":
        Image.fromarray(rgb(30, 40)).save(labels)
        return labels
    if how == "corrupt label map":
        labels.write_bytes(b"\x89PNG not really")
        return labels
    raise AssertionError(how)


SEG_CASES = {
    "image without label map": "do not pair up by name",
    "label map without image": "do not pair up by name",
    "label map of another size": "a label map must match its image pixel for pixel",
    "label value beyond the classes": "label values [200] are not classes",
    "colour label map": "label map in PIL mode 'RGB'",
    "corrupt label map": "corrupt or unreadable label map",
}


@pytest.mark.parametrize("how", SEG_CASES)
def test_segmentation_pairs(how, tmp_path):
    root = ade(tmp_path)
    named = break_pair(root, how)
    dm = ADE20KDataModule(
        root=str(root), crop_size=32, eval_short_side=32, loader=LoaderConfig(batch_size=2, num_workers=0)
    )
    with pytest.raises(DataError) as err:
        dm.setup("validate")
        list(dm.val_dataloader())
    assert str(named) in str(err.value) and SEG_CASES[how] in str(err.value)


def test_exif_rotated_image_and_its_label_map_turn_together(tmp_path):
    """A label map drawn on the pixels as stored follows the EXIF turn of its photo."""
    root = ade(tmp_path)
    labels = label_map(30, 40, 0, num_labels=151)
    labels[:5, :] = 7  # a band along the stored top edge
    exif = Image.Exif()
    exif[274] = 6  # shown turned 90 degrees clockwise: the stored top edge becomes the right edge
    Image.fromarray(rgb(30, 40)).save(root / "images" / "validation" / "ADE_val_00000000.jpg", exif=exif)
    Image.fromarray(labels).save(root / "annotations" / "validation" / "ADE_val_00000000.png")
    dm = ADE20KDataModule(
        root=str(root), crop_size=32, eval_short_side=32, loader=LoaderConfig(batch_size=1, num_workers=0)
    )
    dm.setup("validate")
    sample = dm.val_dataset[0]
    assert tuple(sample.mask.shape) == (40, 30)  # upright
    assert (sample.mask[:, -5:] == 6).all()  # class 7 on disk is label 6 (reduce_zero_label): now the right edge


# ------------------------------------------------------------------ COCO boxes and files
def coco(tmp_path: Path, change: Callable[[dict], None]) -> tuple[Path, Path]:
    for split in ("train2017", "val2017"):
        path = write_synthetic_coco(tmp_path, split, 4, img_size=48, num_classes=3, seed=1)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path, tmp_path / "val2017"


def test_coco_box_outside_the_image_is_clipped_and_counted(tmp_path, caplog):
    def outside(data):
        image = data["images"][0]
        data["annotations"].append(
            dict(id=901, image_id=image["id"], category_id=1, bbox=[-10, 2, 30, 8], area=240.0, iscrowd=0)
        )
        data["annotations"].append(
            dict(id=902, image_id=image["id"], category_id=1, bbox=[image["width"] + 5, 2, 9, 9], area=81.0, iscrowd=0)
        )

    path, _ = coco(tmp_path, outside)
    dm = COCODataModule(root=str(tmp_path), eval_short_side=48, loader=LoaderConfig(batch_size=2, num_workers=0))
    with caplog.at_level(logging.INFO):
        index = dm.index("val")
    first = index.images[0]
    assert [0, 2, 20, 10] in first.boxes.tolist()  # clipped at x = 0
    assert "1 boxes have no area once clipped" in caplog.text and "annotation id 902" in caplog.text


def test_coco_zero_area_box_is_dropped_and_counted(tmp_path, caplog):
    def flat(data):
        data["annotations"].append(
            dict(id=903, image_id=data["images"][1]["id"], category_id=3, bbox=[4, 4, 0, 6], area=0.0, iscrowd=0)
        )

    coco(tmp_path, flat)
    dm = COCODataModule(root=str(tmp_path), eval_short_side=48, loader=LoaderConfig(batch_size=2, num_workers=0))
    with caplog.at_level(logging.INFO):
        dm.index("val")
    assert "annotation id 903" in caplog.text


def test_coco_image_of_another_size_than_its_entry(tmp_path):
    path, images = coco(tmp_path, lambda d: d["images"][0].update(width=d["images"][0]["width"] + 3))
    dm = COCODataModule(root=str(tmp_path), eval_short_side=48, loader=LoaderConfig(batch_size=2, num_workers=0))
    dm.setup("validate")
    with pytest.raises(DataError, match=r"but .*instances_val2017.json says .*fix the JSON entry of image id"):
        dm.val_dataset[0]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda tmp: COCODataModule(root=str(tmp / "coco")), "python data_scripts/coco.py --out"),
        (lambda tmp: ADE20KDataModule(root=str(tmp / "ade")), "data_scripts/ade20k.py"),
        (lambda tmp: ImageFolderDataModule(root=str(tmp / "imagenet")), "python data_scripts/imagenet.py"),
    ],
    ids=["COCO", "ADE20K", "ImageNet"],
)
def test_missing_dataset_names_the_path_and_the_script(make, message, tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        make(tmp_path)
    assert str(tmp_path) in str(err.value) and message in str(err.value)


# ------------------------------------------------------------------ through the command line
def cli_error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()


def imagenet_args(root: Path, *extra: str) -> list[str]:
    args = ["fit", "--config", str(CONFIGS / "cls_imagenet.yaml"), f"--data.init_args.root={root}"]
    args += ["--model.init_args.backbone.pretrained=false", "--model.init_args.backbone.model_args={depth: 1}"]
    args += ["--data.init_args.img_size=32", "--data.init_args.loader.batch_size=2", "--trainer.devices=1"]
    args += ["--trainer.strategy=auto", "--trainer.accelerator=cpu", "--trainer.max_steps=2"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.num_sanity_val_steps=0", "--trainer.logger=false"]
    args += ["--trainer.enable_checkpointing=false", "--trainer.callbacks=[]"]
    return [*args, *extra]


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_errors_are_the_same_one_line(workers, tmp_path, capsys, monkeypatch):
    """With loader workers, the error arrives as it would without them: one line naming the file."""
    monkeypatch.chdir(tmp_path)
    odd = image_folder(tmp_path / "imagenet", lambda p: p.with_suffix(".jpg").write_bytes(b""))
    lines = cli_error(imagenet_args(tmp_path / "imagenet", f"--data.init_args.loader.num_workers={workers}"), capsys)
    assert lines[-1] == f"vitdense: error: {odd}: empty file (0 bytes); replace or delete it"


def test_skip_through_a_fit_is_logged_and_counted(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "imagenet", lambda p: p.with_suffix(".jpg").write_bytes(b""))
    for name in ("bad1.jpg", "bad2.png"):
        (tmp_path / "imagenet" / "train" / "a" / name).write_bytes(b"garbage")
    args = imagenet_args(tmp_path / "imagenet", "--data.init_args.loader.on_bad_sample=skip")
    args += ["--data.init_args.loader.num_workers=0", "--trainer.max_steps=-1", "--trainer.max_epochs=1"]
    with caplog.at_level(logging.WARNING):
        cli = main(args)
    metrics = cli.trainer.callback_metrics
    assert metrics["train/skipped_samples"] == 2 and metrics["val/skipped_samples"] == 1
    assert "train: skipped 2 bad samples this epoch" in caplog.text
    assert "val: skipped 1 bad samples this epoch" in caplog.text
    for name in ("bad1.jpg", "bad2.png", "odd.jpg"):
        assert f"/{name}: " in caplog.text  # each named when skipped


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data.init_args.img_size=-3"], "vitdense: error: data.init_args.img_size=-3: must be positive"),
        (
            ["--data.init_args.loader.batch_size=0"],
            "vitdense: error: data.init_args.loader.batch_size=0: must be positive",
        ),
        (
            ["--data.init_args.loader.num_workers=-1"],
            "data.init_args.loader.num_workers=-1: must be 0 (load in the main process)",
        ),
        (["--data.init_args.loader.batch_size=abc"], 'Parser key "loader.batch_size"'),
        (["--data.init_args.loader.on_bad_sample=sometimes"], "on_bad_sample"),
        (["--model.init_args.pol=avg"], "pol"),
        (["--model.init_args.num_classes=7"], "model.init_args.num_classes=7: the task takes it from the data"),
        (["--model.init_args.backbone.img_size=32"], "set that instead"),
        (["--data.init_args.backbone=vit_base_patch16_224"], "data.init_args.backbone: the data normalises as"),
        (["--trainer.max_epochs=many"], "max_epochs"),
        (
            ["--data.init_args.batch_size=4"],
            "data.init_args.batch_size: the loader settings live in one block now; "
            "write data.init_args.loader.batch_size",
        ),
    ],
    ids=[
        "negative size",
        "zero batch",
        "negative workers",
        "wrong type",
        "unknown policy",
        "unknown key",
        "linked classes",
        "linked size",
        "linked normalisation",
        "trainer type",
        "flat loader key",
    ],
)
def test_bad_settings_are_one_clear_error(args, message, capsys):
    lines = cli_error(["fit", "--config", str(CONFIGS / "demo_cls.yaml"), *args], capsys)
    assert lines[0].startswith("vitdense: error: ") and message in "\n".join(lines)
    assert "usage:" not in "\n".join(lines)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda root: ADE20KDataModule(root=str(root), eval_short_side=0),
            "data.init_args.eval_short_side=0: must be positive",
        ),
        (
            lambda root: ADE20KDataModule(root=str(root), scale=(2048, -1)),
            "data.init_args.scale=(2048, -1): must be positive",
        ),
        (
            lambda root: COCODataModule(root=str(root), scales=[480, 0]),
            "data.init_args.scales=[480, 0]: must be positive",
        ),
        (
            lambda root: COCODataModule(root=str(root), crop_size=(0, 600)),
            "data.init_args.crop_size=(0, 600): must be positive",
        ),
    ],
    ids=["ADE20K eval size", "ADE20K scale", "COCO scales", "COCO crop"],
)
def test_out_of_range_sizes_name_the_setting(make, message, tmp_path):
    with pytest.raises(DataError) as err:
        make(tmp_path)
    assert str(err.value) == message


def test_bad_yaml_is_one_clear_error(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text("model:\n  class_path: vitdense.tasks.ClassificationTask\n  init_args: [unclosed\n")
    lines = cli_error(["fit", "--config", str(config)], capsys)
    assert lines == [
        f"vitdense: error: {config}: not valid YAML (expected ',' or ']', but got '<stream end>' at line 4, column 1)"
    ]
