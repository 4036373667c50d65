"""The plain models (`vitdense.models`) from a checkpoint alone give the numbers the Trainer
gives: `vitdense.load_model(ckpt)` called on a padded batch of mixed sizes equals
`Trainer.predict` of the same checkpoint's task, for every task."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader

import vitdense
from vitdense.deploy.checkpoint import load_task
from vitdense.models.classification import ImageClassifier, LinearProbe
from vitdense.models.detection import DETRDetector
from vitdense.models.segmentation import Segmenter
from vitdense.tasks import BackboneConfig, LinearProbeTask
from vitdense.types import BoxTargets, DetectedImages, LabeledImages, SegmentedImages
from vitdense.types.collate import pad_collate

SIZES = [(32, 40), (27, 32), (32, 32), (20, 36)]


class Keep(BasePredictionWriter):
    """A writer that writes nothing (so that the task adds none of its own)."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")

    def write_on_batch_end(self, *args, **kwargs) -> None:
        pass


def through_the_trainer(task: L.LightningModule, samples: list) -> tuple[list, list]:
    """(predictions of `Trainer.predict`, the collated batches it ran on), two images a batch."""
    loader = DataLoader(samples, batch_size=2, collate_fn=pad_collate)
    trainer = L.Trainer(accelerator="cpu", logger=False, callbacks=[Keep()], enable_progress_bar=False)
    return trainer.predict(task, dataloaders=loader), list(loader)


def images() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(3, h, w, generator=generator) for h, w in SIZES]


def test_classifier_equals_the_trainer(trained):
    _, ckpt = trained["cls"]
    model = vitdense.load_model(ckpt)
    assert isinstance(model, ImageClassifier) and not model.training
    predictions, batches = through_the_trainer(
        load_task(ckpt), [LabeledImages(x, 0, i) for i, x in enumerate(images())]
    )
    for prediction, batch in zip(predictions, batches, strict=True):
        with torch.no_grad():
            probs = model(batch.image, batch.image_sizes).softmax(-1)
        torch.testing.assert_close(probs.gather(1, prediction.classes), prediction.probs, rtol=0, atol=1e-6)
        assert torch.equal(probs.argmax(-1), prediction.classes[:, 0])


def test_segmenter_equals_the_trainer(trained):
    _, ckpt = trained["seg"]
    model, task = vitdense.load_model(ckpt), load_task(ckpt)
    assert isinstance(model, Segmenter) and model.window == task.window
    samples = [
        SegmentedImages.of(x, torch.zeros(h + 3, w + 5, dtype=torch.int64), i)
        for i, (x, (h, w)) in enumerate(zip(images(), SIZES, strict=True))
    ]  # label maps at another size than the images
    predictions, batches = through_the_trainer(task, samples)
    for prediction, batch in zip(predictions, batches, strict=True):
        logits = model.segment(batch.image, batch.image_sizes, batch.mask_sizes.sizes, task.test_stride)
        for labels, mine, (h, w) in zip(prediction.labels, logits, batch.mask_sizes.sizes, strict=True):
            assert mine.shape[-2:] == labels.shape == (h, w)
            assert torch.equal(mine[0].argmax(0), labels)
        # the model's plain forward: pixel logits of the padded batch at its own size
        with torch.no_grad():
            assert model(batch.image, batch.image_sizes).shape == (2, task.num_classes, *batch.image.shape[-2:])


def test_detector_equals_the_trainer(trained):
    _, ckpt = trained["det"]
    model = vitdense.load_model(ckpt)
    assert isinstance(model, DETRDetector)
    none = BoxTargets(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64))
    samples = [
        DetectedImages(x, none, i, orig_sizes=(2 * h, 3 * w))
        for i, (x, (h, w)) in enumerate(zip(images(), SIZES, strict=True))
    ]
    predictions, batches = through_the_trainer(load_task(ckpt), samples)
    for prediction, batch in zip(predictions, batches, strict=True):
        boxes, scores, labels = model.detect(batch.image, batch.image_sizes, batch.orig_sizes)
        for ours, theirs in ((boxes, prediction.boxes), (scores, prediction.scores), (labels, prediction.labels)):
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("avgpool", [False, True])
def test_linear_probe_equals_its_task(avgpool):
    task = LinearProbeTask(
        num_classes=3,
        lrs=[0.1, 0.01],
        avgpool=avgpool,
        backbone=BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 2}),
    ).eval()
    task.best_head.fill_(1)
    assert isinstance(task.model, LinearProbe) and not task.model.backbone.training
    predictions, batches = through_the_trainer(task, [LabeledImages(x, 0, i) for i, x in enumerate(images())])
    for prediction, batch in zip(predictions, batches, strict=True):
        with torch.no_grad():
            logits = task.model(batch.image, batch.image_sizes)[int(task.model.best_head)]
        assert torch.equal(logits.softmax(-1).argmax(-1), prediction.classes[:, 0])


def test_old_checkpoint_keys_load_into_the_model(trained, tmp_path):
    """Checkpoints written before the model object (keys `backbone.*`, `head.*`) still load."""
    _, ckpt = trained["cls"]
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    checkpoint["state_dict"] = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    assert any(k.startswith("backbone.") for k in checkpoint["state_dict"])
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    new, restored = vitdense.load_model(ckpt), vitdense.load_model(old)
    for (name, a), (_, b) in zip(new.state_dict().items(), restored.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
