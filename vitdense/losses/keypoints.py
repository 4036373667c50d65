"""RF-DETR's keypoint terms (rfdetr 1.11, `compute_l1_keypoint_loss` and
`compute_keypoint_matching_cost`, the loss of its GroupPose-style keypoint preview), for any
K keypoints a dataset declares.

Each query predicts, per keypoint, 7 numbers (`vitdense.types.keypoints.KEYPOINT_CHANNELS`): its position (x, y) in
[0, 1] of the unpadded image, a "findable" logit (the annotator could place it: v > 0), a
"visible" logit (v = 2), and the Cholesky factor of its precision (log l11, l21, log l22:
L = [[l11, 0], [l21, l22]], precision L^T L in units of the normalised image). For a query
matched to an object of box area a (w h, normalised) with labelled keypoints V (v > 0):

    location = sum_V (|dx| + |dy|) / |V| / sqrt(a)
    findable = mean_K BCE(findable logit, v > 0)
    visible  = mean_K BCE(visible logit, v = 2)
    nll      = sum_V (1/2 |L d|^2 / a - log l11 - log l22) / |V|     (d = predicted - labelled)

(location and nll are 0 for an object without labelled keypoints). The nll is a Gaussian's
negative log-likelihood without its constant, so it can be negative. The loss sums each
term over the matched objects and divides by the batch's target boxes, as the box terms;
the matching cost of a query for an object is the same four terms (`matching_cost`),
weighted as in the loss (RF-DETR's matcher takes the loss coefficients).

RF-DETR's own code also guards every term against non-finite predictions; here a
non-finite prediction of a matched query stops the matching with `NonFiniteError` first,
as a non-finite box does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _gaussian_nll(delta: torch.Tensor, cholesky: torch.Tensor, area: torch.Tensor) -> torch.Tensor:
    """delta [..., 2] (prediction - label), cholesky [..., 3] (log l11, l21, log l22), area
    broadcastable to delta[..., 0] -> [...]: 1/2 |L d|^2 / a - log l11 - log l22."""
    log_l11, l21, log_l22 = cholesky.unbind(-1)
    dx, dy = delta.unbind(-1)
    u0 = log_l11.exp() * dx + l21 * dy
    u1 = log_l22.exp() * dy
    return 0.5 * (u0 * u0 + u1 * u1) / area - (log_l11 + log_l22)


class KeypointLoss(nn.Module):
    """RF-DETR's four keypoint terms and their matching cost (see the module docstring).

    Args:
        loss_l1, loss_findable, loss_visible, loss_nll: weights of the location, findable,
            visible and Gaussian NLL terms (RF-DETR's keypoint recipe: 1 each), in the loss
            and in the matching cost alike.
    """

    def __init__(
        self, loss_l1: float = 1.0, loss_findable: float = 1.0, loss_visible: float = 1.0, loss_nll: float = 1.0
    ) -> None:
        super().__init__()
        self.weights = {
            "loss_keypoints_l1": loss_l1,
            "loss_keypoints_findable": loss_findable,
            "loss_keypoints_visible": loss_visible,
            "loss_keypoints_nll": loss_nll,
        }

    @staticmethod
    def per_object(pred: torch.Tensor, target: torch.Tensor, area: torch.Tensor) -> dict[str, torch.Tensor]:
        """Unweighted terms of m matched pairs, in fp32: pred [m, K, 7], target [m, K, 3]
        (x, y, v), area [m] (the target box's w h, normalised) -> {term name: [m]}."""
        pred, target, area = pred.float(), target.float(), area.float()
        v = target[..., 2]
        labelled = v > 0
        count = labelled.sum(-1).clamp(min=1)
        # unlabelled keypoints (x = y = 0) take no part: their differences are zeroed before any
        # product, so neither the value nor the gradient sees them
        delta = torch.where(labelled[..., None], pred[..., :2] - target[..., :2], 0.0)
        l1 = delta.abs().sum(-1).sum(-1) / count / area.sqrt()
        findable = F.binary_cross_entropy_with_logits(pred[..., 2], labelled.float(), reduction="none").mean(-1)
        visible = F.binary_cross_entropy_with_logits(pred[..., 3], (v > 1).float(), reduction="none").mean(-1)
        cholesky = torch.where(labelled[..., None], pred[..., 4:7], 0.0)
        nll = torch.where(labelled, _gaussian_nll(delta, cholesky, area[:, None]), 0.0).sum(-1) / count
        return {
            "loss_keypoints_l1": l1,
            "loss_keypoints_findable": findable,
            "loss_keypoints_visible": visible,
            "loss_keypoints_nll": nll,
        }

    @torch.no_grad()
    def matching_cost(self, pred: torch.Tensor, target: torch.Tensor, area: torch.Tensor) -> torch.Tensor:
        """The weighted terms of every query against every object, in fp32: pred [N, K, 7]
        (N queries), target [n, K, 3], area [n] -> [N, n]."""
        pred, target, area = pred.float(), target.float(), area.float()
        v = target[..., 2]
        labelled = (v > 0)[None]  # [1, n, K]
        count = labelled.sum(-1).clamp(min=1)  # [1, n]
        delta = torch.where(labelled[..., None], pred[:, None, :, :2] - target[None, :, :, :2], 0.0)  # [N, n, K, 2]
        l1 = delta.abs().sum(-1).sum(-1) / count / area.sqrt()
        nll = _gaussian_nll(delta, pred[:, None, :, 4:7], area[None, :, None])
        nll = torch.where(labelled, nll, 0.0).sum(-1) / count
        # BCE(x, y) = softplus(x) - x y, averaged over the K keypoints: a matrix product
        findable = (F.softplus(pred[..., 2]).sum(-1, keepdim=True) - pred[..., 2] @ (v > 0).float().T) / v.shape[-1]
        visible = (F.softplus(pred[..., 3]).sum(-1, keepdim=True) - pred[..., 3] @ (v > 1).float().T) / v.shape[-1]
        w = self.weights
        return (
            w["loss_keypoints_l1"] * l1
            + w["loss_keypoints_findable"] * findable
            + w["loss_keypoints_visible"] * visible
            + w["loss_keypoints_nll"] * nll
        )
