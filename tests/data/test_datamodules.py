"""What every DataModule shares: keyword-only constructors, the loader settings in one
block (`LoaderConfig`), and hyperparameters that rebuild the DataModule and load safely."""

from __future__ import annotations

import dataclasses
import inspect
import io

import pytest
import torch

import vitdense.data as data
from vitdense.data import LoaderConfig

DATAMODULES = sorted(
    (
        cls
        for cls in (getattr(data, name) for name in data.__all__)
        if isinstance(cls, type) and issubclass(cls, data.ImageDataModule)
    ),
    key=lambda cls: cls.__name__,
)
LOADER_KEYS = {field.name for field in dataclasses.fields(LoaderConfig)}


@pytest.mark.parametrize("cls", DATAMODULES, ids=[cls.__name__ for cls in DATAMODULES])
def test_constructors_are_keyword_only_with_one_loader_block(cls):
    params = list(inspect.signature(cls).parameters.values())
    assert params and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert "loader" in {p.name for p in params} and not LOADER_KEYS & {p.name for p in params}


@pytest.mark.parametrize(
    "build",
    [
        lambda tmp: data.SyntheticClassificationDataModule(img_size=32, loader=LoaderConfig(batch_size=4)),
        lambda tmp: data.SyntheticSegmentationDataModule(num_classes=3, mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2)),
        lambda tmp: data.SyntheticDetectionDataModule(root=str(tmp), img_size=32, train_size=2, val_size=2),
    ],
    ids=["classification", "segmentation", "detection"],
)
def test_hyperparameters_are_the_constructors_arguments_and_rebuild_it(build, tmp_path):
    dm = build(tmp_path)
    dm.setup("validate")  # records the normalisation used
    taken = set(inspect.signature(type(dm)).parameters) - {"backbone"}
    assert set(dm.hparams) == taken  # what a subclass passes its base (paths, crop sizes) is not recorded
    assert isinstance(dm.hparams["loader"], dict) and dm.hparams["mean"] == list(dm.mean)
    buffer = io.BytesIO()
    torch.save({"datamodule_hyper_parameters": dict(dm.hparams)}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["datamodule_hyper_parameters"]
    rebuilt = type(dm)(**{**saved, "loader": LoaderConfig(**saved["loader"])})
    assert rebuilt.loader == dm.loader and rebuilt.mean == dm.mean and rebuilt.class_names == dm.class_names


def test_loader_settings_are_checked_where_they_are_made():
    with pytest.raises(ValueError, match=r"data.init_args.loader.batch_size=0: must be positive"):
        LoaderConfig(batch_size=0)
    with pytest.raises(ValueError, match=r"data.init_args.loader.on_bad_sample='sometimes': choose raise or skip"):
        LoaderConfig(on_bad_sample="sometimes")
    assert LoaderConfig(batch_size=8).eval_size == 8 and LoaderConfig(batch_size=8, eval_batch_size=1).eval_size == 1
    with pytest.raises(ValueError, match=r"num_workers='many': must be 0 .* or auto"):
        LoaderConfig(num_workers="many")
    with pytest.raises(ValueError, match=r"pin_memory='sometimes': choose true, false or auto"):
        LoaderConfig(pin_memory="sometimes")


@pytest.mark.parametrize(
    "cpus, processes, workers",
    [(1, 1, 0), (2, 1, 0), (3, 1, 2), (4, 1, 3), (16, 1, 8), (16, 2, 7), (8, 4, 0), (96, 8, 8)],
)
def test_auto_workers_from_the_cpus_each_process_has(cpus, processes, workers):
    assert data.base.auto_num_workers(cpus, processes) == workers


def test_auto_loader_settings_follow_the_machine_and_the_trainer(monkeypatch):
    """The default loader ("auto") takes its workers from the CPUs this process may use,
    shared among the trainer's processes on the machine, and pins memory only for CUDA;
    numbers given are kept."""
    from lightning.pytorch import Trainer

    monkeypatch.setattr(data.base, "available_cpus", lambda: 8)
    dm = data.SyntheticClassificationDataModule(
        img_size=32, train_size=8, val_size=4, loader=LoaderConfig(batch_size=4)
    )
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert (train.num_workers, train.persistent_workers, train.pin_memory) == (7, True, False)
    assert val.num_workers == 7
    dm.trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    assert dm.train_dataloader().num_workers == 3  # 4 CPUs for each of 2 processes
    assert LoaderConfig(num_workers=2, pin_memory=True).resolved(processes=4) == LoaderConfig(
        num_workers=2, pin_memory=True
    )
    assert LoaderConfig().resolved(cuda=True).pin_memory is True
    assert dm.loader.num_workers == "auto"  # recorded as given: a checkpoint resolves it on its own machine


def test_auto_workers_under_srun_count_the_tasks_own_cpus(monkeypatch):
    """srun gives each task its own CPUs (--cpus-per-task): they are not shared among the
    trainer's devices."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.environments import SLURMEnvironment

    from vitdense.data.base import loader_machine

    slurm = SimpleNamespace(strategy=SimpleNamespace(cluster_environment=SLURMEnvironment()), num_devices=8)
    shared = SimpleNamespace(strategy=SimpleNamespace(), num_devices=8)
    for trainer in (slurm, shared):
        trainer.accelerator = None
    assert loader_machine(slurm) == (1, False) and loader_machine(shared) == (8, False)
