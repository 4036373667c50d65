"""MultiTask: several vitdense tasks trained on ONE encoder.

Each task keeps its own head, loss, metrics, result type and DataModule; the multi-task
module owns the one encoder they share (the first task's; every other task's encoder is
replaced by it, and their settings must agree), the sum of their losses, the optimizer and
the schedule:

    tasks: {det: DetectionTask(...), seg: SegmentationTask(...)}     (YAML: class_path + init_args each)
    data:  MultiTaskDataModule(tasks={det: ..., seg: ...})           (the same names)

    training step:  batch {name: that task's batch} -> each task's forward_batch and compute_loss
                    -> total = sum_k w_k L_k        ("fixed": w_k = loss_weights[k], default 1)
                     or sum_k exp(-s_k) L_k + s_k   ("uncertainty": s_k = log sigma_k^2 learned,
                                                    Kendall, Gal & Cipolla, CVPR 2018, eq. 10 as
                                                    commonly implemented, one s_k per task)
    validation:     each task's own evaluation on its own data, logged under its name:
                    val/<name>/loss, val/<name>/mIoU, val/<name>/map, ... and val/loss, the
                    weighted sum of the tasks' evaluation losses (what `monitor` watches by default)

The tasks' hooks run unchanged: each sees the trainer with its own DataModule as
`trainer.datamodule`, and what a task logs itself (`self.log`) is logged under its name.
The encoder's weights are stored once in checkpoints (`backbone.*`), not once per task.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable, instantiate_module
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from vitdense.backbone import VisionTransformer
from vitdense.backbone.one_pass import EncoderRequest, shared_request
from vitdense.core.errors import CheckpointError, ConfigError
from vitdense.deploy.checkpoint import (
    CLASS_PATH_KEY,
    INSTANTIATOR,
    TASKS_KEY,
    importable_path,
    plain_data,
    record_class_paths,
    without_weights_file,
)
from vitdense.deploy.multitask import record_tasks
from vitdense.heads.factory import locate
from vitdense.tasks.base import STAGES, BaseTask, Stage
from vitdense.training.callbacks import task_callbacks
from vitdense.training.optim import DEFAULT_LR_SCHEDULER, DEFAULT_OPTIMIZER, optimizer_config, resolve_schedules

#: how the tasks' losses add up
Weighting = Literal["fixed", "uncertainty"]
#: backbone settings that may differ between the tasks (they describe training, not the encoder)
_FREE_BACKBONE_SETTINGS = ("checkpoint", "trust_checkpoint", "pretrained")


class TaskTrainer:
    """The trainer as one task of a `MultiTask` sees it: everything the real trainer has,
    with that task's own DataModule as `datamodule`."""

    def __init__(self, trainer: L.Trainer, datamodule: Any) -> None:
        self._trainer = trainer
        self.datamodule = datamodule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)

    @classmethod
    def of(cls, trainer: L.Trainer, name: str, loaders: str) -> TaskTrainer:
        """Task `name`'s view of a multi-task run: its DataModule, and as `loaders` (e.g.
        "val_dataloaders") its own loader out of the run's loaders by name."""
        data = getattr(getattr(trainer, "datamodule", None), "tasks", {}).get(name)
        view = cls(trainer, data)
        found = getattr(trainer, loaders)
        setattr(view, loaders, found[name] if isinstance(found, Mapping) else found)
        return view


class MultiTask(L.LightningModule):
    """Several tasks on one encoder.

    Args:
        tasks: {name: task}: any vitdense task, or one of a user's written to README's "How
            to add a task" contract (a `BaseTask`). Names are path-safe words; they prefix
            every logged figure (`val/<name>/...`).
        loss_weights: {name: w_k} for "fixed" weighting (missing names: 1).
        weighting: "fixed" (sum_k w_k L_k) or "uncertainty" (learned per-task log variances).
        task_lr_scale: {name: factor} multiplying that task's head learning rates (the
            encoder's follow its `backbone` settings: lr_scale, layer_decay, freeze).
        monitor: the logged figure plateau schedules watch (and the progress bar shows),
            e.g. "val/seg/mIoU"; default the weighted evaluation loss "val/loss".
        mode: "min" or "max" for `monitor`.
        optimizer, lr_scheduler, lr_interval: as every task's (`vitdense.training.optim`).
    """

    def __init__(
        self,
        tasks: dict[str, BaseTask],
        loss_weights: dict[str, float] | None = None,
        weighting: Weighting = "fixed",
        task_lr_scale: dict[str, float] | None = None,
        monitor: str = "val/loss",
        mode: Literal["min", "max"] = "min",
        optimizer: OptimizerCallable = DEFAULT_OPTIMIZER,
        lr_scheduler: LRSchedulerCallable = DEFAULT_LR_SCHEDULER,
        lr_interval: Literal["step", "epoch"] = "step",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tasks", "optimizer", "lr_scheduler"])
        tasks = {name: build_task(name, task) for name, task in (tasks or {}).items()}
        check_names(tasks)
        for label, given in (("loss_weights", loss_weights), ("task_lr_scale", task_lr_scale)):
            unknown = sorted(set(given or {}) - set(tasks))
            if unknown:
                raise ConfigError(
                    f"model.init_args.{label} names {unknown}, which are not tasks: choose from {sorted(tasks)}"
                )
        if weighting not in ("fixed", "uncertainty"):
            raise ConfigError(f"model.init_args.weighting={weighting!r}: choose fixed or uncertainty")
        if weighting == "uncertainty" and loss_weights:
            raise ConfigError(
                "model.init_args.loss_weights are for weighting: fixed; uncertainty weighting learns them"
            )
        self.loss_weights = {name: float((loss_weights or {}).get(name, 1.0)) for name in tasks}
        self.weighting = weighting
        self.task_lr_scale = {name: float((task_lr_scale or {}).get(name, 1.0)) for name in tasks}
        self.monitor, self.mode = monitor, mode
        self.optimizer, self.lr_scheduler, self.lr_interval = optimizer, lr_scheduler, lr_interval
        first = next(iter(tasks))
        self.backbone: VisionTransformer = tasks[first].backbone
        for name, task in tasks.items():
            check_same_encoder(first, tasks[first], name, task)
            task.model.backbone = self.backbone  # the one encoder (the others' are dropped here)
        self.tasks = nn.ModuleDict(tasks)
        # each task as plain data (class path + its own recorded settings): a checkpoint rebuilds them
        self.hparams["tasks"] = {name: task_spec(task) for name, task in tasks.items()}
        #: "uncertainty": s_k = log sigma_k^2 per task, learned (0: weight 1)
        self.log_vars = nn.Parameter(torch.zeros(len(tasks))) if weighting == "uncertainty" else None
        # checkpoints hold the encoder once: each task's copy of its keys is left out and restored from it
        self._register_state_dict_hook(_drop_shared_keys)
        self._register_load_state_dict_pre_hook(_restore_shared_keys, with_module=True)

    # ----------------------------------------------------------------- the tasks' view
    @property
    def names(self) -> list[str]:
        return list(self.tasks)

    @contextmanager
    def _attached(self) -> Iterator[None]:
        """While the tasks' hooks run: each sees the trainer with its own DataModule, and
        logs under its name (then each is itself again, e.g. to be validated alone)."""
        if self._trainer is None:
            yield
            return
        data = getattr(self._trainer, "datamodule", None)
        per_task = getattr(data, "tasks", {}) if data is not None else {}
        saved = {name: task._trainer for name, task in self.tasks.items()}
        for name, task in self.tasks.items():
            task._trainer = TaskTrainer(self._trainer, per_task.get(name))
            task.log = self._logger_of(name)  # (an instance attribute shadows the method, until the finally)
        try:
            yield
        finally:
            for name, task in self.tasks.items():
                task._trainer = saved[name]
                task.__dict__.pop("log", None)

    def _logger_of(self, name: str) -> Any:
        def log(key: str, value: Any, **kwargs: Any) -> None:
            self.log(named(key, name), value, **kwargs)

        return log

    def prepare_data(self) -> None:
        with self._attached():
            for task in self.tasks.values():
                task.prepare_data()

    def drawn_parts(self, trainer: Any, tag: str) -> list[tuple[Any, Any, str, str]]:
        """What `ValidationImages` draws of a multi-task model: each task's pictures of its own
        validation images, [(the task's view of `trainer` (its DataModule and loader), the
        task, `tag` under its name, its name)]."""
        return [
            (TaskTrainer.of(trainer, name, "val_dataloaders"), task, named(tag, name), name)
            for name, task in self.tasks.items()
        ]

    def setup(self, stage: str) -> None:
        data = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if data is not None:
            if not hasattr(data, "tasks"):
                raise ConfigError(
                    f"data: a MultiTask trains from a MultiTaskDataModule (one DataModule per task, by name), "
                    f"not a {type(data).__name__}"
                )
            data.check_tasks(self.names)
            for name, task in self.tasks.items():
                check_data(name, task, data.tasks[name])
        with self._attached():
            for task in self.tasks.values():
                task.setup(stage)  # hub weights (the shared encoder's, once per task asking), the data's facts

    def configure_model(self) -> None:
        with self._attached():
            for task in self.tasks.values():
                task.configure_model()  # (`compile`, as each task asks)

    @property
    def encoder_request(self) -> EncoderRequest:
        """The union of what the tasks' heads read off the encoder."""
        return shared_request({name: task.model for name, task in self.tasks.items()})

    def forward(self, images: torch.Tensor, image_sizes: Any = None) -> dict[str, Any]:
        """{name: that task's model output} for images [B, 3, H, W], the encoder run once."""
        with self.backbone.one_pass(self.encoder_request):
            return {name: task(images, image_sizes) for name, task in self.tasks.items()}

    # ------------------------------------------------------------------------ the loop
    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor | None:
        # tasks whose batches hold the same images (one dataset, several kinds of labels) share
        # one encoder pass, and its gradient sums theirs; other batches are encoded each
        with self._attached(), self.backbone.one_pass(self.encoder_request):
            # each task's own step on its own batch (its losses logged under its name); None: that
            # loader is exhausted ("max_size") or every sample of the batch was skipped
            losses = {name: task._shared_step(batch.get(name), "train") for name, task in self.tasks.items()}
            losses = {name: loss for name, loss in losses.items() if loss is not None}
            if not losses:
                return None
            total = self.combine(losses)
            self.log("train/loss", total, prog_bar=True, on_step=True, on_epoch=True, batch_size=1)
            return total

    def combine(self, losses: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The training loss from the tasks' own totals, by `weighting`."""
        if self.log_vars is None:
            return sum(self.loss_weights[name] * loss for name, loss in losses.items())
        total = 0.0
        for i, name in enumerate(self.names):
            if name in losses:
                s = self.log_vars[i]
                total = total + torch.exp(-s) * losses[name] + s
                self.log(f"train/{name}/log_var", s.detach(), on_step=True, on_epoch=False)
        return total

    def _eval_step(self, batch: Any, dataloader_idx: int, stage: Stage) -> None:
        with self._attached():  # the task's own evaluation step: its metrics and its dataset-level losses
            self.tasks[self.names[dataloader_idx]]._shared_step(batch, stage)

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "val")

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "test")

    def _end_epoch(self, stage: Stage) -> None:
        """Each task's figures under its name, and the weighted sum of its losses."""
        with self._attached():
            total = None
            for i, (name, task) in enumerate(self.tasks.items()):
                figures = {}
                if stage != "train":
                    losses = task.eval_losses.pop(stage)
                    if f"{stage}/loss" in losses:
                        weight = (
                            self.loss_weights[name] if self.log_vars is None else torch.exp(-self.log_vars[i]).detach()
                        )
                        total = weight * losses[f"{stage}/loss"] + (0 if total is None else total)
                    figures.update(losses)
                metrics = task.metrics_of(stage)
                if metrics is not None and metrics:
                    result = metrics.compute()
                    figures.update(task.summarize(result, stage))
                    table = task.format_table(result, stage)
                    if table and stage != "train" and not self.trainer.sanity_checking:
                        rank_zero_info(f"[{name}] {table}")
                    metrics.reset()
                for key, value in figures.items():
                    key = named(key, name)
                    self.log(key, value.float(), prog_bar=key == self.monitor, sync_dist=True)
            if total is not None:
                self.log(f"{stage}/loss", total, prog_bar=self.monitor == f"{stage}/loss", sync_dist=True)

    def on_train_epoch_end(self) -> None:
        self._end_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._end_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._end_epoch("test")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # a fit from Python names the class as the command line does: the checkpoint loads alone
        data = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        record_class_paths(checkpoint, self, None)
        # each task's plain model and preprocessing: vitdense.load, serve and export build from them
        record_tasks(checkpoint, dict(self.tasks.items()), getattr(data, "tasks", None) or {})

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        with self._attached():  # the task whose loader this is predicts its batch
            return self.tasks[self.names[dataloader_idx]].predict_step(batch, batch_idx)

    def configure_callbacks(self) -> list[L.Callback]:
        """Skipped-sample counts and the resume RNG state, as every task's; `predict`
        without a writer of the user's writes each task's own files and table under
        `<default_root_dir>/predictions/<name>/` (`TaskWriters`)."""
        if self._trainer is None:
            return []
        callbacks = task_callbacks(self._trainer, lambda _: None)  # (the tasks' writers: below)
        trainer = self._trainer
        if trainer.predicting and not any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks):
            output_dir = Path(trainer.default_root_dir) / "predictions"
            writers = {name: task.prediction_writer(output_dir / name) for name, task in self.tasks.items()}
            rank_zero_info(f"predictions go to {output_dir}/<task>/ (add a writer callback to choose)")
            callbacks.append(TaskWriters(writers))
        return callbacks

    # ------------------------------------------------------------------- optimisation
    def param_groups(self) -> list[dict]:
        """Every task's parameter groups (its own `param_groups`: layer decay and the
        encoder's scales as its backbone settings say), each parameter once: the shared
        encoder's groups come from the first task; a task's other groups scale by
        `task_lr_scale`. The uncertainty weights train at the optimizer's rate, no decay."""
        seen: set[int] = set()
        groups = []
        for name, task in self.tasks.items():
            for group in task.param_groups():
                params = [p for p in group["params"] if id(p) not in seen]
                if not params:
                    continue
                keep = [i for i, p in enumerate(group["params"]) if id(p) not in seen]
                seen.update(id(p) for p in params)
                group = {**group, "params": params}
                if "names" in group:
                    group["names"] = [f"tasks.{name}.{group['names'][i]}" for i in keep]
                if not group.get("backbone"):
                    group["lr_scale"] = group.get("lr_scale", 1.0) * self.task_lr_scale[name]
                groups.append(group)
        if self.log_vars is not None:
            groups.append({"params": [self.log_vars], "names": ["log_vars"], "lr_scale": 1.0, "weight_decay": 0.0})
        return groups

    def configure_optimizers(self) -> dict:
        return optimizer_config(self.optimizer, self.lr_scheduler, self.param_groups(), self.lr_interval, self.monitor)

    def on_train_start(self) -> None:
        resolve_schedules(self.trainer)
        with self._attached():
            for task in self.tasks.values():
                task.on_train_start()  # (EoMT's annealing continues where a resumed run's step count is)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        with self._attached():
            for name, task in self.tasks.items():
                if batch.get(name) is not None:
                    task.on_train_batch_end(outputs, batch[name], batch_idx)


class TaskWriters(BasePredictionWriter):
    """Each task's own prediction writer (`prediction_writer`, e.g. `ResultWriter`), given
    that task's batches (its loader's `dataloader_idx`), the task itself, and the trainer as
    the task sees it (its DataModule, its predict loader)."""

    def __init__(self, writers: Mapping[str, BasePredictionWriter | None]) -> None:
        super().__init__(write_interval="batch")
        self.writers = dict(writers)

    def _views(self, trainer: L.Trainer, model: MultiTask) -> Iterator[tuple[str, Any, Any, BasePredictionWriter]]:
        for name, writer in self.writers.items():
            if writer is not None:
                yield name, TaskTrainer.of(trainer, name, "predict_dataloaders"), model.tasks[name], writer

    def on_predict_start(self, trainer: L.Trainer, pl_module: MultiTask) -> None:
        for _, view, task, writer in self._views(trainer, pl_module):
            writer.on_predict_start(view, task)

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: MultiTask,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        name = pl_module.names[dataloader_idx]
        for other, view, task, writer in self._views(trainer, pl_module):
            if other == name:
                writer.write_on_batch_end(view, task, prediction, batch_indices, batch, batch_idx, 0)

    def on_predict_end(self, trainer: L.Trainer, pl_module: MultiTask) -> None:
        for _, view, task, writer in self._views(trainer, pl_module):
            writer.on_predict_end(view, task)


def named(key: str, name: str) -> str:
    """ "val/mIoU" of task `name` -> "val/<name>/mIoU" (a key without a stage: "<name>/key")."""
    stage, sep, rest = key.partition("/")
    return f"{stage}/{name}/{rest}" if sep and stage in (*STAGES, "predict") else f"{name}/{key}"


def build_task(name: str, task: Any) -> Any:
    """A task, or one built from its plain-data form (`task_spec`, as a checkpoint records it)."""
    if isinstance(task, Mapping) and "class_path" in task:
        try:
            cls = locate(task["class_path"])
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"model.init_args.tasks.{name}: cannot import {task['class_path']} ({err})") from err
        # as Lightning rebuilds a task from a checkpoint's plain data (dicts into BackboneConfig, head specs)
        return instantiate_module(cls, dict(task.get("init_args", {})))
    return task


def task_spec(task: BaseTask) -> dict[str, Any]:
    """A task as plain data: its class path and its recorded settings (dataclasses as dicts,
    the head as `HeadSpec` data, the encoder's starting weights file left out: the
    multi-task checkpoint's weights replace it)."""
    init = {k: v for k, v in task.hparams.items() if not k.startswith("_")}
    if "backbone" in init:
        init["backbone"] = without_weights_file(init["backbone"])
    init = {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
        for k, v in init.items()
    }
    return {"class_path": importable_path(type(task)) or type(task).__qualname__, "init_args": init}


def check_names(tasks: Mapping[str, Any]) -> None:
    if not tasks:
        raise ConfigError(
            "model.init_args.tasks is empty: name at least one task, e.g. tasks: {seg: {class_path: ...}}"
        )
    for name, task in tasks.items():
        if not name.isidentifier():
            raise ConfigError(
                f"model.init_args.tasks: {name!r} is not a name (letters, digits and _): it prefixes logged keys"
            )
        if not isinstance(task, BaseTask):
            raise ConfigError(
                f"model.init_args.tasks.{name} is a {type(task).__name__}, not a vitdense task (a BaseTask subclass)"
            )


def check_data(name: str, task: BaseTask, data: Any) -> None:
    """What a single task's command line links from its data, checked here, where each task
    names it: the image size the data crops or resizes to is the encoder's `img_size` (a
    Segmenter's windows, the position table's native grid), the class count agrees, and the
    data's class names replace default ones ("0", "1", ...)."""
    size, encoder = getattr(data, "img_size", None), getattr(task.backbone_config, "img_size", None)
    if isinstance(size, int) and isinstance(encoder, int) and size != encoder:
        raise ConfigError(
            f"data.init_args.tasks.{name}.init_args.img_size={size}, but the shared encoder's backbone.img_size is "
            f"{encoder}: a task's data and its encoder have one size (a single task links them); give them one"
        )
    count = getattr(data, "num_classes", None)
    if count is None or getattr(task, "num_classes", None) is None:
        return
    if count != task.num_classes:
        raise ConfigError(
            f"model.init_args.tasks.{name}.init_args.num_classes={task.num_classes}, but "
            f"data.init_args.tasks.{name} has {count} classes: set it to {count}"
        )
    names = getattr(data, "class_names", None)
    if names and task.class_names == [str(c) for c in range(task.num_classes)]:
        task.class_names = list(names)
        task.hparams["class_names"] = list(names)


def check_same_encoder(first_name: str, first: BaseTask, name: str, task: BaseTask) -> None:
    """Tasks share an encoder only when they describe the same one (its architecture, size
    and training settings; where its starting weights come from may differ)."""
    a, b = first.backbone_config, task.backbone_config
    if not (dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b)):
        return
    differ = [
        f.name
        for f in dataclasses.fields(a)
        if f.name not in _FREE_BACKBONE_SETTINGS and getattr(a, f.name) != getattr(b, f.name, None)
    ]
    if differ:
        shown = ", ".join(f"{k}: {getattr(a, k)!r} vs {getattr(b, k)!r}" for k in differ)
        raise ConfigError(
            f"model.init_args.tasks.{name}.init_args.backbone differs from tasks.{first_name}'s ({shown}): the tasks "
            "share one encoder, so give them one backbone setting (or leave it out of all but the first)"
        )


def _shared_prefixes(module: MultiTask, prefix: str) -> list[str]:
    return [f"{prefix}tasks.{name}.model.backbone." for name in module.tasks]


def _drop_shared_keys(module: MultiTask, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    for key in [k for k in state_dict if any(k.startswith(p) for p in _shared_prefixes(module, prefix))]:
        del state_dict[key]


def _restore_shared_keys(module: MultiTask, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    shared = {
        k[len(prefix) + len("backbone.") :]: v for k, v in state_dict.items() if k.startswith(f"{prefix}backbone.")
    }
    for task_prefix in _shared_prefixes(module, prefix):
        for key, value in shared.items():
            state_dict.setdefault(task_prefix + key, value)


# ------------------------------------------------------------ heads trained apart, served together
def encoder_digest(encoder: nn.Module) -> str:
    """sha256 of an encoder's weights (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for key, value in sorted(encoder.state_dict().items()):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def combine(checkpoints: Mapping[str, str | Path], output: str | Path, **settings: Any) -> Path:
    """One multi-task checkpoint from single-task ones trained on one frozen encoder (heads
    trained apart, served together), without training: the tasks as their checkpoints hold
    them, the encoder once. `settings`: `MultiTask`'s (loss_weights, monitor, ...).

    Raises:
        CheckpointError: an encoder whose weights differ from the first checkpoint's (by
            sha256), or a file that is not a vitdense task checkpoint.
    """
    from vitdense.deploy.checkpoint import Checkpoint

    if not checkpoints:
        raise ConfigError("combine: name at least one task checkpoint, e.g. det=runs/det/last.ckpt")
    tasks, digests, found = {}, {}, {}
    for name, path in checkpoints.items():
        found[name] = Checkpoint(path)
        tasks[name] = found[name].restore()
        digests[name] = encoder_digest(tasks[name].backbone)
    first = next(iter(checkpoints))
    differ = [name for name, digest in digests.items() if digest != digests[first]]
    if differ:
        listed = ", ".join(f"{name} ({checkpoints[name]})" for name in differ)
        raise CheckpointError(
            f"combine: the encoder of {listed} differs from {first}'s ({checkpoints[first]}; sha256 of the weights "
            f"{digests[first][:12]} against {', '.join(digests[n][:12] for n in differ)}): heads combine only when "
            "trained on one frozen encoder (backbone.freeze: true from the same weights); train them jointly "
            "with a MultiTask instead"
        )
    model = MultiTask(tasks, **settings)
    hparams = {CLASS_PATH_KEY: importable_path(MultiTask), **dict(model.hparams), "_instantiator": INSTANTIATOR}
    state = {
        "pytorch-lightning_version": L.__version__,
        "epoch": 0,
        "global_step": 0,
        "state_dict": model.state_dict(),
        "hyper_parameters": hparams,
        # each task's plain model and recorded preprocessing, by name, as its own checkpoint has them
        TASKS_KEY: plain_data({name: {"model": c.model_record, "inference": c.inference} for name, c in found.items()}),
        "vitdense_combined_from": {name: str(path) for name, path in checkpoints.items()},
    }
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, output)
    return output


def main(argv: list[str] | None = None) -> None:
    """`python -m vitdense combine NAME=CKPT ... --output FILE`: one multi-task checkpoint
    from single-task checkpoints trained on one frozen encoder."""
    parser = argparse.ArgumentParser(
        prog="python -m vitdense combine",
        description="Combine single-task checkpoints whose encoders are identical (heads trained on one frozen "
        "encoder) into one multi-task checkpoint, without training.",
    )
    parser.add_argument(
        "tasks", nargs="+", metavar="NAME=CKPT", help="a task's name and its checkpoint, e.g. det=runs/det/last.ckpt"
    )
    parser.add_argument("--output", "-o", required=True, help="the multi-task checkpoint to write")
    args = parser.parse_args(argv)
    checkpoints = {}
    for item in args.tasks:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"combine: {item!r} is not NAME=CKPT (e.g. det=runs/det/last.ckpt)")
        if name in checkpoints:
            raise ConfigError(f"combine: the task name {name!r} is given twice")
        checkpoints[name] = path
    written = combine(checkpoints, args.output)
    print(f"wrote {written}: tasks {', '.join(checkpoints)} on one encoder")
