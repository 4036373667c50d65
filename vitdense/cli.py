"""`python -m vitdense fit|validate|test|predict --config configs/….yaml` (LightningCLI).

Model and data are chosen by `class_path` (subclass mode), so a user's own task or
DataModule works from YAML. What belongs to the data is linked from the DataModule to the
task and never written twice: the number of classes, the class names and the image size
(the encoder's native size, to which its position embeddings are resampled). The other way,
the encoder's name goes to the DataModule, which normalises images as the encoder was
pretrained.
"""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.cli import LightningCLI

from vitdense.backbone import CheckpointError
from vitdense.errors import ConfigError, DataError
from vitdense.tasks import BaseTask
from vitdense.trainer import Trainer

#: errors of the user's making (config, files, data) that deserve one line, not a traceback;
#: any other exception is a bug and keeps its traceback
USER_ERRORS = (FileNotFoundError, NotADirectoryError, CheckpointError, ConfigError, DataError)


class VitDenseCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.init_args.backbone.name", "data.init_args.backbone", apply_on="parse")
        parser.link_arguments("data.img_size", "model.init_args.backbone.img_size", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.init_args.class_names", apply_on="instantiate")

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            if (user_error := _user_error(err)) is None:
                raise
            _exit_with(user_error)


def _user_error(err: BaseException) -> BaseException | None:
    """The innermost error of the user's making in `err`'s chain (jsonargparse wraps what a
    class raises while it is instantiated in its own ValueError), or None."""
    found = None
    while err is not None:
        if isinstance(err, USER_ERRORS):
            found = err
        err = err.__cause__ or err.__context__
    return found


def _exit_with(err: BaseException) -> None:
    print(f"vitdense: error: {err}", file=sys.stderr)
    raise SystemExit(2) from err


def main(args: list[str] | None = None) -> VitDenseCLI:
    """Run the CLI; `args` as on the command line (tests pass a list)."""
    try:
        return VitDenseCLI(
            BaseTask,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_class=Trainer,
            args=args,
            save_config_kwargs={"overwrite": True},
        )
    except USER_ERRORS as err:  # e.g. bad data at setup
        _exit_with(err)
