"""The BaseTask contract: named loss terms, the stage in every hook, epoch-end summaries,
opt-in training metrics, injected heads, schedules in steps or epochs."""

import warnings
from functools import partial
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torchmetrics import MetricCollection, SumMetric

from vitdense.data import LoaderConfig, SyntheticClassificationDataModule
from vitdense.heads import ClassificationHead
from vitdense.heads.factory import HeadSpec
from vitdense.tasks import BackboneConfig, BaseTask
from vitdense.training.callbacks import ResumeRNG, SkippedSamples
from vitdense.training.optim import WarmupCosineLR, WarmupPolyLR
from vitdense.types import Losses

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})


class TwoTermTask(BaseTask):
    """A toy task: two loss terms, a metric whose result is a vector, stages recorded."""

    monitor = "val/top"
    mode = "max"

    def __init__(self, train_metrics: bool = False, lr_scheduler=WarmupCosineLR) -> None:
        super().__init__(num_classes=4, head=ClassificationHead, backbone=TINY, lr_scheduler=lr_scheduler)
        self.log_train_metrics = train_metrics
        self.stages: list[str] = []
        self.summaries: list[tuple[str, float]] = []

    def configure_metrics(self):
        return MetricCollection({"count": SumMetric()})

    def forward_batch(self, batch, stage):
        self.stages.append(stage)
        return super().forward_batch(batch, stage)

    def compute_loss(self, output, batch, stage):
        ce = F.cross_entropy(output, batch.label)
        return Losses(ce + 0.5 * output.pow(2).mean(), {"loss_ce": ce, "loss_l2": 0.5 * output.pow(2).mean()})

    def update_metrics(self, metrics, output, batch, stage):
        metrics["count"].update(torch.tensor(float(batch.image.shape[0])))

    def summarize(self, result: dict[str, Any], stage):
        count = result[f"{stage}/count"]
        self.summaries.append((stage, float(count)))
        return {f"{stage}/top": count / 100, f"{stage}/count": count}


def fit(task, epochs=2, batch_size=4, **trainer_args):
    """Train on 16 synthetic images (validate on 6); the trainer that ran."""
    data = SyntheticClassificationDataModule(
        img_size=32, train_size=16, val_size=6, loader=LoaderConfig(batch_size=batch_size)
    )
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer_args,
    )
    trainer.fit(task, datamodule=data)
    return trainer


def test_loss_terms_summaries_and_stages():
    task = TwoTermTask()
    trainer = fit(task)
    logged = trainer.callback_metrics
    for key in ("train/loss_step", "train/loss_ce_epoch", "train/loss_l2_epoch", "val/loss", "val/loss_ce"):
        assert key in logged, key
    torch.testing.assert_close(logged["val/loss"], logged["val/loss_ce"] + logged["val/loss_l2"])
    # summarized once per validation epoch from the whole epoch's metric, then reset (6 images each time)
    assert task.summaries == [("val", 6.0), ("val", 6.0)]
    assert logged["val/top"] == pytest.approx(0.06)
    # training metrics are off by default: no train/count, no summary for "train"
    assert not any(k.startswith("train/count") for k in logged)
    assert set(task.stages) == {"train", "val"}


def test_training_metrics_are_opt_in():
    task = TwoTermTask(train_metrics=True)
    trainer = fit(task, epochs=1)
    assert ("train", 16.0) in task.summaries and trainer.callback_metrics["train/count"] == 16
    # exact resume and skipped-sample counts come with every fit, with or without a logger
    assert {ResumeRNG, SkippedSamples} <= {type(c) for c in trainer.callbacks}


class LossOnlyTask(BaseTask):
    """A task that overrides nothing but its loss."""

    def compute_loss(self, output, batch, stage):
        return Losses(F.cross_entropy(output, batch.label))


def test_the_base_builds_what_a_subclass_does_not_override():
    task = LossOnlyTask(num_classes=3, head=partial(ClassificationHead, pool="avg"), backbone=TINY)
    assert task.class_names == ["0", "1", "2"] and task.head.fc.out_features == 3
    # the head is recorded as data, so a checkpoint rebuilds it
    assert task.hparams["head"] == {
        "class_path": "vitdense.heads.classification.ClassificationHead",
        "init_args": {"pool": "avg"},
    }
    assert len(task.val_metrics) == 0 and task.metrics_of("val") is task.val_metrics
    with pytest.raises(ValueError, match="class_names has 2 entries for num_classes=3"):
        LossOnlyTask(num_classes=3, head=ClassificationHead, class_names=["a", "b"], backbone=TINY)


def test_head_spec_rebuilds_injected_heads():
    spec = HeadSpec.of(partial(ClassificationHead, pool="avg", drop_rate=0.1))
    assert spec == HeadSpec("vitdense.heads.classification.ClassificationHead", {"pool": "avg", "drop_rate": 0.1})
    head = spec(8, 3)
    assert isinstance(head, ClassificationHead) and head.pool == "avg" and head.fc.out_features == 3
    assert HeadSpec.of(ClassificationHead) == HeadSpec("vitdense.heads.classification.ClassificationHead", {})
    assert HeadSpec.of(lambda d, k: torch.nn.Linear(d, k)) is None


def lrs_of(task, epochs, batch_size):
    """The learning rate of every optimizer step of a run."""
    lrs = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, *args):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    fit(task, epochs, batch_size, limit_val_batches=0, callbacks=[Record()])
    return lrs


@pytest.mark.parametrize("batch_size", [4, 8])
def test_warmup_in_epochs_follows_the_steps_per_epoch(batch_size):
    task = TwoTermTask(lr_scheduler=partial(WarmupCosineLR, warmup_epochs=1))
    lrs = lrs_of(task, epochs=3, batch_size=batch_size)
    per_epoch = 16 // batch_size
    base = 1e-3  # the default AdamW rate
    assert len(lrs) == 3 * per_epoch
    # linear warmup over exactly the first epoch, whatever the batch size; then cosine to 0 over the rest
    assert lrs[:per_epoch] == pytest.approx([base * (i + 1) / per_epoch for i in range(per_epoch)])
    assert lrs[per_epoch] == pytest.approx(base)
    assert lrs[-1] == pytest.approx(
        base * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * (per_epoch * 2 - 1) / (per_epoch * 2))).item())
    )


def test_epoch_interval_steps_the_schedule_once_per_epoch():
    task = TwoTermTask(lr_scheduler=partial(WarmupPolyLR, power=1.0))
    task.lr_interval = "epoch"
    lrs = lrs_of(task, epochs=4, batch_size=8)
    # poly with power 1 over 4 epochs: 1, 3/4, 1/2, 1/4 of the base rate, constant within an epoch
    assert lrs == pytest.approx([1e-3 * f for f in (1, 1, 0.75, 0.75, 0.5, 0.5, 0.25, 0.25)])


def test_poly_schedule_length_comes_from_the_trainer():
    task = TwoTermTask(lr_scheduler=partial(WarmupPolyLR, power=0.9, warmup_steps=2))
    lrs = lrs_of(task, epochs=2, batch_size=4)  # 8 steps
    expected = [0.5, 1.0] + [(1 - i / 6) ** 0.9 for i in range(6)]
    assert lrs == pytest.approx([1e-3 * f for f in expected])


def compiled_fit(compile, monkeypatch=None) -> tuple[Any, float]:
    from vitdense.tasks import ClassificationTask

    torch.manual_seed(0)
    task = ClassificationTask(num_classes=4, backbone=TINY, compile=compile)
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=2, loader=LoaderConfig(batch_size=4))
    trainer = L.Trainer(
        accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(task, datamodule=data)
    return task, float(trainer.callback_metrics["train/loss_step"])


def test_compile_compiles_backbone_and_head_in_place():
    # the eager backend: TorchDynamo captures the graphs (what can break) without inductor's minutes
    task, loss = compiled_fit({"backend": "eager"})
    assert task.backbone._compiled_call_impl is not None and task.head._compiled_call_impl is not None
    assert not any("_orig_mod" in k for k in task.state_dict())  # checkpoints keep their keys
    _, eager_loss = compiled_fit(False)
    assert loss == pytest.approx(eager_loss, rel=1e-5)


def test_compile_without_a_cpp_compiler_warns_and_runs_eager(monkeypatch):
    monkeypatch.setattr("vitdense.tasks.running.shutil.which", lambda name: None)
    with pytest.warns(UserWarning, match="inductor needs a C\\+\\+ compiler"):
        task, _ = compiled_fit(True)
    assert task.backbone._compiled_call_impl is None


def test_clipping_by_norm_under_fsdp_uses_fsdps_own_norm():
    from unittest import mock

    from torch.distributed.fsdp import FullyShardedDataParallel

    task = TwoTermTask()
    root = mock.create_autospec(FullyShardedDataParallel, instance=True)  # what FSDPStrategy.model is
    task._trainer = mock.Mock(strategy=mock.Mock(model=root))
    optimizer = torch.optim.SGD(task.parameters(), lr=0.1)
    task.configure_gradient_clipping(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
    root.clip_grad_norm_.assert_called_once_with(0.5)  # the norm over every shard, not this process's
    with mock.patch.object(L.LightningModule, "clip_gradients") as lightning_clipping:
        task.configure_gradient_clipping(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="value")
    lightning_clipping.assert_called_once()  # by value: Lightning's own (elementwise, per shard is right)
    assert root.clip_grad_norm_.call_count == 1


def clipped_bf16_fit(fused: bool, clip: float | None) -> list[torch.Tensor]:
    """The parameters after 2 bf16-mixed steps of AdamW (fused or not), clipped at `clip`."""
    torch.manual_seed(0)
    task = TwoTermTask()
    task.optimizer = lambda params: torch.optim.AdamW(params, lr=1e-2, fused=fused)
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=2, loader=LoaderConfig(batch_size=4))
    trainer = L.Trainer(
        accelerator="cpu", precision="bf16-mixed", max_steps=2, gradient_clip_val=clip, limit_val_batches=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without it: slow, said once; fine for 2 tiny steps
        trainer.fit(task, datamodule=data)
    return [p.detach().clone() for p in task.parameters()]


def test_a_fused_optimizer_clips_under_bf16():
    """Lightning refuses clipping with a fused optimizer under any mixed precision (its issue
    #21435); bf16 has no gradient scaler, so vitdense clips as Lightning does in fp32: the
    same steps as the unfused optimizer, and clipped (not the unclipped steps)."""
    fused = clipped_bf16_fit(True, 1e-3)
    for a, b in zip(fused, clipped_bf16_fit(False, 1e-3), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(fused, clipped_bf16_fit(True, None), strict=True))


@pytest.mark.parametrize("where", ["vitdense.deploy.checkpoint", "vitdense.tasks.base"])
def test_head_specs_pickled_where_they_lived_still_load(where, tmp_path, monkeypatch):
    """Checkpoints pickled `HeadSpec` under the modules it lived in before `vitdense.heads.factory`."""
    import importlib

    spec = HeadSpec("vitdense.heads.classification.ClassificationHead", {"pool": "avg"})
    monkeypatch.setattr(importlib.import_module(where), "HeadSpec", HeadSpec, raising=False)
    monkeypatch.setattr(HeadSpec, "__module__", where)
    torch.save({"head": spec}, tmp_path / "old.ckpt")
    assert f"{where}\nHeadSpec".encode() in (tmp_path / "old.ckpt").read_bytes()  # pickled under the old name
    monkeypatch.undo()
    assert torch.load(tmp_path / "old.ckpt", weights_only=True)["head"] == spec


def test_a_setup_that_forgets_the_base_is_refused_before_training():
    """A task whose `setup` does not call `super().setup(stage)` never loads its pretrained
    weights: refused when the loop starts, not trained from random weights without a word."""
    from vitdense.core.errors import ConfigError
    from vitdense.tasks import ClassificationTask

    class Forgetful(ClassificationTask):
        def prepare_data(self) -> None:  # (no hub here: the weights would be fetched first)
            pass

        def setup(self, stage: str) -> None:
            self.ready = True  # its own set-up, without the base's

    pretrained = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1}, pretrained=True)
    task = Forgetful(num_classes=4, backbone=pretrained)
    data = SyntheticClassificationDataModule(img_size=32, train_size=4, val_size=2, loader=LoaderConfig(batch_size=2))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ConfigError, match=r"setup\(\) must call super\(\).setup\(stage\)"):
        trainer.fit(task, data)


def test_a_model_without_backbone_or_head_is_refused_when_the_task_is_built():
    from vitdense.core.errors import ConfigError
    from vitdense.tasks import ClassificationTask

    class Wrapped(torch.nn.Module):  # the parts under other names
        def __init__(self, backbone, head):
            super().__init__()
            self.encoder, self.classifier = backbone, head

    class Renamed(ClassificationTask):
        def build_model(self, backbone, head):
            return Wrapped(backbone, head)

    with pytest.raises(ConfigError, match=r"Renamed.build_model returned a Wrapped without backbone and head"):
        Renamed(num_classes=4, backbone=TINY)
