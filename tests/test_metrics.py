"""Segmentation metrics equal a direct NumPy computation of dataset-level IoU (mmseg's definitions)."""

import numpy as np
import torch

from vitdense.metrics import SegmentationMetrics


def numpy_reference(preds, targets, num_classes, ignore_index):
    """Intersections and unions summed over all images, then divided; NaN classes dropped."""
    inter = np.zeros(num_classes)
    union = np.zeros(num_classes)
    labelled = np.zeros(num_classes)
    for p, t in zip(preds, targets, strict=True):
        keep = t != ignore_index
        p, t = p[keep], t[keep]
        for c in range(num_classes):
            inter[c] += np.sum((p == c) & (t == c))
            union[c] += np.sum((p == c) | (t == c))
            labelled[c] += np.sum(t == c)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / union
        acc = inter / labelled
    return np.nanmean(iou), np.nanmean(acc), inter.sum() / labelled.sum(), iou


def test_dataset_level_iou_matches_numpy():
    rng = np.random.default_rng(0)
    k, ignore = 6, 255
    preds, targets = [], []
    for h, w in [(17, 23), (40, 31), (8, 9)]:  # images of different sizes, as in evaluation
        t = rng.integers(0, k - 1, (h, w))  # class 5 never labelled ...
        t[rng.random((h, w)) < 0.2] = ignore
        p = np.where(rng.random((h, w)) < 0.6, t, rng.integers(0, k - 1, (h, w)))  # ... nor predicted
        p[p == ignore] = 0
        p[0, 0] = 4  # a prediction on an ignored or mismatched pixel
        preds.append(p)
        targets.append(t)
    metric = SegmentationMetrics(k, ignore)
    for p, t in zip(preds, targets, strict=True):
        metric.update(torch.from_numpy(p), torch.from_numpy(t))
    result = metric.compute()
    miou, macc, aacc, iou = numpy_reference(preds, targets, k, ignore)
    assert np.isnan(iou[5]) and torch.isnan(result["IoU"][5])  # absent class: left out of the mean
    np.testing.assert_allclose(result["IoU"].numpy()[:5], iou[:5], rtol=1e-12)
    np.testing.assert_allclose(result["mIoU"].item(), miou, rtol=1e-12)
    np.testing.assert_allclose(result["mAcc"].item(), macc, rtol=1e-12)
    np.testing.assert_allclose(result["aAcc"].item(), aacc, rtol=1e-12)
    # averaging per-image IoUs would give another number: the metric must not do that
    per_image = np.nanmean([numpy_reference([p], [t], k, ignore)[0] for p, t in zip(preds, targets, strict=True)])
    assert abs(per_image - miou) > 1e-3
