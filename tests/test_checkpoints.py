"""A checkpoint is self-contained: `predict --ckpt_path X --data.predict_dir photos/` on any
folder of images for every task, offline, without the dataset or a config; and a checkpoint
that does not fit is one clear line."""

import csv
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitdense.tasks  # noqa: F401  (the types checkpoints hold, for weights_only loading)
from vitdense.cli import main

CONFIGS = Path(__file__).parents[1] / "configs"
#: stored (H, W) of each photo; the EXIF-rotated one is upright as (60, 40)
PHOTOS = {
    "a.jpg": (50, 70),
    "rotated.jpg": (40, 60),
    "gray16.png": (33, 47),
    "rgba.png": (30, 30),
    "cmyk.jpg": (45, 35),
    "palette.gif": (28, 52),
    "sub/deeper.png": (64, 48),
}
UPRIGHT = {**PHOTOS, "rotated.jpg": (60, 40)}


def write_photos(root: Path) -> Path:
    """A folder of unlabelled images as users have them: sizes, formats, modes, EXIF, a
    sub-folder and a file that is not an image."""
    rng = np.random.default_rng(0)
    (root / "sub").mkdir(parents=True)
    for name, (h, w) in PHOTOS.items():
        rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        if name == "rotated.jpg":
            exif = Image.Exif()
            exif[274] = 6  # stored sideways; viewers turn it 90 degrees clockwise
            rgb.save(root / name, exif=exif)
        elif name == "gray16.png":
            Image.fromarray(rng.integers(0, 65536, (h, w)).astype(np.uint16)).save(root / name)
        elif name == "rgba.png":
            rgb.convert("RGBA").save(root / name)
        elif name == "cmyk.jpg":
            rgb.convert("CMYK").save(root / name)
        elif name == "palette.gif":
            rgb.convert("P").save(root / name)
        else:
            rgb.save(root / name)
    (root / "README.txt").write_text("not an image")
    return root


def offline_env(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("NO_ALBUMENTATIONS_UPDATE", "1")


def predict(ckpt: Path, photos: Path, *writer: str) -> None:
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false", *writer])


def test_classification_predicts_a_folder_from_the_checkpoint_alone(trained, tmp_path, monkeypatch):
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)  # no dataset, no config here
    _, ckpt = trained["cls"]
    out = tmp_path / "classes.csv"
    writer = [
        "--trainer.callbacks+=vitdense.training.callbacks.TopKPredictionWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predict(ckpt, write_photos(tmp_path / "photos"), *writer)
    # the training run's callbacks (checkpointing, images) are not needed to predict: no warning
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]
    rows = list(csv.DictReader(out.open()))
    assert sorted(Path(r["path"]).relative_to(tmp_path / "photos").as_posix() for r in rows) == sorted(PHOTOS)
    names = torch.load(ckpt, map_location="cpu", weights_only=True)["hyper_parameters"]["class_names"]
    assert {r["class_1"] for r in rows} <= set(names)  # the checkpoint's class names


def test_segmentation_writes_label_maps_at_each_upright_size(trained, tmp_path, monkeypatch):
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _, ckpt = trained["seg"]
    out = tmp_path / "masks"
    writer = ["--trainer.callbacks+=vitdense.training.callbacks.SegmentationPredictionWriter"]
    writer += [f"--trainer.callbacks.output_dir={out}", "--trainer.callbacks.overlay=true"]
    predict(ckpt, write_photos(tmp_path / "photos"), *writer)
    for name, size in UPRIGHT.items():
        stem = Path(name).with_suffix("").as_posix()  # sub-folders mirrored
        labels = np.asarray(Image.open(out / f"{stem}.png"))
        assert labels.shape == size, name  # the original size, turned upright as the photo is shown
        assert labels.max() < 4
        assert Image.open(out / f"{stem}_overlay.jpg").size == size[::-1]


def test_detection_writes_coco_results_with_file_names(trained, tmp_path, monkeypatch):
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _, ckpt = trained["det"]
    out = tmp_path / "dets.json"
    writer = [
        "--trainer.callbacks+=vitdense.training.callbacks.COCOResultsWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    writer += [f"--trainer.callbacks.draw_dir={tmp_path / 'drawn'}"]
    predict(ckpt, write_photos(tmp_path / "photos"), *writer)
    results = json.loads(out.read_text())
    by_file = {r["file_name"]: r["image_id"] for r in results}
    assert sorted(by_file) == sorted(PHOTOS) and sorted(by_file.values()) == list(range(1, len(PHOTOS) + 1))
    assert {r["category_id"] for r in results} <= {1, 3, 5}  # the training JSON's category ids
    for r in results:  # boxes at each photo's upright size (a box may reach a little past the edge)
        h, w = UPRIGHT[r["file_name"]]
        x, y, bw, bh = r["bbox"]
        assert -0.5 * w <= x <= w and -0.5 * h <= y <= h and 0 <= bw <= 1.5 * w and 0 <= bh <= 1.5 * h
    drawn = sorted(p.relative_to(tmp_path / "drawn").as_posix() for p in (tmp_path / "drawn").rglob("*.jpg"))
    assert drawn == sorted(str(Path(n).with_suffix(".jpg")) for n in PHOTOS)


def test_predict_without_a_writer_writes_the_tasks_own_output(trained, tmp_path, monkeypatch):
    """No writer configured: each task writes its natural output under <root>/predictions/;
    images that would share a name (x.jpg, x.png) keep their suffix in it."""
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    photos = write_photos(tmp_path / "photos")
    Image.open(photos / "a.jpg").save(photos / "a.png")
    _, ckpt = trained["det"]
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"])
    results = json.loads((tmp_path / "predictions" / "detections.json").read_text())
    assert {"a.jpg", "a.png"} <= {r["file_name"] for r in results}
    assert {"a_jpg.jpg", "a_png.jpg", "rotated.jpg"} <= {p.name for p in (tmp_path / "predictions" / "drawn").iterdir()}
    _, ckpt = trained["seg"]
    main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"])
    assert (tmp_path / "predictions" / "masks" / "sub" / "deeper.png").is_file()
    assert (tmp_path / "predictions" / "masks" / "a_png_overlay.jpg").is_file()


def test_a_checkpoint_of_pretrained_weights_restores_offline(trained, tmp_path, monkeypatch):
    """A run that started from hub weights predicts from its checkpoint with no network: the
    checkpoint's weights replace the hub's, which are never fetched."""
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    _, ckpt = trained["cls"]
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    state["hyper_parameters"]["backbone"]["pretrained"] = True  # as if fitted from augreg weights
    state["hyper_parameters"]["backbone"]["name"] = "vit_tiny_patch16_224.augreg_in21k"
    moved = tmp_path / "from_hub.ckpt"
    torch.save(state, moved)
    out = tmp_path / "classes.csv"
    writer = [
        "--trainer.callbacks+=vitdense.training.callbacks.TopKPredictionWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    predict(moved, write_photos(tmp_path / "photos"), *writer)
    assert len(list(csv.DictReader(out.open()))) == len(PHOTOS)


def test_a_checkpoint_saved_from_python_loads_and_predicts_alone(fitted_from_python, trained, tmp_path, monkeypatch):
    """A task fitted from Python (`lightning.Trainer(...).fit(task, datamodule)`, no CLI) names
    its task and data classes in its checkpoint as the CLI does: `vitdense.load_model` rebuilds
    its model, and `predict --ckpt_path` runs on it alone. A CLI checkpoint keeps what the CLI wrote."""
    import vitdense

    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    task, ckpt = fitted_from_python
    model = vitdense.load_model(ckpt)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), task.model(x))
    out = tmp_path / "classes.csv"
    writer = [
        "--trainer.callbacks+=vitdense.training.callbacks.TopKPredictionWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predict(ckpt, write_photos(tmp_path / "photos"), *writer)
    # Lightning's default ModelCheckpoint wrote it: its folder is no concern of predict's
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == len(PHOTOS) and {r["class_1"] for r in rows} <= set(task.class_names)
    cli_hparams = torch.load(trained["cls"][1], map_location="cpu", weights_only=True)["hyper_parameters"]
    assert cli_hparams["_class_path"] == "vitdense.tasks.ClassificationTask"  # as demo_cls.yaml names it


def test_an_older_python_checkpoint_says_how_to_load_it(fitted_from_python, older_python_checkpoint, capsys):
    """Saved from Python before checkpoints named their classes: the error says how to load it."""
    from vitdense.core.errors import CheckpointError
    from vitdense.deploy.checkpoint import load_model
    from vitdense.tasks import ClassificationTask

    task, _ = fitted_from_python
    older = older_python_checkpoint
    with pytest.raises(CheckpointError, match=r"TheTask\.load_from_checkpoint\("):
        load_model(older)
    line = run_error(["predict", f"--ckpt_path={older}", "--data.predict_dir=."], capsys)
    assert f"TheTask.load_from_checkpoint({str(older)!r})" in line
    assert ClassificationTask.load_from_checkpoint(older).backbone_config == task.backbone_config  # as it says


def run_error(args, capsys, run=main) -> str:
    """The one-line error a command (`run`: vitdense's CLI by default) printed as it exited with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        run(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_a_file_that_is_not_a_checkpoint(tmp_path, capsys):
    text = tmp_path / "notes.ckpt"
    text.write_text("hello")
    line = run_error(["predict", f"--ckpt_path={text}", "--data.predict_dir=."], capsys)
    assert line.startswith(f"vitdense: error: ckpt_path {text}: not a PyTorch Lightning checkpoint")
    assert "weights_only=False" not in line
    line = run_error(["predict", f"--ckpt_path={tmp_path / 'missing.ckpt'}"], capsys)
    assert line == f"vitdense: error: ckpt_path {tmp_path / 'missing.ckpt'}: no such file"


def test_a_weights_file_is_pointed_to_backbone_checkpoint(tmp_path, capsys):
    weights = tmp_path / "vit.pth"
    torch.save({"cls_token": torch.zeros(1, 1, 8)}, weights)
    line = run_error(["predict", f"--ckpt_path={weights}"], capsys)
    assert "weights without the task they belong to" in line
    assert f"model.init_args.backbone.checkpoint={weights}" in line


def test_a_checkpoint_of_another_task(trained, capsys, monkeypatch):
    folder, ckpt = trained["seg"]
    monkeypatch.chdir(folder)
    line = run_error(["predict", "--config", str(CONFIGS / "demo_det.yaml"), f"--ckpt_path={ckpt}"], capsys)
    assert f"ckpt_path {ckpt} is a checkpoint of vitdense.tasks.SegmentationTask" in line
    assert "the config's model is vitdense.tasks.DetectionTask" in line


def test_a_checkpoint_of_another_class_count(trained, capsys, monkeypatch):
    folder, ckpt = trained["cls"]
    monkeypatch.chdir(folder)
    args = ["test", "--config", str(CONFIGS / "demo_cls.yaml"), f"--ckpt_path={ckpt}"]
    line = run_error([*args, "--data.init_args.num_classes=3"], capsys)
    assert f"ckpt_path {ckpt} was trained on 4 classes (circle, square, triangle, cross)" in line
    assert "but the data has 3" in line


def test_predict_says_only_what_the_user_can_act_on(trained, tmp_path):
    """A newcomer's `predict` from a checkpoint prints no warning they cannot act on: neither
    Lightning's 'args and sys.argv' (vitdense rewrites the command line), jsonargparse's
    'unable to serialize functools.partial' (the default optimizer), 'No seed found', nor
    Lightning's advertisements."""
    import subprocess
    import sys

    _, ckpt = trained["seg"]
    photos = write_photos(tmp_path / "photos")
    command = [sys.executable, "-m", "vitdense", "predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}"]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "predictions go to" in out
    for noise in ("args parameter is intended", "Unable to serialize", "No seed found", "💡 Tip", "LeafSpec"):
        assert noise not in out, noise


def test_settings_asked_for_at_predict_win_over_the_checkpoints(trained, tmp_path, monkeypatch, capsys):
    """Detection's selection and cap, segmentation's test-time flip and windows given with
    `--ckpt_path` are the ones used (Lightning's CLI puts a checkpoint's hyperparameters over
    them); what the checkpoint fixed at training (classification's encoder) is refused by name."""
    offline_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    photos = write_photos(tmp_path / "photos")
    _, ckpt = trained["det"]
    asked = ["--model.init_args.selection=top_k", "--model.init_args.top_k=2"]
    cli = main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false", *asked])
    assert (cli.model.model.selection, cli.model.model.top_k) == ("top_k", 2)
    found = json.loads((tmp_path / "predictions" / "detections.json").read_text())
    assert max(sum(r["file_name"] == name for r in found) for name in PHOTOS) == 2  # two per image, no more

    _, ckpt = trained["seg"]
    one = tmp_path / "one"
    one.mkdir()
    Image.open(photos / "a.jpg").save(one / "a.png")
    asked = ["--model.init_args.test_flip=true", "--model.init_args.window_batch_size=3"]
    cli = main(["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={one}", "--trainer.logger=false", *asked])
    assert (cli.model.test_flip, cli.model.window_batch_size) == (True, 3)

    _, ckpt = trained["cls"]
    with pytest.raises(SystemExit) as exit_info:
        predict(ckpt, photos, "--model.init_args.backbone.name=vit_small_patch16_224")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model.init_args.backbone.name='vit_small_patch16_224'" in err and "trained with 'vit_tiny" in err
