"""The one DataModule base (image size, loader settings, normalisation, seeding, setup,
loaders) and the loader every image batch goes through; each task family's base builds on
it (`classification.py`, `segmentation.py`, `detection.py`)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar, Literal

import albumentations as A
import lightning as L
import numpy as np
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from vitdense.core.errors import DataError
from vitdense.core.images import ImageFiles
from vitdense.core.preprocess import PredictSample, Preprocess
from vitdense.data.samplers import (
    EpochSeededDataset,
    EvalSampler,
    TrainLayout,
    TrainSampler,
    data_seed,
    restart_epoch_at,
    resume_position,
)
from vitdense.data.transforms.common import process_seed, resolve_normalization, seed_worker_transforms
from vitdense.deploy.slicing import SlicedImage, Slicing
from vitdense.types import LabeledImages
from vitdense.types.collate import pad_collate

Triple = tuple[float, float, float]

_logger = logging.getLogger(__name__)


class ResumableDataLoader(DataLoader):
    """A training `DataLoader` whose position Lightning saves in checkpoints and restores.

    `state_dict()` records (epoch, batches the training loop has completed in it), read
    from the trainer — not from the loader itself, which has already prefetched batches the
    loop has not used — and the run's `TrainLayout` (batch size, processes, accumulation).
    `load_state_dict` makes the `TrainSampler` skip the samples the epoch has consumed and
    sets the loop's batch count to match, converted when this run has another batch size or
    number of processes; when its global batch differs from the checkpoint's it warns and
    says which `accumulate_grad_batches` keeps it.
    """

    def __init__(self, *args: Any, trainer: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        # DataLoader's own arguments, forwarded (Lightning re-creates loaders from them)
        super().__init__(*args, **kwargs)
        self.trainer = trainer  # the trainer whose loop consumes the batches (None: not resumable)

    def layout(self, trainer: Any) -> TrainLayout:
        return TrainLayout(self.batch_size, self.sampler.num_replicas, trainer.accumulate_grad_batches)

    def state_dict(self) -> dict[str, Any]:
        if self.trainer is None:
            return {}
        trainer = self.trainer()
        return {"train_position": list(resume_position(trainer)), "train_layout": asdict(self.layout(trainer))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "train_position" not in state_dict or not isinstance(self.sampler, TrainSampler):
            return
        epoch, batches = state_dict["train_position"]
        if self.trainer is None or "train_layout" not in state_dict:  # written before layouts were recorded
            self.sampler.resume(epoch, batches * self.batch_size)
            return
        trainer = self.trainer()
        saved, now = TrainLayout(**state_dict["train_layout"]), self.layout(trainer)
        if saved.global_batch != now.global_batch:
            rank_zero_warn(
                f"resuming a run whose global batch was {saved} with a global batch of {now}: the learning "
                f"rate and the schedule's steps were set for the former; {now.keeping(saved)}"
            )
        done = now.resumed_from(saved, epoch, batches)
        self.sampler.resume(epoch, done * self.batch_size)
        restart_epoch_at(trainer, done)


def require_positive(**settings: int | float | list | tuple | None) -> None:
    """Raise naming every setting that is not positive (None: unset, allowed; lists and
    tuples: every entry)."""
    bad = [
        f"data.init_args.{name}={value}"
        for name, value in settings.items()
        if value is not None and any(v <= 0 for v in (value if isinstance(value, (list, tuple)) else [value]))
    ]
    if bad:
        raise DataError(f"{', '.join(bad)}: must be positive")


class SkipBadSamples(Dataset):
    """`dataset` whose unreadable samples (a `DataError`: corrupt, truncated or empty file,
    label map that does not fit) become None, each logged with its file, and counted.

    The count lives in shared memory, so the main process reads what every loader worker
    skipped (`take_count`); `skip_collate` drops the Nones from their batch.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.skipped = multiprocessing.get_context().Value("i", 0)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # the wrapped dataset's attributes (paths, transform, ...)
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: Any) -> Any:
        try:
            return self.dataset[key]
        except DataError as err:
            _logger.warning("skipped a bad sample (on_bad_sample=skip): %s", err)
            with self.skipped.get_lock():
                self.skipped.value += 1
            return None

    def take_count(self) -> int:
        """Samples skipped since the last call."""
        with self.skipped.get_lock():
            count, self.skipped.value = self.skipped.value, 0
        return count


def skip_collate(samples: list[Any], collate: Callable[[list[Any]], Any]) -> Any:
    """`collate` of the samples that are not None; None when none is left (the step is skipped)."""
    kept = [s for s in samples if s is not None]
    return collate(kept) if kept else None


def image_dataloader(
    dataset: Dataset,
    loader: LoaderConfig,
    train: bool,
    collate_fn: Callable | None = None,
    trainer: Callable[[], Any] | None = None,
) -> DataLoader:
    """Loader of image batches (`pad_collate` by default) as `loader` says, in a resumable,
    process-aware order.

    Training shuffles with a `TrainSampler` (seeded per epoch, sharded across processes,
    each sample's augmentation seeded from (seed, epoch, index)) and drops the last partial
    batch: every step has a full batch (Mixup pairs samples, stable loss scale). With
    `trainer` (a function returning the trainer that runs the loop), checkpoints record
    where the epoch is and a resumed run continues from the next batch, on any number of
    processes (`ResumableDataLoader`).
    Evaluation keeps every sample once across processes (`EvalSampler`). The loader's own
    generator keeps data loading off the global RNG, which dropout and Mixup draw from.
    """
    seed = data_seed()
    common = dict(
        batch_size=loader.batch_size if train else loader.eval_size,
        drop_last=train,
        num_workers=loader.num_workers,
        persistent_workers=loader.num_workers > 0,
        pin_memory=loader.pin_memory,
        worker_init_fn=seed_worker_transforms,
        collate_fn=collate_fn or pad_collate,
        generator=torch.Generator().manual_seed(seed),
    )
    if train:
        sampler = TrainSampler(dataset, seed)
        return ResumableDataLoader(EpochSeededDataset(dataset, seed), sampler=sampler, trainer=trainer, **common)
    return DataLoader(dataset, sampler=EvalSampler(dataset), **common)


def check_train_size(dataset: Dataset, batch_size: int, where: str | Path) -> None:
    """Fail early when drop_last would leave the training split with no batch at all."""
    if len(dataset) < batch_size:
        raise DataError(
            f"{where}: {len(dataset)} training images but batch_size={batch_size}, so no full batch; "
            "lower data.init_args.loader.batch_size or add images"
        )


@dataclass(frozen=True)
class LoaderConfig:
    """How a DataModule loads its batches (one YAML block, `data.init_args.loader`, shared by
    every DataModule, as `model.init_args.backbone` is by every task).

    Attributes:
        batch_size: training batch size (per process).
        eval_batch_size: validation/test/predict batch size; None: `batch_size`.
        num_workers: loader worker processes per training process (0: load in the main
            process); "auto": from this machine (`auto_num_workers`). Workers persist across
            epochs.
        pin_memory: copy batches into page-locked memory (faster host-to-GPU copies);
            "auto": when the trainer runs on CUDA.
        on_bad_sample: what an unreadable sample (corrupt, truncated or empty file, a label
            map that does not fit its image) does: "raise" stops with the file named;
            "skip" leaves it out of its batch, logs the file, and logs the epoch's total
            (`{stage}/skipped_samples`). The depth DataModules also apply it to the files
            and lines of their split files at setup ("skip": left out, one counted warning).
    """

    batch_size: int = 32
    eval_batch_size: int | None = None
    num_workers: int | Literal["auto"] = "auto"
    pin_memory: bool | Literal["auto"] = "auto"
    on_bad_sample: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        if self.on_bad_sample not in ("raise", "skip"):
            raise DataError(f"data.init_args.loader.on_bad_sample={self.on_bad_sample!r}: choose raise or skip")
        require_positive(**{"loader.batch_size": self.batch_size, "loader.eval_batch_size": self.eval_batch_size})
        if self.num_workers != "auto" and (not isinstance(self.num_workers, int) or self.num_workers < 0):
            raise DataError(
                f"data.init_args.loader.num_workers={self.num_workers!r}: must be 0 (load in the main process), "
                "more, or auto (from this machine's CPUs)"
            )
        if self.pin_memory not in (True, False, "auto"):
            raise DataError(f"data.init_args.loader.pin_memory={self.pin_memory!r}: choose true, false or auto")

    @property
    def eval_size(self) -> int:
        """The evaluation batch size (`eval_batch_size`, else `batch_size`)."""
        return self.eval_batch_size or self.batch_size

    def resolved(self, processes: int = 1, cuda: bool = False) -> LoaderConfig:
        """This config with "auto" settled for `processes` training processes on this
        machine, on CUDA or not."""
        workers = auto_num_workers(available_cpus(), processes) if self.num_workers == "auto" else self.num_workers
        pin = cuda if self.pin_memory == "auto" else self.pin_memory
        return replace(self, num_workers=workers, pin_memory=pin)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a SLURM allocation), else
    the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def auto_num_workers(cpus: int, processes: int) -> int:
    """Loader workers for each of `processes` training processes sharing `cpus` CPUs: none
    while a process has two CPUs or fewer (measured on 2 cores, `python -m vitdense.bench
    data`: one worker is slower than none, since the batches cross processes and the worker
    has no core of its own), else one per CPU beyond the process's own, at most 8 (the paper
    recipes' count per GPU)."""
    per_process = cpus // max(processes, 1)
    return 0 if per_process <= 2 else min(8, per_process - 1)


def loader_machine(trainer: L.Trainer | None) -> tuple[int, bool]:
    """(training processes sharing this process's CPUs, whether they run on CUDA) for "auto"
    loader settings: the trainer's devices, or 1 when SLURM started each process as its own
    task (its CPU allocation, `--cpus-per-task`, is its own); without a trainer, one
    process, on CUDA if there is one."""
    if trainer is None:
        return 1, torch.cuda.is_available()
    own_cpus = isinstance(getattr(trainer.strategy, "cluster_environment", None), SLURMEnvironment)
    return 1 if own_cpus else trainer.num_devices, isinstance(trainer.accelerator, CUDAAccelerator)


def loader_key_hint(message: str) -> str:
    """`message` (a parser error) naming the new key when it rejects a loader setting given
    the old, flat way (`data.init_args.batch_size`, now `data.init_args.loader.batch_size`)."""
    rejected = re.search(r"Option '(\w+)' is not accepted", message)
    if rejected is None or rejected.group(1) not in {f.name for f in fields(LoaderConfig)}:
        return message
    name = rejected.group(1)
    return (
        f"data.init_args.{name}: the loader settings live in one block now; write "
        f"data.init_args.loader.{name} (YAML: `loader: {{{name}: ...}}` under data.init_args)"
    )


def _outermost_init(obj: Any) -> FrameType:
    """The frame of the most specific constructor running on `obj` (called from a base's
    `__init__`): the constructor that was called, whose arguments rebuild the object."""
    frame = sys._getframe(1)
    outer = frame
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is obj:
        outer, frame = frame, frame.f_back
    return outer


class ImageDataModule(L.LightningDataModule):
    """The one base of every vitdense DataModule: image size, loader settings,
    normalisation, augmentation seeding, hyperparameters, `setup` and the four split loaders
    live here.

    A subclass sets `num_classes` and `class_names` in `__init__` (the CLI links them, and
    `img_size`, into the task before anything is read from disk) and fills
    `train_dataset` / `val_dataset` / `test_dataset` / `predict_dataset` in `setup_splits`
    (the base's `setup` calls it, unless predicting on `predict_dir`). Every loader batches
    with `pad_collate` (label maps padded with `ignore_index`); training shuffles and drops
    the last partial batch, and fails early naming `train_location` when the split holds
    less than one batch.

    The arguments of the constructor that was called (the most specific class's, not what
    it passes to its bases) are the hyperparameters a checkpoint records, so that
    `type(dm)(**dm.hparams)` rebuilds the DataModule; `record` adds what the data decided
    (normalisation, classes) under the constructor's own keys.

    Args:
        img_size: side of the square training images; the task's native input size.
        loader: batch sizes, workers and bad-sample handling (`LoaderConfig`).
        backbone: timm model name whose pretrained normalisation to use (see `normalization`).
        mean, std: explicit normalisation; each wins over the backbone's.
        predict_dir: a folder of unlabelled images (any size and format, searched
            recursively) to predict on instead of the dataset's own split; the dataset
            itself need not be present then (classes come from the checkpoint).
    """

    #: what an image to predict on becomes (`unlabeled` of a `vitdense.types` batch type)
    sample_type: ClassVar[type] = LabeledImages

    #: label of unlabelled pixels; label maps are padded with it (segmentation)
    ignore_index: int = 255
    #: predict `predict_dir`'s images in tiles (`python -m vitdense predict --slicing.*` sets it;
    #: not a constructor argument: how a checkpoint is predicted is not what its data was)
    predict_slicing: Slicing | None = None
    num_classes: int
    class_names: list[str]

    def __init__(
        self,
        *,
        img_size: int,
        loader: LoaderConfig,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        # the encoder name only picks mean and std (kept as attributes); the task logs it already
        self.save_hyperparameters(ignore=["backbone"], frame=_outermost_init(self))
        if isinstance(self.hparams.get("loader"), LoaderConfig):  # a plain dict: checkpoints load it safely
            self.hparams["loader"] = asdict(self.hparams["loader"])
        require_positive(img_size=img_size)
        self.img_size = img_size
        # a plain dict too: the form a checkpoint records it in (`Checkpoint.data`)
        self.loader = LoaderConfig(**loader) if isinstance(loader, dict) else loader
        self.mean, self.std = resolve_normalization(backbone, mean, std)
        self.predict_dir = predict_dir
        self._skipping: dict[str, SkipBadSamples] = {}
        self.train_dataset: Dataset | None = None
        self.val_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.predict_dataset: Dataset | None = None

    @property
    def on_bad_sample(self) -> str:
        return self.loader.on_bad_sample

    def record(self, **decided: Any) -> None:
        """Record what the data decided (normalisation, classes) in the hyperparameters, so that
        a checkpoint rebuilds the DataModule without the dataset; only keys the constructor
        takes (a subclass that fixes them records nothing)."""
        self.hparams.update({k: v for k, v in decided.items() if k in self.hparams})

    @property
    def train_location(self) -> str:
        """Where the training images come from, for error messages."""
        return f"{type(self).__name__} training split"

    def seeded(self, transform: A.Compose) -> A.Compose:
        """A training pipeline seeded from torch's seed and the rank: albumentations ignores
        torch's seed, so without this `seed_everything` would not reproduce the crops."""
        transform.set_random_seed(process_seed())
        return transform

    def setup(self, stage: str) -> None:
        """The datasets of `stage`: `predict_dir`'s images when predicting on a folder, else
        the subclass's splits (`setup_splits`). Subclasses override `setup_splits`, not this."""
        # checkpoints record the normalisation used, also one taken from the backbone
        self.record(mean=list(self.mean), std=list(self.std))
        if stage == "predict" and self.predict_dir is not None:
            to_sample = self.predict_sample()
            if self.predict_slicing is not None:  # each image whole, cut into tiles when predicted
                to_sample = SlicedImage.maker(to_sample, self.predict_slicing)
            self.predict_dataset = ImageFiles(self.predict_dir, to_sample)
        else:
            self.setup_splits(stage)

    def setup_splits(self, stage: str) -> None:
        """Fill `train_dataset` / `val_dataset` / `test_dataset` / `predict_dataset` for `stage`
        ("fit", "validate", "test" or "predict")."""
        raise NotImplementedError(f"{type(self).__name__} must implement setup_splits")

    def preprocess(self) -> Preprocess | None:
        """This DataModule's evaluation preprocessing of an image as plain data (`Preprocess`):
        what `predict_dir`'s images go through, and what checkpoints record so that
        `vitdense.load`, `serve` and `export` need no DataModule. None: it cannot predict on
        images it does not know."""
        return None

    def predict_sample(self) -> Callable[[np.ndarray, int], Any]:
        """`f(image [H, W, 3] uint8, index)` -> the unlabelled sample `predict_dir`'s image
        becomes, preprocessed as in evaluation: the task's own `predict_sample` (the trainer's
        module), as `vitdense.load` makes it; without a task, this DataModule's `sample_type`."""
        preprocess = self.preprocess()
        if preprocess is None:
            raise NotImplementedError(f"{type(self).__name__} cannot predict on a folder of images (no preprocess)")
        task = self.trainer.lightning_module if self.trainer is not None else None
        make = getattr(task, "predict_sample", None)
        if make is None:
            make = partial(self.sample_type.unlabeled, ignore_index=self.ignore_index)
        return PredictSample(make, preprocess)

    def _loader(self, dataset: Dataset | None, split: str) -> DataLoader:
        if dataset is None:
            raise DataError(f"{type(self).__name__} has no {split} split (setup did not create one)")
        train = split == "train"
        if train:
            check_train_size(dataset, self.loader.batch_size, self.train_location)
        collate = partial(pad_collate, ignore_index=self.ignore_index)
        if self.loader.on_bad_sample == "skip":
            dataset = self._skipping[split] = SkipBadSamples(dataset)
            collate = partial(skip_collate, collate=collate)
        loader = self.loader.resolved(*loader_machine(self.trainer))
        if train and self.loader != loader:
            _logger.info("data loader: %d workers, pin_memory %s (loader: auto)", loader.num_workers, loader.pin_memory)
        trainer = (lambda: self.trainer) if train else None
        return image_dataloader(dataset, loader, train, collate, trainer)

    def take_skipped(self, stage: str) -> int:
        """Bad samples skipped in `stage` ("train", "val", "test", "predict") since the last
        call (0 unless `on_bad_sample="skip"`)."""
        skipping = self._skipping.get(stage)
        return skipping.take_count() if skipping is not None else 0

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, "train")

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, "val")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, "test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_dataset, "predict")


torch.serialization.add_safe_globals([LoaderConfig])
