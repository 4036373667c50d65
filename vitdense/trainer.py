"""Lightning's Trainer with `precision="auto"` (bf16 autocast where the hardware has bf16)
and the callbacks a vitdense `fit` adds by default (pictures, learning rates, throughput)."""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from vitdense.core.precision import resolve_precision
from vitdense.viz.callbacks import ImagesPerSecond, ValidationImages

#: Lightning's advertisements for its cloud services ("💡 Tip: ... litlogger / litmodels"),
#: printed on every run; nothing in them is the user's to act on
_ADVERTISEMENT = "💡 Tip:"


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ADVERTISEMENT)


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdvertisements())


def _noting_checkpoint(method: Callable) -> Callable:
    """Lightning's `method` (fit, validate, test, predict; same signature) that first notes
    whether it will restore a checkpoint."""

    @functools.wraps(method)
    def run(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        self._note_checkpoint(method, args, kwargs)
        if method is L.Trainer.fit:
            self._add_default_callbacks()
            return method(self, *args, **kwargs)
        with warnings.catch_warnings():
            # Callback states (checkpoint bookkeeping, image counters) only matter to a fit
            # that goes on; evaluating or predicting from a checkpoint without the training
            # run's callbacks is the normal case, not something to warn about.
            warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`")
            # a checkpoint saved by another run's ModelCheckpoint (e.g. Lightning's default, from Python)
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
            return method(self, *args, **kwargs)

    return run


class Trainer(L.Trainer):
    """`lightning.Trainer` whose `precision` also takes "auto" (vitdense's CLI uses it).

    "auto" resolves once, at construction, to "bf16-mixed" where the accelerator computes
    bf16 natively and to "32-true" elsewhere, and says which and why in one line. An
    explicit bf16 precision on a CPU without native bf16 runs as asked, with one warning.
    Every other argument is Lightning's own (forwarded unchanged).

    `fit` with a logger also logs pictures of validation predictions (`ValidationImages`,
    drawn by the task's `draw_batch`), the learning rates (`LearningRateMonitor`) and the
    throughput (`ImagesPerSecond`), each unless the trainer already has a callback of that
    kind (configure one in `callbacks` to change its settings).

    It also says, from the moment `fit`/`validate`/`test`/`predict` is called, whether the
    weights will come from a checkpoint (`weights_from_checkpoint`): Lightning sets
    `ckpt_path` only after `prepare_data` and `setup`, where a task would otherwise fetch
    pretrained weights the checkpoint then replaces (and fail offline).
    """

    #: the running fit/validate/test/predict restores a checkpoint (`ckpt_path` given)
    weights_from_checkpoint: bool = False

    def __init__(self, *, precision: Literal["auto"] | _PRECISION_INPUT | None = None, **kwargs: Any) -> None:
        # the signature forwards Lightning's arguments as they are: jsonargparse reads them from L.Trainer
        resolved = resolve_precision(precision, kwargs.get("accelerator", "auto"))
        if resolved.note:
            rank_zero_info(resolved.note)
        if resolved.warning:
            rank_zero_warn(resolved.warning)
        super().__init__(precision=resolved.precision, **kwargs)

    def _note_checkpoint(self, method: Callable, args: tuple, kwargs: dict[str, Any]) -> None:
        ckpt_path = inspect.signature(method).bind(self, *args, **kwargs).arguments.get("ckpt_path")
        if ckpt_path == "last":  # found only if a checkpoint callback has written one (else: from scratch)
            found = [p for p in map(_last_checkpoint, self.checkpoint_callbacks) if p is not None and p.is_file()]
            ckpt_path = found[0] if found else None
        self.weights_from_checkpoint = ckpt_path is not None

    def _add_default_callbacks(self) -> None:
        if not self.loggers:
            return
        defaults = (ValidationImages(), LearningRateMonitor(logging_interval="step"), ImagesPerSecond())
        missing = [c for c in defaults if not any(isinstance(t, type(c)) for t in self.callbacks)]
        self.callbacks[:0] = missing  # before the checkpoint callbacks, which Lightning keeps last

    fit = _noting_checkpoint(L.Trainer.fit)
    validate = _noting_checkpoint(L.Trainer.validate)
    test = _noting_checkpoint(L.Trainer.test)
    predict = _noting_checkpoint(L.Trainer.predict)


def _last_checkpoint(callback: Any) -> Path | None:
    """Where a `ModelCheckpoint` with a fixed `dirpath` keeps its last checkpoint (None: no fixed folder)."""
    if getattr(callback, "dirpath", None) is None:
        return None
    return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
