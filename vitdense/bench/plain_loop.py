"""`plain-loop`: a classification recipe trained through vitdense (the CLI, as users run
it) and through the plain PyTorch loop with timm's ViT that people would otherwise write,
same model, recipe and data, per seed: does the pipeline learn as fast as the plain loop?

The plain side is built from the same YAML (its `model` and `data` sections):
- model: `timm.create_model(name, num_classes=K, img_size=..., global_pool=pool,
  fc_norm=False, **model_args)` at timm's own initialisation; `fc_norm=False` because
  vitdense's "avg" pooling averages the final-normed patch tokens (timm's default for
  "avg" normalises after pooling instead: another architecture);
- optimizer: the config's class and arguments over timm's `param_groups_weight_decay` (no
  decay for biases, norms, position embedding and class token, as vitdense's groups);
- schedule: linear warmup from 0 and cosine to 0 per step (`WarmupCosineLR`'s formula,
  written out here as a `LambdaLR`), over epochs x steps per epoch;
- data: the very datasets of the config's DataModule (`setup("fit")`), the config's batch
  size, shuffled by a generator seeded per run, last partial batch dropped (as vitdense's
  training loader); the DataModule's own pipeline does any augmentation;
- precision: the trainer's, resolved (`precision: auto` -> bf16-mixed on a CPU with native
  bf16): autocast over the forward pass and the loss, as Lightning's mixed precision does.

Only the training loop and the model code differ; the shuffling order does too (each side
draws its own). Validation top-1 is micro accuracy over the whole validation split.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import timm
import torch
import torch.nn.functional as F
import yaml
from timm.optim import param_groups_weight_decay
from torch.utils.data import DataLoader

from vitdense.bench.common import cpu_kind
from vitdense.heads.factory import locate

DEMO_CONFIG = Path(__file__).parents[2] / "configs" / "demo_cls.yaml"


class ValAccuracyCurve(L.Callback):
    """Records `val/acc1` after each validation epoch of a fit (not the sanity check)."""

    def __init__(self) -> None:
        self.acc1: list[float] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_validation_end, not on_validation_epoch_end: the task logs val/acc1 in its own
        # epoch-end hook, which Lightning calls after the callbacks' epoch-end hooks
        if not trainer.sanity_checking:
            self.acc1.append(float(trainer.callback_metrics["val/acc1"]))


@dataclass
class Curve:
    """One training run: validation top-1 (%) after each epoch, and its wall time (s)."""

    acc1: list[float] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Recipe:
    """What the plain loop reads from a vitdense classification YAML."""

    model_name: str
    model_args: dict[str, Any]
    pool: str
    drop_rate: float
    optimizer: str
    optimizer_args: dict[str, Any]
    warmup_steps: int
    batch_size: int
    epochs: int
    precision: str

    @classmethod
    def of(cls, config: dict[str, Any], epochs: int | None, precision: str | None) -> Recipe:
        from vitdense.core.precision import resolve_precision

        model = config["model"]["init_args"]
        head = (model.get("head") or {}).get("init_args") or {}
        opt = model.get("optimizer") or {"class_path": "torch.optim.AdamW", "init_args": {}}
        sched = model.get("lr_scheduler") or {}
        if sched and not sched["class_path"].endswith("WarmupCosineLR"):
            raise ValueError(f"plain-loop writes out WarmupCosineLR only; the config has {sched['class_path']}")
        trainer = config.get("trainer") or {}
        chosen = precision or str(trainer.get("precision", "auto"))
        return cls(
            model_name=model.get("backbone", {}).get("name", "vit_tiny_patch16_224"),
            model_args=dict(model.get("backbone", {}).get("model_args") or {}),
            pool=head.get("pool", "token"),
            drop_rate=float(head.get("drop_rate", 0.0)),
            optimizer=opt["class_path"],
            optimizer_args=dict(opt.get("init_args") or {}),
            warmup_steps=int((sched.get("init_args") or {}).get("warmup_steps", 0)),
            batch_size=int(config["data"]["init_args"].get("loader", {}).get("batch_size", 32)),
            epochs=epochs or int(trainer.get("max_epochs", 1)),
            precision=str(resolve_precision(chosen, trainer.get("accelerator", "cpu")).precision),
        )


def data_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """`key=value` pairs (YAML values) of `data.init_args`."""
    out = {}
    for pair in pairs or []:
        key, _, value = pair.partition("=")
        out[key] = yaml.safe_load(value)
    return out


def fit_vitdense(config: Path, recipe: Recipe, seed: int, data_args: dict[str, Any]) -> Curve:
    """The recipe through `python -m vitdense fit --config ...` (the CLI in this process),
    with no checkpoints, logger or progress bar."""
    from vitdense.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "fit",
            f"--config={config}",
            f"--seed_everything={seed}",
            f"--trainer.max_epochs={recipe.epochs}",
            f"--trainer.precision={recipe.precision}",
            f"--trainer.default_root_dir={tmp}",
            '--trainer.callbacks=[{"class_path": "vitdense.bench.plain_loop.ValAccuracyCurve"}]',
            "--trainer.enable_checkpointing=false",
            "--trainer.logger=false",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ] + [f"--data.init_args.{k}={yaml.safe_dump(v, default_flow_style=True).strip()}" for k, v in data_args.items()]
        start = time.perf_counter()
        cli = main(argv)
        seconds = time.perf_counter() - start
    curve = next(c for c in cli.trainer.callbacks if isinstance(c, ValAccuracyCurve))
    return Curve([100 * a for a in curve.acc1], seconds)


def plain_model(recipe: Recipe, num_classes: int, img_size: int) -> torch.nn.Module:
    """timm's ViT for the recipe at timm's own initialisation."""
    return timm.create_model(
        recipe.model_name,
        pretrained=False,
        num_classes=num_classes,
        img_size=img_size,
        global_pool=recipe.pool,
        fc_norm=False,
        drop_rate=recipe.drop_rate,
        **recipe.model_args,
    )


def warmup_cosine(warmup: int, total: int):
    """LR factor per optimizer step: linear from 1/warmup to 1, then cosine to 0."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def stack(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([s.image for s in samples]), torch.tensor([int(s.label) for s in samples])


def fit_plain(config: dict[str, Any], recipe: Recipe, seed: int, data_args: dict[str, Any]) -> Curve:
    """The recipe in a plain PyTorch loop on timm's ViT, on the config's DataModule's datasets."""
    from jsonargparse import ArgumentParser

    L.seed_everything(seed, verbose=False)
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    # the CLI links the backbone's name into the data (its normalisation); do the same
    init_args = {**config["data"]["init_args"], "backbone": recipe.model_name, **data_args}
    data_cfg = {"class_path": config["data"]["class_path"], "init_args": init_args}
    dm = parser.instantiate_classes(parser.parse_object({"data": data_cfg})).data
    dm.setup("fit")
    train_set, val_set = dm.train_dataset, dm.val_dataset
    start = time.perf_counter()
    model = plain_model(recipe, dm.num_classes, dm.img_size)
    groups = param_groups_weight_decay(model, recipe.optimizer_args.get("weight_decay", 0.0), model.no_weight_decay())
    optimizer = locate(recipe.optimizer)(groups, **recipe.optimizer_args)
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(train_set, recipe.batch_size, shuffle=True, drop_last=True, collate_fn=stack, generator=g)
    val = DataLoader(val_set, recipe.batch_size, collate_fn=stack)
    total = recipe.epochs * len(train)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(recipe.warmup_steps, total))
    bf16 = recipe.precision.startswith("bf16")
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext
    curve = Curve()
    for _ in range(recipe.epochs):
        model.train()
        for images, labels in train:
            with autocast():
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        model.eval()
        correct = 0
        with torch.no_grad(), autocast():
            for images, labels in val:
                correct += int((model(images).argmax(-1) == labels).sum())
        curve.acc1.append(100 * correct / len(val_set))
    curve.seconds = time.perf_counter() - start
    return curve


def bench_plain_loop(args: argparse.Namespace) -> tuple[Recipe, dict[str, list[Curve]]]:
    """({"vitdense": [a Curve per seed], "plain": [...]}), the two sides alternating per seed."""
    config = yaml.safe_load(Path(args.config).read_text())
    recipe = Recipe.of(config, args.epochs, args.precision)
    data_args = data_overrides(args.set)
    curves: dict[str, list[Curve]] = {"vitdense": [], "plain": []}
    for seed in range(args.seeds):
        curves["vitdense"].append(fit_vitdense(Path(args.config), recipe, seed, data_args))
        curves["plain"].append(fit_plain(config, recipe, seed, data_args))
        for side, runs in curves.items():  # as they come: a long benchmark that is stopped still says something
            print(f"seed {seed} {side}: {runs[-1]}", file=sys.stderr, flush=True)
    return recipe, curves


def print_plain_loop(args: argparse.Namespace, recipe: Recipe, curves: dict[str, list[Curve]]) -> None:
    opt = ", ".join(f"{k} {v}" for k, v in recipe.optimizer_args.items())
    print(
        f"{Path(args.config).name}: {recipe.model_name}{f' {recipe.model_args}' if recipe.model_args else ''}, "
        f"pool {recipe.pool}, "
        f"{recipe.optimizer.rsplit('.', 1)[-1]} ({opt}), {recipe.warmup_steps} warmup steps + cosine, "
        f"batch {recipe.batch_size}, {recipe.epochs} epochs, {recipe.precision}, {args.seeds} seeds; "
        f"on {cpu_kind()} ({torch.get_num_threads()} threads, torch {torch.__version__}, timm {timm.__version__}, "
        f"lightning {L.__version__})"
    )
    epochs = range(1, recipe.epochs + 1)
    print(f"{'validation top-1 (%) by epoch':30}" + "".join(f"{e:>7}" for e in epochs) + f"{'wall s':>9}")
    for seed in range(args.seeds):
        for side in curves:
            c = curves[side][seed]
            print(f"{f'seed {seed} {side}':30}" + "".join(f"{a:7.1f}" for a in c.acc1) + f"{c.seconds:9.1f}")
    for side, runs in curves.items():
        mean = [sum(r.acc1[e] for r in runs) / len(runs) for e in range(recipe.epochs)]
        seconds = sum(r.seconds for r in runs) / len(runs)
        print(f"{f'mean {side}':30}" + "".join(f"{a:7.1f}" for a in mean) + f"{seconds:9.1f}")
