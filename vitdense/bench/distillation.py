"""`python -m vitdense.bench distill-study`: on Fashion-MNIST's real images, a small student
encoder distilled from a teacher without labels, against the same student from random
initialisation and from MAE at equal CPU time; then DeiT's hard distillation against plain
fine-tuning (issue 43's study).

    python -m vitdense.bench distill-study                   # the defaults below, seeds 0 1 2
    python -m vitdense.bench distill-study --seeds 0 --out runs/distill_study_quick

Every run is `python -m vitdense fit` (in this process, from a config this command writes
into `--out/<run>/config.yaml`, the one to rerun by hand), on the IDX files of Debian's
`dataset-fashion-mnist` (`--root`), 28 x 28 pixels, Fashion-MNIST's own normalisation; the
labelled runs see whole images, flipped (the teacher with 4 x 4 patches: 75.6 % after 2 epochs of
crops down to a third of the area, 77.7 % after 1 epoch of whole images):

    teacher    ClassificationTask, ViT 192 wide x 6 blocks, 7 x 7 patches (2.7 M parameters),
               trained on the 60,000 labelled training images (`--teacher-epochs`), once
    distill    FeatureDistillationTask: the student (ViT 96 wide x 4 blocks, 4 x 4 patches,
               0.46 M parameters, half the teacher's operations) taught by the frozen teacher
               on the training images without their labels (FashionMNISTUnlabeledDataModule:
               MAE's crops and flips; the teacher's 4 x 4 token grid resampled to the
               student's 7 x 7), `--pretrain-steps` steps of `--batch-size`
    mae        MaskedImageModelingTask (MAE, 75 % masked, a 2-block 64-wide decoder) on the
               same student and images, for as many steps as take the distillation's CPU
               time (measured on seed 0's distillation and a short MAE run; both times
               printed per seed)
    probe      LinearProbeTask on each encoder frozen (random, MAE, distilled, and the
               teacher's: the ceiling): class token + mean patch token, four learning rates
               side by side, the features of one view per image cached, `--probe-epochs`
    finetune   ClassificationTask from each student encoder (class-token head, as ViT and
               DeiT): `--finetune-epochs` over the labelled images
    deit       ClassificationTask, DeiT's hard distillation (`distillation: hard`, the teacher
               checkpoint as teacher): the student with a distillation token, from random
               initialisation, the same epochs and recipe as `finetune`; against `finetune`
               from random initialisation (plain fine-tuning, no distillation token)

Accuracy is on the 10,000 test images (the validation split of FashionMNISTDataModule; the
probe's best learning rate is chosen on it, as DINOv2's protocol chooses on ImageNet's
validation set). Printed: mean and sample standard deviation over `--seeds` per row, the
pre-training CPU and wall seconds, and the CPU. Results are kept in `--out/results.json` run by
run: a rerun skips the runs already there (delete the file, or a run's entry, to redo it) and
refuses a file made with other settings (`--seeds` may change).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.callbacks import Callback

from vitdense.bench.common import cpu_kind, spread
from vitdense.core.errors import ConfigError
from vitdense.data.fashion_mnist import FASHION_MNIST_ROOT

#: the student: 0.46 M parameters (a sixth of the teacher's), 49 tokens of 4 x 4 pixels
STUDENT_ARGS = {"patch_size": 4, "depth": 4, "embed_dim": 96, "num_heads": 3}
#: the teacher: ViT-Ti's width, 6 blocks, 16 tokens of 7 x 7 pixels (1 epoch: 82.6 % against 77.7 % with 4 x 4)
TEACHER_ARGS = {"patch_size": 7, "depth": 6}
#: Fashion-MNIST's own normalisation (its README's statistics of the training images)
NORMALISATION = {"mean": [0.286] * 3, "std": [0.353] * 3}
#: the encoders each student row starts from
INITS = ("random", "mae", "distill")


class TrainClock(Callback):
    """CPU (`time.process_time`, every thread of this process) and wall seconds from the start
    of training to its end: the setup and the sanity check are not counted, the data loading
    (in this process: `num_workers: 0`) and, for distillation, the teacher's forward are.
    `step_cpu`: the CPU seconds of each step after the first (from one step's end to the next's)."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0
        self.step_cpu: list[float] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._start = (time.process_time(), time.perf_counter())
        self._step_end = self._start[0]

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        now = time.process_time()
        if trainer.global_step > 1:
            self.step_cpu.append(now - self._step_end)
        self._step_end = now

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.cpu = time.process_time() - self._start[0]
        self.wall = time.perf_counter() - self._start[1]


class Study:
    """The runs of the study, each fitted once and its figures kept in `out/results.json`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.path = self.out / "results.json"
        self.results: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        # runs made with other settings are not this study's: refuse rather than mix them in
        settings = {k: v for k, v in vars(args).items() if k not in ("command", "out", "seeds")}
        other = {k: v for k, v in self.results.get("settings", settings).items() if settings.get(k) != v}
        if other:
            raise ConfigError(
                f"{self.path} holds runs made with other settings ({other}); give another --out or delete the file"
            )
        self.results["settings"] = settings

    # -- configs ------------------------------------------------------------------------------

    def data(self, labelled: bool, scale: tuple[float, float]) -> dict[str, Any]:
        init = {
            "root": self.args.root,
            "img_size": 28,
            "scale": list(scale),
            **NORMALISATION,
            "loader": {"batch_size": self.args.batch_size, "num_workers": 0},
        }
        name = "FashionMNISTDataModule" if labelled else "FashionMNISTUnlabeledDataModule"
        return {"class_path": f"vitdense.data.{name}", "init_args": init}

    def backbone(self, model_args: dict[str, Any], checkpoint: str | None = None, name: str = "") -> dict[str, Any]:
        config = {"name": name or "vit_tiny_patch16_224", "model_args": model_args}
        return config | ({"checkpoint": checkpoint} if checkpoint else {})

    @staticmethod
    def adamw(lr: float, warmup: int, betas: tuple[float, float] = (0.9, 0.999)) -> dict[str, Any]:
        return {
            "optimizer": {
                "class_path": "torch.optim.AdamW",
                "init_args": {"lr": lr, "weight_decay": 0.05, "betas": list(betas)},
            },
            "lr_scheduler": {
                "class_path": "vitdense.training.optim.WarmupCosineLR",
                "init_args": {"warmup_steps": warmup},
            },
        }

    def fit(
        self, name: str, seed: int, model: dict[str, Any], data: dict[str, Any], length: dict[str, int], **trainer: Any
    ) -> dict[str, Any]:
        """`python -m vitdense fit` of one run into `out/name`: {"acc1" (last validation, %, if
        any), "cpu_s", "wall_s", "steps", "checkpoint"}."""
        from vitdense.cli import main

        folder = self.out / name
        shutil.rmtree(folder, ignore_errors=True)  # a run killed half-way starts again
        folder.mkdir(parents=True)
        checkpoint = {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(folder / "checkpoints"), "save_top_k": 0, "save_last": True},
        }
        clock = {"class_path": "vitdense.bench.distillation.TrainClock"}
        config = {
            "seed_everything": seed,
            "trainer": {
                "accelerator": "cpu",
                "precision": "auto",
                "logger": False,
                "enable_progress_bar": False,
                "enable_model_summary": False,
                "num_sanity_val_steps": 0,
                "default_root_dir": str(folder),
                "callbacks": [checkpoint, clock],
                **length,
                **trainer,
            },
            "model": model,
            "data": data,
        }
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        cli = main(["fit", "--config", str(folder / "config.yaml")])
        clock = next(c for c in cli.trainer.callbacks if isinstance(c, TrainClock))
        acc = cli.trainer.callback_metrics.get("val/acc1")
        return {
            "acc1": None if acc is None else 100 * float(acc),
            "cpu_s": clock.cpu,
            "wall_s": clock.wall,
            "steps": cli.trainer.global_step,
            "step_cpu": clock.step_cpu,
            "checkpoint": str(folder / "checkpoints" / "last.ckpt"),
        }

    def run(self, name: str, seed: int, build: Any) -> dict[str, Any]:
        """Run `name` unless `results.json` has it; record its figures."""
        if name not in self.results:
            print(f"# distill-study: {name}", flush=True)
            figures = {k: v for k, v in build().items() if k != "step_cpu"}  # (only the calibration reads it)
            self.results[name] = {"seed": seed, **figures}
            self.out.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.results, indent=1))
        return self.results[name]

    # -- the runs -------------------------------------------------------------------------------

    def teacher(self) -> dict[str, Any]:
        model = {
            "class_path": "vitdense.tasks.ClassificationTask",
            "init_args": {
                "backbone": self.backbone(self.args.teacher_args),
                # from scratch, the mean patch token learns faster than the class token (demo_cls)
                "head": {"class_path": "vitdense.heads.ClassificationHead", "init_args": {"pool": "avg"}},
                **self.adamw(1e-3, 100),
            },
        }
        length = {"max_epochs": self.args.teacher_epochs}
        return self.run("teacher", 0, lambda: self.fit("teacher", 0, model, self.data(True, (1.0, 1.0)), length))

    def probe(self, name: str, seed: int, backbone: dict[str, Any]) -> dict[str, Any]:
        model = {
            "class_path": "vitdense.tasks.LinearProbeTask",
            "init_args": {
                "lrs": [0.01, 0.03, 0.1, 0.3],
                "avgpool": True,
                "cache_features": True,  # the whole image (scale 1) each epoch: one view, the first flip kept
                "backbone": backbone,
                "optimizer": {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1, "momentum": 0.9}},
                "lr_scheduler": {
                    "class_path": "vitdense.training.optim.WarmupCosineLR",
                    "init_args": {"warmup_steps": 20},
                },
            },
        }
        length = {"max_epochs": self.args.probe_epochs}
        data = self.data(True, (1.0, 1.0))
        return self.run(name, seed, lambda: self.fit(name, seed, model, data, length))

    def pretrain(self, name: str, seed: int, steps: int, record: bool = True) -> dict[str, Any]:
        teacher = self.teacher()["checkpoint"]
        if name.startswith("distill"):
            model = {
                "class_path": "vitdense.tasks.FeatureDistillationTask",
                "init_args": {
                    "teacher": self.backbone(self.args.teacher_args, teacher),
                    "backbone": self.backbone(self.args.student_args),
                    **self.adamw(1e-3, 50),
                },
            }
        else:
            mae = {"mask_ratio": 0.75, "decoder_embed_dim": 64, "decoder_depth": 2, "decoder_num_heads": 4}
            model = {
                "class_path": "vitdense.tasks.MaskedImageModelingTask",
                "init_args": {
                    "objective": {
                        "class_path": "vitdense.pretrain.MaskedAutoencoder",
                        "init_args": mae | {"norm_pix_loss": True},
                    },
                    "backbone": self.backbone(self.args.student_args),
                    **self.adamw(1e-3, 50, betas=(0.9, 0.95)),  # MAE's betas
                },
            }
        data = self.data(False, (0.2, 1.0))
        fit = lambda: self.fit(name, seed, model, data, {"max_steps": steps}, limit_val_batches=0)  # noqa: E731
        return self.run(name, seed, fit) if record else fit()

    def mae_steps(self) -> int:
        """MAE's steps in seed 0's distillation CPU time: its CPU seconds per step measured on a
        short run (`--calibration-steps`, the mean step after the first fifth: warm-up)."""
        seed = self.args.seeds[0]
        distill = self.pretrain(f"distill_s{seed}", seed, self.args.pretrain_steps)
        short = self.run("mae_calibration", seed, lambda: self._calibrate(seed, self.args.calibration_steps))
        return max(round(distill["cpu_s"] / short["cpu_per_step"]), 1)

    def _calibrate(self, seed: int, steps: int) -> dict[str, Any]:
        result = self.pretrain("mae_calibration_run", seed, steps, record=False)
        shutil.rmtree(self.out / "mae_calibration_run", ignore_errors=True)
        timed = result["step_cpu"][max(steps // 5, 1) - 1 :]
        return {"cpu_per_step": statistics.fmean(timed), "steps_timed": len(timed)}

    def finetune(self, name: str, seed: int, backbone: dict[str, Any], deit: bool = False) -> dict[str, Any]:
        init: dict[str, Any] = {"backbone": backbone, **self.adamw(1e-3, 50)}
        if deit:
            init |= {
                "head": {"class_path": "vitdense.heads.DistilledClassificationHead"},
                "distillation": "hard",
                "teacher_checkpoint": self.teacher()["checkpoint"],
            }
        model = {"class_path": "vitdense.tasks.ClassificationTask", "init_args": init}
        length = {"max_epochs": self.args.finetune_epochs}
        data = self.data(True, (1.0, 1.0))
        return self.run(name, seed, lambda: self.fit(name, seed, model, data, length))

    def all(self) -> dict[str, dict[str, Any]]:
        teacher = self.teacher()
        self.probe("probe_teacher", 0, self.backbone(self.args.teacher_args, teacher["checkpoint"]))
        mae_steps = self.mae_steps()
        student = self.args.student_args
        for seed in self.args.seeds:
            encoders = {"random": None}
            encoders["mae"] = self.pretrain(f"mae_s{seed}", seed, mae_steps)["checkpoint"]
            encoders["distill"] = self.pretrain(f"distill_s{seed}", seed, self.args.pretrain_steps)["checkpoint"]
            for init, checkpoint in encoders.items():
                self.probe(f"probe_{init}_s{seed}", seed, self.backbone(student, checkpoint))
                self.finetune(f"finetune_{init}_s{seed}", seed, self.backbone(student, checkpoint))
            deit = self.backbone(student, name="deit_tiny_distilled_patch16_224")
            self.finetune(f"deit_s{seed}", seed, deit, deit=True)
        return self.results


def _spread(values: list[float]) -> str:
    return spread(values, digits=1, width=5)


def print_study(args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> None:
    import torch

    from vitdense.core.precision import resolve_precision

    precision = resolve_precision("auto", "cpu").precision
    seeds = args.seeds

    def figures(prefix: str, key: str = "acc1") -> list[float]:
        return [results[f"{prefix}_s{s}"][key] for s in seeds if f"{prefix}_s{s}" in results]

    teacher = results["teacher"]
    print(
        f"# distill-study: Fashion-MNIST test accuracy (%), seeds {seeds} (mean ± sd); {cpu_kind()}, "
        f"precision {precision}, torch {torch.__version__}"
    )
    print(
        f"teacher ViT {args.teacher_args}: {args.teacher_epochs} epochs on the labels, {teacher['acc1']:.1f} % "
        f"({teacher['cpu_s']:.0f} CPU s, {teacher['wall_s']:.0f} s); its linear probe {results['probe_teacher']['acc1']:.1f}"
        " (the ceiling)"
    )
    print(f"student ViT {args.student_args}; fine-tune {args.finetune_epochs} epoch(s), probe {args.probe_epochs}")
    print(f"{'student from':22} {'steps':>6} {'CPU s':>13} {'wall s':>13} {'linear probe':>13} {'fine-tune':>13}")
    for init in INITS:
        if init == "random":
            steps, cpu, wall = "-", "-", "-"
        else:
            steps = str(round(statistics.fmean(figures(init, "steps")))) if figures(init, "steps") else "-"
            cpu, wall = _spread(figures(init, "cpu_s")), _spread(figures(init, "wall_s"))
        label = {"random": "random initialisation", "mae": "MAE", "distill": "distillation"}[init]
        print(
            f"{label:22} {steps:>6} {cpu:>13} {wall:>13} {_spread(figures(f'probe_{init}')):>13} "
            f"{_spread(figures(f'finetune_{init}')):>13}"
        )
    print(
        f"DeiT hard distillation from random initialisation: {_spread(figures('deit'))}; "
        f"plain fine-tuning: {_spread(figures('finetune_random'))}  ({args.finetune_epochs} epoch(s) each)"
    )


def add_parser(sub: Any) -> None:
    ds = sub.add_parser(
        "distill-study",
        help="Fashion-MNIST: a student distilled without labels vs random and MAE at equal CPU time; DeiT hard vs plain",
    )
    ds.add_argument("--root", default=FASHION_MNIST_ROOT, help="folder of Fashion-MNIST's four IDX files")
    ds.add_argument("--out", default="runs/distill_study", help="runs and results.json (a rerun skips what it holds)")
    ds.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ds.add_argument("--batch-size", type=int, default=128)
    ds.add_argument("--teacher-epochs", type=int, default=5)
    ds.add_argument("--pretrain-steps", type=int, default=500, help="steps of each distillation")
    ds.add_argument("--calibration-steps", type=int, default=40, help="MAE steps timed to match the CPU time")
    ds.add_argument("--probe-epochs", type=int, default=5)
    ds.add_argument("--finetune-epochs", type=int, default=1)
    ds.add_argument("--teacher-args", type=json.loads, default=TEACHER_ARGS, help="timm model_args (JSON)")
    ds.add_argument("--student-args", type=json.loads, default=STUDENT_ARGS, help="timm model_args (JSON)")


def run_study(args: argparse.Namespace) -> None:
    print_study(args, Study(args).all())
