"""The evaluation preprocessing as plain data (`vitdense.core.preprocess`): equal to every
DataModule's evaluation transform to the last bit, recorded in checkpoints, and what
`vitdense.load` builds from without importing the DataModule or albumentations."""

import subprocess
import sys

import numpy as np
import pytest
import torch

import vitdense
from vitdense.core.errors import ConfigError
from vitdense.core.preprocess import CHECKPOINT_KEY, InferenceData, Preprocess
from vitdense.data.transforms.classification import classification_eval_transforms
from vitdense.data.transforms.detection import detection_eval_transforms
from vitdense.data.transforms.segmentation import segmentation_eval_transforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NO_BOXES = {"bboxes": np.zeros((0, 4), np.float32), "labels": np.zeros(0, np.int64)}
#: (DataModule's evaluation transform, keyword arguments it needs, the same as plain data)
RULES = {
    "center_crop": (classification_eval_transforms(32, MEAN, STD, crop_pct=0.875), {}, ("center_crop", 32), {"crop_pct": 0.875, "interpolation": "bicubic"}),
    "center_crop_whole": (classification_eval_transforms(32, MEAN, STD, crop_pct=1.0), {}, ("center_crop", 32), {"interpolation": "bicubic"}),
    "rescale": (segmentation_eval_transforms(48, MEAN, STD), {}, ("rescale", 48), {"max_size": 192}),
    "short_side": (detection_eval_transforms(MEAN, STD, 40, 66), NO_BOXES, ("short_side", 40), {"max_size": 66}),
    "square": (detection_eval_transforms(MEAN, STD, 40, 66, square=True), NO_BOXES, ("square", 40), {}),
}  # fmt: skip


@pytest.mark.parametrize("rule", RULES)
def test_equal_to_the_datamodules_evaluation_transform(rule):
    transform, extra, (resize, size), kwargs = RULES[rule]
    preprocess = Preprocess(resize, size, MEAN, STD, **kwargs)
    rng = np.random.default_rng(0)
    for shape in [(37, 53), (300, 200), (64, 64), (17, 90), (33, 1)]:
        pixels = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        expected = transform(image=pixels, **extra)["image"]
        assert torch.equal(preprocess(pixels), expected), (rule, shape)
    assert Preprocess.from_data(preprocess.as_data()) == preprocess


def test_every_datamodule_declares_its_own():
    from vitdense.data import (
        SyntheticClassificationDataModule,
        SyntheticDetectionDataModule,
        SyntheticSegmentationDataModule,
    )

    pixels = np.random.default_rng(1).integers(0, 256, (45, 70, 3), dtype=np.uint8)
    for data in (
        SyntheticClassificationDataModule(img_size=32),
        SyntheticSegmentationDataModule(img_size=32),
        SyntheticDetectionDataModule(img_size=32),
    ):
        extra = NO_BOXES if isinstance(data, SyntheticDetectionDataModule) else {}
        assert torch.equal(data.preprocess()(pixels), data.eval_transforms()(image=pixels, **extra)["image"])


def test_bad_settings_name_the_field():
    with pytest.raises(ConfigError, match="resize='zoom'"):
        Preprocess("zoom", 32, MEAN, STD)
    with pytest.raises(ConfigError, match="max_size"):
        Preprocess("rescale", 32, MEAN, STD)
    with pytest.raises(ConfigError, match="crop_pct"):
        Preprocess("center_crop", 32, MEAN, STD, crop_pct=1.5)


def test_checkpoints_record_it_and_load_builds_from_it_alone(trained, tmp_path):
    """The seg demo's checkpoint holds its preprocessing and palette; loading it and predicting
    imports no dataset module nor albumentations; without the records (a checkpoint from
    before them) it rebuilds the DataModule and predicts the same."""
    _, ckpt = trained["seg"]
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    recorded = InferenceData.from_data(state[CHECKPOINT_KEY])
    assert recorded.preprocess.resize == "rescale" and recorded.preprocess.size == 32
    assert recorded.labels.file_offset == 0  # (ADE20K: 1)
    code = (
        "import sys, numpy as np, vitdense; "
        f"r = vitdense.load({str(ckpt)!r})(np.zeros((20, 30, 3), np.uint8)); "
        "print(r.label_map.shape, sorted(m for m in sys.modules if m.startswith(('vitdense.data', 'albumentations'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "(20, 30) []"  # (not even the package: the checkpoint's plain model, no task, no Lightning)

    del state[CHECKPOINT_KEY]
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    pixels = np.random.default_rng(2).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    np.testing.assert_array_equal(vitdense.load(older)(pixels).label_map, vitdense.load(ckpt)(pixels).label_map)
