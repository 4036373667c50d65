"""A multi-task checkpoint used as a model: every task's result from one encoder pass.

    predictor = vitdense.load("runs/demo_multitask/checkpoints/last.ckpt")
    results = predictor("scene.png")          # {"det": DetectionResult, "seg": SegmentationResult, ...}
    results["det"].boxes
    predictor("scene.png", tasks=["seg"])     # only the tasks named

A multi-task checkpoint (`vitdense.tasks.MultiTask`, trained jointly or `combine`d from
single-task checkpoints) records, per task, what a single task's checkpoint records: its
plain model (`record_model`) and its data's preprocessing (`record_inference`), under
`TASKS_KEY`. Each task is then rebuilt as its own `PlainTask` (no Lightning), all on the one
encoder, and predicted by its own `Predictor`; the predictors run inside one
`VisionTransformer.one_pass`, so tasks whose preprocessing makes the same batch (the same
resize and normalisation) share one pass of the encoder, and every result is the one that
task's single checkpoint gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitdense.backbone.one_pass import shared_request
from vitdense.core.errors import CheckpointError, ConfigError
from vitdense.core.preprocess import InferenceData
from vitdense.deploy.checkpoint import (
    MODEL_KEY,
    TASKS_KEY,
    Checkpoint,
    locate,
    plain_data,
    plain_task,
    record_inference,
    record_model,
)
from vitdense.deploy.predictor import ImageInput, Predictor, is_one_image
from vitdense.deploy.slicing import Slicing, check_sliceable
from vitdense.results.common import Result


def record_tasks(checkpoint: dict[str, Any], tasks: Mapping[str, Any], datamodules: Mapping[str, Any]) -> None:
    """Write each task's model record and its DataModule's preprocessing in `checkpoint`
    under `TASKS_KEY`, by name (what `record_model` / `record_inference` write for one task)."""
    recorded = {}
    for name, task in tasks.items():
        one: dict[str, Any] = {}
        record_model(one, task)
        record_inference(one, datamodules.get(name))
        recorded[name] = {"model": one.get(MODEL_KEY), "inference": one.get("vitdense_inference")}
    checkpoint[TASKS_KEY] = plain_data(recorded)


def task_state_dict(state_dict: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Task `name`'s own state dict (`model.*`, ...) out of a multi-task one, the shared
    encoder's tensors (stored once, as `backbone.*`) under its `model.backbone.`."""
    prefix = f"tasks.{name}."
    own = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    for key, value in state_dict.items():
        if key.startswith("backbone."):
            own.setdefault(f"model.{key}", value)
    return own


def restore_tasks(found: Checkpoint, map_location: str | torch.device = "cpu") -> dict[str, nn.Module]:
    """{name: the task, in evaluation mode} on ONE encoder object: each a `PlainTask` where
    every task's plain model is recorded (no Lightning), else the tasks of the `MultiTask`
    restored through Lightning (a task of your own in it)."""
    records = found.tasks_record or {}
    names = list(found.task.get("tasks") or records)
    if names and all((records.get(name) or {}).get("model") for name in names):
        tasks = {
            name: plain_task(
                records[name]["model"],
                task_state_dict(found.state_dict, name),
                found.task["tasks"][name]["class_path"] if "tasks" in found.task else "",
                found.path,
                map_location,
            )
            for name in names
        }
        first = next(iter(tasks.values())).model.backbone
        for task in tasks.values():
            task.model.backbone = first  # (equal weights: the checkpoint holds the encoder once)
        return tasks
    multi = found.restore(map_location).eval()
    return dict(multi.tasks.items())


def tasks_inference(found: Checkpoint) -> dict[str, InferenceData]:
    """Each task's recorded preprocessing and label facts, by name (`record_tasks`)."""
    records = found.tasks_record or {}
    data = {}
    for name in found.task.get("tasks") or records:
        recorded = (records.get(name) or {}).get("inference")
        if recorded is None:
            raise CheckpointError(
                f"ckpt_path {found.path}: task {name!r} has no recorded preprocessing (a MultiTask checkpoint "
                "written before vitdense recorded it per task); build the predictors yourself: "
                "MultiTaskPredictor({name: Predictor(task, InferenceData(Preprocess(...)))})"
            )
        data[name] = InferenceData.from_data(recorded)
    return data


def normalization(found: Checkpoint) -> tuple[list[float], list[float]]:
    """The one mean / std every task's data normalises with (an exported graph runs the
    encoder once, on one normalised input): refused when the tasks' differ."""
    found_by = {name: (list(d.preprocess.mean), list(d.preprocess.std)) for name, d in tasks_inference(found).items()}
    first = next(iter(found_by))
    differ = [name for name, pair in found_by.items() if pair != found_by[first]]
    if differ:
        raise ConfigError(
            f"ckpt_path {found.path}: tasks {differ} normalise their images otherwise than {first!r} "
            f"(mean/std {found_by[differ[0]]} vs {found_by[first]}): one graph runs the encoder on one input; "
            "give the tasks' data one mean and std"
        )
    return found_by[first]


class PlainMultiTask(nn.Module):
    """The tasks of a multi-task checkpoint as one module: `.tasks` by name, `.model` the
    `MultiTaskModel` of their plain models (what `load_model` and `export` use)."""

    def __init__(self, tasks: Mapping[str, nn.Module]) -> None:
        super().__init__()
        self.tasks = nn.ModuleDict(dict(tasks))
        # (by its path, as every plain model here: deployment imports no family it does not run)
        model_class = locate("vitdense.models.multitask.MultiTaskModel")
        self.model = model_class({name: task.model for name, task in self.tasks.items()})


class MultiTaskPredictor:
    """Several tasks on one encoder as a function from images to {name: result}.

    Args:
        predictors: {name: that task's `Predictor`}, their tasks on one encoder object.
    """

    def __init__(self, predictors: Mapping[str, Predictor]) -> None:
        if not predictors:
            raise ConfigError("MultiTaskPredictor: give at least one task's Predictor")
        self.predictors = dict(predictors)
        encoders = {id(p.task.backbone) for p in self.predictors.values()}
        if len(encoders) != 1:
            raise ConfigError("MultiTaskPredictor: the tasks' models must hold one encoder object (task.backbone)")
        self.backbone = next(iter(self.predictors.values())).task.backbone
        self.request = shared_request({name: p.task.model for name, p in self.predictors.items()})
        #: the encoder passes the last call made (one per batch when the tasks' preprocessing agrees)
        self.last_passes = 0

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        batch_size: int | None = None,
        precision: str = "32-true",
        preprocess_as: str | None = None,
        slicing: Slicing | None = None,
    ) -> MultiTaskPredictor:
        """Every task of a multi-task checkpoint, with its recorded preprocessing, or with
        task `preprocess_as`'s for all (resize and normalisation; each task keeps its labels):
        then every task reads the same batch and the encoder runs once per batch, where
        tasks whose data resized otherwise would each run it on their own input. `slicing`:
        the tasks that predict objects (detection, instances) predict in tiles, merged
        (`vitdense.deploy.slicing`); the others read whole images."""
        found = path if isinstance(path, Checkpoint) else Checkpoint(path)
        tasks = restore_tasks(found)
        data = tasks_inference(found)
        if preprocess_as is not None:
            if preprocess_as not in data:
                raise ConfigError(f"preprocess_as={preprocess_as!r}: choose among {list(data)}")
            data = {name: replace(d, preprocess=data[preprocess_as].preprocess) for name, d in data.items()}
        batch_size = batch_size or first_batch_size(found)
        predictors = {
            name: Predictor(task, data[name], device=device, batch_size=batch_size, precision=precision)
            for name, task in tasks.items()
        }
        if slicing is not None:  # the tasks that predict objects, in tiles; the others whole
            sliced = [name for name, task in tasks.items() if sliceable(task)]
            if not sliced:
                check_sliceable(next(iter(tasks.values())))  # (the one-line refusal, naming the first)
            for name in sliced:
                predictors[name].slicing = slicing
        return cls(predictors)

    @property
    def names(self) -> list[str]:
        return list(self.predictors)

    @property
    def class_names(self) -> dict[str, list[str]]:
        return {name: p.class_names for name, p in self.predictors.items()}

    def __call__(
        self, images: ImageInput | Sequence[ImageInput], tasks: Sequence[str] | None = None
    ) -> dict[str, Result] | list[dict[str, Result]]:
        """{name: result} of one image, or a list of them for several (a folder counts as
        several); `tasks`: only those (default: every task)."""
        chosen = self.chosen(tasks)
        first = next(iter(chosen.values()))
        single = is_one_image(images)
        loaded = list(first.load_images(images if isinstance(images, (list, tuple)) else [images]))
        step = min(p.batch_size for p in chosen.values())
        results: list[dict[str, Result]] = []
        self.last_passes = 0
        for start in range(0, len(loaded), step):
            chunk = loaded[start : start + step]
            with self.backbone.one_pass(self.request) as shared:
                per_task = {name: p.predict_batch(chunk) for name, p in chosen.items()}
            self.last_passes += shared.encoded
            results += [{name: per_task[name][i] for name in chosen} for i in range(len(chunk))]
        return results[0] if single else results

    def chosen(self, tasks: Sequence[str] | None) -> dict[str, Predictor]:
        if tasks is None:
            return self.predictors
        unknown = [name for name in tasks if name not in self.predictors]
        if unknown or not tasks:
            raise ConfigError(f"tasks={list(tasks)}: choose among {self.names}")
        return {name: self.predictors[name] for name in tasks}


def sliceable(task: Any) -> bool:
    """Whether a task predicts objects, which sliced inference merges (`check_sliceable`)."""
    try:
        check_sliceable(task)
    except ConfigError:
        return False
    return True


def example_size(found: Checkpoint) -> int | None:
    """The size an export traces at: the shared encoder's native `img_size`, as the first
    task's model record has it (None: not recorded)."""
    for record in (found.tasks_record or {}).values():
        size = ((record or {}).get("model") or {}).get("backbone", {}).get("img_size")
        return (size[0] if isinstance(size, (list, tuple)) else size) or None
    return None


def first_batch_size(found: Checkpoint) -> int | None:
    """The evaluation batch the first task's data loaded with, if the checkpoint says."""
    for spec in (found.data.get("tasks") or {}).values():
        loader = (spec.get("init_args") or {}).get("loader") if isinstance(spec, Mapping) else None
        return (loader.get("eval_batch_size") or loader.get("batch_size")) if isinstance(loader, Mapping) else None
    return None
