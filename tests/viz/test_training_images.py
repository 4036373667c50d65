"""What training logs besides scalars: validation pictures for every task, learning rates
and images per second, through TensorBoard (a dependency) or any other logger."""

from functools import partial

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vitdense.core.draw import GREEN, RED, blend, default_palette
from vitdense.data import LoaderConfig, SyntheticClassificationDataModule, SyntheticSegmentationDataModule
from vitdense.data.multitask import MultiTaskDataModule
from vitdense.data.synthetic.detection import SyntheticDetectionDataModule
from vitdense.heads import DETRHead
from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, MultiTask, SegmentationTask
from vitdense.tasks.pictures import draw_classified, draw_detected, draw_segmented
from vitdense.trainer import Trainer
from vitdense.viz.callbacks import ImagesPerSecond, ValidationImages

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1, "patch_size": 8})


def fit(task, datamodule, logger, callbacks=(), batches=2):
    trainer = Trainer(
        max_epochs=1,
        limit_train_batches=batches,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=logger,
        callbacks=list(callbacks),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(task, datamodule)
    return trainer


def events(logger):
    accumulator = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


def decoded(event):
    from io import BytesIO

    from PIL import Image

    return np.asarray(Image.open(BytesIO(event.encoded_image_string)))


def classification():
    data = SyntheticClassificationDataModule(
        num_classes=3, img_size=32, train_size=8, val_size=12, loader=LoaderConfig(batch_size=4)
    )
    return ClassificationTask(num_classes=3, class_names=data.class_names, backbone=TINY), data


def segmentation():
    data = SyntheticSegmentationDataModule(
        num_classes=3, img_size=32, train_size=8, val_size=12, loader=LoaderConfig(batch_size=4)
    )
    return SegmentationTask(num_classes=3, class_names=data.class_names, backbone=TINY), data


def detection(tmp_path):
    data = SyntheticDetectionDataModule(
        root=str(tmp_path / "det"),
        num_classes=3,
        img_size=32,
        train_size=8,
        val_size=12,
        loader=LoaderConfig(batch_size=4),
    )
    data.prepare_data()
    head = partial(DETRHead, hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=10, dec_layers=1)
    return DetectionTask(num_classes=3, class_names=data.class_names, head=head, backbone=TINY), data


@pytest.mark.parametrize("make", ["classification", "segmentation", "detection"])
def test_fit_logs_pictures_learning_rates_and_throughput_to_tensorboard(make, tmp_path):
    task, data = detection(tmp_path) if make == "detection" else globals()[make]()
    logger = TensorBoardLogger(tmp_path / "runs", name="tb")
    trainer = fit(task, data, logger)
    found = events(logger)
    images = found.Tags()["images"]
    # classification: one grid of the 8 samples; the dense tasks: one picture per sample
    expected = ["val/images/0"] if make == "classification" else [f"val/images/{i}" for i in range(8)]
    assert sorted(images) == sorted(expected)
    picture = decoded(found.Images(expected[0])[-1])
    assert picture.ndim == 3 and picture.shape[2] == 3 and min(picture.shape[:2]) >= 64
    assert found.Images(expected[0])[-1].step == trainer.global_step
    scalars = found.Tags()["scalars"]
    assert "train/images_per_sec" in scalars and any(t.startswith("lr-AdamW") for t in scalars)
    rates = [e.value for e in found.Scalars("train/images_per_sec")]
    assert len(rates) == 2 and all(r > 0 for r in rates)  # one per batch at log_every_n_steps=1


def test_the_same_samples_every_epoch_spread_over_the_split():
    callback = ValidationImages(num_images=4)
    assert callback.select(range(10)) == [0, 3, 6, 9]
    assert callback.select(range(2)) == [0, 1]
    assert ValidationImages(num_images=0).select(range(5)) == []


def test_any_other_logger_gets_png_files_and_a_users_callback_wins(tmp_path):
    task, data = segmentation()
    logger = CSVLogger(tmp_path, name="csv")
    trainer = fit(task, data, logger, callbacks=[ValidationImages(num_images=3, tag="val/seg")])
    files = sorted(p.name for p in (tmp_path / "csv" / "version_0" / "images").iterdir())
    assert files == [f"val_seg_{i}_step{trainer.global_step:07d}.png" for i in range(3)]
    assert sum(isinstance(c, ValidationImages) for c in trainer.callbacks) == 1


def test_a_multitask_model_logs_each_tasks_pictures_under_its_name(tmp_path):
    seg, seg_data = segmentation()
    det, det_data = detection(tmp_path)
    model = MultiTask({"seg": seg, "det": det})
    data = MultiTaskDataModule({"seg": seg_data, "det": det_data})
    trainer = fit(model, data, CSVLogger(tmp_path, name="csv"), callbacks=[ValidationImages(num_images=2)])
    files = sorted(p.name for p in (tmp_path / "csv" / "version_0" / "images").iterdir())
    step = f"step{trainer.global_step:07d}"
    assert files == sorted(f"val_{name}_images_{i}_{step}.png" for name in ("seg", "det") for i in range(2))


def test_no_pictures_when_turned_off_or_without_a_logger(tmp_path):
    task, data = classification()
    logger = CSVLogger(tmp_path, name="csv")
    fit(task, data, logger, callbacks=[ValidationImages(num_images=0)])
    assert not (tmp_path / "csv" / "version_0" / "images").exists()
    trainer = fit(*classification(), logger=False)
    assert not any(isinstance(c, ValidationImages | ImagesPerSecond) for c in trainer.callbacks)


def test_images_per_second_is_images_over_wall_time(monkeypatch):
    # batch (start, end) times: (10, 11), (12, 13) | (13.5, 13.8), (13.9, 14): windows end at 13 and 14 s
    clock = iter([10.0, 11.0, 12.0, 13.0, 13.5, 13.8, 13.9, 14.0])
    monkeypatch.setattr("vitdense.viz.callbacks.time.perf_counter", lambda: next(clock))
    logged = []

    class Module:
        def log(self, name, value, **kwargs):
            logged.append((name, value))

    class Batch:
        image = torch.zeros(6, 3, 4, 4)

    callback = ImagesPerSecond(every_n_steps=2)
    trainer, module = type("T", (), {"log_every_n_steps": 50})(), Module()
    callback.on_train_epoch_start(trainer, module)
    for i in range(4):
        callback.on_train_batch_start(trainer, module, Batch(), i)
        callback.on_train_batch_end(trainer, module, None, Batch(), i)
    # waiting: 12 - 11 of the first window's 3 s; 13.5 - 13 and 13.9 - 13.8 of the second's 1 s
    assert logged[0::2] == [("train/images_per_sec", 12 / 3.0), ("train/images_per_sec", 12 / 1.0)]
    assert [name for name, _ in logged[1::2]] == ["train/data_wait"] * 2
    assert [value for _, value in logged[1::2]] == pytest.approx([1 / 3, 0.6])


def test_classification_grid_is_green_where_right_and_red_where_wrong():
    pixels = [np.full((20, 20, 3), 128, np.uint8)] * 2
    probs = torch.tensor([[0.1, 0.9], [0.8, 0.2]])  # both predicted...
    grid = draw_classified(pixels, [1, 1], probs, ["cat", "dog"], columns=2, side=64)  # ...first right
    cell = grid.shape[1] // 2
    left, right = grid[:, :cell].reshape(-1, 3), grid[:, cell:].reshape(-1, 3)

    def has(part, colour):
        return bool((np.abs(part.astype(int) - colour).sum(1) < 60).any())

    assert has(left, GREEN) and not has(left, RED)
    assert has(right, RED) and not has(right, GREEN)


def test_segmentation_picture_tints_truth_and_prediction_with_the_palette():
    image = np.full((8, 8, 3), 100, np.uint8)
    truth = np.zeros((8, 8), np.int64)
    truth[:, 4:] = 255  # unlabelled: left untinted
    predicted = np.ones((8, 8), np.int64)
    palette = np.array([[255, 0, 0], [0, 0, 255], [0, 255, 0]], np.uint8)
    picture = draw_segmented(image, truth, predicted, palette, ["a", "b", "c"])
    panel = picture.shape[1] // 3  # three panels side by side (with small gaps)
    tinted_truth = blend(image, np.zeros((8, 8), np.int64), palette)[0, 0]
    assert (picture[10, panel + 10] == tinted_truth).all()  # class 0 on the left half
    assert (picture[10, panel + panel - 20] == image[0, 0]).all()  # unlabelled right half
    assert (picture[10, 2 * panel + 20] == blend(image, predicted, palette)[0, 0]).all()
    colours = {tuple(c) for c in picture[picture.shape[0] - 20 :].reshape(-1, 3).tolist()}
    assert (255, 0, 0) in colours and (0, 0, 255) in colours and (0, 255, 0) not in colours  # legend: a, b only


def test_detection_picture_draws_each_box_in_its_class_colour():
    image = np.zeros((300, 300, 3), np.uint8)
    palette = default_palette(3)
    picture = draw_detected(
        image,
        np.array([[10.0, 20.0, 100.0, 200.0]]),
        [2],
        np.array([[50.0, 50.0, 250.0, 250.0], [0, 0, 5, 5]]),
        [0.9, 0.1],  # the second is below the score threshold: not drawn
        [1, 0],
        palette,
        ["a", "b", "c"],
    )
    assert (picture[150, 10] == palette[2]).all()  # left edge of the true box (x = 10)
    second = 300 + 4  # the prediction panel starts after the truth panel and a gap
    assert (picture[150, second + 50] == palette[1]).all()
    assert not (picture[2, second + 5] == palette[0]).all()
