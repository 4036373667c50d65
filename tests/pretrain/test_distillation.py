"""Feature distillation's objective: timm's FeatureDistillationTask on the class token, LightlyTrain
v2's patch-token loss (reference number), the loss by hand, padding, grid resampling, the cache."""

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.task.distillation import FeatureDistillationTask as TimmFeatureDistillation
from torch import nn

from vitdense.backbone.pretrained import create_backbone
from vitdense.backbone.vit import ViTFeatures
from vitdense.core.errors import ConfigError
from vitdense.core.precision import cpu_bf16_support
from vitdense.pretrain.distillation import (
    FeatureDistillation,
    FrozenTeacher,
    TeacherFeatureCache,
    TeacherFeatures,
    resample_to_grid,
    view_fingerprint,
)
from vitdense.types import ImageSizes

STUDENT = {"depth": 1, "embed_dim": 24, "num_heads": 2, "patch_size": 8}


def build(teacher_patch: int, teacher_blocks: int = 2):
    """Student (24 wide, 8 px patches), teacher (32 wide, 2 blocks), objective, 2 images of 32 px:
    in this order from seed 0 (LightlyTrain's reference number below was computed on these)."""
    torch.manual_seed(0)
    teacher_args = {"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": teacher_patch}
    student = create_backbone("vit_tiny_patch16_224", img_size=32, model_args=STUDENT)
    teacher = create_backbone("vit_tiny_patch16_224", img_size=32, model_args=teacher_args)
    objective = FeatureDistillation(24, 32, teacher_blocks=teacher_blocks)
    images = torch.randn(2, 3, 32, 32)
    # fp32 teacher: the references' numbers (bf16 where native is the default, `FrozenTeacher.bf16`)
    return student.eval(), FrozenTeacher(teacher, teacher_blocks, bf16=False), objective, images, teacher_args


def test_class_token_loss_equals_timms_feature_distillation():
    """timm 1.0.31's FeatureDistillationTask (pooled pre-logits, projector, MSE) on timm models with
    the same weights and the same projector: its kd_loss is our class-token loss."""
    student, teacher, objective, images, teacher_args = build(teacher_patch=16)
    output = objective(student(images), teacher(images))
    ours = objective.cls_loss(output)

    timm_student = timm.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, **STUDENT)
    timm_teacher = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=32, **teacher_args)
    timm_student.load_state_dict(student.state_dict(), strict=False)  # (its classifier stays random)
    timm_teacher.load_state_dict(teacher.encoder.state_dict())
    task = TimmFeatureDistillation(timm_student.eval(), timm_teacher, criterion=nn.CrossEntropyLoss(), verbose=False)
    task.trainable_module.projection.load_state_dict(objective.cls_proj.state_dict())
    reference = task(images, torch.tensor([0, 1]))["kd_loss"]
    assert ours.item() > 0.01
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_patch_loss_equals_lightlytrain_v2_on_equal_grids():
    """LightlyTrain's distillationv2 (teacher: the last 2 blocks' normalised patch tokens
    concatenated; student: linear projection, bilinear to the teacher's grid; MSELoss) on timm
    copies of these models: 1.01721811 (throwaway script with LightlyTrain's code, timm 1.0.31)."""
    student, teacher, objective, images, _ = build(teacher_patch=8)
    output = objective(student(images), teacher(images))
    assert output.target.shape == (2, 16, 64)
    assert objective.patch_loss(output).item() == pytest.approx(1.01721811, rel=1e-5)


def test_patch_loss_by_hand():
    """Two 1 x 2 grids, a projector of ones: the mean of the squared differences over tokens and channels."""
    objective = FeatureDistillation(embed_dim=1, teacher_dim=2, teacher_blocks=1, cls_weight=0.0)
    with torch.no_grad():
        objective.patch_proj.weight.fill_(1.0)
        objective.patch_proj.bias.zero_()
    tokens = torch.tensor([[[1.0], [2.0]]])  # [1, 2, 1]
    sizes = ImageSizes.full(1, (8, 16)).at_stride(8)
    student = ViTFeatures(None, tokens, (1, 2), sizes, tokens[:, :0])
    target = torch.tensor([[[[0.0, 1.0], [2.0, 4.0]]]])  # [1, 1, 2, 2]
    teacher = TeacherFeatures(target, torch.zeros(1, 2), sizes)
    output = objective(student, teacher)
    by_hand = ((1 - 0) ** 2 + (1 - 1) ** 2 + (2 - 2) ** 2 + (2 - 4) ** 2) / 4
    assert objective.patch_loss(output).item() == pytest.approx(by_hand)
    assert objective.losses(output)["loss"].item() == pytest.approx(by_hand)


def test_padding_tokens_are_left_out():
    """A padded image: what its padding tokens predict or would be taught changes nothing, the
    loss is the mean over the image's tokens only, and the teacher's padding never enters a target."""
    student, teacher, objective, images, _ = build(teacher_patch=16)
    sizes = ImageSizes.of([(32, 32), (12, 20)])  # the second: 2 x 3 of the 4 x 4 student tokens, 1 x 2 of the teacher's
    images[1, :, 12:] = 0
    images[1, :, :, 20:] = 0
    taught = teacher(images, sizes)
    output = objective(student(images, sizes), taught)
    assert output.keep.sum(1).tolist() == [16, 6]
    loss = objective.patch_loss(output)
    pad = ~output.keep
    moved = output._replace(pred=output.pred + 100 * pad[..., None], target=output.target - 50 * pad[..., None])
    assert objective.patch_loss(moved).item() == pytest.approx(loss.item())
    per_token = (output.pred - output.target).pow(2).mean(-1)
    assert loss.item() == pytest.approx(per_token[output.keep].mean().item(), rel=1e-5)
    # the teacher's one valid row, resampled along its width only: its padded row 1 (zeros) adds nothing
    row, _ = resample_to_grid(taught.patches[1:, :1], None, (1, 4))  # [1, 1, 4, C]
    targets = output.target[1].reshape(4, 4, -1)[:2, :3]
    torch.testing.assert_close(targets, row[0, 0, :3].expand(2, 3, -1))


def test_grid_resampling_is_bilinear_on_the_token_map():
    """Teacher 2 x 2 (16 px patches) to student 4 x 4 (8 px): align_corners=False bilinear, by hand
    along a row: a, 3a/4 + b/4, a/4 + 3b/4, b; with the right column padding, its zeros never enter."""
    a, b = 1.0, 5.0
    tokens = torch.tensor([[a, b], [a, b]]).reshape(1, 2, 2, 1)
    out, weight = resample_to_grid(tokens, None, (4, 4))
    row = [a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b]
    torch.testing.assert_close(out[0, :, :, 0], torch.tensor([row] * 4))
    assert torch.all(weight == 1)
    valid = torch.tensor([[[True, False], [True, False]]])
    out, weight = resample_to_grid(tokens * valid[..., None], valid, (4, 4))
    torch.testing.assert_close(out[0, :, :2, 0], torch.full((4, 2), a))  # only a is read where a is
    assert weight[0, 0].tolist() == [1.0, 0.75, 0.25, 0.0]
    # teacher and student of other patch sizes on real encoders: the target has the student's grid
    student, teacher, objective, images, _ = build(teacher_patch=16)
    output = objective(student(images), teacher(images))
    assert teacher(images).patches.shape == (2, 2, 2, 64) and output.target.shape == (2, 16, 64)


def test_teacher_runs_frozen_without_gradients():
    student, teacher, objective, images, _ = build(teacher_patch=16)
    teacher.train()
    assert not teacher.training and not teacher.encoder.training
    assert not any(p.requires_grad for p in teacher.parameters())
    features = teacher(images)
    assert not features.patches.requires_grad and features.patches.dtype == torch.float32
    # bf16 by default only where the CPU computes it natively; the features differ by bf16's rounding then
    auto = FrozenTeacher(teacher.encoder)
    assert auto.uses_bf16(images.device) == cpu_bf16_support().native
    assert not FrozenTeacher(teacher.encoder, bf16=False).uses_bf16(images.device)
    bf16 = FrozenTeacher(teacher.encoder, blocks=2, bf16=True)(images)
    assert 0 < (bf16.patches - features.patches).abs().max() < 0.2


def test_cache_round_trip_and_refused_other_view(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(b"not read: the key is the file's path, size and time")
    config = type("C", (), {"name": "t", "pretrained": False, "img_size": None, "model_args": None, "checkpoint": None})
    key = TeacherFeatureCache.teacher_key(config(), 1, False)
    cache = TeacherFeatureCache(tmp_path / "cache", key)
    view = torch.randn(3, 8, 8)
    assert cache.get(image, view_fingerprint(view)) is None
    patches, pooled = torch.randn(2, 3, 5), torch.randn(5)
    cache.put(image, view_fingerprint(view), patches, pooled)
    got = TeacherFeatureCache(tmp_path / "cache", key).get(image, view_fingerprint(view.clone()))
    assert torch.equal(got[0], patches) and torch.equal(got[1], pooled)
    with pytest.raises(ConfigError, match="random augmentation"):
        cache.get(image, view_fingerprint(view.flip(-1)))
    # another teacher (here: two blocks instead of one) has another key, and so reads nothing of these
    other = TeacherFeatureCache.teacher_key(config(), 2, False)
    assert TeacherFeatureCache.teacher_key(config(), 1, False, scale=2.0) not in (key, other)
    assert other != key and TeacherFeatureCache(tmp_path / "cache", other).get(image, view_fingerprint(view)) is None


def test_teacher_at_another_image_size():
    """A teacher with twice the student's patch size sees the images at twice their size
    (`scale=2`): its grid is the student's, padded images included (20 x 27 -> 40 x 54 px)."""
    student, teacher, objective, images, _ = build(teacher_patch=16)
    sizes = ImageSizes.of([(32, 32), (20, 27)])
    images[1, :, 20:], images[1, :, :, 27:] = 0, 0
    scaled = FrozenTeacher(teacher.encoder, blocks=2, bf16=False, scale=2.0)
    features = scaled(images, sizes)
    assert features.image_sizes.grids == ((4, 4), (3, 4)) and features.patches.shape[1:3] == (4, 4)
    big = F.interpolate(images, size=(64, 64), mode="bilinear", align_corners=False)
    direct = teacher(big, ImageSizes(((64, 64), (40, 54)), (64, 64)))
    torch.testing.assert_close(features.patches, direct.patches)
    output = objective(student(images, sizes), features)
    assert output.keep.sum(1).tolist() == [16, 12]
    torch.testing.assert_close(output.target.reshape(2, 4, 4, -1), features.patches)  # equal grids: as they are
