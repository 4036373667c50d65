"""LinearProbeTask: frozen backbone stays bit-identical, several learning rates, feature cache."""

import lightning as L
import pytest
import timm
import torch

from vitdense.backbone import create_backbone
from vitdense.data import LoaderConfig, SyntheticClassificationDataModule
from vitdense.heads import probe_features
from vitdense.tasks import BackboneConfig, LinearProbeTask

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, drop_path_rate=0.1)


def fit(task, data, max_epochs=1, limit_batches=3):
    trainer = L.Trainer(
        max_epochs=max_epochs,
        limit_train_batches=limit_batches,
        limit_val_batches=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(task, datamodule=data)
    return trainer


def test_backbone_bit_identical_and_best_of_several_lrs():
    data = SyntheticClassificationDataModule(
        num_classes=4, img_size=32, train_size=24, val_size=16, loader=LoaderConfig(batch_size=8)
    )
    task = LinearProbeTask(num_classes=4, lrs=[1e-3, 1e-1], backbone=TINY)
    before = {k: v.clone() for k, v in task.backbone.state_dict().items()}
    heads_before = [h.fc.weight.clone() for h in task.head]
    trainer = fit(task, data, max_epochs=2)
    after = task.backbone.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(not torch.equal(h0, h.fc.weight) for h0, h in zip(heads_before, task.head, strict=True))
    base_lrs = [g["initial_lr"] for g in trainer.optimizers[0].param_groups]
    assert base_lrs == pytest.approx([1e-3, 1e-1])  # each head its own rate
    m = trainer.logged_metrics
    assert m["val/acc1"] == max(m["val/acc1_lr0"], m["val/acc1_lr1"])
    assert int(m["val/best_lr_index"]) == int(m["val/acc1_lr1"] > m["val/acc1_lr0"])


def test_test_reports_the_head_validation_picked_not_the_best_on_test():
    task = LinearProbeTask(num_classes=4, lrs=[1e-3, 1e-1, 1.0], backbone=TINY)
    task.best_head.fill_(1)  # validation picked the second rate
    result = {
        "test/acc1_lr0": torch.tensor(0.9),
        "test/acc1_lr1": torch.tensor(0.5),
        "test/acc1_lr2": torch.tensor(0.7),
    }
    summary = task.summarize(result, "test")
    assert summary["test/acc1"] == 0.5 and summary["test/best_lr_index"] == 1


def test_backbone_stays_in_eval_mode_while_training():
    task = LinearProbeTask(num_classes=3, backbone=TINY)
    task.train()
    assert task.head.training and not task.backbone.training
    assert not any(p.requires_grad for p in task.backbone.parameters())


def test_feature_cache_skips_the_backbone_after_the_first_pass():
    data = SyntheticClassificationDataModule(
        num_classes=4, img_size=32, train_size=16, val_size=8, loader=LoaderConfig(batch_size=8)
    )
    task = LinearProbeTask(num_classes=4, cache_features=True, backbone=TINY)
    calls = []
    task.backbone.register_forward_hook(lambda *_: calls.append(1))
    fit(task, data, max_epochs=1, limit_batches=2)
    first = len(calls)
    assert first == 2 + 1  # 2 train batches, the 1 val batch once (sanity check; validation reads the cache)
    fit(task, data, max_epochs=1, limit_batches=2)
    assert len(calls) == first  # second fit: every feature came from the cache
    batch = next(iter(data.train_dataloader()))
    task.eval()
    cached = torch.stack([task._cache[("train", int(i))] for i in batch.index])
    torch.testing.assert_close(cached, task.extract(batch.image), rtol=0, atol=1e-5)


def test_dinov2_features_match_timm_intermediates(tmp_path):
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0).eval()
    torch.save(ref.state_dict(), tmp_path / "w.pth")
    ours = create_backbone("vit_tiny_patch16_224", checkpoint=tmp_path / "w.pth").eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        feats = probe_features(ours, x, None, n_last_blocks=4, avgpool=True)
        spatial, prefixes = zip(
            *ref.forward_intermediates(x, indices=4, norm=True, return_prefix_tokens=True, intermediates_only=True),
            strict=True,
        )
    expected = torch.cat([p[:, 0] for p in prefixes] + [spatial[-1].flatten(2).mean(-1)], dim=-1)
    assert feats.shape == (2, 5 * 192)
    torch.testing.assert_close(feats, expected, rtol=0, atol=1e-5)


def test_cached_features_are_kept_per_split():
    data = SyntheticClassificationDataModule(
        num_classes=4, img_size=32, train_size=16, val_size=8, loader=LoaderConfig(batch_size=8)
    )
    task = LinearProbeTask(num_classes=4, cache_features=True, backbone=TINY)
    calls = []
    task.backbone.register_forward_hook(lambda *_: calls.append(1))
    trainer = fit(task, data, max_epochs=1, limit_batches=2)
    before = len(calls)
    trainer.test(task, datamodule=data, verbose=False)
    assert len(calls) == before + 1  # the test images (same indices as val) get their own features
    assert {split for split, _ in task._cache} == {"train", "val", "test"}
