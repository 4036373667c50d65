"""DeiT's hard and soft token distillation in `ClassificationTask`: the losses equal timm
1.0.31's `TokenDistillationTask` on the same logits, the teacher is frozen and not saved, and
a distilled checkpoint predicts the mean of its two heads."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from torch import nn

from vitdense.core.errors import ConfigError
from vitdense.heads import DistilledClassificationHead
from vitdense.losses.distillation import combine_token_distillation
from vitdense.tasks import BackboneConfig, ClassificationTask

NAME = "deit_tiny_distilled_patch16_224"
ARGS = {"embed_dim": 24, "depth": 1, "num_heads": 2, "img_size": 32, "patch_size": 8}


class _Fixed(nn.Module):
    """A stand-in model returning given logits (what timm's task reads of its models)."""

    def __init__(self, *outputs: torch.Tensor) -> None:
        super().__init__()
        self.outputs, self.num_classes, self.in_chans = outputs, outputs[0].shape[-1], 3
        self.pretrained_cfg = {"mean": timm.data.IMAGENET_DEFAULT_MEAN, "std": timm.data.IMAGENET_DEFAULT_STD}

    def set_distilled_training(self, enable: bool = True) -> None:
        pass

    def forward(self, x: torch.Tensor):
        return self.outputs if len(self.outputs) > 1 else self.outputs[0]


@pytest.mark.parametrize(("kind", "alpha", "tau"), [("hard", 0.5, 1.0), ("soft", 0.3, 3.0)])
def test_losses_equal_timm_token_distillation_task(kind, alpha, tau):
    from timm.task.token_distillation import TokenDistillationTask

    torch.manual_seed(0)
    logits, dist_logits, teacher = torch.randn(3, 6, 7).mul(2).unbind()
    labels = torch.randint(0, 7, (6,))
    reference = TokenDistillationTask(
        _Fixed(logits, dist_logits), _Fixed(teacher), criterion=nn.CrossEntropyLoss(), distill_type=kind,
        task_loss_weight=1 - alpha, temperature=tau, verbose=False,
    )(torch.zeros(6, 3, 4, 4), labels)  # fmt: skip
    task_loss = nn.functional.cross_entropy(logits, labels)
    ours = combine_token_distillation(task_loss, dist_logits, teacher, kind, alpha, tau)
    for part in ("loss", "task_loss", "distill_loss"):
        torch.testing.assert_close(getattr(ours, part), reference[part])
    assert ours.distill_loss > 0


def test_distillation_without_a_distillation_token_is_refused():
    with pytest.raises(ConfigError, match=r"distillation=hard.*no distillation token.*deit_\*_distilled_\*"):
        ClassificationTask(
            num_classes=3,
            distillation="hard",
            teacher_model="vit_tiny_patch16_224",
            backbone=BackboneConfig("vit_tiny_patch16_224", model_args=ARGS),
        )


def test_a_timm_teacher_without_a_local_file_is_refused():
    with pytest.raises(ConfigError, match="teacher_model='vit_tiny_patch16_224' needs model.init_args.teacher_weights"):
        ClassificationTask(
            num_classes=3,
            head=DistilledClassificationHead,
            distillation="soft",
            teacher_model="vit_tiny_patch16_224",
            backbone=BackboneConfig(NAME, model_args=ARGS),
        )


@pytest.fixture(scope="module")
def distilled_run(tmp_path_factory):
    """Two steps of soft distillation through the CLI from a YAML-like config, with a timm
    ViT teacher from a local file (its own normalisation, 0.5/0.5, converted from the data's)."""
    from vitdense.cli import main

    folder = tmp_path_factory.mktemp("deit_run")
    torch.manual_seed(0)
    teacher = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, **ARGS).eval()
    torch.save(teacher.state_dict(), folder / "teacher.pth")
    config = {
        "trainer": {"max_steps": 2, "limit_val_batches": 1, "logger": False, "enable_progress_bar": False,
                    "default_root_dir": str(folder), "accelerator": "cpu"},
        "model": {"class_path": "vitdense.tasks.ClassificationTask", "init_args": {
            "backbone": {"name": NAME, "model_args": ARGS},
            "head": {"class_path": "vitdense.heads.DistilledClassificationHead"},
            "distillation": "soft", "distillation_alpha": 0.5, "distillation_tau": 2.0,
            "teacher_model": "vit_tiny_patch16_224", "teacher_weights": str(folder / "teacher.pth"),
            "teacher_model_args": ARGS}},
        "data": {"class_path": "vitdense.data.SyntheticClassificationDataModule", "init_args": {
            "num_classes": 3, "img_size": 32, "train_size": 4, "val_size": 2, "loader": {"batch_size": 2}}},
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    cli = main(["fit", "--config", str(folder / "config.json")])
    return cli, teacher, folder


def test_cli_trains_with_a_frozen_teacher_left_out_of_checkpoints(distilled_run):
    cli, teacher, folder = distilled_run
    task = cli.model
    assert cli.trainer.global_step == 2
    logged = cli.trainer.logged_metrics
    total, task_loss, distill = (logged[f"train/{k}_step"] for k in ("loss", "task_loss", "distill_loss"))
    torch.testing.assert_close(total, 0.5 * task_loss + 0.5 * distill)
    assert distill > 0
    wrapped = task._teacher[0]
    assert not wrapped.training and not any(p.requires_grad for p in wrapped.parameters())
    torch.testing.assert_close(wrapped.model.state_dict()["head.weight"], teacher.state_dict()["head.weight"])
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert "model.head.head_dist.weight" in saved and not any("teacher" in k for k in saved)
    # the teacher sees the data's normalised batch converted to its own mean/std (0.5, 0.5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (cli.datamodule.mean, cli.datamodule.std))
        expected = teacher(((x * std + mean) - 0.5) / 0.5)
        torch.testing.assert_close(task.teacher_logits(x, None), expected)


def test_checkpoint_loads_and_predicts_the_mean_of_both_heads(distilled_run):
    import vitdense

    cli, _, folder = distilled_run
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    model = vitdense.load_model(ckpt)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        head = model.head
        logits, dist_logits = head.forward_both(model.backbone(x))
        torch.testing.assert_close(model(x), (logits + dist_logits) / 2)
        torch.testing.assert_close(model(x), cli.model.model.eval()(x))
    # through Lightning too, without the teacher's file (the teacher is for training only)
    from vitdense.deploy.checkpoint import load_task

    (folder / "teacher.pth").rename(folder / "moved.pth")
    try:
        with torch.no_grad():
            torch.testing.assert_close(load_task(ckpt)(x), model(x))
    finally:
        (folder / "moved.pth").rename(folder / "teacher.pth")


def test_a_vitdense_checkpoint_is_a_teacher(distilled_run):
    import vitdense

    _, _, folder = distilled_run
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    student = ClassificationTask(
        num_classes=3,
        head=DistilledClassificationHead,
        distillation="hard",
        teacher_checkpoint=str(ckpt),
        backbone=BackboneConfig(NAME, model_args=ARGS),
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(student.teacher_logits(x, None), vitdense.load_model(ckpt)(x))
