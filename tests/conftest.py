"""Shared test setup: everything offline, deterministic."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "configs"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


#: each demo shrunk to seconds: (config, data overrides)
DEMOS = {
    "cls": ("demo_cls.yaml", ["--data.init_args.train_size=8", "--data.init_args.val_size=4"]),
    "seg": ("demo_seg.yaml", ["--data.init_args.img_size=32", "--data.init_args.train_size=8"]),
    "det": ("demo_det.yaml", ["--data.init_args.img_size=32", "--data.init_args.train_size=8"]),
}


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """Each demo fitted for one step through the CLI (shared by the tests of checkpoints and of
    `vitdense.viz`); {task: (its folder, its last.ckpt)}."""
    from vitdense.cli import main

    out = {}
    cwd = os.getcwd()
    try:
        for task, (config, overrides) in DEMOS.items():
            folder = tmp_path_factory.mktemp(task)
            os.chdir(folder)
            args = ["fit", "--config", str(CONFIGS / config), *overrides, "--data.init_args.loader.batch_size=4"]
            args += ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
            main(args)
            out[task] = folder, folder / "runs" / config.removesuffix(".yaml") / "checkpoints" / "last.ckpt"
    finally:
        os.chdir(cwd)
    return out


@pytest.fixture(scope="session")
def fitted_from_python(tmp_path_factory):
    """A tiny classifier fitted for one step from Python, `lightning.Trainer(...).fit(task,
    datamodule)` without the CLI, as a user's script trains one; (the task, the checkpoint
    Lightning's default ModelCheckpoint wrote)."""
    import lightning as L

    from vitdense.data import LoaderConfig, SyntheticClassificationDataModule
    from vitdense.tasks import BackboneConfig, ClassificationTask

    folder = tmp_path_factory.mktemp("python_fit")
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=4, loader=LoaderConfig(batch_size=4))
    backbone = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})
    task = ClassificationTask(num_classes=data.num_classes, class_names=data.class_names, backbone=backbone)
    trainer = L.Trainer(
        max_steps=1,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    trainer.fit(task, datamodule=data)
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    return task.eval(), ckpt


@pytest.fixture(scope="session")
def older_python_checkpoint(fitted_from_python, tmp_path_factory):
    """`fitted_from_python`'s checkpoint as vitdense wrote it before tasks named their classes
    in it: no `_class_path` (nor LightningCLI's instantiator), the BackboneConfig pickled."""
    from vitdense.tasks import BackboneConfig

    _, ckpt = fitted_from_python
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        del state[key]["_class_path"], state[key]["_instantiator"]
    state["hyper_parameters"]["backbone"] = BackboneConfig(**state["hyper_parameters"]["backbone"])
    older = tmp_path_factory.mktemp("older") / "older.ckpt"
    torch.save(state, older)
    return older
