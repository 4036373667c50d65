"""A fit killed with SIGKILL mid-epoch resumes with `--ckpt_path last` exactly: same data
order, same augmentation draws, same dropout/drop-path/Mixup randomness, same schedule, so
the final weights equal those of a run that was never stopped."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import vitdense.tasks  # noqa: F401  (registers the types checkpoints hold for weights_only loading)

DEMO = Path(__file__).parents[2] / "configs" / "demo_cls.yaml"
STEPS_PER_EPOCH = 8
BATCH = 4


def image_folder(root: Path) -> Path:
    """An ImageNet-layout training split: 2 classes x 16 images of varied sizes, plus val."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 16), ("val", 2)):
        for label in ("a", "b"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                h, w = (int(v) for v in rng.integers(24, 48, 2))
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def write_config(tmp_path: Path, run: str) -> Path:
    cfg = yaml.safe_load(DEMO.read_text())
    out = tmp_path / run
    cfg["trainer"].update(
        max_epochs=3, default_root_dir=str(out), log_every_n_steps=1, precision="32-true", num_sanity_val_steps=1
    )
    for callback in cfg["trainer"]["callbacks"]:
        callback["init_args"]["dirpath"] = str(out / "checkpoints")
    cfg["trainer"]["callbacks"][1]["init_args"]["every_n_train_steps"] = 3
    model = cfg["model"]["init_args"]
    model["backbone"].update(drop_path_rate=0.2, model_args={"depth": 2})  # randomness in every step
    model["mixup_alpha"] = 0.4  # numpy's global RNG, through timm's Mixup
    # random resized crops, flips and colour jitter from albumentations, 2 loader workers
    cfg["data"] = {
        "class_path": "vitdense.data.ImageFolderDataModule",
        "init_args": {
            "root": str(image_folder(tmp_path / f"{run}_data")),
            "img_size": 32,
            "loader": {"batch_size": BATCH, "num_workers": 2},
            "color_jitter": 0.4,
        },
    }
    path = tmp_path / f"{run}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fit(cfg: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_ALBUMENTATIONS_UPDATE="1")
    return subprocess.Popen(
        [sys.executable, "-m", "vitdense", "fit", "--config", str(cfg), "--trainer.enable_progress_bar=false", *extra],
        cwd=cfg.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    # the reference: the same seeded run, never stopped
    reference = fit(write_config(tmp_path, "reference"))
    cfg = write_config(tmp_path, "killed")
    ckpt_dir = tmp_path / "killed" / "checkpoints"
    proc = fit(cfg)
    deadline = time.time() + 240
    killed_after = None
    while time.time() < deadline and proc.poll() is None:
        last = ckpt_dir / "last.ckpt"
        if last.exists() and load(last)["global_step"] >= STEPS_PER_EPOCH + 3:  # inside the second epoch
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_after = load(last)["global_step"]
            break
        time.sleep(0.05)
    assert killed_after is not None, f"training ended or hung before a mid-epoch checkpoint: {proc.stderr.read()}"
    assert proc.returncode == -signal.SIGKILL
    assert killed_after % STEPS_PER_EPOCH != 0  # the checkpoint is mid-epoch

    resumed = fit(cfg, "--ckpt_path", "last")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"Restoring states from the checkpoint path at {ckpt_dir / 'last.ckpt'}" in err
    assert "not resumable" not in err  # Lightning's warning for loaders that restart their epoch
    # the resumed run logged its first step after the checkpoint's, not from zero, and finished
    logged = EventAccumulator(str(tmp_path / "killed" / "lightning_logs" / "version_1"))  # TensorBoard's
    logged.Reload()
    steps = [event.step for event in logged.Scalars("train/loss_step")]
    assert steps and min(steps) >= killed_after
    final = load(ckpt_dir / "last.ckpt")
    assert final["global_step"] == 3 * STEPS_PER_EPOCH

    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err
    expected = load(tmp_path / "reference" / "checkpoints" / "last.ckpt")
    assert expected["global_step"] == final["global_step"]
    diff = max((final["state_dict"][k] - v).abs().max().item() for k, v in expected["state_dict"].items())
    print(f"max |resumed - uninterrupted| over all weights: {diff:.3g}")
    assert diff <= 1e-6


def test_detection_resumes_mid_epoch_exactly(tmp_path, monkeypatch):
    """DETR training resumed from a mid-epoch checkpoint ends with the weights of the run that
    was never stopped: DETR's random resize and crop, dropout in the decoder, query groups,
    Hungarian matching, and an epoch milestone of the schedule crossed after the resume."""
    from vitdense.cli import main

    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load((Path(__file__).parents[2] / "configs" / "demo_det.yaml").read_text())
    cfg["trainer"].update(max_epochs=2, precision="32-true", log_every_n_steps=1, enable_progress_bar=False)
    cfg["trainer"]["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"every_n_train_steps": 3, "save_top_k": -1, "filename": "{step}"},
        }
    ]
    model = cfg["model"]["init_args"]
    model["head"]["init_args"].update(dropout=0.1, dec_layers=2)
    model["backbone"]["model_args"]["depth"] = 2
    model["lr_scheduler"] = {
        "class_path": "vitdense.training.optim.WarmupMultiStepLR",
        "init_args": {"milestone_epochs": [1.5], "warmup_steps": 2},
    }
    cfg["data"]["init_args"].update(img_size=32, train_size=24, val_size=2)
    cfg["data"]["init_args"]["loader"]["batch_size"] = 4  # 6 steps per epoch
    config = tmp_path / "det.yaml"
    config.write_text(yaml.safe_dump(cfg))

    def run(root: str, *extra: str):
        return main(["fit", "--config", str(config), f"--trainer.default_root_dir={root}", *extra])

    uninterrupted = run("whole")
    assert uninterrupted.trainer.global_step == 12
    mid = tmp_path / "whole" / "lightning_logs" / "version_0" / "checkpoints" / "step=9.ckpt"
    assert load(mid)["global_step"] == 9  # three steps into the second epoch, before the milestone (step 9)
    resumed = run("resumed", f"--ckpt_path={mid}")
    assert resumed.trainer.global_step == 12
    expected = uninterrupted.model.state_dict()
    diff = max((v - expected[k]).abs().max().item() for k, v in resumed.model.state_dict().items())
    print(f"max |resumed - uninterrupted| over all weights: {diff:.3g}")
    assert diff <= 1e-6
    lrs = [g["lr"] for g in resumed.trainer.optimizers[0].param_groups]
    assert lrs == pytest.approx([g["lr"] for g in uninterrupted.trainer.optimizers[0].param_groups])


def as_written_before_backbone_groups(ckpt: dict) -> dict:
    """`ckpt` as a vitdense before `param_groups` kept backbone and head apart wrote it: the
    groups of one (lr_scale, weight_decay) merged, in order of first appearance (2 groups
    where there are 4), the optimizer's per-parameter state renumbered to match, and one
    entry per group in the schedule's state (checked against a checkpoint of that vitdense,
    aceb3a8^: the same groups, names and sizes)."""
    optimizer = ckpt["optimizer_states"][0]
    merged: dict[tuple, dict] = {}
    for group in optimizer["param_groups"]:
        kept = {k: v for k, v in group.items() if k != "backbone"}
        old = merged.setdefault((group["lr_scale"], group["weight_decay"]), {**kept, "params": [], "names": []})
        old["params"] += group["params"]
        old["names"] += group["names"]
    renumber = {index: new for new, index in enumerate(i for g in merged.values() for i in g["params"])}
    for group in merged.values():
        group["params"] = [renumber[i] for i in group["params"]]
    optimizer["state"] = {renumber[i]: state for i, state in optimizer["state"].items()}
    optimizer["param_groups"] = list(merged.values())
    schedule = ckpt["lr_schedulers"][0]
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):
        schedule[key] = schedule[key][: len(merged)]
    return ckpt


def test_an_optimizer_state_of_other_groups_is_one_line_and_its_weights_start_a_new_fit(tmp_path, monkeypatch, capsys):
    """A last.ckpt of an earlier vitdense (issue 40: 2 optimizer groups, 4 now) stopped `fit
    --ckpt_path` with torch's "loaded state dict has a different number of parameter groups"
    traceback from deep in Lightning. Now one line names the file and the way on: a new fit
    from its weights, which works from the command line (the encoder) and from Python (the
    whole task, as README's "Resuming a run" says)."""
    from functools import partial

    import lightning as L

    from vitdense.cli import main
    from vitdense.data import LoaderConfig, SyntheticClassificationDataModule
    from vitdense.deploy.checkpoint import Checkpoint

    monkeypatch.chdir(tmp_path)
    small = ["--data.init_args.train_size=8", "--data.init_args.val_size=4", "--data.init_args.img_size=32"]
    small += ["--data.init_args.loader.batch_size=4", "--model.init_args.backbone.model_args={depth: 1}"]
    small += ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.logger=false"]
    small += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    args = ["fit", "--config", str(DEMO), *small]
    main(args)
    old = tmp_path / "old.ckpt"
    torch.save(as_written_before_backbone_groups(load(tmp_path / "runs/demo_cls/checkpoints/last.ckpt")), old)
    capsys.readouterr()

    with pytest.raises(SystemExit) as exited:
        main([*args, f"--ckpt_path={old}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"vitdense: error: ckpt_path {old}: its optimizer state has 2 parameter groups (14, 6 parameters) where "
        "this run's optimizer has 4 (13, 5, 1, 1), so training cannot resume from it (saved by an earlier vitdense, "
        "whose backbone and head parameters shared groups, or with another backbone lr_scale, layer_decay or "
        "freeze); start a new fit from its weights instead: without --ckpt_path, with "
        f"--model.init_args.backbone.checkpoint={old} (the encoder's weights; the head, optimizer and schedule "
        "start anew; README: Resuming a run)"
    )

    # the way the line names, with a rate of 0: after its one step the encoder still holds the checkpoint's weights
    weights = load(old)["state_dict"]
    cli = main([*args, f"--model.init_args.backbone.checkpoint={old}", "--model.init_args.optimizer.init_args.lr=0"])
    assert cli.trainer.global_step == 1  # a new fit, counted from 0
    encoder = cli.model.backbone.state_dict()
    assert all(torch.equal(v, weights[f"model.backbone.{k}"]) for k, v in encoder.items())

    # the whole task (head too), from Python: the checkpoint holds no optimizer or schedule, so give the recipe's
    task = Checkpoint(old).task_type().load_from_checkpoint(old, optimizer=partial(torch.optim.AdamW, lr=0.0))
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=4, loader=LoaderConfig(batch_size=4))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(task, datamodule=data)
    assert trainer.global_step == 1
    assert all(torch.equal(v, weights[k]) for k, v in task.state_dict().items())
