"""Two CPU processes (gloo, `ddp_spawn`) give the single-process figures: dataset-level
metrics count every validation sample once, one DDP step equals one step on the same global
batch, the linear probe's feature cache stays correct as samples move between ranks, and
pretrained weights are fetched by one process, then loaded by all."""

import os
from functools import partial
from pathlib import Path

import lightning as L
import pytest
import torch

from vitdense.data import (
    LoaderConfig,
    SyntheticClassificationDataModule,
    SyntheticDetectionDataModule,
    SyntheticSegmentationDataModule,
)
from vitdense.heads import LinearDecoder
from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, LinearProbeTask, SegmentationTask
from vitdense.types import DetectionOutput

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 2})

# spawned processes receive the module through shared memory; file descriptors fail on some kernels
torch.multiprocessing.set_sharing_strategy("file_system")


def trainer(devices: int, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def classifier() -> ClassificationTask:
    torch.manual_seed(0)
    task = ClassificationTask(num_classes=4, backbone=TINY)
    torch.nn.init.normal_(task.head.fc.weight, std=0.5)  # not zero: predictions that differ per image
    return task


@pytest.mark.parametrize("devices", [2])
def test_validation_metrics_count_every_sample_once(devices):
    # 13 images: 2 processes get 7 and 6, where torch's sampler would repeat one to make 7 + 7
    data = SyntheticClassificationDataModule(img_size=32, val_size=13, loader=LoaderConfig(eval_batch_size=3))
    single = trainer(1).validate(classifier(), datamodule=data, verbose=False)[0]
    multi = trainer(devices).validate(classifier(), datamodule=data, verbose=False)[0]
    assert multi["val/acc1"] == single["val/acc1"]
    assert 0 < single["val/acc1"] < 1  # a figure where a repeated image would show

    torch.manual_seed(0)
    seg = SegmentationTask(num_classes=4, head=LinearDecoder, backbone=TINY, window=32)
    seg_data = SyntheticSegmentationDataModule(img_size=32, val_size=7, loader=LoaderConfig(eval_batch_size=2))
    single = trainer(1).validate(seg, datamodule=seg_data, verbose=False)[0]
    multi = trainer(devices).validate(seg, datamodule=seg_data, verbose=False)[0]
    for key in ("val/mIoU", "val/mAcc", "val/aAcc"):
        assert multi[key] == single[key], key


class GridBoxHead(torch.nn.Module):
    """Boxes on a fixed grid of centres and sizes, scored from the image's tokens: an
    untrained detector whose AP is not 0, so that a lost or repeated image would show."""

    def __init__(self, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        c = (torch.arange(5) + 0.5) / 5
        grid = torch.stack(torch.meshgrid(c, c, indexing="ij"), -1).reshape(-1, 1, 2).expand(-1, 4, -1)
        sizes = torch.tensor([0.15, 0.25, 0.35, 0.5])[None, :, None].expand(25, -1, 2)
        self.register_buffer("boxes", torch.cat([grid, sizes], -1).reshape(-1, 4))  # [100, 4]
        self.score = torch.nn.Linear(embed_dim, 100 * (num_classes + 1))

    def forward(self, features):
        b = features.patch_tokens.shape[0]
        logits = self.score(features.patch_tokens.mean(1)).view(b, 100, -1)
        return DetectionOutput(logits, self.boxes.expand(b, -1, -1))


def test_detection_ap_counts_every_image_once(tmp_path):
    torch.manual_seed(0)
    det = DetectionTask(num_classes=3, head=GridBoxHead, backbone=TINY)
    data = SyntheticDetectionDataModule(
        root=str(tmp_path / "det"), img_size=32, train_size=2, val_size=7, loader=LoaderConfig(eval_batch_size=2)
    )
    single = trainer(1).validate(det, datamodule=data, verbose=False)[0]
    multi = trainer(2).validate(det, datamodule=data, verbose=False)[0]
    for key in ("val/map", "val/map_50", "val/mar_100"):
        assert multi[key] == single[key], key
    assert single["val/map_50"] > 0  # grid boxes hit some objects: a figure a lost or repeated image would change


def test_one_ddp_step_equals_one_step_on_the_global_batch():
    def one_step(devices: int, batch_size: int) -> dict[str, torch.Tensor]:
        task = classifier()
        task.optimizer = partial(torch.optim.SGD, lr=0.5)
        data = SyntheticClassificationDataModule(
            img_size=32, train_size=32, val_size=4, loader=LoaderConfig(batch_size=batch_size)
        )
        trainer(devices, max_steps=1, limit_val_batches=0).fit(task, datamodule=data)
        return {k: v.detach().clone() for k, v in task.state_dict().items()}

    before = {k: v.clone() for k, v in classifier().state_dict().items()}
    single = one_step(1, 8)  # the first 8 of the epoch's permutation
    multi = one_step(2, 4)  # rank 0 takes its even positions, rank 1 its odd ones: the same 8
    assert any(not torch.equal(before[k], single[k]) for k in before)  # the step did change weights
    diff = max((single[k] - multi[k]).abs().max().item() for k in single)
    # the same sums in another order (per-rank partial sums, then the all-reduce): 1.9e-6 measured on an
    # AVX2 CPU, 0 on AVX512 ones; gradients not averaged, or other samples, move weights by ~1e-2
    assert diff <= 1e-5, diff


def test_linear_probe_cache_is_correct_when_samples_move_between_ranks():
    def probe(cache: bool) -> tuple[dict, dict]:
        torch.manual_seed(0)
        task = LinearProbeTask(num_classes=4, backbone=TINY, cache_features=cache)
        data = SyntheticClassificationDataModule(
            img_size=32, train_size=16, val_size=5, loader=LoaderConfig(batch_size=4)
        )
        fit = trainer(2, max_epochs=2)  # the epoch-2 permutation hands each rank samples it has not cached
        fit.fit(task, datamodule=data)
        return dict(fit.callback_metrics), {k: v.clone() for k, v in task.head.state_dict().items()}

    (cached_metrics, cached_head), (plain_metrics, plain_head) = probe(True), probe(False)
    assert cached_metrics["val/acc1"] == plain_metrics["val/acc1"]
    for key, value in plain_head.items():
        torch.testing.assert_close(cached_head[key], value, rtol=0, atol=1e-6)


class CountingFetchTask(ClassificationTask):
    """Records which process fetches and which loads the hub weights (offline stand-ins)."""

    def fetch_pretrained(self) -> None:
        with open(os.environ["CALLS_FILE"], "a") as f:  # the environment reaches the spawned processes
            f.write(f"fetch {self.global_rank}\n")

    def load_pretrained(self) -> None:
        with open(os.environ["CALLS_FILE"], "a") as f:
            f.write(f"load {self.global_rank}\n")
        self.pretrained_loaded = True


def test_pretrained_weights_are_fetched_once_then_loaded_by_every_process(tmp_path, monkeypatch):
    monkeypatch.setenv("CALLS_FILE", str(tmp_path / "calls.txt"))
    CountingFetchTask.record = str(tmp_path / "calls.txt")
    task = CountingFetchTask(
        num_classes=4, backbone=BackboneConfig(img_size=32, pretrained=True, model_args={"depth": 1})
    )
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=2, loader=LoaderConfig(batch_size=4))
    trainer(2, max_steps=1, limit_val_batches=0).fit(task, datamodule=data)
    calls = sorted(Path(os.environ["CALLS_FILE"]).read_text().splitlines())
    assert calls == ["fetch 0", "load 0", "load 1"]
