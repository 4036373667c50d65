"""Shared test setup: everything offline, deterministic."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "configs"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


#: each demo shrunk to seconds: (config, data overrides)
DEMOS = {
    "cls": ("demo_cls.yaml", ["--data.init_args.train_size=8", "--data.init_args.val_size=4"]),
    "seg": ("demo_seg.yaml", ["--data.init_args.img_size=32", "--data.init_args.train_size=8"]),
    "det": ("demo_det.yaml", ["--data.init_args.img_size=32", "--data.init_args.train_size=8"]),
}


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """Each demo fitted for one step through the CLI (shared by the tests of checkpoints and of
    `vitdense.viz`); {task: (its folder, its last.ckpt)}."""
    from vitdense.cli import main

    out = {}
    cwd = os.getcwd()
    try:
        for task, (config, overrides) in DEMOS.items():
            folder = tmp_path_factory.mktemp(task)
            os.chdir(folder)
            args = ["fit", "--config", str(CONFIGS / config), *overrides, "--data.init_args.loader.batch_size=4"]
            args += ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
            main(args)
            out[task] = folder, folder / "runs" / config.removesuffix(".yaml") / "checkpoints" / "last.ckpt"
    finally:
        os.chdir(cwd)
    return out
