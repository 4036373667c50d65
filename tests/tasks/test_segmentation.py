"""SegmentationTask: training on crops, whole-image evaluation at the label's size."""

import torch

from vitdense.heads import LinearDecoder
from vitdense.tasks import BackboneConfig, SegmentationTask
from vitdense.types import SegmentedImages
from vitdense.types.collate import pad_collate

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32)


def batch(sizes, mask_sizes=None, k=3):
    mask_sizes = mask_sizes or sizes
    images = [torch.randn(3, h, w) for h, w in sizes]
    masks = [torch.randint(0, k, size) for size in mask_sizes]
    return pad_collate([SegmentedImages(x, m, i) for i, (x, m) in enumerate(zip(images, masks, strict=True))])


def test_training_step_is_pixel_cross_entropy_ignoring_255():
    task = SegmentationTask(num_classes=3, backbone=TINY).train()
    b = batch([(32, 32), (32, 32)])
    out = task.forward_batch(b, "train")
    assert out.logits[0].shape == (2, 3, 32, 32)
    loss = task.compute_loss(out, b, "train").total
    expected = torch.nn.functional.cross_entropy(out.logits[0], b.mask, ignore_index=255)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert task.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_evaluation_scores_each_image_at_its_label_size():
    task = SegmentationTask(num_classes=3, head=LinearDecoder, backbone=TINY, window=64).eval()
    b = batch([(45, 37), (30, 50)], mask_sizes=[(90, 74), (15, 25)])
    with torch.no_grad():
        out = task.forward_batch(b, "val")
        assert [tuple(x.shape) for x in out.logits] == [(1, 3, 90, 74), (1, 3, 15, 25)]
        assert [tuple(t.shape) for t in out.targets] == [(1, 90, 74), (1, 15, 25)]
        # one window over a whole small image is the plain forward, resized to the label
        alone = task(b.image[1:, :, :30, :50])
        resized = torch.nn.functional.interpolate(alone, size=(15, 25), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out.logits[1], resized)
    task.update_metrics(task.val_metrics, out, b, "val")
    labelled = sum(int((t != 255).sum()) for t in out.targets)
    assert int(task.val_metrics["seg"].confmat.sum()) == labelled


def test_class_weights_follow_torch_weighted_mean():
    weights = [1.0, 2.0, 0.5]
    task = SegmentationTask(num_classes=3, backbone=TINY, class_weights=weights).train()
    b = batch([(32, 32)])
    out = task.forward_batch(b, "train")
    expected = torch.nn.functional.cross_entropy(out.logits[0], b.mask, weight=torch.tensor(weights), ignore_index=255)
    torch.testing.assert_close(task.compute_loss(out, b, "train").total, expected)


def test_the_stage_argument_picks_crops_validation_windows_or_test_windows(monkeypatch):
    # the module's train/eval mode must not matter: only the stage does
    task = SegmentationTask(num_classes=3, backbone=TINY, window=32, test_scales=[1.0, 0.5], test_flip=True).eval()
    calls = []
    monkeypatch.setattr(task, "segment", lambda b, stride, scales, flip: calls.append((stride, scales, flip)) or [])
    b = batch([(32, 32)])
    with torch.no_grad():
        assert task.forward_batch(b, "train").logits[0].shape == (1, 3, 32, 32)
        for stage in ("val", "test", "predict"):
            task.forward_batch(b, stage)
    assert calls == [(32, [1.0], False), (32, [1.0, 0.5], True), (32, [1.0, 0.5], True)]  # stride = window
