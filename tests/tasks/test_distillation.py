"""FeatureDistillationTask: the teacher stays frozen through a step, cached teacher features are the
teacher's, and the distilled student fine-tunes through the command line (`backbone.checkpoint`)."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from vitdense.backbone.pretrained import create_backbone
from vitdense.cli import main
from vitdense.core.errors import ConfigError
from vitdense.pretrain import TeacherFeatureCache
from vitdense.tasks import BackboneConfig, FeatureDistillationTask
from vitdense.types import ImageSizes, LabeledImages

CONFIGS = Path(__file__).parents[2] / "configs"
TEACHER_ARGS = {"depth": 1, "embed_dim": 32, "num_heads": 2}  # 16 px patches
STUDENT_ARGS = {"patch_size": 8, "depth": 1, "embed_dim": 24, "num_heads": 2}


@pytest.fixture
def teacher_file(tmp_path) -> Path:
    """A teacher's weights in timm's format, as a user's encoder file would be."""
    path = tmp_path / "teacher.pth"
    torch.save(create_backbone("vit_tiny_patch16_224", img_size=32, model_args=TEACHER_ARGS).state_dict(), path)
    return path


def tiny_task(teacher_file: Path, **kwargs) -> FeatureDistillationTask:
    return FeatureDistillationTask(
        teacher=BackboneConfig(
            name="vit_tiny_patch16_224", checkpoint=str(teacher_file), img_size=32, model_args=TEACHER_ARGS
        ),
        backbone=BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args=STUDENT_ARGS),
        teacher_precision="32",
        **kwargs,
    )


def test_teacher_stays_frozen_through_a_training_step(teacher_file):
    task = tiny_task(teacher_file)
    teacher = task.teacher.encoder
    loaded = torch.load(teacher_file, weights_only=True)
    assert all(torch.equal(v, loaded[k]) for k, v in teacher.state_dict().items())  # the file's weights
    assert not any(name.startswith("model.teacher") for name in task.state_dict())  # never in checkpoints
    assert {id(p) for p in teacher.parameters()}.isdisjoint(id(p) for p in task.parameters())
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = task.backbone.patch_embed.proj.weight.clone()
    task.train()
    assert not teacher.training and task.backbone.training
    optimizer = torch.optim.SGD(task.parameters(), lr=0.1)
    batch = LabeledImages(torch.randn(2, 3, 32, 32), torch.tensor([-1, -1]), torch.tensor([0, 1]), None)
    losses = task.compute_loss(task.forward_batch(batch, "train"), batch, "train")
    losses.total.backward()
    optimizer.step()
    assert set(losses.terms) == {"loss_patch", "loss_cls"} and losses.total.item() > 0
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert not torch.equal(task.backbone.patch_embed.proj.weight, student_before)


def test_cached_teacher_features_are_the_teachers(teacher_file, tmp_path):
    """First pass: the teacher runs and each image's features are stored; second: read back,
    equal to the teacher's (padded batch included); a random view of a cached file is refused."""
    task = tiny_task(teacher_file, teacher_cache=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="scale=\\[1.0, 1.0\\]"):
        task.open_cache(SimpleNamespace(scale=(0.2, 1.0), hflip=0.5))
    task._cache = task.open_cache(SimpleNamespace(scale=(1.0, 1.0), hflip=0.0))
    files = []
    for i in range(2):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(files[-1])
    sizes = ImageSizes.of([(32, 32), (20, 27)])
    images = torch.randn(2, 3, 32, 32)
    images[1, :, 20:], images[1, :, :, 27:] = 0, 0
    batch = LabeledImages(images, torch.tensor([-1, -1]), torch.tensor([1, 0]), sizes)
    direct = task.teacher(images, sizes)
    first = task.teacher_features(batch, files)
    second = task.teacher_features(batch, files)
    assert (task._cache.misses, task._cache.hits) == (2, 2)
    for a, b in ((first, direct), (second, direct)):
        torch.testing.assert_close(a.patches, b.patches)
        torch.testing.assert_close(a.pooled, b.pooled)
    assert second.image_sizes == direct.image_sizes
    cached_loss = task.compute_loss(task.model(images, sizes, second), batch, "val").total
    torch.testing.assert_close(cached_loss, task.compute_loss(task.model(images, sizes), batch, "val").total)
    flipped = batch._replace(image=images.flip(-1))
    with pytest.raises(ConfigError, match="another view"):
        task.teacher_features(flipped, files)
    assert isinstance(task._cache, TeacherFeatureCache)


def test_distilled_student_fine_tunes_through_the_cli(teacher_file, tmp_path, monkeypatch):
    """demo_distill.yaml at 32 px for 2 steps, then demo_cls.yaml from its checkpoint
    (`--model.init_args.backbone.checkpoint`): the classifier's encoder is the distilled student."""
    monkeypatch.chdir(tmp_path)
    tiny = [
        "--data.init_args.img_size=32",
        "--data.init_args.train_size=4",
        "--data.init_args.val_size=2",
        "--data.init_args.loader.batch_size=2",
        "--trainer.limit_val_batches=1",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger=false",
        "--trainer.precision=32-true",
        "--trainer.max_steps=2",
        f"--model.init_args.backbone.model_args={STUDENT_ARGS}",
    ]
    distill = main(
        ["fit", "--config", str(CONFIGS / "demo_distill.yaml"), *tiny]
        + [
            f"--model.init_args.teacher.checkpoint={teacher_file}",
            f"--model.init_args.teacher.model_args={TEACHER_ARGS}",
        ]
    )
    assert distill.trainer.global_step == 2
    ckpt = tmp_path / "runs/demo_distill/checkpoints/last.ckpt"
    student = {k.removeprefix("model.backbone."): v for k, v in torch.load(ckpt, weights_only=True)["state_dict"].items()
               if k.startswith("model.backbone.")}  # fmt: skip
    fine_tune = main(
        ["fit", "--config", str(CONFIGS / "demo_cls.yaml"), *tiny[:-2], "--trainer.max_steps=1"]
        + [f"--model.init_args.backbone.checkpoint={ckpt}", f"--model.init_args.backbone.model_args={STUDENT_ARGS}"]
        + ["--model.init_args.backbone.freeze=true"]  # (its encoder stays as loaded: compared below)
    )
    assert fine_tune.trainer.global_step == 1
    encoder = fine_tune.model.backbone.state_dict()
    assert set(encoder) == set(student)
    assert all(torch.equal(encoder[k], student[k]) for k in student)
