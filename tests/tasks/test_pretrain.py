"""MaskedImageModelingTask through the command line: both objectives train from the demo
configs; a run resumed mid-epoch ends with the uninterrupted run's weights (the masks are
redrawn as they were); and the pre-trained backbone loads into every task, from the
training checkpoint and from `export --format weights`."""

from pathlib import Path

import pytest
import torch
import yaml

from vitdense.backbone.config import BackboneConfig
from vitdense.cli import main
from vitdense.deploy.export import main as export_main
from vitdense.tasks import ClassificationTask, DetectionTask, LinearProbeTask, MaskedImageModelingTask, SegmentationTask

CONFIGS = Path(__file__).parents[2] / "configs"
ARCH = {"name": "vit_tiny_patch16_224", "model_args": {"depth": 2}}


def write_config(tmp_path: Path, name: str) -> Path:
    """The demo config at 32 px, 2 blocks, 3 steps per epoch, a checkpoint every 2 steps."""
    cfg = yaml.safe_load((CONFIGS / name).read_text())
    cfg["trainer"].update(max_epochs=2, precision="32-true", log_every_n_steps=1, enable_progress_bar=False)
    cfg["trainer"]["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"every_n_train_steps": 2, "save_top_k": -1, "filename": "{step}", "save_last": True},
        }
    ]
    cfg["model"]["init_args"]["backbone"].update(model_args={"depth": 2}, drop_path_rate=0.1)
    cfg["model"]["init_args"]["lr_scheduler"]["init_args"]["warmup_steps"] = 2
    cfg["data"]["init_args"].update(img_size=32, train_size=12, val_size=4)
    cfg["data"]["init_args"]["loader"]["batch_size"] = 4
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def pretrained(tiny_runs):
    """{objective: (uninterrupted CLI run, its folder)} for MAE and the paper's objective, each
    the demo config as `write_config` writes it (the session's runs: tests/tiny_runs.py)."""
    return {name: (tiny_runs.cli(name), tiny_runs[name][0]) for name in ("mae", "mpp")}


@pytest.mark.parametrize("name", ["mae", "mpp"])
def test_pretraining_resumes_mid_epoch_exactly(pretrained, name, tmp_path):
    uninterrupted, root = pretrained[name]
    assert isinstance(uninterrupted.model, MaskedImageModelingTask)
    assert uninterrupted.trainer.global_step == 6
    logged = uninterrupted.trainer.callback_metrics
    assert torch.isfinite(logged["val/loss"]) and ("val/color_acc" in logged) == (name == "mpp")
    mid = root / "lightning_logs" / "version_0" / "checkpoints" / "step=4.ckpt"  # one step into epoch 2
    config = root / ("demo_pretrain.yaml" if name == "mae" else "demo_pretrain_mpp.yaml")
    resumed = main(["fit", "--config", str(config), f"--trainer.default_root_dir={tmp_path}", f"--ckpt_path={mid}"])
    expected = uninterrupted.model.state_dict()
    diff = max((v.float() - expected[k].float()).abs().max().item() for k, v in resumed.model.state_dict().items())
    assert diff <= 1e-6


def backbone_state(task) -> dict[str, torch.Tensor]:
    return task.backbone.state_dict()


def test_the_pretrained_backbone_loads_into_every_task(pretrained, tmp_path):
    run, root = pretrained["mae"]
    ckpt = root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    expected = backbone_state(run.model)
    assert not run.model.backbone.pos_embed.requires_grad  # MAE's fixed sine-cosine table ...
    weights = tmp_path / "encoder.safetensors"
    export_main(["--ckpt_path", str(ckpt), "--format", "weights", "--output", str(weights)])
    for source in (ckpt, weights):
        backbone = BackboneConfig(checkpoint=str(source), img_size=32, **ARCH)
        tasks = [
            ClassificationTask(num_classes=3, backbone=backbone),
            LinearProbeTask(num_classes=3, backbone=backbone),
            SegmentationTask(num_classes=3, backbone=backbone),
            DetectionTask(num_classes=3, backbone=backbone),
            MaskedImageModelingTask(backbone=backbone),  # pre-training continued from it
        ]
        for task in tasks:
            got = backbone_state(task)
            assert got.keys() == expected.keys()
            assert all(torch.equal(got[k], expected[k]) for k in expected), (type(task).__name__, source.name)
        assert tasks[0].backbone.pos_embed.requires_grad  # ... trained as a learned one downstream
        assert torch.equal(tasks[-1].backbone.pos_embed, expected["pos_embed"])  # not reset by the objective
