"""ClassificationTask through the CLI, and its head."""

from pathlib import Path

import torch
import yaml

from vitdense.backbone import VisionTransformer
from vitdense.cli import main
from vitdense.heads import ClassificationHead
from vitdense.tasks import ClassificationTask

CONFIGS = Path(__file__).parents[2] / "configs"


def test_head_is_zero_initialised_and_pools_valid_tokens_only():
    bb = VisionTransformer(img_size=32, embed_dim=32, depth=1, num_heads=2).eval()
    head = ClassificationHead(32, 3, pool="avg")
    assert not head.fc.weight.any() and not head.fc.bias.any()
    torch.nn.init.normal_(head.fc.weight)
    x = torch.zeros(2, 3, 32, 64)
    x[0] = torch.randn(3, 32, 64)
    x[1, :, :, :32] = torch.randn(3, 32, 32)
    mask = torch.zeros(2, 32, 64, dtype=torch.bool)
    mask[1, :, 32:] = True
    with torch.no_grad():
        logits = head(bb(x, pad_mask=mask))
        alone = head(bb(x[1:, :, :, :32]))
    torch.testing.assert_close(logits[1:], alone, rtol=0, atol=1e-5)


def test_demo_config_fits_through_the_cli(tmp_path):
    cfg = CONFIGS / "demo_cls.yaml"
    cli = main(["fit", "--config", str(cfg), "--trainer.fast_dev_run=2", f"--trainer.default_root_dir={tmp_path}"])
    model = cli.model
    assert isinstance(model, ClassificationTask)
    assert model.num_classes == yaml.safe_load(cfg.read_text())["data"]["init_args"]["num_classes"]  # linked
    assert cli.trainer.global_step == 2
    assert "train/loss_step" in cli.trainer.logged_metrics and "val/acc1" in cli.trainer.logged_metrics
    # optimizer from YAML, with the schedule's length filled in from the trainer
    sched = cli.trainer.lr_scheduler_configs[0]
    assert sched.interval == "step" and sched.scheduler.total_steps == 2
    assert type(cli.trainer.optimizers[0]).__name__ == "AdamW"
