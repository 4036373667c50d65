"""DepthMetrics: 2 x 2 images computed by hand, Eigen's and Garg's crops, invalid pixels and
images, any split of the images over objects (processes) and batches, and the numbers of the
depth literature's per-image `compute_errors` (monodepth2 / BTS / AdaBins evaluation, run in
float64 by a throwaway script on the inputs of `depth_metrics_reference.pt`)."""

import math
from pathlib import Path

import pytest
import torch

from vitdense.metrics.depth import DEPTH_METRIC_NAMES, DepthMetrics

REFERENCE = Path(__file__).with_name("depth_metrics_reference.pt")


@pytest.fixture(scope="module")
def ref() -> dict:
    return torch.load(REFERENCE, weights_only=True)


def _hand_images() -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Three 2 x 2 images and the mean of the first two's figures (the third has no valid pixel).

    Image 1, all valid: t = 1, 2, 4, 8 and p = 1, 2.4, 2, 8; ratios 1, 1.2, 2, 1.
    Image 2: t = 0 (below min_depth) and 20 (above max_depth 10) are out; the valid pixels
    are t = 5, p = 5 and t = 5, p = 12 clamped to 10 (ratio 2).
    Image 3: every target 0 or beyond max_depth.
    """
    preds = torch.tensor(
        [[[1.0, 2.4], [2.0, 8.0]], [[3.0, 5.0], [1.0, 12.0]], [[1.0, 1.0], [1.0, 1.0]]], dtype=torch.float64
    )
    targets = torch.tensor(
        [[[1.0, 2.0], [4.0, 8.0]], [[0.0, 5.0], [20.0, 5.0]], [[0.0, 0.0], [10.0, 30.0]]], dtype=torch.float64
    )
    ln2, ln12 = math.log(2), math.log(1.2)
    image1 = {
        "d1": 3 / 4,
        "d2": 3 / 4,  # 2 > 1.25^2 = 1.5625
        "d3": 3 / 4,  # 2 > 1.25^3 = 1.953125
        "abs_rel": (0 + 0.4 / 2 + 2 / 4 + 0) / 4,
        "sq_rel": (0 + 0.16 / 2 + 4 / 4 + 0) / 4,
        "rmse": math.sqrt((0.16 + 4) / 4),
        "rmse_log": math.sqrt((ln12**2 + ln2**2) / 4),
        "log10": (math.log10(1.2) + math.log10(2)) / 4,
        "silog": 100 * math.sqrt((ln12**2 + ln2**2) / 4 - ((ln12 - ln2) / 4) ** 2),
    }
    image2 = {
        "d1": 1 / 2,
        "d2": 1 / 2,
        "d3": 1 / 2,
        "abs_rel": (0 + 5 / 5) / 2,
        "sq_rel": (0 + 25 / 5) / 2,
        "rmse": math.sqrt(25 / 2),
        "rmse_log": ln2 / math.sqrt(2),
        "log10": math.log10(2) / 2,
        "silog": 100 * math.sqrt(ln2**2 / 2 - ln2**2 / 4),
    }
    return preds, targets, {k: (image1[k] + image2[k]) / 2 for k in DEPTH_METRIC_NAMES}


def test_hand_computed_and_skipped_image() -> None:
    preds, targets, expected = _hand_images()
    metric = DepthMetrics(min_depth=1e-3, max_depth=10.0)
    metric.update(preds.float(), targets.float())
    assert metric.sums.dtype == torch.float64 and metric.images.dtype == torch.float64
    assert metric.images.item() == 2 and metric.skipped.item() == 1
    with pytest.warns(UserWarning, match=r"1 image\(s\) without a valid target pixel"):
        out = metric.compute()
    assert list(out) == list(DEPTH_METRIC_NAMES)
    for name in DEPTH_METRIC_NAMES:
        assert out[name].item() == pytest.approx(expected[name], rel=1e-6), name


def test_invalid_pixels_count_nothing() -> None:
    """Whatever an invalid target pixel's prediction is (NaN, inf, huge), nothing changes; a
    NaN target is invalid too."""
    preds, targets, expected = _hand_images()
    preds[1, 0, 0], preds[1, 1, 0] = float("nan"), float("inf")
    targets[2, 0, 0] = float("nan")
    metric = DepthMetrics()
    metric.update(preds, targets)
    with pytest.warns(UserWarning):
        out = metric.compute()
    for name in DEPTH_METRIC_NAMES:
        assert out[name].item() == pytest.approx(expected[name], rel=1e-6), name


@pytest.mark.parametrize("crop", ["none", "garg"])
def test_reference(ref: dict, crop: str) -> None:
    """Per-image figures of the literature's `compute_errors`, predictions clamped to
    [min, max], targets outside (min, max) out: 3 images of 16 x 20, ~20% zero targets,
    predictions from -0.5 to 10.5."""
    metric = DepthMetrics(min_depth=1e-3, max_depth=10.0, crop=crop)
    metric.update(ref["preds"], ref["targets"])
    out = metric.compute()
    for name in DEPTH_METRIC_NAMES:
        assert out[name].item() == pytest.approx(ref["metrics"][crop][name], rel=1e-6), name


def test_eigen_crop_rows_and_cols() -> None:
    """Eigen's crop keeps rows 45:471 and cols 41:601 of 480 x 640: errors just outside it do
    not count; one wrong pixel at each inside corner counts 1 each in AbsRel."""
    target = torch.ones(1, 480, 640, dtype=torch.float64)
    pred = torch.full_like(target, 2.0)
    pred[:, 45:471, 41:601] = 1.0
    metric = DepthMetrics(crop="eigen")
    metric.update(pred, target)
    assert metric.compute()["abs_rel"].item() == 0
    pred[0, 45, 41] = pred[0, 470, 600] = 2.0
    metric = DepthMetrics(crop="eigen")
    metric.update(pred, target)
    assert metric.compute()["abs_rel"].item() == pytest.approx(2 / (426 * 560))
    with pytest.raises(ValueError, match="480 x 640"):
        DepthMetrics(crop="eigen").update(pred[:, :240], target[:, :240])


def test_garg_crop_rows_and_cols() -> None:
    """Garg's crop of a 37 x 54 map: rows int(0.40810811 * 37) = 15 to int(0.99189189 * 37) = 36,
    cols int(0.03594771 * 54) = 1 to int(0.96405229 * 54) = 52."""
    target = torch.ones(1, 37, 54, dtype=torch.float64)
    pred = torch.full_like(target, 2.0)
    pred[:, 15:36, 1:52] = 1.0
    metric = DepthMetrics(crop="garg")
    metric.update(pred, target)
    assert metric.compute()["abs_rel"].item() == 0
    pred[0, 15, 1] = pred[0, 35, 51] = 2.0
    metric = DepthMetrics(crop="garg")
    metric.update(pred, target)
    assert metric.compute()["abs_rel"].item() == pytest.approx(2 / (21 * 51))


def test_split_over_objects_and_batches_equals_one(ref: dict) -> None:
    """The per-image sums add: two objects (processes) merged, each fed different batches,
    give one object's figures; a list of [H, W] images gives the batch's."""
    preds, targets = ref["preds"], ref["targets"]
    whole = DepthMetrics()
    whole.update(preds, targets)
    first, second = DepthMetrics(), DepthMetrics()
    first.update(preds[:1], targets[:1])
    second.update(list(preds[1:]), list(targets[1:]))
    second.update(preds[:0], targets[:0])
    first.merge_state(second)
    expected, merged = whole.compute(), first.compute()
    for name in DEPTH_METRIC_NAMES:
        torch.testing.assert_close(merged[name], expected[name], rtol=1e-12, atol=0)
    # images of different sizes in one update
    mixed = DepthMetrics()
    mixed.update([preds[0], preds[1, :8, :5]], [targets[0], targets[1, :8, :5]])
    assert mixed.images.item() == 2


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="same \\[H, W\\]"):
        DepthMetrics().update([torch.ones(4, 4)], [torch.ones(4, 5)])
    with pytest.raises(ValueError, match="must be \\[B, H, W\\]"):
        DepthMetrics().update(torch.ones(1, 1, 4, 4), torch.ones(1, 1, 4, 4))
    with pytest.raises(ValueError, match="as many predictions as targets"):
        DepthMetrics().update(torch.ones(2, 4, 4), torch.ones(1, 4, 4))
    with pytest.raises(ValueError, match="crop must be"):
        DepthMetrics(crop="kitti")
