"""Data order that survives a kill and a change of process count.

Training: `TrainSampler` draws each epoch's permutation from its own generator seeded with
(seed, epoch) — never from the global RNG — shards it across processes like torch's
`DistributedSampler(drop_last=True)`, and yields `(epoch, index)` pairs so that
`EpochSeededDataset` can seed each sample's augmentation from (seed, epoch, index): the
same draws whichever process or worker loads it, and after a resume. A resumed run skips
the samples its epoch had already consumed (`resume`), so it continues exactly where the
killed run was, also on another number of processes or with another batch size
(`TrainLayout`): process r of W takes the permutation's positions r, r + W, ..., so the
first n steps of any layout consume the same samples, the first n x global batch.

Evaluation: `EvalSampler` splits the dataset across processes without repeating samples
(torch's sampler pads the shards by repeating some, which dataset-level metrics would count
twice); shards may then differ in length by one, which evaluation tolerates (no collective
per step). Both subclass `DistributedSampler`, so Lightning leaves them in place.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import albumentations as A
import torch
from torch.utils.data import Dataset, DistributedSampler

from vitdense.core.errors import ConfigError


def world(num_replicas: int | None = None, rank: int | None = None) -> dict[str, int]:
    """`num_replicas` and `rank` as given, else the default process group's, else 1 and 0."""
    size, this = 1, 0
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        size, this = torch.distributed.get_world_size(), torch.distributed.get_rank()
    return {"num_replicas": size if num_replicas is None else num_replicas, "rank": this if rank is None else rank}


class TrainSampler(DistributedSampler):
    """A seeded, sharded, resumable shuffle of `dataset` (see the module docstring).

    Yields `(epoch, index)`; every process gets `len(dataset) // num_replicas` samples per
    epoch (the permutation's tail that does not divide evenly is dropped, as
    `DistributedSampler(drop_last=True)` does).

    Args:
        dataset: the training dataset.
        seed: seed of the permutations (the same on every process).
        num_replicas, rank: the process layout; default: the current process group's.
    """

    def __init__(self, dataset: Dataset, seed: int, num_replicas: int | None = None, rank: int | None = None) -> None:
        super().__init__(dataset, **world(num_replicas, rank), shuffle=True, seed=seed, drop_last=True)
        self._skip: tuple[int, int] | None = None  # (epoch, samples of this process to skip)

    def resume(self, epoch: int, consumed: int) -> None:
        """Continue `epoch` after the first `consumed` samples of this process's shard.

        The epoch is set here too: a loader with workers draws its first indices as soon as
        its iterator exists, which Lightning creates before it announces the epoch.
        """
        self.set_epoch(epoch)
        self._skip = (epoch, consumed) if consumed > 0 else None

    def order(self, epoch: int) -> list[int]:
        """This process's indices of `epoch`, in order."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        indices = torch.randperm(len(self.dataset), generator=generator).tolist()
        return indices[: self.total_size][self.rank : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices = self.order(self.epoch)
        if self._skip is not None and self._skip[0] == self.epoch:
            indices = indices[self._skip[1] :]
        self._skip = None
        return iter([(self.epoch, i) for i in indices])


class EvalSampler(DistributedSampler):
    """Every sample exactly once across processes, in order within each: rank r takes
    indices r, r + W, r + 2W, ... (no padding, so shards differ in length by at most one)."""

    def __init__(self, dataset: Dataset, num_replicas: int | None = None, rank: int | None = None) -> None:
        super().__init__(dataset, **world(num_replicas, rank), shuffle=False)
        self.num_samples = len(range(self.rank, len(self.dataset), self.num_replicas))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))


class EpochSeededDataset(Dataset):
    """`dataset` indexed by `(epoch, index)`: before loading a sample, its albumentations
    pipeline (`dataset.transform`, if any) is seeded from (seed, epoch, index), so a sample's
    augmentation depends on nothing else — not the worker, the process, or a restart."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # prediction writers and tests look up `samples`, `image_paths`, ... on the dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        transform = getattr(self.dataset, "transform", None)
        if isinstance(transform, A.BaseCompose):
            transform.set_random_seed(((self.seed * 1_000_003 + epoch) * 1_000_033 + index) % 2**32)
        return self.dataset[index]


def data_seed() -> int:
    """The run's seed for data order and augmentation: `seed_everything`'s (the same on every
    process), or 0 when the run is not seeded (as torch's `DistributedSampler`)."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def resume_position(trainer: Any) -> tuple[int, int]:
    """(epoch, batches of it the training loop has processed) of a running trainer."""
    return (
        trainer.fit_loop.epoch_progress.current.processed,
        trainer.fit_loop.epoch_loop.batch_progress.current.processed,
    )


def restart_epoch_at(trainer: Any, batches: int) -> None:
    """Make a trainer restored from a checkpoint count `batches` of its epoch as done (the
    checkpoint's count converted to this run's batches): accumulation, validation intervals
    and the epoch's end count from it."""
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    # shift every counter alike: Lightning's restart logic reads their differences (a checkpoint
    # written in on_train_batch_end has `completed` one behind `processed`)
    shift = batches - current.processed
    current.ready, current.started = current.ready + shift, current.started + shift
    current.processed, current.completed = current.processed + shift, current.completed + shift


@dataclass(frozen=True)
class TrainLayout:
    """How a training run splits its global batch: `batch_size` images per process and step,
    `num_replicas` processes, `accumulate` steps of gradient accumulation per optimizer step."""

    batch_size: int
    num_replicas: int
    accumulate: int = 1

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.num_replicas * self.accumulate

    def __str__(self) -> str:
        return (
            f"{self.global_batch} (batch_size {self.batch_size} x {self.num_replicas} processes"
            f" x accumulate_grad_batches {self.accumulate})"
        )

    def resumed_from(self, saved: TrainLayout, epoch: int, batches: int) -> int:
        """Batches of `epoch` this layout has done, given that a run in the `saved` layout
        had done `batches` (per process) of it: the same samples, the first `batches` x
        `saved.batch_size` x `saved.num_replicas` of the epoch's permutation (every layout
        deals them out to its processes in turn: `TrainSampler`)."""
        samples = batches * saved.batch_size * saved.num_replicas
        per_batch = self.batch_size * self.num_replicas
        if samples % per_batch:
            raise ConfigError(
                f"the checkpoint stopped {samples} samples into epoch {epoch} ({batches} batches of "
                f"{saved.batch_size} on {saved.num_replicas} processes), which is not a whole number of this "
                f"run's batches of {self.batch_size} on {self.num_replicas} processes: choose a "
                "data.init_args.loader.batch_size x processes that divides it, or resume from a checkpoint "
                "saved at the end of an epoch"
            )
        return samples // per_batch

    def keeping(self, saved: TrainLayout) -> str:
        """What to pass to keep `saved`'s global batch with this layout's batch and processes."""
        per_step = self.batch_size * self.num_replicas
        if saved.global_batch % per_step:
            return (
                f"no accumulate_grad_batches gives {saved.global_batch} from {per_step} images per step: "
                "change data.init_args.loader.batch_size or the number of processes"
            )
        return f"--trainer.accumulate_grad_batches {saved.global_batch // per_step} keeps it"
