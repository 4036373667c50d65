"""`vitdense.load(ckpt)`: the predictor gives the numbers `python -m vitdense predict` writes for
the same files (every task), reads every kind of input as the command line reads files, and
says what is wrong with an input that is not an image."""

import base64
import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitdense
from tests.test_checkpoints import UPRIGHT, write_photos
from tests.test_models import through_the_trainer
from tests.test_readme import as_module, code_blocks
from vitdense.cli import main
from vitdense.core.errors import DataError
from vitdense.deploy.predictor import Predictor
from vitdense.results.classification import ClassificationResult
from vitdense.results.detection import DetectionResult
from vitdense.results.segmentation import SegmentationResult
from vitdense.tasks import BackboneConfig, LinearProbeTask


@pytest.fixture(scope="module")
def predicted(trained, tmp_path_factory):
    """The photos, and what `python -m vitdense predict` wrote for them with each demo
    checkpoint (its default writers): {task: (ckpt, output folder)}."""
    root = tmp_path_factory.mktemp("predictor")
    photos = write_photos(root / "photos")
    out = {}
    for task in ("cls", "seg", "det"):
        _, ckpt = trained[task]
        folder = root / task
        args = ["predict", f"--ckpt_path={ckpt}", f"--data.predict_dir={photos}", "--trainer.logger=false"]
        main([*args, f"--trainer.default_root_dir={folder}", "--trainer.enable_progress_bar=false"])
        out[task] = ckpt, folder / "predictions"
    return photos, out


def by_name(results, photos: Path) -> dict:
    return {Path(r.source).relative_to(photos).as_posix(): r for r in results}


def test_classification_equals_the_command_line(predicted):
    photos, out = predicted
    ckpt, folder = out["cls"]
    predictor = vitdense.load(ckpt, batch_size=3)  # another batching than the command line's
    results = by_name(predictor(photos), photos)
    rows = list(csv.DictReader((folder / "classes.csv").open()))
    assert sorted(results) == sorted(UPRIGHT) and len(rows) == len(results)
    for row in rows:
        result = results[Path(row["path"]).relative_to(photos).as_posix()]
        assert isinstance(result, ClassificationResult)
        assert result.names == [row[f"class_{i}"] for i in range(1, 5)]
        np.testing.assert_allclose(result.probs, [float(row[f"prob_{i}"]) for i in range(1, 5)], atol=2e-6)
        assert result.size == UPRIGHT[Path(row["path"]).relative_to(photos).as_posix()]
        assert (int(row["height"]), int(row["width"])) == result.size  # the image's, not the model's input


def test_segmentation_equals_the_command_line(predicted):
    photos, out = predicted
    ckpt, folder = out["seg"]
    results = by_name(vitdense.load(ckpt, batch_size=2)(photos), photos)
    for name, result in results.items():
        assert isinstance(result, SegmentationResult)
        written = np.asarray(Image.open(folder / "masks" / Path(name).with_suffix(".png")))
        assert result.label_map.shape == UPRIGHT[name]
        np.testing.assert_array_equal(result.label_map, written)
        # the JSON form: a PNG of the same class indices, and the class table
        as_json = json.loads(json.dumps(result.to_dict()))
        png = Image.open(io.BytesIO(base64.b64decode(as_json["label_map_png"])))
        np.testing.assert_array_equal(np.asarray(png), result.label_map)
        assert [c["name"] for c in as_json["classes"]] == result.class_names
        assert sum(c["pixels"] for c in as_json["classes"]) == result.label_map.size
    assert result.overlay(np.zeros((*result.size, 3), np.uint8)).shape == (*result.size, 3)


def test_detection_equals_the_command_line(predicted):
    photos, out = predicted
    ckpt, folder = out["det"]
    results = by_name(vitdense.load(ckpt, batch_size=5)(photos), photos)
    written = json.loads((folder / "detections.json").read_text())
    for name, result in results.items():
        assert isinstance(result, DetectionResult) and result.size == UPRIGHT[name]
        mine = [r for r in written if r["file_name"] == name]
        assert len(mine) == len(result) > 0
        np.testing.assert_allclose(result.scores, [r["score"] for r in mine], atol=1e-5)
        x1, y1, x2, y2 = result.boxes.T
        np.testing.assert_allclose(np.stack([x1, y1, x2 - x1, y2 - y1], 1), [r["bbox"] for r in mine], atol=1e-3)
        assert [result.category_ids[k] for k in result.labels] == [r["category_id"] for r in mine]
    kept = result.above(0.2)
    assert (kept.scores >= 0.2).all() and len(kept) == int((result.scores >= 0.2).sum())
    assert [d["name"] for d in result.to_dict()["detections"]] == result.names


def test_linear_probe_predicts_with_its_best_head(predicted):
    """A linear probe (built here, with the demo's data) predicts with the head that
    validated best, as its task's `predict_step` does."""
    photos, out = predicted
    data = vitdense.load(out["cls"][0]).data
    task = LinearProbeTask(
        num_classes=4,
        lrs=[0.1, 0.01],
        backbone=BackboneConfig(name="vit_tiny_patch16_224", img_size=64, model_args={"depth": 1}),
    )
    task.best_head.fill_(1)
    probe = Predictor(task, data)
    sample = probe.sample(np.asarray(Image.open(photos / "a.jpg").convert("RGB")), 0)
    [expected], _ = through_the_trainer(probe.task, [sample])
    result = probe(photos / "a.jpg")
    assert result.classes == expected.classes[0].tolist() and result.names == [str(k) for k in result.classes]
    np.testing.assert_allclose(result.probs, expected.probs[0].tolist(), atol=1e-6)
    with torch.no_grad():  # the best head's, not the first head's
        logits = task.model(sample.image[None])[1]
    assert result.label == int(logits.argmax())


@pytest.fixture(scope="module")
def classify(predicted):
    return vitdense.load(predicted[1]["cls"][0])


def test_every_kind_of_input_reads_as_the_file_does(predicted, classify):
    photos, predictor = predicted[0], classify
    from_file = predictor(photos / "rotated.jpg")
    assert from_file.size == UPRIGHT["rotated.jpg"]  # EXIF: turned upright
    assert predictor(Image.open(photos / "rotated.jpg")).probs == from_file.probs
    pixels = np.array(Image.open(photos / "a.jpg").convert("RGB"))
    expected = predictor(photos / "a.jpg").probs
    chw = torch.from_numpy(pixels).permute(2, 0, 1)
    for same in (pixels, chw, chw.float() / 255, chw[None], [pixels]):
        result = predictor(same)
        result = result[0] if isinstance(result, list) else result
        assert result.probs == expected and result.source is None
    # 16-bit: a uint16 array reads as the 16-bit PNG does
    gray16 = np.asarray(Image.open(photos / "gray16.png"))
    assert gray16.dtype == np.uint16
    assert predictor(gray16).probs == predictor(photos / "gray16.png").probs


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (np.zeros((4, 5, 2), np.uint8), "shape (4, 5, 2)"),
        (np.full((8, 8, 3), 2.0, np.float32), "float pixels must lie in [0, 1]"),
        (np.zeros((8, 8, 3), np.int8), "dtype int8"),
        ("no/such/photo.jpg", "no/such/photo.jpg"),
    ],
)
def test_an_input_that_is_not_an_image_is_named(classify, image, message):
    with pytest.raises((DataError, FileNotFoundError), match=re.escape(message)):
        classify(image)


def test_readme_examples(trained, tmp_path, monkeypatch):
    """README's three predictor examples run on the demo checkpoints and photos."""
    monkeypatch.chdir(tmp_path)
    photos = write_photos(tmp_path / "photos")
    for name in ("cat.jpg", "street.jpg", "b.jpg"):
        Image.open(photos / "a.jpg").save(photos / name)
    blocks = code_blocks("Predicting from Python")
    assert len(blocks) == 3
    for task, code in zip(("cls", "seg", "det"), blocks, strict=True):
        code = code.replace(f"runs/demo_{task}/checkpoints/last.ckpt", str(trained[task][1]))
        module = as_module(f"readme_predict_{task}", code, monkeypatch)
        assert isinstance(module.result, (ClassificationResult, SegmentationResult, DetectionResult))
    assert Image.open(tmp_path / "overlay.jpg").size == Image.open(photos / "street.jpg").size


def test_a_checkpoint_fitted_from_python_predicts(fitted_from_python):
    """A task fitted with `Trainer.fit` from a script: its predictor preprocesses as its
    DataModule did and gives its model's numbers."""
    task, ckpt = fitted_from_python
    predictor = vitdense.load(ckpt)
    pixels = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    sample = predictor.sample(pixels, 0)
    with torch.no_grad():
        probs = task.model(sample.image[None]).softmax(-1)[0]
    result = predictor(pixels)
    np.testing.assert_allclose(result.probs, probs.topk(len(result.probs)).values.tolist(), atol=1e-6)
    assert result.names[0] == task.class_names[int(probs.argmax())]
