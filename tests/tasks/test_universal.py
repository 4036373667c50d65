"""UniversalSegmentationTask: EoMT's annealing, its losses and evaluation, semantic on label maps."""

from functools import partial

import lightning as L
import pytest
import torch

from vitdense.data import LoaderConfig, SyntheticSegmentationDataModule
from vitdense.data.collate import pad_collate
from vitdense.errors import ConfigError
from vitdense.heads.eomt import EoMTHead
from vitdense.losses import MaskSetCriterion
from vitdense.metrics import LossMeans
from vitdense.tasks import BackboneConfig
from vitdense.tasks.universal import UniversalSegmentationTask, label_map_segments
from vitdense.types import PanopticImages, SegmentTargets

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 3})
HEAD = partial(EoMTHead, num_queries=6, num_blocks=2)
CRITERION = partial(MaskSetCriterion, num_points=64)


def task(**kwargs) -> UniversalSegmentationTask:
    torch.manual_seed(0)
    args = {"num_classes": 3, "is_thing": [True, True, False], "head": HEAD, "criterion": CRITERION, "backbone": TINY}
    return UniversalSegmentationTask(**{**args, **kwargs})


def segments(h: int, w: int, seed: int) -> SegmentTargets:
    """A stuff region, and two things (one of them a crowd when asked)."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(3, h, w, dtype=torch.bool)
    masks[0, : h // 2] = True
    y, x = (int(v) for v in torch.randint(0, h // 2, (2,), generator=g))
    masks[1, h // 2 + y // 2 : h // 2 + y // 2 + 6, x : x + 7] = True
    masks[2, 2 : 2 + h // 4, w // 2 : w // 2 + w // 4] = True
    masks[0] &= ~masks[2]
    return SegmentTargets(masks, torch.tensor([2, 0, 1]), torch.zeros(3, dtype=torch.bool))


def panoptic_batch(sizes, first=0):
    samples = []
    for i, (h, w) in enumerate(sizes):
        t = segments(h, w, first + i)
        image = torch.randn(3, h, w, generator=torch.Generator().manual_seed(first + i))
        samples.append(PanopticImages(image, t, first + i, (h, w), (2 * h, 2 * w), resized(t)))
    return pad_collate(samples)


def resized(t: SegmentTargets) -> SegmentTargets:
    """The same segments at twice the size (an evaluation annotation at its original size)."""
    masks = t.masks.repeat_interleave(2, 1).repeat_interleave(2, 2)
    return t._replace(masks=masks)


def test_annealing_follows_eomts_polynomial():
    """EoMT's `mask_annealing` (training/lightning_module.py): 1 before the start, (1 -
    progress) ** 0.9 within, 0 from the end step on; numbers from that function."""
    t = task(attn_mask_annealing_start_steps=[10, 20], attn_mask_annealing_end_steps=[20, 30])
    assert [t.mask_probability(0, s) for s in (0, 10, 15, 19, 20, 99)] == pytest.approx(
        [1.0, 1.0, 0.535887, 0.125893, 0.0, 0.0], abs=1e-6
    )
    assert t.mask_probability(1, 15) == 1.0
    with pytest.raises(ConfigError, match="one entry per joined block"):
        task(attn_mask_annealing_start_steps=[1], attn_mask_annealing_end_steps=[2])
    with pytest.raises(ConfigError, match="or neither"):
        task(attn_mask_annealing_start_steps=[1, 2])


def test_label_maps_become_one_segment_per_class_present():
    label_map = torch.tensor([[0, 0, 255], [2, 2, 7]])
    found = label_map_segments(label_map, num_classes=3)
    assert found.labels.tolist() == [0, 2]  # 255 is void; 7 is no class of 3
    assert found.masks.tolist() == [[[True, True, False], [False, False, False]], [[False] * 3, [True, True, False]]]


def test_training_loss_has_every_block_and_reaches_the_queries():
    t = task().train()
    b = panoptic_batch([(32, 32), (24, 40)])
    losses = t.compute_loss(t.forward_batch(b, "train"), b, "train")
    assert set(losses.terms) == {f"loss_{n}{s}" for n in ("ce", "mask", "dice") for s in ("", "_0", "_1")}
    losses.total.backward()
    assert t.model.head.q.weight.grad.abs().sum() > 0
    assert t.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_evaluation_losses_are_the_images_own_whatever_the_batching():
    """Each image's loss as if it ran alone (its part of the grid, its own points): the
    dataset figure of 3 images is the same in one batch as in batches of 2 and 1."""
    t = task().eval()
    sizes = [(32, 32), (24, 40), (40, 16)]

    def figures(batches):
        means = LossMeans()
        with torch.no_grad():
            for b in batches:
                means.update("val", t.compute_loss(t.forward_batch(b, "val"), b, "val"), len(b.targets))
        return {k: float(v) for k, v in means.pop("val").items()}

    together = figures([panoptic_batch(sizes)])
    apart = figures([panoptic_batch(sizes[:2]), panoptic_batch(sizes[2:], first=2)])
    assert together.keys() == apart.keys() and "val/loss" in together
    for key in together:
        assert apart[key] == pytest.approx(together[key], rel=1e-5), key


def test_evaluation_reports_panoptic_instance_and_semantic_figures():
    t = task(evaluate=["panoptic", "instance", "semantic"]).eval()
    b = panoptic_batch([(32, 32), (24, 40)])
    with torch.no_grad():
        t.update_metrics(t.val_metrics, t.forward_batch(b, "val"), b, "val")
    result = t.val_metrics.compute()
    summary = t.summarize(result, "val")
    assert {"val/PQ", "val/PQ_th", "val/PQ_st", "val/map", "val/map_small", "val/mIoU"} <= summary.keys()
    assert t.monitor == "val/PQ"
    assert "PQ" in t.format_table(result, "val")


def test_semantic_segmentation_trains_on_label_maps():
    """The semantic task reads SegmentedImages (today's semantic data), trains with the mask
    loss and validates mIoU in sliding windows; its predictions are label maps."""
    data = SyntheticSegmentationDataModule(
        num_classes=3, img_size=32, train_size=8, val_size=3, loader=LoaderConfig(batch_size=4, num_workers=0)
    )
    t = task(segmentation="semantic", is_thing=None, num_classes=3)
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(t, datamodule=data)
    assert 0 <= float(trainer.callback_metrics["val/mIoU"]) <= 1
    assert t.monitor == "val/mIoU"
    data.setup("validate")
    b = next(iter(data.val_dataloader()))
    prediction = t.eval().predict_step(b, 0)
    assert [tuple(x.shape) for x in prediction.labels] == [tuple(s) for s in b.mask_sizes.sizes]
