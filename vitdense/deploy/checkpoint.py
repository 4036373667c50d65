"""What a vitdense checkpoint records beyond the weights, and reading it back.

- the head a task was trained with, as plain data (`vitdense.heads.factory.HeadSpec`,
  written by `record_head`), so that a checkpoint rebuilds it.
- `record_class_paths`: the task's and the DataModule's classes named in every checkpoint,
  as LightningCLI names them, also when the task was trained from Python (`Trainer.fit`).
- `Checkpoint`: what a Lightning checkpoint says of its task and data, read lazily, or one
  `CheckpointError` naming the file (the command line and `python -m vitdense.viz` use it).
- `load_task` / `load_model`: the trained task, or just its plain model (`vitdense.models`),
  from a checkpoint alone: no config, no Trainer.
- `refuse_other_optimizer_groups`: a fit resuming from an optimizer state of other parameter
  groups (an earlier vitdense's) stops in one `CheckpointError` naming the file and the way on.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from dataclasses import asdict, is_dataclass, replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

import vitdense.backbone.config  # noqa: F401  (hyperparameters hold a BackboneConfig: registered for weights_only)
from vitdense.core.errors import CheckpointError, NoTaskError
from vitdense.core.safe_load import torch_load

# (re-exported: older code and pickled checkpoints name them here)
from vitdense.heads.factory import HeadFactory, HeadSpec, head_factory, locate, record_head  # noqa: F401

#: where LightningCLI names a class in a checkpoint's hyperparameters (and `Checkpoint` reads it)
CLASS_PATH_KEY = "_class_path"
#: what LightningCLI records to rebuild a class from its plain-data hyperparameters (jsonargparse)
INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"


def importable_path(cls: type) -> str | None:
    """The dotted path that imports `cls` in another process, or None: a class of a script
    run as `__main__`, or one defined inside a function."""
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        return None
    return f"{cls.__module__}.{cls.__qualname__}"


def record_class_paths(checkpoint: dict[str, Any], task: L.LightningModule, datamodule: Any) -> None:
    """Write the task's and the DataModule's hyperparameters in `checkpoint` as LightningCLI
    writes them, where it has not: a task trained from Python (`Trainer.fit(task, datamodule)`)
    then saves a checkpoint that `Checkpoint`, `load_model`, `python -m vitdense predict
    --ckpt_path` and `python -m vitdense.viz` read as one of the CLI's.

    As the CLI's: the class named (`_class_path`), dataclass settings (`BackboneConfig`) as
    plain dicts, which the CLI's parser reads, and its instantiator recorded, with which
    `load_from_checkpoint` rebuilds them. A CLI checkpoint is left as it is; so is a class
    that another process could not import (defined in a script or a function)."""
    objects = [(task, task.CHECKPOINT_HYPER_PARAMS_KEY)]
    if datamodule is not None:
        objects.append((datamodule, datamodule.CHECKPOINT_HYPER_PARAMS_KEY))
    for obj, key in objects:
        hparams = checkpoint.get(key)
        path = importable_path(type(obj))
        if isinstance(hparams, dict) and CLASS_PATH_KEY not in hparams and path is not None:
            plain = {k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in hparams.items()}
            checkpoint[key] = {CLASS_PATH_KEY: path, **plain, "_instantiator": INSTANTIATOR}


def record_inference(checkpoint: dict[str, Any], datamodule: Any) -> None:
    """Write the DataModule's evaluation preprocessing and label facts (`InferenceData`) in
    `checkpoint`, as plain data: what `vitdense.load`, `serve` and `export` build from
    without re-creating the DataModule. Nothing for a DataModule without `preprocess()`."""
    from vitdense.core.preprocess import CHECKPOINT_KEY, InferenceData

    found = InferenceData.of(datamodule) if datamodule is not None else None
    if found is not None:
        checkpoint[CHECKPOINT_KEY] = found.as_data()


def under_model(state_dict: dict[str, Any], own_keys: Any) -> dict[str, Any]:
    """A task state dict written before tasks held their model as `model` (keys `backbone.*`,
    `head.*`, `best_head`), with those keys moved under `model.`; a newer one unchanged."""
    if any(k.startswith("model.") for k in state_dict):
        return state_dict
    own = set(own_keys)
    return {(f"model.{k}" if k not in own and f"model.{k}" in own else k): v for k, v in state_dict.items()}


def refuse_other_optimizer_groups(checkpoint: dict[str, Any], sizes: list[int], path: Any) -> None:
    """One `CheckpointError` naming `path` when the optimizer state a fit would resume from
    `checkpoint` has other parameter groups than the run's optimizer (`sizes`: its parameters
    per group). torch refuses such a state too, but deep in Lightning, as a traceback that
    says neither which file nor what to do. A checkpoint of an earlier vitdense is one:
    before the "backbone" flag of `vitdense.training.optim.param_groups`, backbone and head
    parameters shared their groups (2 groups where there are 4 now)."""
    states = checkpoint.get("optimizer_states")
    if not isinstance(states, list) or len(states) != 1 or not isinstance(states[0], dict):
        return  # no optimizer state (Lightning says so itself) or several optimizers: not a task of the base's
    saved = [len(group.get("params", ())) for group in states[0].get("param_groups", [])]
    if saved == list(sizes):
        return
    raise CheckpointError(
        f"ckpt_path {path}: its optimizer state has {len(saved)} parameter groups ({', '.join(map(str, saved))} "
        f"parameters) where this run's optimizer has {len(sizes)} ({', '.join(map(str, sizes))}), so training cannot "
        "resume from it (saved by an earlier vitdense, whose backbone and head parameters shared groups, or with "
        "another backbone lr_scale, layer_decay or freeze); start a new fit from its weights instead: without "
        f"--ckpt_path, with --model.init_args.backbone.checkpoint={path} (the encoder's weights; the head, "
        "optimizer and schedule start anew; README: Resuming a run)"
    )


#: the last words of a `ckpt_path` refused for holding objects that could run code
UNSAFE_CKPT_HINT = (
    "A vitdense checkpoint holds none: pass a .ckpt written by vitdense training (to start from the weights "
    "of a file you trust: model.init_args.backbone.checkpoint with trust_checkpoint=true)"
)


def load_checkpoint(path: str | Path) -> Any:
    """The object a checkpoint file holds (tensors memory-mapped: weights stay on disk), or
    one `CheckpointError` naming the file: no such file, not a checkpoint, or one holding
    objects that could run code as they load (`vitdense.core.safe_load`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"ckpt_path {path}: no such file")
    try:
        # no opt-in here: vitdense's own checkpoints load with weights_only (Lightning reloads them so)
        return torch_load(path, "ckpt_path", hint=UNSAFE_CKPT_HINT, mmap=True)
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"ckpt_path {path}: not a PyTorch Lightning checkpoint that loads safely ({first}); "
            "pass a .ckpt file written by vitdense training"
        ) from err


class Checkpoint:
    """What a Lightning checkpoint says of the task and data it was trained with (read
    lazily: weights stay on disk), or one clear error naming the file.

    Raises:
        CheckpointError: no such file, not a checkpoint, or weights without a task.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        ckpt = load_checkpoint(self.path)
        hparams = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
        if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
            raise NoTaskError(
                f"ckpt_path {self.path}: weights without the task they belong to (no state_dict and "
                "hyper_parameters of a vitdense run); to start from these weights set "
                f"model.init_args.backbone.checkpoint={self.path}",
                lightning=False,
            )
        if CLASS_PATH_KEY not in hparams:
            raise NoTaskError(
                f"ckpt_path {self.path}: weights without the task they belong to (a Lightning checkpoint whose "
                "hyper_parameters name no task class: saved from Python by an earlier vitdense, or by a task class "
                "defined in a script); load it in Python with its task class, "
                f"TheTask.load_from_checkpoint({str(self.path)!r}) (e.g. TheTask = vitdense.tasks.ClassificationTask; "
                "its .model is the plain model), or start training from its weights with "
                f"model.init_args.backbone.checkpoint={self.path}",
                lightning=True,
            )
        self.task_class: str = hparams[CLASS_PATH_KEY]
        self.task: dict[str, Any] = {k: v for k, v in hparams.items() if not k.startswith("_")}
        #: the recorded preprocessing and label facts (`record_inference`), as plain data, or None
        self.inference: dict[str, Any] | None = ckpt.get("vitdense_inference")
        data = ckpt.get("datamodule_hyper_parameters") or {}
        self.data_class: str | None = data.get(CLASS_PATH_KEY)
        self.data: dict[str, Any] = {k: v for k, v in data.items() if not k.startswith("_")}

    def describe_classes(self) -> str:
        names = self.task.get("class_names") or []
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        return f"{self.task.get('num_classes')} classes ({shown})"

    def config(self) -> str:
        """The task and DataModule as a `--config` (a JSON string, which YAML reads); the
        task's hyperparameters are merged from the checkpoint by LightningCLI itself."""
        config: dict[str, Any] = {"model": {"class_path": self.task_class}}
        if self.data_class is not None:
            config["data"] = {"class_path": self.data_class, "init_args": self.data}
        return json.dumps(config, default=list)

    def restore(self, map_location: str | torch.device = "cpu") -> L.LightningModule:
        """The task, its weights from this checkpoint. The backbone's starting weights file
        (`backbone.checkpoint`, recorded in the hyperparameters) is not read: the checkpoint's
        weights replace it, and a file beside a shipped checkpoint must not be unpickled
        because the checkpoint names it (nor be needed once it has moved)."""
        overrides = {"backbone": without_weights_file(self.task["backbone"])} if "backbone" in self.task else {}
        return self.task_type().load_from_checkpoint(
            self.path, map_location=map_location, weights_only=True, **overrides
        )

    def task_type(self) -> type[L.LightningModule]:
        """The task class the checkpoint was trained with (imported by its recorded path)."""
        try:
            return locate(self.task_class)
        except (ImportError, AttributeError) as err:
            raise CheckpointError(
                f"ckpt_path {self.path}: its task {self.task_class} cannot be imported ({err}); install the package "
                "that defines it"
            ) from err


def without_weights_file(backbone: Any) -> Any:
    """A recorded backbone setting (`BackboneConfig`, or its plain-data form) without its
    starting weights file: for a task whose weights come from a checkpoint."""
    if isinstance(backbone, dict):
        return {**backbone, "checkpoint": None, "trust_checkpoint": False}
    if is_dataclass(backbone) and getattr(backbone, "checkpoint", None) is not None:
        return replace(backbone, checkpoint=None, trust_checkpoint=False)
    return backbone


def load_task(path: str | Path, map_location: str | torch.device = "cpu") -> L.LightningModule:
    """The task a vitdense training checkpoint holds (`python -m vitdense fit`, or a task
    trained from Python with `Trainer.fit`: `record_class_paths`), its weights loaded, in
    evaluation mode."""
    return Checkpoint(path).restore(map_location).eval()


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The plain model of a vitdense training checkpoint (`ImageClassifier`, `LinearProbe`,
    `Segmenter`, `DETRDetector`, or a custom task's), in evaluation mode: call it on images
    [B, 3, H, W] without Lightning, script or export it."""
    return load_task(path, map_location).model
