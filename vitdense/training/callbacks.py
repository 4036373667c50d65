"""Callbacks every task uses: writers of what tasks predict, the count of skipped samples,
the random states for exact resume (`ResumeRNG`) and an EMA of the weights with a warmup.

They sit below the tasks (which hand them out) and import no task."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from vitdense.core.preprocess import LabelInfo
from vitdense.results.common import ResultContext, WriteOptions

_logger = logging.getLogger(__name__)


def ema_warmup_update(
    averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor, decay: float, tau: float
) -> torch.Tensor:
    """One EMA step whose decay ramps up: the k-th update uses `decay * (1 - exp(-k / tau))`
    (the schedule of YOLOv5's and RF-DETR's `ModelEma`), so that the average soon leaves the
    early weights instead of carrying them for ~1 / (1 - decay) steps. `tau=0`: the constant
    `decay` (Lightning's `EMAWeightAveraging`). The first update is a copy (torch's
    `AveragedModel`), where `ModelEma` keeps 1% of the initial weights; every later one is
    the same. `num_averaged`: updates so far (k - 1)."""
    d = decay * (1 - torch.exp(-(num_averaged.to(averaged.dtype) + 1) / tau)) if tau > 0 else decay
    return averaged + (current - averaged) * (1 - d)


class WarmupEMAWeightAveraging(EMAWeightAveraging):
    """Lightning's `EMAWeightAveraging` with RF-DETR's decay warmup (`ema_warmup_update`):
    RF-DETR fine-tunes with `decay=0.993, warmup_tau=100`. Validation, test and the saved
    checkpoint's `state_dict` use the averaged weights; the current ones are kept in the
    checkpoint too, so a resumed run goes on with both (Lightning's behaviour).

    Args:
        decay: the EMA's decay once warmed up.
        warmup_tau: steps over which the decay ramps up (0: none).
        update_every_n_steps, update_starting_at_step, update_starting_at_epoch, device,
            use_buffers: as `EMAWeightAveraging`'s.
    """

    def __init__(
        self,
        decay: float = 0.993,
        warmup_tau: float = 100.0,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        device: str | None = None,
        use_buffers: bool = True,
    ) -> None:
        if not 0 <= decay < 1 or warmup_tau < 0:
            raise ValueError(f"decay={decay}, warmup_tau={warmup_tau}: expected 0 <= decay < 1 and warmup_tau >= 0")
        super().__init__(
            device=device,
            use_buffers=use_buffers,
            decay=decay,
            update_every_n_steps=update_every_n_steps,
            update_starting_at_step=update_starting_at_step,
            update_starting_at_epoch=update_starting_at_epoch,
        )
        # WeightAveraging hands its kwargs to torch's AveragedModel when training starts
        self._kwargs["avg_fn"] = partial(ema_warmup_update, decay=decay, tau=warmup_tau)


def rng_states() -> dict[str, Any]:
    """The global random states (torch, CUDA, numpy, Python) as tensors and plain values, so
    that checkpoints holding them still load with `torch.load(weights_only=True)`."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `rng_states` returned."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))


class ResumeRNG(L.Callback):
    """Exact resume of the global random streams (dropout, drop path, Mixup's numpy draws):
    each checkpoint holds them as the next step would find them (`checkpoint["rng_states"]`),
    and a fit restored from one sets them right before its first step, not at load time
    (sanity checks and loader start-up in between would otherwise draw from them).
    Every vitdense task adds it to `fit` (`BaseTask.configure_callbacks`)."""

    def __init__(self) -> None:
        self._to_restore: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng_states()

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._to_restore = checkpoint.get("rng_states")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if self._to_restore is not None:
            set_rng_states(self._to_restore)
            self._to_restore = None


class SkippedSamples(L.Callback):
    """At each epoch end, warn how many bad samples the DataModule skipped (with
    `on_bad_sample: skip`; each was logged with its file when it was skipped) and log
    `{stage}/skipped_samples`, summed over processes. Every vitdense task adds it
    (`BaseTask.configure_callbacks`); a DataModule that does not skip is left alone."""

    def report(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        if getattr(datamodule, "on_bad_sample", "raise") != "skip":
            return
        count = datamodule.take_skipped(stage)
        if count:
            rank = f" on rank {trainer.global_rank}" if trainer.world_size > 1 else ""
            _logger.warning("%s: skipped %d bad samples this epoch%s (files named above)", stage, count, rank)
        if stage != "predict":
            pl_module.log(f"{stage}/skipped_samples", float(count), reduce_fx="sum", sync_dist=True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "train")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "test")

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module, "predict")


class ResultWriter(BasePredictionWriter):
    """Write what a task predicts through its result type (`task.to_results`, see
    `vitdense.results`): each image's files (`Result.write`: segmentation's label-map PNGs
    and overlays, detection's drawn boxes) named after the image, and the run's table
    (`Result.rows`: classification's CSV, detection's COCO results JSON). It holds no list
    of task types: a task of yours with its own result type is written the same way.

    Args:
        output_dir: where the result type's own layout goes (`<table_name>` and
            `<files_folder>/<name>...`); None: only what `table_file` / `files_dir` say.
        table_file: the table's path instead of `<output_dir>/<table_name>`.
        files_dir: the images' files' folder instead of `<output_dir>/<files_folder>`.
        pictures: also write pictures (overlays, drawn boxes).
        score_threshold: boxes drawn from this score on (the table keeps every detection).
        alpha: weight of the class colours in overlays.

    With several processes each writes `<table stem>.rank<r><suffix>`.
    """

    def __init__(
        self,
        output_dir: str | None = "predictions",
        table_file: str | None = None,
        files_dir: str | None = None,
        pictures: bool = True,
        score_threshold: float = 0.5,
        alpha: float = 0.5,
    ) -> None:
        super().__init__(write_interval="batch")
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.table_file = Path(table_file) if table_file is not None else None
        self.files_dir = Path(files_dir) if files_dir is not None else None
        self.options = WriteOptions(pictures, score_threshold, alpha)
        self.rows: list[dict[str, Any]] = []
        self.result_type: type | None = None

    def table_path(self, result_type: type) -> Path | None:
        if self.table_file is not None:
            return self.table_file
        name = getattr(result_type, "table_name", None)
        return self.output_dir / name if self.output_dir is not None and name else None

    def files_path(self, result_type: type) -> Path | None:
        if self.files_dir is not None:
            return self.files_dir
        name = getattr(result_type, "files_folder", None)
        return self.output_dir / name if self.output_dir is not None and name else None

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.rows, self.result_type = [], None

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if prediction is None:  # a batch whose every image was skipped (on_bad_sample=skip)
            return
        dataset = predicted_dataset(trainer, dataloader_idx)
        indexes = batch_indexes(batch, batch_indices)
        paths = [sample_path(dataset, i) for i in indexes]
        context = ResultContext(
            class_names=pl_module.class_names,
            labels=labels_of(trainer.datamodule, dataset),
            sizes=original_sizes(batch, paths),
            sources=[str(p) if p is not None else None for p in paths],
            indexes=indexes,
            image_ids=[dataset_image_id(dataset, i) for i in indexes],
            file_names=[dataset.file_names[i] if hasattr(dataset, "file_names") else None for i in indexes],
            output_names=[output_name(dataset, i) for i in indexes],
        )
        results = pl_module.to_results(prediction, context)
        if not results:
            return
        self.result_type = type(results[0])
        folder = self.files_path(self.result_type)
        for index, result in zip(indexes, results, strict=True):
            if folder is not None:
                result.write(folder, output_name(dataset, index), self.options)
            self.rows += result.rows()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.result_type is None:  # nothing was predicted (every image skipped): no table to write
            _logger.warning("predict: no image was predicted, so no table was written")
            return
        path = self.table_path(self.result_type)
        if path is None:
            return
        path = rank_path(path, trainer)
        self.result_type.write_table(self.rows, path)
        _logger.info("wrote %d rows to %s", len(self.rows), path)


class TopKPredictionWriter(ResultWriter):
    """The table of what is predicted (classification: the top-k classes of every image as
    CSV, `index`, `path`, `height`, `width`, `class_1, prob_1, ...`) at `output_file`; no per-image files."""

    def __init__(self, output_file: str = "predictions.csv") -> None:
        super().__init__(output_dir=None, table_file=output_file)


class SegmentationPredictionWriter(ResultWriter):
    """Each image's files under `output_dir` (segmentation: `<name>.png`, the label map as
    the dataset's files store it, and with `overlay` `<name>_overlay.jpg`); no table."""

    def __init__(self, output_dir: str = "predictions", overlay: bool = False, alpha: float = 0.5) -> None:
        super().__init__(output_dir=None, files_dir=output_dir, pictures=overlay, alpha=alpha)


class COCOResultsWriter(ResultWriter):
    """The table at `output_file` (detection: a COCO results JSON, `image_id`, the dataset's
    `category_id`, `bbox` [x, y, width, height] pixels, `score`; `file_name` for a folder of
    images) and, with `draw_dir`, each image with its boxes from `score_threshold` on."""

    def __init__(
        self, output_file: str = "predictions.json", draw_dir: str | None = None, score_threshold: float = 0.5
    ) -> None:
        super().__init__(
            output_dir=None, table_file=output_file, files_dir=draw_dir, pictures=True, score_threshold=score_threshold
        )


def rank_path(path: Path, trainer: L.Trainer) -> Path:
    """`path`, or `<stem>.rank<r><suffix>` beside it when several processes each write one;
    its folder is created."""
    if trainer.world_size > 1:
        path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def predicted_dataset(trainer: L.Trainer, dataloader_idx: int) -> Any:
    """The dataset behind the predict loader `dataloader_idx`."""
    loaders = trainer.predict_dataloaders
    return (loaders[dataloader_idx] if isinstance(loaders, list) else loaders).dataset


def output_name(dataset: Any, index: int) -> str:
    """The name (without suffix, maybe with sub-folders) of what is written for sample
    `index`: a folder's own relative names (`ImageFiles.output_names`), else the image's
    stem, else the index."""
    if getattr(dataset, "output_names", None) is not None:
        return dataset.output_names[index]
    path = sample_path(dataset, index)
    return path.stem if path is not None else f"{index:06d}"


def sample_path(dataset: Any, index: int) -> Path | None:
    """The image file behind sample `index`, when the dataset says (`image_paths` or `samples`)."""
    if getattr(dataset, "image_paths", None) is not None:
        return Path(dataset.image_paths[index])
    if getattr(dataset, "samples", None) is not None:
        return Path(dataset.samples[index][0])
    return None


def field(value: Any, name: str) -> Any:
    """`value.name` when it is a field of data, else None (a NamedTuple without an `index`
    field still has the tuple's own `index` method)."""
    found = getattr(value, name, None)
    return None if callable(found) and not isinstance(found, torch.Tensor) else found


def batch_indexes(batch: Any, batch_indices: Any) -> list[int]:
    """Each predicted image's position in the dataset: the batch's `index` (every vitdense
    sample type has one, and it stays right when bad samples were skipped), else the
    positions Lightning's sampler drew (`batch_indices`)."""
    index = field(batch, "index")
    if index is not None:
        return [int(i) for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
    if batch_indices is None or not len(batch_indices):
        raise TypeError(
            f"predict: the batch ({type(batch).__name__}) has no index field and the loader's sampler gave no "
            "positions; give the task's predict_sample's samples an index (the `index` argument)"
        )
    return [int(i) for i in batch_indices]


def original_sizes(batch: Any, paths: Sequence[Path | None] = ()) -> list[tuple[int, int]]:
    """Each image's (H0, W0) as given: what the batch says its predictions are made at
    (detection's and sliced images' `orig_sizes`, segmentation's and depth's label-map
    sizes), else the image file's own size (upright; read from its header), else, for
    images held in memory without one, the size the model saw. `paths`: each image's file
    (`sample_path`), or None."""
    sizes = field(batch, "orig_sizes")
    if sizes is not None:
        return [(int(h), int(w)) for h, w in sizes]
    for name in ("mask_sizes", "depth_sizes"):
        if (given := field(batch, name)) is not None and not isinstance(given, tuple):
            return [tuple(s) for s in given.sizes]
    if paths and all(p is not None for p in paths):
        from vitdense.core.images import image_size  # (lazily: tasks import no dataset family)

        return [image_size(p) for p in paths]
    given = field(batch, "image_sizes")
    if given is not None and not isinstance(given, tuple):
        return [tuple(s) for s in given.sizes]
    return [tuple(batch.image.shape[-2:])] * len(batch.image)


def labels_of(datamodule: Any, dataset: Any) -> LabelInfo:
    """The DataModule's label facts, with the dataset's own category ids where it has them
    (a COCO split's JSON: what its results must name)."""
    labels = LabelInfo.of(datamodule)
    ids = getattr(dataset, "category_ids", None)
    return replace(labels, category_ids=tuple(int(i) for i in ids)) if ids else labels


def dataset_image_id(dataset: Any, index: int) -> int:
    """Sample `index`'s id: the dataset's own (`image_ids`, COCO's), else its position + 1
    (COCO numbers images from 1)."""
    ids = getattr(dataset, "image_ids", None)
    return int(ids[index]) if ids is not None else index + 1


def task_callbacks(
    trainer: L.Trainer, prediction_writer: Callable[[Path], BasePredictionWriter | None]
) -> list[L.Callback]:
    """The callbacks a vitdense task adds to its trainer (`configure_callbacks`): every run
    counts skipped samples (`SkippedSamples`); `fit` keeps the random states for exact resume
    (`ResumeRNG`); `predict` without a writer of the user's writes the task's own
    (`prediction_writer(output_dir)`) under `<default_root_dir>/predictions/` and says where."""
    callbacks: list[L.Callback] = [SkippedSamples()]
    if trainer.state.fn == TrainerFn.FITTING:
        callbacks.append(ResumeRNG())
    if trainer.predicting and not any(isinstance(c, BasePredictionWriter) for c in trainer.callbacks):
        output_dir = Path(trainer.default_root_dir) / "predictions"
        writer = prediction_writer(output_dir)
        if writer is not None:
            rank_zero_info(f"predictions go to {output_dir}/ (add a writer callback to choose)")
            callbacks.append(writer)
    return callbacks
