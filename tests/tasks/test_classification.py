"""ClassificationTask through the CLI, and its head."""

from pathlib import Path

import pytest
import torch
import yaml

from vitdense.backbone import VisionTransformer
from vitdense.data import LabeledImages
from vitdense.heads import ClassificationHead
from vitdense.tasks import BackboneConfig, ClassificationTask
from vitdense.types import ImageSizes

CONFIGS = Path(__file__).parents[2] / "configs"


def test_head_pools_valid_tokens_only():
    bb = VisionTransformer(img_size=32, embed_dim=32, depth=1, num_heads=2).eval()
    head = ClassificationHead(32, 3, pool="avg")
    torch.nn.init.normal_(head.fc.weight)
    x = torch.zeros(2, 3, 32, 64)
    x[0] = torch.randn(3, 32, 64)
    x[1, :, :, :32] = torch.randn(3, 32, 32)
    with torch.no_grad():
        logits = head(bb(x, ImageSizes.of([(32, 64), (32, 32)])))
        alone = head(bb(x[1:, :, :, :32]))
    torch.testing.assert_close(logits[1:], alone, rtol=0, atol=1e-5)


TINY = dict(img_size=32, model_args={"depth": 1})


def is_timm_init(fc: torch.nn.Linear) -> bool:
    """timm's init of a ViT's Linear layers, the head's too: trunc_normal std .02, zero bias."""
    return abs(fc.weight.std().item() - 0.02) < 0.002 and not fc.bias.any()


def is_zero(fc: torch.nn.Linear) -> bool:
    return not fc.weight.any() and not fc.bias.any()


def test_head_starts_at_timms_init_from_scratch_and_at_zero_on_pretrained_weights(tmp_path):
    import timm

    torch.manual_seed(0)
    assert is_timm_init(ClassificationTask(num_classes=10, backbone=BackboneConfig(**TINY)).head.fc)
    # a checkpoint file: the weights of a timm model (random, but loaded as trained weights)
    path = tmp_path / "vit.pth"
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, depth=1)
    torch.save(vit.state_dict(), path)
    assert is_zero(ClassificationTask(num_classes=10, backbone=BackboneConfig(checkpoint=str(path), **TINY)).head.fc)
    # hub weights: built at random, loaded in setup; the head already knows (nothing is fetched here)
    assert is_zero(ClassificationTask(num_classes=10, backbone=BackboneConfig(pretrained=True, **TINY)).head.fc)


@pytest.mark.parametrize("pretrained", [False, True])
def test_zero_init_given_overrides_the_backbone(tmp_path, pretrained):
    from functools import partial

    backbone = BackboneConfig(pretrained=pretrained, **TINY)
    zero = ClassificationTask(10, head=partial(ClassificationHead, zero_init=True), backbone=backbone)
    timm_init = ClassificationTask(10, head=partial(ClassificationHead, zero_init=False), backbone=backbone)
    assert is_zero(zero.head.fc) and is_timm_init(timm_init.head.fc)
    assert zero.hparams["head"]["init_args"]["zero_init"] is True  # recorded, so a checkpoint rebuilds it


def test_a_checkpoint_from_before_the_head_followed_the_backbone_loads_as_recorded(tmp_path):
    """Checkpoints written when the head was always zero-initialised record `zero_init: true`
    (the CLI writes every default): they load, with their trained head, and the head they
    record still starts at zero."""
    import lightning as L

    from vitdense.deploy.checkpoint import head_factory

    task = ClassificationTask(num_classes=3, backbone=BackboneConfig(**TINY))
    task.hparams["head"] = {
        "class_path": "vitdense.heads.ClassificationHead",
        "init_args": {"pool": "avg", "zero_init": True},
    }
    path = tmp_path / "old.ckpt"
    torch.save(
        {
            "state_dict": task.state_dict(),
            "hyper_parameters": dict(task.hparams),
            "pytorch-lightning_version": L.__version__,
        },
        path,
    )
    loaded = ClassificationTask.load_from_checkpoint(path)
    assert loaded.head.zero_init is True and loaded.head.pool == "avg"
    torch.testing.assert_close(loaded.head.fc.weight, task.head.fc.weight)  # the trained head, not zeros
    assert is_zero(head_factory(loaded.hparams["head"])(192, 3).fc)


@pytest.fixture
def demo_fit(tiny_runs):
    """demo_cls.yaml fitted through the CLI for 2 steps (8 images of 64 px, batch 4, one epoch
    with its validation), as the session's other tests use it (tests/tiny_runs.py): its
    LightningCLI."""
    return tiny_runs.cli("cls")


def test_demo_config_fits_through_the_cli(demo_fit):
    cfg = CONFIGS / "demo_cls.yaml"
    cli = demo_fit
    model = cli.model
    assert isinstance(model, ClassificationTask)
    assert isinstance(model.head, ClassificationHead) and model.head.pool == "avg"  # injected from YAML
    assert model.num_classes == yaml.safe_load(cfg.read_text())["data"]["init_args"]["num_classes"]  # linked
    assert cli.trainer.global_step == 2
    assert "train/loss_step" in cli.trainer.logged_metrics and "val/acc1" in cli.trainer.logged_metrics
    # optimizer from YAML, with the schedule's length filled in from the trainer
    sched = cli.trainer.lr_scheduler_configs[0]
    assert sched.interval == "step" and sched.scheduler.total_steps == 2
    assert type(cli.trainer.optimizers[0]).__name__ == "AdamW"


def test_mixup_trains_on_soft_targets_like_timm():
    from timm.loss import SoftTargetCrossEntropy

    task = ClassificationTask(
        num_classes=4, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, backbone=BackboneConfig(img_size=32)
    ).train()
    torch.nn.init.normal_(task.head.fc.weight, std=0.1)
    batch = LabeledImages(torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3]), torch.arange(4))
    torch.manual_seed(1)
    out = task.forward_batch(batch, "train")
    assert out.soft_targets.shape == (4, 4)
    torch.testing.assert_close(out.soft_targets.sum(-1), torch.ones(4))
    assert (out.soft_targets.max(-1).values < 1).all()  # smoothed and/or mixed, never one-hot
    expected = SoftTargetCrossEntropy()(out.logits, out.soft_targets)
    torch.testing.assert_close(task.compute_loss(out, batch, "train").total, expected)
    assert task.forward_batch(batch, "val").soft_targets is None  # evaluation sees plain labels, whatever the mode
    odd = LabeledImages(torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 2]), torch.arange(3))
    with pytest.raises(ValueError, match="even batch size"):
        task.forward_batch(odd, "train")


def test_checkpoint_reloads_with_load_from_checkpoint(demo_fit, tmp_path):
    cli = demo_fit
    path = tmp_path / "model.ckpt"
    cli.trainer.save_checkpoint(path)
    reloaded = ClassificationTask.load_from_checkpoint(path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), cli.model.eval()(x))
    assert reloaded.class_names == cli.datamodule.class_names
    assert reloaded.backbone_config == cli.model.backbone_config


def test_accuracy_is_the_fraction_of_images_not_a_class_average():
    task = ClassificationTask(num_classes=4, backbone=BackboneConfig(img_size=32))
    logits = torch.nn.functional.one_hot(torch.tensor([0, 0, 0, 2]), 4).float()
    task.val_metrics["acc1"].update(logits, torch.tensor([0, 0, 0, 1]))
    assert task.val_metrics["acc1"].compute() == pytest.approx(0.75)  # macro would say 1/3


def test_plateau_schedule_steps_per_epoch_on_the_monitored_metric():
    from functools import partial

    task = ClassificationTask(
        num_classes=3,
        backbone=BackboneConfig(img_size=32),
        lr_scheduler=partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="max"),
    )
    task.trainer = None
    config = task.configure_optimizers()["lr_scheduler"]
    assert config["interval"] == "epoch" and config["monitor"] == "val/acc1"


def test_python_api_checkpoint_loads_with_weights_only(fitted_from_python):
    # a classifier fitted by `lightning.Trainer(...).fit(task, datamodule)`, the checkpoint its
    # ModelCheckpoint wrote (`trainer.save_checkpoint`): the session's (tests/conftest.py)
    task, path = fitted_from_python
    reloaded = ClassificationTask.load_from_checkpoint(path)  # torch.load(weights_only=True) underneath
    assert reloaded.backbone_config == task.backbone_config
