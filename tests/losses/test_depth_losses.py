"""SILogLoss and ScaleShiftInvariantLoss: closed-form cases, a NumPy transcription of the
formulas, and the numbers of the references (`depth_losses_reference.pt`: inputs and the
outputs of MiDaS's released loss (gist dvdhfnr/732c26b61a0e63a0abc8a5d769dbebd0,
reduction='batch-based') and of BTS's silog formula, run in float64 by a throwaway script)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from vitdense.losses import ScaleShiftInvariantLoss, SILogLoss, compute_scale_and_shift

REFERENCE = Path(__file__).with_name("depth_losses_reference.pt")


@pytest.fixture(scope="module")
def ref() -> dict:
    return torch.load(REFERENCE, weights_only=True)


def _depths(seed: int = 0, shape: tuple[int, int, int] = (2, 6, 7)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(shape, generator=g) * 9 + 0.5
    pred = target * torch.exp(0.3 * torch.randn(shape, generator=g))
    mask = torch.rand(shape, generator=g) > 0.3
    return pred, target, mask


# ---- NumPy transcriptions of the formulas (independent of the torch code) ----


def np_silog(pred: np.ndarray, target: np.ndarray, mask: np.ndarray, vf: float, scale: float = 10.0) -> float:
    d = np.log(pred[mask]) - np.log(target[mask])  # the batch's valid pixels jointly
    return scale * math.sqrt(np.mean(d**2) - vf * np.mean(d) ** 2)


def np_ssi(pred: np.ndarray, target: np.ndarray, mask: np.ndarray, alpha: float, scales: int) -> float:
    residuals = np.zeros_like(pred)
    for b in range(pred.shape[0]):
        m = mask[b]
        if m.sum() < 2:
            continue
        a = np.stack([pred[b][m], np.ones(m.sum())], 1)
        (s, t), *_ = np.linalg.lstsq(a, target[b][m], rcond=None)  # least squares, not the 2 x 2 formula
        residuals[b][m] = s * pred[b][m] + t - target[b][m]
    data = (residuals[mask] ** 2).sum() / (2 * max(mask.sum(), 1))
    reg = 0.0
    for k in range(scales):
        r, m = residuals[:, :: 2**k, :: 2**k], mask[:, :: 2**k, :: 2**k]
        total = 0.0
        for b in range(r.shape[0]):
            for i in range(r.shape[1]):
                for j in range(r.shape[2]):
                    if not m[b, i, j]:
                        continue
                    if j + 1 < r.shape[2] and m[b, i, j + 1]:
                        total += abs(r[b, i, j + 1] - r[b, i, j])
                    if i + 1 < r.shape[1] and m[b, i + 1, j]:
                        total += abs(r[b, i + 1, j] - r[b, i, j])
        reg += total / max(m.sum(), 1)
    return data + alpha * reg


# ---- SILog ----


def test_silog_closed_form() -> None:
    pred, target, mask = _depths()
    assert SILogLoss()(target, target, mask) == 0
    # pred = c * target: d = log c at every pixel, so mean(d^2) = mean(d)^2 = log(c)^2
    c = 2.0
    assert SILogLoss(variance_focus=1.0)(c * target, target, mask) == pytest.approx(0, abs=1e-3)
    expected = 10 * math.sqrt(1 - 0.85) * math.log(c)
    assert SILogLoss()(c * target, target, mask).item() == pytest.approx(expected, rel=1e-5)
    assert SILogLoss(0.85, scale=1.0)(c * target, target, mask).item() == pytest.approx(expected / 10, rel=1e-5)


@pytest.mark.parametrize("vf", [0.85, 1.0, 0.5])
def test_silog_reference(ref: dict, vf: float) -> None:
    pred, target, mask = ref["si_pred"], ref["si_target"], ref["si_mask"]
    loss = SILogLoss(variance_focus=vf)(pred, target, mask)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref["si"][str(vf)], rel=1e-5)  # BTS's formula, run in float64
    assert loss.item() == pytest.approx(np_silog(pred.numpy(), target.numpy(), mask.numpy(), vf), rel=1e-5)


def test_silog_joint_over_batch_not_per_image() -> None:
    """BTS's reduction: one image of log-ratio 0 and one of log-ratio log 2 are one set of
    pixels of mean and variance (log 2)^2 / 4 (not two images of zero variance)."""
    target = torch.full((2, 3, 3), 2.0)
    pred = torch.stack([target[0], 2 * target[1]])
    mask = torch.ones(2, 3, 3, dtype=torch.bool)
    ln2 = math.log(2)
    expected = 10 * math.sqrt(ln2**2 / 2 - ln2**2 / 4)  # variance_focus 1
    assert SILogLoss(1.0)(pred, target, mask).item() == pytest.approx(expected, rel=1e-5)


def test_silog_mask_and_gradient() -> None:
    pred, target, mask = _depths(1)
    expected = SILogLoss()(pred, target, mask)
    # anything outside the mask (0 and NaN targets, NaN and negative predictions) counts nothing
    pred_bad, target_bad = pred.clone(), target.clone()
    pred_bad[~mask] = float("nan")
    pred_bad[0, ~mask[0]] = -3.0
    target_bad[~mask] = 0.0
    target_bad[1, ~mask[1]] = float("nan")
    pred_bad.requires_grad_()
    loss = SILogLoss()(pred_bad, target_bad, mask)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert torch.isfinite(pred_bad.grad).all()
    assert (pred_bad.grad[~mask] == 0).all() and (pred_bad.grad[mask] != 0).all()
    # the gradient is the formula's: finite differences in float64 of the NumPy version
    i = mask.nonzero()[0].tolist()
    h = 1e-4
    up, down = pred.double().numpy().copy(), pred.double().numpy().copy()
    up[tuple(i)] += h
    down[tuple(i)] -= h
    fd = (np_silog(up, target.numpy(), mask.numpy(), 0.85) - np_silog(down, target.numpy(), mask.numpy(), 0.85)) / (
        2 * h
    )
    assert pred_bad.grad[tuple(i)].item() == pytest.approx(fd, rel=1e-3)


def test_silog_empty_and_perfect_give_zero_without_nan() -> None:
    pred, target, mask = _depths(2)
    pred.requires_grad_()
    empty = SILogLoss()(pred, target, torch.zeros_like(mask))
    perfect = SILogLoss()(pred, pred.detach(), mask)
    (empty + perfect).backward()
    assert empty.item() == 0 and perfect.item() == 0
    assert (pred.grad == 0).all()  # no NaN: sqrt's gradient at 0 is not taken
    # an image without valid pixels next to one with them: the loss is the other image's
    half = mask.clone()
    half[0] = False
    torch.testing.assert_close(SILogLoss()(pred[1:], target[1:], mask[1:]), SILogLoss()(pred, target, half))


def test_silog_bf16_and_autocast() -> None:
    pred, target, mask = _depths(3)
    pred16, target16 = pred.bfloat16(), target.bfloat16()
    expected = SILogLoss()(pred16.float(), target16.float(), mask)
    pred16.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = SILogLoss()(pred16, target16, mask)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert pred16.grad.dtype == torch.bfloat16 and torch.isfinite(pred16.grad.float()).all()


def test_bad_input_is_named() -> None:
    pred, target, mask = _depths()
    with pytest.raises(ValueError, match=r"SILogLoss: .*\[B, H, W\]"):
        SILogLoss()(pred[:, None], target, mask)
    with pytest.raises(ValueError, match="mask must be a bool"):
        ScaleShiftInvariantLoss()(pred, target, mask.float())
    with pytest.raises(ValueError, match="variance_focus"):
        SILogLoss(variance_focus=1.5)


# ---- scale- and shift-invariant loss ----


def test_ssi_affine_prediction_gives_zero() -> None:
    """pred = a * target + b in disparity: the alignment undoes it, data and gradient terms are 0."""
    _, depth, mask = _depths(4)
    disparity = 1 / depth
    pred = 3.0 * disparity + 0.5
    scale, shift = compute_scale_and_shift(pred * mask, disparity * mask, mask)
    torch.testing.assert_close(scale, torch.full((2,), 1 / 3))
    torch.testing.assert_close(shift, torch.full((2,), -0.5 / 3))
    assert ScaleShiftInvariantLoss()(pred, disparity, mask).item() == pytest.approx(0, abs=1e-6)
    # per image: a different affine map on each image is still free
    pred[1] = 0.2 * disparity[1] - 4
    assert ScaleShiftInvariantLoss()(pred, disparity, mask).item() == pytest.approx(0, abs=1e-6)


def test_ssi_constant_prediction_is_not_fitted() -> None:
    """A prediction constant over an image (0.3 and 1.1 here, whose fp32 means over these
    masks differ from them by rounding) has no scale to fit: (0, 0) as MiDaS's singular
    system, not s ~ 1e9."""
    _, depth, mask = _depths(5)
    pred = torch.tensor([0.3, 1.1])[:, None, None].expand_as(depth).clone()
    scale, shift = compute_scale_and_shift(pred * mask, 1 / depth * mask, mask)
    assert (scale == 0).all() and (shift == 0).all()
    data = ((1 / depth)[mask] ** 2).sum() / (2 * mask.sum())
    assert ScaleShiftInvariantLoss(alpha=0)(pred, 1 / depth, mask).item() == pytest.approx(data.item(), rel=1e-6)


def test_ssi_hand_computed() -> None:
    """pred = column index, target = [[0, 1], [1, 0]]: the best fit is s = 0, t = 0.5, so
    R = [[0.5, -0.5], [-0.5, 0.5]]; data = sum R^2 / (2 * 4) = 1/8; at stride 1 each of the
    2 horizontal and 2 vertical pairs differs by 1: 4 / 4 pixels = 1; at stride 2 one pixel
    and no pair: 0. With alpha = 0.5: 1/8 + 0.5 * (1 + 0) = 0.625."""
    pred = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])
    target = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    assert ScaleShiftInvariantLoss(alpha=0.5, scales=2)(pred, target, mask).item() == pytest.approx(0.625)
    assert ScaleShiftInvariantLoss(alpha=0.0)(pred, target, mask).item() == pytest.approx(0.125)


@pytest.mark.parametrize(("alpha", "scales"), [(0.5, 4), (0.0, 1), (1.0, 2)])
def test_ssi_reference(ref: dict, alpha: float, scales: int) -> None:
    """MiDaS's released loss (float64) and the NumPy transcription, on a batch of 13 x 11
    disparities with ~30% invalid pixels and one image without any."""
    pred, target, mask = ref["ssi_pred"], ref["ssi_target"], ref["ssi_mask"]
    loss = ScaleShiftInvariantLoss(alpha, scales)(pred, target, mask)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(ref["ssi"][f"{alpha}_{scales}"], rel=1e-5)
    numpy_loss = np_ssi(pred.double().numpy(), target.double().numpy(), mask.numpy(), alpha, scales)
    assert loss.item() == pytest.approx(numpy_loss, rel=1e-5)


def test_ssi_mask_gradient_empty_and_bf16(ref: dict) -> None:
    pred, target, mask = ref["ssi_pred"], ref["ssi_target"], ref["ssi_mask"]
    expected = ScaleShiftInvariantLoss()(pred, target, mask)
    pred_bad, target_bad = pred.clone(), target.clone()
    pred_bad[~mask] = float("nan")
    target_bad[~mask] = float("inf")
    pred_bad.requires_grad_()
    loss = ScaleShiftInvariantLoss()(pred_bad, target_bad, mask)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert torch.isfinite(pred_bad.grad).all()
    assert (pred_bad.grad[~mask] == 0).all() and pred_bad.grad[0].abs().sum() > 0
    # no valid pixel anywhere: 0, connected to the graph, no NaN
    pred.requires_grad_()
    empty = ScaleShiftInvariantLoss()(pred, target, torch.zeros_like(mask))
    empty.backward()
    assert empty.item() == 0 and (pred.grad == 0).all()
    # bf16 inputs under autocast: computed in fp32 from the bf16 values
    pred16, target16 = pred.detach().bfloat16(), target.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16 = ScaleShiftInvariantLoss()(pred16, target16, mask)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, ScaleShiftInvariantLoss()(pred16.float(), target16.float(), mask))
