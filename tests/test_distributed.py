"""Two CPU processes (gloo) give the single-process figures: every task evaluates shards
holding different numbers of batches without waiting per step (no hang; a MultiTask's tasks
too, each on its own data), with dataset-level
metrics that count every validation sample once and dataset-level losses; one DDP step
equals one step on the same global batch, the linear probe's feature cache stays correct as
samples move between ranks, and pretrained weights are fetched by one process, then loaded
by all."""

import os
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from vitdense.data import (
    LoaderConfig,
    MultiTaskDataModule,
    SyntheticClassificationDataModule,
    SyntheticDetectionDataModule,
    SyntheticPanopticDataModule,
    SyntheticSegmentationDataModule,
)
from vitdense.heads import DETRHead, EoMTHead, LinearDecoder
from vitdense.losses import MaskSetCriterion, SetCriterion
from vitdense.metrics.common import LossMeans
from vitdense.tasks import (
    BackboneConfig,
    ClassificationTask,
    DetectionTask,
    LinearProbeTask,
    SegmentationTask,
    UniversalSegmentationTask,
)
from vitdense.tasks.multitask import MultiTask
from vitdense.types import BoxTargets, DetectionOutput, Losses, LossSum

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 2})


def trainer(devices: int, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",  # the processes are `launch`'s
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


def evaluations(root: Path) -> dict[str, tuple[L.LightningModule, L.LightningDataModule]]:
    """Every task on validation sets that 2 processes split into different numbers of batches
    (rank 0 one more): 13 images at batch 3 (7 + 6 images, 3 + 2 batches); 9 images of
    different sizes at batch 4 (5 + 4 images, 2 + 1 batches; one process: 4, 4, 1) and at
    batch 8 (one batch each; one process: 8, 1), whose pixel- and box-normalised losses
    differ per batch composition unless summed over the split and divided once (issue 29).
    Heads with random weights, so that a lost or repeated image, or a mean of per-process
    means, would show."""
    cls_data = SyntheticClassificationDataModule(img_size=32, val_size=13, loader=LoaderConfig(eval_batch_size=3))
    torch.manual_seed(0)
    probe = LinearProbeTask(num_classes=4, backbone=TINY, lrs=[0.1, 0.01])  # two heads: terms loss_lr0, loss_lr1
    for head in probe.head:
        torch.nn.init.normal_(head.fc.weight, std=0.5)
    out: dict[str, tuple[L.LightningModule, L.LightningDataModule]] = {
        "cls": (classifier(), cls_data),
        "probe": (probe, cls_data),
    }
    for batch in (4, 8):
        loader = LoaderConfig(eval_batch_size=batch, num_workers=0)
        torch.manual_seed(0)
        seg = SegmentationTask(num_classes=4, head=LinearDecoder, backbone=TINY, window=32)
        out[f"seg{batch}"] = seg, SyntheticSegmentationDataModule(img_size=32, val_size=9, loader=loader)
        torch.manual_seed(0)
        det = DetectionTask(
            num_classes=3, head=GridBoxHead, backbone=TINY
        )  # SetCriterion: loss_ce, loss_bbox, loss_giou
        det_data = SyntheticDetectionDataModule(root=str(root), img_size=32, train_size=2, val_size=9, loader=loader)
        out[f"det{batch}"] = det, det_data
    # EoMT, untrained but with a low panoptic threshold, so that segments (and PQ, mask AP and
    # mIoU above 0) come out of it; its evaluation losses are per image (own points)
    loader = LoaderConfig(eval_batch_size=4, num_workers=0)
    torch.manual_seed(0)
    pan = UniversalSegmentationTask(
        num_classes=6,
        head=partial(EoMTHead, num_queries=6, num_blocks=1),
        criterion=partial(MaskSetCriterion, num_points=64),
        evaluate=["panoptic", "instance", "semantic"],
        score_threshold=0.05,
        backbone=TINY,
    )
    pan_data = SyntheticPanopticDataModule(root=str(root / "pan"), img_size=32, train_size=2, val_size=9, loader=loader)
    out["pan4"] = pan, pan_data
    # classification and segmentation on one encoder, each task on its own data (its own shards)
    torch.manual_seed(0)
    seg = SegmentationTask(num_classes=4, head=LinearDecoder, backbone=TINY, window=32)
    joint = MultiTask({"cls": classifier(), "seg": seg})
    joint_data = MultiTaskDataModule(
        {
            "cls": SyntheticClassificationDataModule(img_size=32, val_size=13, loader=LoaderConfig(eval_batch_size=3)),
            "seg": SyntheticSegmentationDataModule(img_size=32, val_size=9, loader=LoaderConfig(eval_batch_size=4)),
        }
    )
    out["multi"] = joint, joint_data
    return out


def validate_every_task(devices: int, root: Path) -> dict[str, float]:
    """`validate` each task of `evaluations`; {"task:name": value} of everything logged."""
    out = {}
    for name, (task, data) in evaluations(root).items():
        logged = trainer(devices).validate(task, datamodule=data, verbose=False)[0]
        out.update({f"{name}:{key}": float(value) for key, value in logged.items()})
    return out


def one_step(devices: int, batch_size: int) -> dict[str, torch.Tensor]:
    """The classifier's weights after one SGD step on `devices` processes."""
    task = classifier()
    task.optimizer = partial(torch.optim.SGD, lr=0.5)
    data = SyntheticClassificationDataModule(
        img_size=32, train_size=32, val_size=4, loader=LoaderConfig(batch_size=batch_size)
    )
    trainer(devices, max_steps=1, limit_val_batches=0).fit(task, datamodule=data)
    return {k: v.detach().clone() for k, v in task.state_dict().items()}


def probe(devices: int, cache: bool) -> tuple[dict, dict]:
    """A linear probe's logged figures and head after 2 epochs, with or without its feature cache."""
    torch.manual_seed(0)
    task = LinearProbeTask(num_classes=4, backbone=TINY, cache_features=cache)
    data = SyntheticClassificationDataModule(img_size=32, train_size=16, val_size=5, loader=LoaderConfig(batch_size=4))
    fit = trainer(devices, max_epochs=2)  # the epoch-2 permutation hands each rank samples it has not cached
    fit.fit(task, datamodule=data)
    return dict(fit.callback_metrics), {k: v.clone() for k, v in task.head.state_dict().items()}


class CountingFetchTask(ClassificationTask):
    """Records which process fetches and which loads the hub weights (offline stand-ins)."""

    def fetch_pretrained(self) -> None:
        with open(os.environ["CALLS_FILE"], "a") as f:
            f.write(f"fetch {self.global_rank}\n")

    def load_pretrained(self) -> None:
        with open(os.environ["CALLS_FILE"], "a") as f:
            f.write(f"load {self.global_rank}\n")
        self.pretrained_loaded = True


def fetch_calls(devices: int, calls: Path) -> list[str]:
    """Which process fetched and which loaded the hub weights in a one-step fit."""
    os.environ["CALLS_FILE"] = str(calls)
    task = CountingFetchTask(
        num_classes=4, backbone=BackboneConfig(img_size=32, pretrained=True, model_args={"depth": 1})
    )
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=2, loader=LoaderConfig(batch_size=4))
    trainer(devices, max_steps=1, limit_val_batches=0).fit(task, datamodule=data)
    return sorted(calls.read_text().splitlines())


def jobs(devices: int, folder: Path) -> dict[str, Any]:
    """Everything the tests need from `devices` processes, run one after another (in one
    process group: start-up, seconds per process, is paid once)."""
    return {
        "evaluations": validate_every_task(devices, folder / "det"),
        "one_step": one_step(devices, 4),
        "probe": (probe(devices, True), probe(devices, False)),
        "fetch_calls": fetch_calls(devices, folder / "calls.txt"),
    }


def launch(world_size: int, folder: Path, timeout: float) -> dict[str, Any]:
    """`jobs` on `world_size` processes started here with Lightning's environment variables
    (as torchrun would), rank 0's results; every process is killed after `timeout` seconds,
    so a hang (a collective that one process never reaches) fails instead of blocking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": "0"}
    env["WORLD_SIZE"] = str(world_size)
    logs = [folder / f"rank{rank}.log" for rank in range(world_size)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.test_distributed", str(folder)],
            env={**env, "LOCAL_RANK": str(rank), "RANK": str(rank)},
            cwd=Path(__file__).parents[1],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        for rank, log in enumerate(logs)
    ]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one failed: the others would wait for it in their next collective
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    tails = "\n".join(f"--- rank {r}:\n" + "\n".join(log.read_text().splitlines()[-15:]) for r, log in enumerate(logs))
    codes = [p.returncode for p in procs]
    assert codes == [0] * world_size, f"exit codes {codes} (negative: killed after {timeout:.0f} s, hung)\n{tails}"
    return torch.load(folder / "results.pt", weights_only=False)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict[str, Any]:
    """`jobs` on 2 processes (gloo), in one launch."""
    return launch(2, tmp_path_factory.mktemp("two_processes"), timeout=float(os.environ.get("DIST_TIMEOUT", 300)))


def test_every_task_evaluates_uneven_shards_as_one_process(two_processes, tmp_path):
    # the processes hold different numbers of batches: any per-step collective in evaluation
    # (SetCriterion's box count was one) waits forever for the process that has finished
    multi = two_processes["evaluations"]
    single = validate_every_task(1, tmp_path / "det")
    assert multi.keys() == single.keys()
    losses = [k for k in single if k.rsplit("/", 1)[1].startswith("loss")]  # (a MultiTask's: val/<task>/loss...)
    # every logged loss: the total of each task, each linear probe head's, each DETR term
    assert {k for k in losses if k.startswith(("probe", "det"))} >= {
        "probe:val/loss_lr0",
        "probe:val/loss_lr1",
        "det4:val/loss_ce",
        "det4:val/loss_bbox",
        "det4:val/loss_giou",
    }
    for key in losses:
        # dataset-level sums over counts of the same per-image losses, summed in another order;
        # Lightning's own epoch mean was 13/12 of it for classification (the 2 processes' image
        # counts averaged as integers: 6.5 -> 6), a deadlock for detection; per-batch means
        # weighted by images differed by 1.0e-3 (seg4), 1.3e-4 (seg8), 2.6e-2 (det4), 3.5e-3 (det8)
        assert multi[key] == pytest.approx(single[key], rel=1e-6, abs=1e-6), key
    for key in single.keys() - set(losses):  # metrics: every image counted once, as on one process
        assert multi[key] == single[key], key
    assert 0 < single["cls:val/acc1"] < 1  # figures a lost or repeated image would change
    assert single["det4:val/map_50"] > 0  # grid boxes hit some objects
    assert single["pan4:val/mIoU"] > 0 and single["pan4:val/loss_mask"] > 0 and "pan4:val/PQ" in single
    # a MultiTask's tasks: their figures under their names, equal to each task's alone
    assert single["multi:val/cls/acc1"] == single["cls:val/acc1"] and "multi:val/seg/mIoU" in single
    assert single["multi:val/loss"] == pytest.approx(single["multi:val/cls/loss"] + single["multi:val/seg/loss"])
    # and the figure itself is the dataset's mean cross-entropy (batches of 3, 3, 3, 3 and 1 images)
    task, data = evaluations(tmp_path / "det")["cls"]
    data.setup("validate")
    with torch.no_grad():
        ce = [F.cross_entropy(task.eval()(b.image), b.label, reduction="none") for b in data.val_dataloader()]
    assert single["cls:val/loss"] == pytest.approx(torch.cat(ce).mean().item(), rel=1e-6)


def test_evaluation_losses_do_not_depend_on_the_batch_size(tmp_path):
    """One process, 5 images of different sizes in batches of 1, 3 and 16: the same `val/loss`
    and terms, each the split's sum over its count (labelled pixels, weighted by class here;
    target boxes, DETR's auxiliary layers included), not a mean of per-batch means."""
    torch.manual_seed(0)
    seg = SegmentationTask(
        num_classes=4, head=LinearDecoder, backbone=TINY, window=32, class_weights=[0.5, 1.0, 2.0, 1.5]
    )
    torch.manual_seed(0)
    detr = partial(DETRHead, hidden_dim=32, num_queries=10, num_heads=2, dim_feedforward=64, dec_layers=2, dropout=0)
    det = DetectionTask(num_classes=3, head=detr, backbone=TINY)
    tasks = {"cls": (classifier(), SyntheticClassificationDataModule)}
    tasks["seg"] = seg, SyntheticSegmentationDataModule
    tasks["det"] = det, partial(SyntheticDetectionDataModule, root=str(tmp_path), train_size=2)
    logged: dict[int, dict[str, float]] = {}
    for batch in (1, 3, 16):
        loader = LoaderConfig(eval_batch_size=batch, num_workers=0)
        for name, (task, data) in tasks.items():
            result = trainer(1).validate(task, datamodule=data(img_size=32, val_size=5, loader=loader), verbose=False)
            logged.setdefault(batch, {}).update({f"{name}:{k}": v for k, v in result[0].items() if "/loss" in k})
    assert {"det:val/loss_ce_0", "det:val/loss_giou_0", "seg:val/loss", "cls:val/loss"} <= logged[1].keys()
    for batch in (3, 16):
        # per-batch means weighted by images differed by 1.5e-3 and 2.2e-3 (seg, batches 3 and 16),
        # 1.2 and 1.4 (det's total), 2e-6 (cls: float rounding, per-image means already)
        assert logged[batch] == pytest.approx(logged[1], rel=1e-5), batch


def test_criterion_synchronises_the_box_count_in_training_only(monkeypatch):
    reduced = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t: reduced.append(t.item()) or t.mul_(2))
    criterion = SetCriterion(num_classes=2, aux_loss=False)
    output = DetectionOutput(torch.zeros(1, 4, 3), torch.full((1, 4, 4), 0.25))
    targets = [BoxTargets(torch.tensor([[0.25, 0.25, 0.5, 0.5]]), torch.tensor([1]))]
    criterion.train()(output, targets)
    assert reduced == [1.0]  # DETR's count, averaged over processes
    criterion.eval()(output, targets)
    assert reduced == [1.0]  # evaluation: no collective, the batch's own count


def test_loss_means_weight_each_batch_by_its_images():
    means = LossMeans()
    means.update("val", Losses(torch.tensor(1.0), {"loss_a": torch.tensor(float("nan"))}), weight=3)
    means.update("val", Losses(torch.tensor(4.0), {"loss_a": torch.tensor(2.0)}), weight=1)
    means.update("test", Losses(torch.tensor(5.0)), weight=2)
    val = means.pop("val")
    assert list(val) == ["val/loss", "val/loss_a"]
    assert val["val/loss"].item() == 1.75  # (3 * 1 + 1 * 4) / 4, not the mean of the batch means (2.5)
    assert val["val/loss_a"].isnan()  # a NaN loss shows, it is not dropped
    assert means.pop("val") == {}  # the next epoch starts afresh
    assert means.pop("test") == {"test/loss": 5.0}


def test_loss_means_divide_summed_losses_once():
    means = LossMeans()
    # DETR-like: every term a sum over its own count, the total their sum; a batch without boxes adds
    # its class sum and no count (not the criterion's count clamped at 1)
    batch = {"loss_ce": LossSum(torch.tensor(6.0), 3.0), "loss_bbox": LossSum(torch.tensor(4.0), torch.tensor(2.0))}
    means.update(
        "val", Losses(torch.tensor(4.0), {"loss_ce": torch.tensor(2.0), "loss_bbox": torch.tensor(2.0)}, batch), 2
    )
    empty = {"loss_ce": LossSum(torch.tensor(3.0), 1.0), "loss_bbox": LossSum(torch.tensor(0.0), 0.0)}
    means.update(
        "val", Losses(torch.tensor(3.0), {"loss_ce": torch.tensor(3.0), "loss_bbox": torch.tensor(0.0)}, empty), 1
    )
    assert means.pop("val") == {"val/loss": 2.25 + 2.0, "val/loss_ce": 9 / 4, "val/loss_bbox": 4 / 2}
    # segmentation-like: the total's own sum; a split with nothing to count gives 0, as DETR's clamped count
    means.update("test", Losses(torch.tensor(0.0), sums={"loss": LossSum(torch.tensor(0.0), 0.0)}), 1)
    assert means.pop("test") == {"test/loss": 0.0}
    with pytest.raises(ValueError, match=r"no LossSum for \['loss_b'\]"):
        means.update(
            "val",
            Losses(
                torch.tensor(1.0),
                {"loss_a": torch.tensor(1.0), "loss_b": torch.tensor(0.0)},
                {"loss_a": LossSum(1.0, 1.0)},
            ),
            1,
        )


def test_one_ddp_step_equals_one_step_on_the_global_batch(two_processes):
    before = {k: v.clone() for k, v in classifier().state_dict().items()}
    single = one_step(1, 8)  # the first 8 of the epoch's permutation
    multi = two_processes["one_step"]  # batch 4: rank 0 takes its even positions, rank 1 its odd ones: the same 8
    assert any(not torch.equal(before[k], single[k]) for k in before)  # the step did change weights
    diff = max((single[k] - multi[k]).abs().max().item() for k in single)
    # the same sums in another order (per-rank partial sums, then the all-reduce): 1.9e-6 measured on an
    # AVX2 CPU, 0 on AVX512 ones; gradients not averaged, or other samples, move weights by ~1e-2
    assert diff <= 1e-5, diff


def test_linear_probe_cache_is_correct_when_samples_move_between_ranks(two_processes):
    (cached_metrics, cached_head), (plain_metrics, plain_head) = two_processes["probe"]
    assert cached_metrics["val/acc1"] == plain_metrics["val/acc1"]
    for key, value in plain_head.items():
        torch.testing.assert_close(cached_head[key], value, rtol=0, atol=1e-6)


def test_pretrained_weights_are_fetched_once_then_loaded_by_every_process(two_processes):
    assert two_processes["fetch_calls"] == ["fetch 0", "load 0", "load 1"]


if __name__ == "__main__":  # one process of `launch`: python -m tests.test_distributed FOLDER
    results = jobs(int(os.environ["WORLD_SIZE"]), Path(sys.argv[1]))
    if os.environ["RANK"] == "0":
        torch.save(results, Path(sys.argv[1]) / "results.pt")
    if torch.distributed.is_initialized():
        # leave the group together: a process that exits with gloo's threads still up can abort
        # ("terminate called without an active exception", seen once in a full test run)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
