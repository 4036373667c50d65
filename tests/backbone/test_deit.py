"""timm's DeiT with a distillation token (`deit_*_distilled_*`) as a vitdense backbone and
classifier: features and logits equal timm's `VisionTransformerDistilled` on the same weights."""

from __future__ import annotations

import pytest
import timm
import torch

from vitdense.backbone import create_backbone
from vitdense.heads import DistilledClassificationHead
from vitdense.models.classification import ImageClassifier

NAME = "deit_tiny_distilled_patch16_224"
ARGS = {"embed_dim": 24, "depth": 2, "num_heads": 2, "img_size": 32, "patch_size": 8}


@pytest.fixture(scope="module")
def timm_deit(tmp_path_factory):
    """timm's tiny distilled DeiT (random weights, 5 classes) and its state dict as a file."""
    torch.manual_seed(0)
    ref = timm.create_model(NAME, pretrained=False, num_classes=5, **ARGS).eval()
    with torch.no_grad():  # non-zero tokens and heads, so that every part is compared
        for p in (ref.cls_token, ref.dist_token, ref.pos_embed):
            p.normal_(std=0.5)
    path = tmp_path_factory.mktemp("deit") / "deit.pth"
    torch.save(ref.state_dict(), path)
    return ref, path


def test_features_and_logits_equal_timm(timm_deit):
    ref, path = timm_deit
    backbone = create_backbone(NAME, checkpoint=path, model_args=ARGS).eval()
    assert backbone.num_prefix_tokens == 2 and backbone.dist_token is not None
    head = DistilledClassificationHead(24, 5)
    assert head.load_timm_heads(torch.load(path, weights_only=True))
    model = ImageClassifier(backbone, head).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        f = backbone(x)
        tokens = ref.forward_features(x)
        torch.testing.assert_close(f.prefix_tokens, tokens[:, :2])  # class, distillation
        torch.testing.assert_close(f.cls_token, tokens[:, 0])
        torch.testing.assert_close(f.patch_tokens, tokens[:, 2:])
        torch.testing.assert_close(model(x), ref(x))  # inference: the mean of both heads
    # distilled training: both logits, as timm's set_distilled_training
    ref.set_distilled_training(True)
    head.set_distilled_training(True)
    ref.train()
    model.train()
    with torch.no_grad():
        for ours, theirs in zip(model(x), ref(x), strict=True):
            torch.testing.assert_close(ours, theirs)
    ref.set_distilled_training(False)
    ref.eval()


def test_position_embeddings_resample_as_timm_dynamic_size(timm_deit):
    """Both prefix entries of the table kept, the patch part resampled (timm's dynamic_img_size)."""
    ref, path = timm_deit
    dynamic = timm.create_model(NAME, pretrained=False, num_classes=5, dynamic_img_size=True, **ARGS).eval()
    dynamic.load_state_dict(ref.state_dict())
    backbone = create_backbone(NAME, checkpoint=path, model_args=ARGS).eval()
    x = torch.randn(1, 3, 48, 40)
    with torch.no_grad():
        f = backbone(x)
        torch.testing.assert_close(torch.cat([f.prefix_tokens, f.patch_tokens], 1), dynamic.forward_features(x))


def test_task_keeps_both_timm_heads_from_the_backbone_file(timm_deit):
    from vitdense.tasks import BackboneConfig, ClassificationTask

    ref, path = timm_deit
    task = ClassificationTask(
        num_classes=5,
        head=DistilledClassificationHead,
        backbone=BackboneConfig(NAME, checkpoint=str(path), model_args=ARGS),
    ).eval()
    for key in ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias"):
        torch.testing.assert_close(task.head.state_dict()[key], ref.state_dict()[key])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(task(x), ref(x))
