"""A fit killed with SIGKILL mid-epoch resumes with `--ckpt_path last` from its last step."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

DEMO = Path(__file__).parents[2] / "configs" / "demo_cls.yaml"
STEPS_PER_EPOCH = 8


def write_config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load(DEMO.read_text())
    cfg["trainer"].update(max_epochs=3, default_root_dir=str(tmp_path / "run"), log_every_n_steps=1)
    for callback in cfg["trainer"]["callbacks"]:
        callback["init_args"]["dirpath"] = str(tmp_path / "run" / "checkpoints")
    cfg["trainer"]["callbacks"][1]["init_args"]["every_n_train_steps"] = 3
    cfg["data"]["init_args"].update(img_size=32, train_size=8 * STEPS_PER_EPOCH, val_size=8, batch_size=8)
    path = tmp_path / "cfg.yaml"
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


def saved_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def test_sigkill_mid_epoch_then_resume_from_last(tmp_path):
    cfg = write_config(tmp_path)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    proc = fit(cfg)
    deadline = time.time() + 240
    killed_after = None
    while time.time() < deadline and proc.poll() is None:
        last = ckpt_dir / "last.ckpt"
        if last.exists() and saved_step(last) >= STEPS_PER_EPOCH + 3:  # inside the second epoch
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_after = saved_step(last)
            break
        time.sleep(0.05)
    assert killed_after is not None, f"training ended or hung before a mid-epoch checkpoint: {proc.stderr.read()}"
    assert proc.returncode == -signal.SIGKILL
    assert killed_after % STEPS_PER_EPOCH != 0  # the checkpoint is mid-epoch

    resumed = fit(cfg, "--ckpt_path", "last")
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert f"Restoring states from the checkpoint path at {ckpt_dir / 'last.ckpt'}" in err
    # the resumed run logged its first step after the checkpoint's, not from zero, and finished
    metrics = (tmp_path / "run" / "lightning_logs" / "version_1" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    steps = [int(row.split(",")[header.index("step")]) for row in metrics[1:]]
    assert min(steps) >= killed_after
    assert saved_step(ckpt_dir / "last.ckpt") == 3 * STEPS_PER_EPOCH
