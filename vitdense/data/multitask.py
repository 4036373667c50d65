"""MultiTaskDataModule: each task's own DataModule, named as the tasks of a `MultiTask` are.

Training batches from several datasets at once: Lightning's `CombinedLoader` gives each
step a dict {name: that task's batch}, every task's own padding, image sizes and
augmentation respected (each DataModule collates its own batches):

    max_size_cycle  every step has a batch of every task; an epoch ends with the longest
                    loader, the shorter ones starting over (the default)
    min_size        every step has a batch of every task; an epoch ends with the shortest
    max_size        an epoch ends with the longest; exhausted tasks are left out of the
                    step (their entry is None)

Validation, test and prediction run each task's loader in turn (Lightning's
`dataloader_idx`, in the order of `tasks`), each with its own evaluation or writer.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import CombinedLoader

from vitdense.core.errors import ConfigError
from vitdense.data.transforms.common import resolve_normalization

#: how the training loaders are combined (Lightning's `CombinedLoader` modes)
TrainMode = Literal["max_size_cycle", "min_size", "max_size"]


class MultiTaskDataModule(L.LightningDataModule):
    """Several DataModules, one per task.

    Args:
        tasks: {name: DataModule}, the names of the model's `tasks` (YAML: class_path +
            init_args each, as a single task's `data`).
        train_mode: how training batches of the tasks are combined (see the module).
        backbone: the encoder's timm name, whose pretraining mean and std normalise every
            task's images where its DataModule sets none (linked from the model's first task
            on the command line, as a single task's data is).
        predict_dir: a folder of images every task predicts (`python -m vitdense predict
            --data.init_args.predict_dir DIR`): each task's files and table go under
            `predictions/<name>/`.
    """

    def __init__(
        self,
        tasks: dict[str, L.LightningDataModule],
        train_mode: TrainMode = "max_size_cycle",
        backbone: str | None = None,
        predict_dir: str | None = None,
    ) -> None:
        super().__init__()
        if not tasks:
            raise ConfigError("data.init_args.tasks is empty: give each task of the model its DataModule by name")
        if train_mode not in ("max_size_cycle", "min_size", "max_size"):
            raise ConfigError(f"data.init_args.train_mode={train_mode!r}: choose max_size_cycle, min_size or max_size")
        self.tasks = dict(tasks)
        self.train_mode = train_mode
        if predict_dir is not None:  # every task predicts the folder's images (each its own preprocessing)
            for name, data in self.tasks.items():
                if not hasattr(data, "predict_dir"):
                    raise ConfigError(
                        f"data.init_args.predict_dir: data.init_args.tasks.{name} ({type(data).__name__}) "
                        "predicts no folder of images"
                    )
                data.predict_dir = predict_dir
        if backbone is not None:  # (the command line links the first task's encoder name)
            for data in self.tasks.values():
                if hasattr(data, "mean") and data.hparams.get("mean") is None and data.hparams.get("std") is None:
                    data.mean, data.std = resolve_normalization(backbone, None, None)

    def _share_trainer(self) -> None:
        for data in self.tasks.values():
            data.trainer = self.trainer

    def check_tasks(self, names: list[str]) -> None:
        """One line when the model's tasks and these DataModules are not named alike; then
        the DataModules in the model's order (evaluation's `dataloader_idx` follows it)."""
        missing, extra = sorted(set(names) - set(self.tasks)), sorted(set(self.tasks) - set(names))
        if missing or extra:
            said = "; ".join(
                s
                for s in (
                    f"tasks without data: {missing}" if missing else "",
                    f"data without a task: {extra}" if extra else "",
                )
                if s
            )
            raise ConfigError(
                f"data.init_args.tasks {list(self.tasks)} and model.init_args.tasks {list(names)} must name the same "
                f"tasks ({said})"
            )
        self.tasks = {name: self.tasks[name] for name in names}

    def prepare_data(self) -> None:
        self._share_trainer()
        for data in self.tasks.values():
            data.prepare_data()

    def setup(self, stage: str) -> None:
        self._share_trainer()
        model = self.trainer.lightning_module if self.trainer is not None else None
        if model is not None and hasattr(model, "tasks"):
            self.check_tasks(list(model.tasks))
        for data in self.tasks.values():
            data.setup(stage)

    def train_dataloader(self) -> CombinedLoader:
        return CombinedLoader({name: data.train_dataloader() for name, data in self.tasks.items()}, self.train_mode)

    def val_dataloader(self) -> CombinedLoader:
        return CombinedLoader({name: data.val_dataloader() for name, data in self.tasks.items()}, "sequential")

    def test_dataloader(self) -> CombinedLoader:
        return CombinedLoader({name: data.test_dataloader() for name, data in self.tasks.items()}, "sequential")

    def predict_dataloader(self) -> CombinedLoader:
        return CombinedLoader({name: data.predict_dataloader() for name, data in self.tasks.items()}, "sequential")

    def take_skipped(self, stage: str) -> int:
        """Bad samples skipped by every task's loaders in `stage` since the last call."""
        return sum(data.take_skipped(stage) for data in self.tasks.values() if hasattr(data, "take_skipped"))

    def state_dict(self) -> dict[str, Any]:
        return {name: data.state_dict() for name, data in self.tasks.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, data in self.tasks.items():
            if name in state_dict:
                data.load_state_dict(state_dict[name])
