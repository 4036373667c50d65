"""What a vitdense checkpoint records beyond the weights, and reading it back.

- the head a task was trained with, as plain data (`vitdense.heads.factory.HeadSpec`,
  written by `record_head`), so that a checkpoint rebuilds it.
- `record_class_paths`: the task's and the DataModule's classes named in every checkpoint,
  as LightningCLI names them, also when the task was trained from Python (`Trainer.fit`).
- `Checkpoint`: what a Lightning checkpoint says of its task and data, read lazily, or one
  `CheckpointError` naming the file (the command line and `python -m vitdense.viz` use it).
- `record_model`: how the plain model (`vitdense.models`) is rebuilt and predicts without
  the task class, as plain data (a built-in task's `plain_inference()`, the backbone's
  settings, the head's factory, the class names); `PlainTask` is that model and inference
  standing in for the task where a trained model is used (`vitdense.load`, `serve`,
  `export`), without importing the task, Lightning, torchmetrics or scipy.
- `load_task` / `load_model`: the trained task (through Lightning), or just its plain model
  (`vitdense.models`; from the record where the checkpoint has one), from a checkpoint alone:
  no config, no Trainer.
- `refuse_other_optimizer_groups`: a fit resuming from an optimizer state of other parameter
  groups (an earlier vitdense's) stops in one `CheckpointError` naming the file and the way on.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from vitdense.backbone.config import BackboneConfig  # (hyperparameters hold one: registered for weights_only)
from vitdense.core.errors import CheckpointError, NoTaskError
from vitdense.core.safe_load import torch_load
from vitdense.deploy.slicing import SlicedImages, predict_sliced

# (re-exported: older code and pickled checkpoints name them here)
from vitdense.heads.factory import HeadFactory, HeadSpec, head_factory, locate, record_head  # noqa: F401

if TYPE_CHECKING:
    import lightning as L

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


#: where a checkpoint records how its plain model is rebuilt and predicts without its task (`record_model`)
MODEL_KEY = "vitdense_model"
#: where a multi-task checkpoint records each task's model record and preprocessing, by name
TASKS_KEY = "vitdense_tasks"


def record_model(checkpoint: dict[str, Any], task: Any) -> None:
    """Write in `checkpoint` how its plain model is rebuilt and predicts without the task class
    (and so without Lightning), as plain data:

        inference    the task's `plain_inference()` (`vitdense.models`: `SegmenterInference`, ...)
                     as {class_path, init_args}: its dotted path and fields
        backbone     the `BackboneConfig`'s fields, without its starting weights file
        head         the head's factory as {class_path, init_args} (`HeadSpec`)
        class_names  the names of the classes, as the task has them

    Written only for a task whose class declares `plain_inference` itself: a subclass of a
    built-in task may build or predict otherwise, so its checkpoints (and those of a task
    written to README's contract, and those written before this record) load through
    Lightning, `Checkpoint.restore`. Nothing either when the head's factory is not plain data
    (a lambda) or the inference's class cannot be imported by path."""
    declares = next((c for c in type(task).__mro__ if "plain_inference" in vars(c)), None)
    if declares is not type(task):
        return
    inference = task.plain_inference()
    head = getattr(task, "head_spec", None)
    path = importable_path(type(inference)) if inference is not None else None
    if path is None or head is None:
        return
    settings = {f.name: plain_data(getattr(inference, f.name)) for f in fields(inference)}
    backbone = without_weights_file(task.backbone_config)
    checkpoint[MODEL_KEY] = {
        "inference": {"class_path": path, "init_args": settings},
        "backbone": plain_data(asdict(backbone) if is_dataclass(backbone) else dict(backbone)),
        "head": plain_data(head.as_data()),
        "class_names": [str(name) for name in task.class_names],
    }


def plain_data(value: Any) -> Any:
    """`value` as what `torch.load(weights_only=True)` reads back: mappings as dicts, lists
    and tuples as themselves (a named tuple as a tuple), NumPy scalars as Python's (a flag
    read off a DataModule may be `numpy.bool_`)."""
    if isinstance(value, Mapping):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, torch.Tensor):  # numpy scalars
        return value.item()
    return value


def move_to(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor in it on `device`: through NamedTuples, lists, tuples and dicts
    (what Lightning's `transfer_batch_to_device` does for vitdense's batches); anything else
    (ints, sizes, a sliced image's pixels) as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to(x, device) for x in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(x, device) for x in batch)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch


class PlainTask(nn.Module):
    """A checkpoint's plain model and its recorded inference (`record_model`), standing in for
    the task where a trained model is used: the hooks `vitdense.load`, `serve` and sliced
    inference call on a task, done as the task does them (`vitdense.models`' `*Inference`).

    Args:
        model: the plain model (`vitdense.models`), its weights loaded.
        inference: how it predicts (`build`, `sample`, `predict`, `result_type`).
        class_names: names of the classes.
        task_class: the dotted path of the task class the checkpoint was trained with (named
            in messages; never imported).
    """

    def __init__(self, model: nn.Module, inference: Any, class_names: list[str], task_class: str) -> None:
        super().__init__()
        self.model = model
        self.inference = inference
        self.class_names = list(class_names)
        self.num_classes = len(self.class_names)
        self.task_class = task_class

    @property
    def task_name(self) -> str:
        """The task class's own name (e.g. "DetectionTask")."""
        return self.task_class.rpartition(".")[2]

    @property
    def result_type(self) -> type | None:
        return self.inference.result_type

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def backbone(self) -> nn.Module:
        return self.model.backbone

    @property
    def head(self) -> nn.Module:
        return self.model.head

    def forward(self, images: torch.Tensor, image_sizes: Any = None) -> Any:
        return self.model(images, image_sizes)

    def predict_sample(self, image: torch.Tensor, size: Any, index: int) -> Any:
        return self.inference.sample(image, size, index)

    def predict_step(self, batch: Any, batch_idx: int = 0) -> Any:
        if batch is None:
            return None
        if isinstance(batch, SlicedImages):  # large images in tiles (`vitdense.deploy.slicing`)
            return predict_sliced(self, batch)
        return self.inference.predict(self.model, batch)

    def to_results(self, prediction: Any, context: Any) -> list[Any]:
        if self.result_type is None:
            raise TypeError(f"{self.task_name} names no result_type, so its predictions cannot become results")
        return self.result_type.from_prediction(prediction, context)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int = 0) -> Any:
        return move_to(batch, device)


class _SkipInPlaceOnMeta(TorchFunctionMode):
    """In-place tensor methods (`uniform_`, `erfinv_`, `mul_`, ...) on a meta tensor return it
    at once: they compute nothing there, but torch still runs them through its Python
    reference implementations (the initialisation of a ViT-B: 0.1-0.3 s)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and args and isinstance(args[0], torch.Tensor):
            if args[0].is_meta:
                return args[0]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside put their parameters on the meta device (shapes, no memory) and
    keep their buffers as they make them: the random initialisation of parameters that a
    checkpoint's weights replace then costs nothing (accelerate's `init_empty_weights` with
    `include_buffers=False`). Not thread-safe: it patches `nn.Module.register_parameter`."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        with _SkipInPlaceOnMeta():
            yield
    finally:
        nn.Module.register_parameter = register


def load_weights_into(build: Callable[[], nn.Module], state_dict: Mapping[str, Any]) -> nn.Module:
    """The model `build()` makes, with the `model.*` tensors of a task's `state_dict` (all of
    its parameters and persistent buffers, strictly; keys of before the task held a `model`
    moved under it first), each in the model's own dtype and memory (not the checkpoint's
    memory map: the file may be rewritten while the model lives, as a `last.ckpt` is).

    Built with its parameters on the meta device (`parameters_on_meta`: no random
    initialisation) and the checkpoint's tensors assigned; where that cannot be (a module
    that reads its parameters' values as it is built), built as the task builds it and the
    tensors copied in."""

    def weights_for(model: nn.Module) -> dict[str, torch.Tensor]:
        own = model.state_dict()
        state = under_model(dict(state_dict), {f"model.{k}" for k in own})  # (keys of before `model`)
        weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        return {k: v.to(dtype=own[k].dtype, copy=True) if k in own else v for k, v in weights.items()}

    try:
        with parameters_on_meta():
            model = build()
        model.load_state_dict(weights_for(model), assign=True)
        if not any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            return model
    except Exception:  # noqa: BLE001  (built again the ordinary way below, which raises what is wrong)
        pass
    model = build()
    model.load_state_dict(weights_for(model))
    return model


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
        #: how the plain model is rebuilt and predicts (`record_model`), as plain data, or None
        self.model_record: dict[str, Any] | None = ckpt.get(MODEL_KEY)
        #: a multi-task checkpoint's tasks: {name: {"model": record or None, "inference": data or
        #: None}} (`vitdense.deploy.multitask.record_tasks`); None for a single task's
        self.tasks_record: dict[str, Any] | None = ckpt.get(TASKS_KEY)
        self._state_dict = ckpt["state_dict"]  # (memory-mapped: read when the model loads it)
        data = ckpt.get("datamodule_hyper_parameters") or {}
        self.data_class: str | None = data.get(CLASS_PATH_KEY)
        self.data: dict[str, Any] = {k: v for k, v in data.items() if not k.startswith("_")}

    @property
    def state_dict(self) -> Mapping[str, Any]:
        """The checkpoint's weights (memory-mapped: read as they are used)."""
        return self._state_dict

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
        """The task, its weights from this checkpoint (through Lightning: it imports the task
        class). The backbone's starting weights file (`backbone.checkpoint`, recorded in the
        hyperparameters) is not read: the checkpoint's weights replace it, and a file beside a
        shipped checkpoint must not be unpickled because the checkpoint names it (nor be
        needed once it has moved)."""
        overrides = {"backbone": without_weights_file(self.task["backbone"])} if "backbone" in self.task else {}
        return self.task_type().load_from_checkpoint(
            self.path, map_location=map_location, weights_only=True, **overrides
        )

    def recorded_inference(self) -> Any | None:
        """The inference the checkpoint recorded (`record_model`: a `vitdense.models` dataclass,
        built from its fields; no weights read), or None for a checkpoint without the record."""
        return None if self.model_record is None else recorded_inference(self.model_record, self.path)

    def restore_plain(self, map_location: str | torch.device = "cpu") -> PlainTask | None:
        """The plain model and its recorded inference as a `PlainTask`, its weights from this
        checkpoint, without importing the task class (nor Lightning); None for a checkpoint
        without the record (`record_model`). As `restore`, the backbone's starting weights
        file is not read (the record keeps none) and pre-trained hub weights are not fetched."""
        if self.model_record is None:
            return None
        return plain_task(self.model_record, self._state_dict, self.task_class, self.path, map_location)

    def for_inference(self, map_location: str | torch.device = "cpu") -> PlainTask | L.LightningModule:
        """What predicts, in evaluation mode: the plain model and its recorded inference
        (`restore_plain`), or for a checkpoint without that record (written before it, or by a
        task of your own) the task itself (`restore`, through Lightning)."""
        if self.is_multitask:  # every task on one encoder (`vitdense.deploy.multitask`)
            from vitdense.deploy.multitask import PlainMultiTask, restore_tasks

            return PlainMultiTask(restore_tasks(self, map_location)).eval()
        plain = self.restore_plain(map_location)
        return plain if plain is not None else self.restore(map_location).eval()

    @property
    def is_multitask(self) -> bool:
        """A checkpoint of `vitdense.tasks.MultiTask` (several tasks on one encoder, by name)."""
        return self.tasks_record is not None or isinstance(self.task.get("tasks"), Mapping)

    def result_type(self) -> Any:
        """What the checkpoint's task predicts (`vitdense.results`), for checks made before its
        weights load: the recorded inference's, else the task class's attribute (which imports
        the task); None when it depends on the task's settings and is not recorded."""
        inference = self.recorded_inference()
        if inference is not None:
            return inference.result_type
        kind = getattr(self.task_type(), "result_type", None)
        return None if isinstance(kind, property) else kind

    def task_type(self) -> type[L.LightningModule]:
        """The task class the checkpoint was trained with (imported by its recorded path)."""
        try:
            return locate(self.task_class)
        except (ImportError, AttributeError) as err:
            raise CheckpointError(
                f"ckpt_path {self.path}: its task {self.task_class} cannot be imported ({err}); install the package "
                "that defines it"
            ) from err


def recorded_inference(record: Mapping[str, Any], path: Any) -> Any:
    """The `vitdense.models` inference dataclass a model record (`record_model`) names, built
    from its fields (no weights read); `path`: the checkpoint, named if it cannot be built."""
    spec = record["inference"]
    try:
        return locate(spec["class_path"])(**spec["init_args"])
    except (ImportError, AttributeError, TypeError) as err:
        raise CheckpointError(
            f"ckpt_path {path}: its model record names {spec['class_path']}, which cannot be built here "
            f"({err}); install the vitdense that wrote it"
        ) from err


def plain_task(
    record: Mapping[str, Any],
    state_dict: Mapping[str, Any],
    task_class: str,
    path: Any,
    map_location: str | torch.device = "cpu",
) -> PlainTask:
    """A model record's `PlainTask` (`record_model`), in evaluation mode, its weights the
    `model.*` tensors of a task's `state_dict`."""
    inference = recorded_inference(record, path)

    def build() -> nn.Module:
        backbone = BackboneConfig(**without_weights_file(dict(record["backbone"]))).build(load_pretrained=False)
        return inference.build(backbone, head_factory(record["head"]))

    model = load_weights_into(build, state_dict)
    task = PlainTask(model, inference, record.get("class_names") or [], task_class)
    return task.to(map_location).eval()


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
    evaluation mode (through Lightning: for training, validating or testing it again)."""
    return Checkpoint(path).restore(map_location).eval()


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The plain model of a vitdense training checkpoint (`ImageClassifier`, `LinearProbe`,
    `Segmenter`, `DETRDetector`, `EoMT`, `DPT`, `MaskedImageModel`, or a custom task's), in
    evaluation mode: call it on images [B, 3, H, W], script or export it. Built from the
    checkpoint's record without Lightning (`record_model`); a checkpoint without the record
    restores its task through Lightning first."""
    return Checkpoint(path).for_inference(map_location).model.eval()
