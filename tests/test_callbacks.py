"""vitdense.training.callbacks.WarmupEMAWeightAveraging: RF-DETR's EMA schedule inside Lightning."""

import math

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vitdense.training.callbacks import WarmupEMAWeightAveraging


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(3, 2)
        self.seen: list[dict[str, torch.Tensor]] = []  # the weights after every optimizer step

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.seen.append({k: v.detach().clone() for k, v in self.layer.state_dict().items()})

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_average_follows_rf_detrs_model_ema_schedule(tmp_path):
    """After 8 steps the averaged weights equal RF-DETR's `ModelEma` recursion written out
    (decay_k = decay * (1 - exp(-k / tau)) at update k), from the first update's copy."""
    decay, tau = 0.9, 3.0
    data = TensorDataset(torch.randn(32, 3), torch.randn(32, 2))
    model = Regression()
    ema = WarmupEMAWeightAveraging(decay=decay, warmup_tau=tau)
    trainer = L.Trainer(
        max_steps=8,
        callbacks=[ema],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, DataLoader(data, batch_size=4))
    assert len(model.seen) == 8
    expected = dict(model.seen[0])
    for k, weights in enumerate(model.seen[1:], start=2):
        d = decay * (1 - math.exp(-k / tau))
        expected = {n: d * expected[n] + (1 - d) * weights[n] for n in expected}
    # at the end of fit Lightning copies the average into the model
    for name, value in model.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(model.layer.weight, model.seen[-1]["weight"])  # not simply the last weights
