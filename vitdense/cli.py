"""`python -m vitdense fit|validate|test|predict --config configs/….yaml` (LightningCLI).

Model and data are chosen by `class_path` (subclass mode), so a user's own task or
DataModule works from YAML. What belongs to the data (its number of classes) is linked from
the DataModule to the task, never written twice.
"""

from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.cli import LightningCLI

from vitdense.tasks import BaseTask


class VitDenseCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")


def main(args: list[str] | None = None) -> VitDenseCLI:
    """Run the CLI; `args` as on the command line (tests pass a list)."""
    return VitDenseCLI(
        BaseTask,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args if args is not None else sys.argv[1:],
        save_config_kwargs={"overwrite": True},
    )
