"""The command line: clear one-line errors, links from data to model, predictions to a file."""

import csv
import json
import os
from pathlib import Path

import pytest

from vitdense.cli import main
from vitdense.data import SyntheticClassificationDataModule

DEMO = str(Path(__file__).parents[1] / "configs" / "demo_cls.yaml")


def run_error(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_wrong_key_is_one_clear_error(capsys):
    err = run_error(["fit", "--config", DEMO, "--model.init_args.pol=avg"], capsys)
    assert "pol" in err and "Traceback" not in err


def test_missing_checkpoint_is_one_line(capsys, tmp_path):
    err = run_error(["fit", "--config", DEMO, f"--model.init_args.backbone.checkpoint={tmp_path}/w.pth"], capsys)
    assert err.strip().splitlines()[-1] == f"vitdense: error: checkpoint {tmp_path}/w.pth does not exist"


@pytest.mark.parametrize("where", ["command line", "config"])
def test_fit_from_a_file_that_is_not_a_checkpoint_is_one_line(capsys, tmp_path, where, monkeypatch):
    # Lightning's CLI reads a fit's checkpoint hyperparameters before anything is built: random
    # bytes ended there in a 30-line UnpicklingError traceback
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(os.urandom(4096))
    monkeypatch.setattr("vitdense.cli.VitDenseCLI.instantiate_classes", lambda self: pytest.fail("built the run"))
    ckpt = [f"--ckpt_path={garbage}"] if where == "command line" else ["--config", f"ckpt_path: {garbage}"]
    err = run_error(["fit", "--config", DEMO, *ckpt], capsys)
    assert "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"vitdense: error: ckpt_path {garbage}: not a PyTorch Lightning checkpoint that loads safely (")
    )


def test_unknown_class_is_one_clear_error(capsys):
    err = run_error(["fit", "--config", DEMO, "--model=vitdense.tasks.NoSuchTask"], capsys)
    assert "NoSuchTask" in err and "Traceback" not in err


def test_predict_writes_top_k_with_class_names(tmp_path):
    out = tmp_path / "pred.csv"
    cli = main(
        [
            "predict",
            "--config",
            DEMO,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.limit_predict_batches=2",
            "--trainer.callbacks+=vitdense.training.callbacks.TopKPredictionWriter",
            f"--trainer.callbacks.output_file={out}",
            "--data.init_args.loader.batch_size=4",
        ]
    )
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8
    assert [int(r["index"]) for r in rows] == list(range(8))
    names = cli.datamodule.class_names
    assert {r["class_1"] for r in rows} <= set(names)
    probs = [float(rows[0][f"prob_{i}"]) for i in range(1, 5)]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-5


def test_print_config_shows_the_linked_recipe(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DEMO, "--print_config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert "class_path: vitdense.tasks.ClassificationTask" in printed
    assert "name: vit_tiny_patch16_224" in printed and "lr: 0.0005" in printed


def test_misspelt_backbone_suggests_names(capsys):
    err = run_error(["fit", "--config", DEMO, "--model.init_args.backbone.name=vit_tiny_patch16_22"], capsys)
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("vitdense: error: unknown model name 'vit_tiny_patch16_22'. Did you mean vit_tiny_patch16_224")
    )


def test_segmentation_predict_writes_palette_pngs_at_label_size(tmp_path):
    import numpy as np
    from PIL import Image

    seg = str(Path(__file__).parents[1] / "configs" / "demo_seg.yaml")
    cli = main(
        [
            "predict",
            "--config",
            seg,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.callbacks+=vitdense.training.callbacks.SegmentationPredictionWriter",
            f"--trainer.callbacks.output_dir={tmp_path / 'pred'}",
            "--data.init_args.img_size=32",
            "--data.init_args.val_size=3",  # (limit_predict_batches=1 would parse as 100%)
            "--data.init_args.loader.batch_size=2",
        ]
    )
    dataset = cli.datamodule.predict_dataloader().dataset
    files = sorted((tmp_path / "pred").glob("*.png"))
    assert [f.name for f in files] == ["000000.png", "000001.png", "000002.png"]
    for i, f in enumerate(files):
        png = Image.open(f)
        labels = np.asarray(png)
        assert png.mode == "P" and labels.shape == tuple(dataset[i].mask.shape)  # the label map's own size
        assert labels.max() < cli.model.num_classes


def test_data_error_at_setup_is_one_line(tmp_path, capsys, monkeypatch):
    from tests.data.test_imagefolder import make_split

    monkeypatch.chdir(tmp_path)
    for split in ("train", "val"):
        make_split(tmp_path / "imagenet" / split, ["bird", "cat"], per_class=2)
    config = str(Path(__file__).parents[1] / "configs" / "cls_imagenet.yaml")
    args = [
        "fit",
        "--config",
        config,
        f"--data.init_args.root={tmp_path / 'imagenet'}",
        "--data.init_args.loader.num_workers=0",
    ]
    args += ["--model.init_args.backbone.pretrained=false", "--data.init_args.img_size=32", "--trainer.devices=1"]
    args += ["--trainer.strategy=auto", "--trainer.accelerator=cpu", "--data.init_args.loader.batch_size=64"]
    err = run_error(args, capsys)
    last = err.strip().splitlines()[-1]
    assert last.startswith("vitdense: error: ") and "batch_size=64" in last and "Traceback" not in err


class BuggyDataModule(SyntheticClassificationDataModule):
    """A DataModule with a bug (not a user error): its ValueError must keep its traceback."""

    def __init__(self, backbone: str | None = None) -> None:
        super().__init__(backbone=backbone)
        raise ValueError("a bug inside a class")


def test_a_bug_keeps_its_traceback():
    with pytest.raises(ValueError, match="a bug inside a class"):
        main(["fit", "--config", DEMO, "--data=tests.test_cli.BuggyDataModule"])


@pytest.fixture
def detection_fit(tiny_runs):
    """The detection demo fitted through the CLI for 2 steps on 8 images of 32 px, 3 for
    validation, in its own folder (the session's: tests/tiny_runs.py): (its LightningCLI, the
    folder its runs/ and data/ went to)."""
    folder, _ = tiny_runs["det"]
    return tiny_runs.cli("det"), folder


def test_detection_fit_then_test_and_predict_from_its_checkpoint(detection_fit, tmp_path, monkeypatch):
    """The detection demo end to end through the CLI: fit, then `test` and `predict` from the
    checkpoint; predict writes a COCO results JSON (original category ids) and drawn images."""
    import json

    from pycocotools.coco import COCO

    monkeypatch.chdir(tmp_path)  # the demo writes runs/ relative to the working folder
    config = str(Path(__file__).parents[1] / "configs" / "demo_det.yaml")
    fit, folder = detection_fit
    data = folder / "data" / "synthetic_det"  # the fit's data, written where it ran
    small = ["--data.init_args.img_size=32", "--data.init_args.train_size=8", "--data.init_args.val_size=3"]
    small += ["--data.init_args.loader.batch_size=4", "--trainer.enable_progress_bar=false"]
    small += [f"--data.init_args.root={data}"]
    assert fit.trainer.global_step == 2
    ckpt = folder / "runs" / "demo_det" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()

    tested = main(["test", "--config", config, *small, f"--ckpt_path={ckpt}"])
    assert 0 <= tested.trainer.callback_metrics["test/map_50"] <= 1
    assert "test/mar_100" in tested.trainer.callback_metrics

    out = tmp_path / "out" / "detections.json"
    args = ["predict", "--config", config, *small, f"--ckpt_path={ckpt}"]
    args += [
        "--trainer.callbacks+=vitdense.training.callbacks.COCOResultsWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    args += [f"--trainer.callbacks.draw_dir={tmp_path / 'drawn'}", "--trainer.callbacks.score_threshold=0"]
    predicted = main(args)
    torch = pytest.importorskip("torch")
    weights = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(v, predicted.model.state_dict()[k]) for k, v in weights.items())  # the trained model
    results = json.loads(out.read_text())
    gt = COCO(str(data / "annotations" / "instances_val.json"))
    assert {r["image_id"] for r in results} == set(gt.getImgIds())  # every image, 20 queries x 3 classes each
    assert len(results) == 3 * 20 * 3
    assert {r["category_id"] for r in results} <= {1, 3, 5}  # the JSON's own ids, not labels 0..2
    assert len(gt.loadRes(results).getAnnIds()) == len(results)
    assert sorted(p.name for p in (tmp_path / "drawn").glob("*.jpg")) == sorted(
        Path(i["file_name"]).stem + ".jpg" for i in gt.loadImgs(gt.getImgIds())
    )


def test_ignore_index_is_linked_from_the_data(tmp_path, capsys):
    import lightning as L

    from vitdense.cli import VitDenseCLI, VitDenseParser
    from vitdense.tasks import BaseTask

    config = {
        "model": {
            "class_path": "vitdense.tasks.SegmentationTask",
            "init_args": {"backbone": {"name": "vit_tiny_patch16_224", "model_args": {"depth": 1}}},
        },
        "data": {
            "class_path": "vitdense.data.SegmentationDataModule",
            "init_args": {"root": str(tmp_path), "class_names": ["a", "b"], "ignore_index": 7, "crop_size": 32},
        },
    }
    (tmp_path / "seg.yaml").write_text(json.dumps(config))  # JSON is YAML
    args = ["--config", str(tmp_path / "seg.yaml")]
    cli = VitDenseCLI(
        BaseTask,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args,
        run=False,
        parser_class=VitDenseParser,
    )
    assert cli.datamodule.ignore_index == 7 and cli.model.ignore_index == 7
    assert cli.model.val_metrics["seg"].ignore_index == 7  # the metrics skip the data's unlabelled pixels
    # written twice, the model's copy would be replaced silently: refused, naming where it comes from
    err = run_error(["fit", "--config", args[1], "--model.init_args.ignore_index=3"], capsys)
    assert "model.init_args.ignore_index=3" in err and "data.init_args.ignore_index" in err


def test_a_head_chosen_in_yaml_gets_its_own_defaults(capsys, tmp_path):
    """jsonargparse hands a class chosen in YAML every argument of the default class's that it
    also takes (its issue #460): with DETRHead as the task's default, LWDETRHead got DETR's
    100 queries, 6 layers and dropout 0.1, and SimpleFeaturePyramid the projector's levels."""
    import yaml

    config = tmp_path / "lwdetr.yaml"
    head = {"class_path": "vitdense.heads.LWDETRHead", "init_args": {"neck": "vitdense.heads.SimpleFeaturePyramid"}}
    data = {"class_path": "vitdense.data.SyntheticDetectionDataModule", "init_args": {"root": str(tmp_path)}}
    config.write_text(
        yaml.safe_dump(
            {"model": {"class_path": "vitdense.tasks.DetectionTask", "init_args": {"head": head}}, "data": data}
        )
    )
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]["head"]["init_args"]
    assert (printed["num_queries"], printed["dec_layers"], printed["dropout"]) == (300, 3, 0.0)  # LWDETRHead's
    assert printed["neck"]["init_args"]["scale_factors"] == [4.0, 2.0, 1.0, 0.5]  # SimpleFeaturePyramid's


def test_the_top_level_help_names_vitdense_and_every_command():
    """`python -m vitdense --help` as a user runs it: LightningCLI's said "usage: __main__.py",
    "Lightning Trainer command line tool" and listed only fit/validate/test/predict."""
    import subprocess
    import sys

    from vitdense.cli_help import COMMAND_HELP

    done = subprocess.run([sys.executable, "-m", "vitdense", "--help"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "usage: python -m vitdense {fit,validate,test,predict,export,serve,combine} [options]"
    assert lines[2].startswith("vitdense is a PyTorch Lightning plugin for Vision Transformer")
    assert "Lightning Trainer command line tool" not in done.stdout and "__main__" not in done.stdout
    for name in ("fit", "validate", "test", "predict", "export", "serve"):
        assert f"  {name:<10}  {COMMAND_HELP[name]}" in lines
    assert any(line.startswith("  python -m vitdense.viz ") for line in lines)
    assert any(line.startswith("  python -m vitdense.bench ") for line in lines)
    # every task family vitdense.tasks exports, and no other (the help was left at the first four once)
    import vitdense.tasks

    exported = {name for name in vitdense.tasks.__all__ if name.endswith("Task") and name != "BaseTask"}
    listed = {line.split()[0] for line in lines if line.startswith("  ") and line.split()[0].endswith("Task")}
    assert listed == exported


def test_short_help_and_no_arguments_print_the_same(capsys):
    from vitdense.cli_help import top_level_help

    with pytest.raises(SystemExit) as exit_info:
        main(["-h"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == top_level_help()
    with pytest.raises(SystemExit) as exit_info:
        main([])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2  # no command: a usage error, with the help to choose one
    assert err == top_level_help() + "python -m vitdense: error: no command given\n"


@pytest.mark.parametrize("command", ["fit", "predict", "export", "serve"])
def test_each_commands_help_names_it(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m vitdense {command} ")
