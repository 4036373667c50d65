"""Tiny trained models of every family, shared by the whole test session.

Each recipe is a `python -m vitdense fit` of a few steps at 32 px; `TinyRuns` (the
`tiny_runs` fixture of tests/conftest.py, `trained` being its older name) runs a recipe the
first time a test asks for it and hands every later test the same run. A test that needs *a*
trained checkpoint of a family (to predict, load, export, serve, draw from it) takes it from
here; a test whose assertion is about a run of its own (a resume equal to the run never
stopped, a schedule, a run's logs, a checkpoint written in a particular way) still trains its
own. A new family adds its recipe to `RECIPES`, once, for all of its modules; the config a
recipe writes may come from the family's own test module (its tests use the same one).

What a run holds is shared: tests read its files and write elsewhere (their `tmp_path`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parents[1] / "configs"
#: every recipe's trainer: no progress bar
QUIET = ["--trainer.enable_progress_bar=false"]


def demo(config: str, *overrides: str) -> Callable[[Path], tuple[list[str], str]]:
    """A demo config, shrunk to seconds, fitted in its folder (the demos write runs/ and data/
    relative to the working folder): its last.ckpt."""

    def recipe(folder: Path) -> tuple[list[str], str]:
        args = ["--config", str(CONFIGS / config), *overrides, "--trainer.limit_val_batches=1", *QUIET]
        return args, f"runs/{config.removesuffix('.yaml')}/checkpoints/last.ckpt"

    return recipe


def depth(folder: Path) -> tuple[list[str], str]:
    """The tiny DPT of tests/tasks/test_depth.py (`MODEL`), fitted for two steps on the
    synthetic rooms: its config is depth.yaml."""
    from tests.tasks.test_depth import MODEL

    config = folder / "depth.yaml"  # (LightningCLI writes its own config.yaml beside)
    rooms = {"root": str(folder / "rooms"), "img_size": 32, "train_size": 4, "val_size": 3, "loader": {"batch_size": 2}}
    data = {"class_path": "vitdense.data.SyntheticDepthDataModule", "init_args": rooms}
    config.write_text(json.dumps({"model": MODEL, "data": data}))
    args = ["--config", str(config), "--trainer.max_steps=2", f"--trainer.default_root_dir={folder}"]
    return [*args, "--trainer.logger=false", *QUIET], "checkpoints/epoch=0-step=2.ckpt"


def panoptic(folder: Path) -> tuple[list[str], str]:
    """EoMT's panoptic demo as tests/tasks/test_universal.py shrinks it (`demo_config`: 32 px,
    a 4-block ViT, 8 queries), fitted for 4 steps: its config is run/config.yaml."""
    from tests.tasks.test_universal import demo_config

    return ["--config", str(demo_config(folder / "run"))], "run/checkpoints/epoch=0-step=4.ckpt"


def pretrain(config: str) -> Callable[[Path], tuple[list[str], str]]:
    """A pre-training demo as tests/tasks/test_pretrain.py shrinks it (`write_config`: 32 px,
    2 blocks, 2 epochs of 3 steps, a checkpoint every 2 steps and last.ckpt)."""

    def recipe(folder: Path) -> tuple[list[str], str]:
        from tests.tasks.test_pretrain import write_config

        args = ["--config", str(write_config(folder, config)), f"--trainer.default_root_dir={folder}"]
        return args, "lightning_logs/version_0/checkpoints/last.ckpt"

    return recipe


#: name: recipe (folder -> the `fit` arguments, the checkpoint the tests take, relative to folder)
RECIPES: dict[str, Callable[[Path], tuple[list[str], str]]] = {
    # the three first demos (the tests of checkpoints, predict, load, export, serve, viz, README);
    # cls logs every step and fits one whole epoch, validation included, with 2 of ViT-Ti's 12
    # blocks (what its tests export, serve and draw is the same for any depth; 12 cost the
    # export test 8 s)
    "cls": demo(
        "demo_cls.yaml",
        "--model.init_args.backbone.model_args={depth: 2}",
        "--data.init_args.train_size=8",
        "--data.init_args.val_size=4",
        "--data.init_args.loader.batch_size=4",
        "--trainer.max_steps=2",
        "--trainer.log_every_n_steps=1",
    ),
    "seg": demo(
        "demo_seg.yaml",
        "--data.init_args.img_size=32",
        "--data.init_args.train_size=8",
        "--data.init_args.loader.batch_size=4",
        "--trainer.max_steps=1",
    ),
    # 3 validation images (written to data/synthetic_det as COCO files, which `test` and
    # `predict` read back: tests/test_cli.py)
    "det": demo(
        "demo_det.yaml",
        "--data.init_args.img_size=32",
        "--data.init_args.train_size=8",
        "--data.init_args.val_size=3",
        "--data.init_args.loader.batch_size=4",
        "--trainer.max_steps=2",
        "--trainer.num_sanity_val_steps=0",
    ),
    # the keypoint demo at 32 px (its figures' 13 keypoints), 3 validation images
    "pose": demo(
        "demo_pose.yaml",
        "--data.init_args.img_size=32",
        "--data.init_args.train_size=8",
        "--data.init_args.val_size=3",
        "--data.init_args.loader.batch_size=4",
        "--model.init_args.backbone.model_args={depth: 2, patch_size: 2}",
        "--model.init_args.head.init_args.neck.init_args.feature_indexes=[0, 1]",  # (of the 2 blocks)
        "--trainer.max_steps=2",
        "--trainer.num_sanity_val_steps=0",
    ),
    "depth": depth,
    "panoptic": panoptic,
    "mae": pretrain("demo_pretrain.yaml"),
    "mpp": pretrain("demo_pretrain_mpp.yaml"),
}


@dataclass
class Run:
    folder: Path
    ckpt: Path
    #: the LightningCLI that fitted it (its trainer, model and datamodule, as `fit` left them)
    cli: Any


class TinyRuns(Mapping):
    """`RECIPES`, each fitted the first time it is asked for: `runs[name]` is (its folder, its
    checkpoint), `runs.cli(name)` the LightningCLI of the fit."""

    def __init__(self, make_folder: Callable[[str], Path]) -> None:
        self._make_folder = make_folder
        self._runs: dict[str, Run] = {}

    def run(self, name: str) -> Run:
        if name not in self._runs:
            from vitdense.cli import main

            folder = self._make_folder(name)
            args, ckpt = RECIPES[name](folder)
            cwd = os.getcwd()
            try:
                os.chdir(folder)
                cli = main(["fit", *args])
            finally:
                os.chdir(cwd)
            assert (folder / ckpt).is_file(), f"the {name} run wrote no {ckpt}"
            self._runs[name] = Run(folder, folder / ckpt, cli)
        return self._runs[name]

    def cli(self, name: str):
        return self.run(name).cli

    def __getitem__(self, name: str) -> tuple[Path, Path]:
        run = self.run(name)
        return run.folder, run.ckpt

    def __iter__(self) -> Iterator[str]:
        return iter(RECIPES)

    def __len__(self) -> int:
        return len(RECIPES)
