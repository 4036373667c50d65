"""HungarianMatcher and SetCriterion against DETR's definitions and its reference code's values."""

import pytest
import torch
from scipy.optimize import linear_sum_assignment

from vitdense.core.errors import NonFiniteError
from vitdense.losses import HungarianMatcher, IoUAwareBCELoss, SetCriterion, SigmoidFocalLoss, SoftmaxCrossEntropy
from vitdense.metrics.common import LossMeans
from vitdense.types import BoxTargets, DetectionOutput

# Inputs (3 images, 5 queries, 3 classes + "no object") and the values DETR's own
# `models/detr.py` SetCriterion (facebookresearch/detr, weights ce 1, bbox 5, giou 2,
# eos_coef 0.1, matcher costs 1/5/2) gives for them, weighted as DETR logs them.
# fmt: off
LOGITS = [[[-2.25, -2.3, -0.5, -0.87], [1.7, 1.38, -0.63, -4.23], [0.64, -2.53, 0.7, 0.62], [0.24, 2.48, 2.23, -0.49], [-2.71, -3.39, 1.13, 1.59]], [[1.2, -3.11, -0.68, 3.71], [1.5, -1.17, -0.35, 0.37], [2.78, 3.17, 1.89, -1.69], [-1.23, 0.06, -0.99, 0.5], [0.88, 0.22, 1.28, 0.88]], [[-0.2, 1.58, -0.58, 0.11], [1.19, 3.08, 1.01, -1.18], [-1.14, 1.84, 2.22, 2.58], [-2.99, -0.39, 0.89, 2.65], [-3.26, -1.1, -0.96, -1.0]]]
BOXES = [[[0.55, 0.28, 0.52, 0.34], [0.27, 0.72, 0.69, 0.25], [0.55, 0.46, 0.46, 0.39], [0.6, 0.35, 0.59, 0.63], [0.68, 0.59, 0.25, 0.34]], [[0.62, 0.55, 0.3, 0.36], [0.74, 0.67, 0.39, 0.44], [0.26, 0.5, 0.31, 0.31], [0.49, 0.54, 0.4, 0.65], [0.35, 0.73, 0.67, 0.29]], [[0.44, 0.51, 0.54, 0.56], [0.6, 0.51, 0.38, 0.62], [0.26, 0.35, 0.44, 0.38], [0.41, 0.3, 0.45, 0.55], [0.34, 0.49, 0.68, 0.47]]]
AUX_LOGITS = [[[2.28, -0.18, 1.46, -3.69], [-0.05, 2.74, 5.31, 1.97], [0.75, 2.2, -2.29, 0.08], [5.39, 2.47, 1.09, 1.05], [-1.66, -2.81, 3.25, 0.34]], [[-3.22, -0.96, -0.29, -0.63], [1.15, 2.0, 1.09, 0.16], [1.73, -0.04, 1.98, -1.56], [-0.6, -0.38, 3.83, 1.38], [-4.64, -2.39, 0.39, -2.35]], [[0.23, 2.21, -2.79, 0.95], [0.34, 1.75, -0.57, 2.04], [-1.02, -3.43, -1.02, -0.95], [1.32, -2.41, 1.21, -1.09], [-2.2, -1.44, 0.02, 0.68]]]
AUX_BOXES = [[[0.53, 0.44, 0.5, 0.53], [0.3, 0.37, 0.7, 0.3], [0.48, 0.75, 0.59, 0.51], [0.28, 0.62, 0.32, 0.43], [0.42, 0.46, 0.5, 0.71]], [[0.53, 0.72, 0.65, 0.34], [0.61, 0.32, 0.39, 0.57], [0.58, 0.69, 0.42, 0.5], [0.63, 0.26, 0.68, 0.29], [0.5, 0.46, 0.37, 0.53]], [[0.71, 0.43, 0.35, 0.41], [0.25, 0.61, 0.38, 0.33], [0.36, 0.64, 0.63, 0.69], [0.59, 0.42, 0.43, 0.57], [0.71, 0.57, 0.38, 0.38]]]
# fmt: on
TARGETS = [
    BoxTargets(torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]]), torch.tensor([0, 2])),
    BoxTargets(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64)),
    BoxTargets(
        torch.tensor([[0.5, 0.5, 0.4, 0.6], [0.2, 0.3, 0.1, 0.1], [0.8, 0.2, 0.2, 0.3]]), torch.tensor([1, 1, 2])
    ),
]
DETR_REFERENCE = {
    "loss_ce": 1.3645484,
    "loss_bbox": 2.75,
    "loss_giou": 1.6414074,
    "loss_ce_0": 2.4115641,
    "loss_bbox_0": 3.0300002,
    "loss_giou_0": 1.8880723,
}
DETR_MATCHES = [([2, 4], [0, 1]), ([], []), ([1, 2, 3], [0, 1, 2])]


def output(aux: bool = True, groups: int = 1) -> DetectionOutput:
    extra = ((torch.tensor(AUX_LOGITS), torch.tensor(AUX_BOXES)),) if aux else ()
    return DetectionOutput(torch.tensor(LOGITS), torch.tensor(BOXES), extra, groups)


def test_criterion_equals_detr_reference():
    losses = SetCriterion(3)(output(), TARGETS)
    assert set(losses.terms) == set(DETR_REFERENCE)
    for name, value in DETR_REFERENCE.items():
        assert losses.terms[name].item() == pytest.approx(value, abs=1e-5), name
    assert losses.total.item() == pytest.approx(sum(DETR_REFERENCE.values()), abs=1e-5)


def test_matcher_equals_detr_reference_and_brute_force():
    out = output()
    matches = HungarianMatcher()(out.logits, out.boxes, TARGETS)
    assert [(q.tolist(), t.tolist()) for q, t in matches] == DETR_MATCHES
    # the assignment is optimal: scipy on each image's own cost matrix gives the same total cost
    cost = HungarianMatcher().cost_matrix(out.logits, out.boxes, TARGETS)
    start = 0
    for i, (q, t) in enumerate(matches):
        n = len(TARGETS[i].labels)
        c = cost[i, :, start : start + n]
        rows, cols = linear_sum_assignment(c.numpy())
        assert c[q, t].sum().item() == pytest.approx(c[rows, cols].sum().item())
        start += n


def test_matcher_known_assignment():
    """Queries that sit exactly on targets, in shuffled order, are matched to them."""
    targets = [
        BoxTargets(
            torch.tensor([[0.2, 0.2, 0.1, 0.1], [0.7, 0.7, 0.2, 0.2], [0.5, 0.2, 0.3, 0.1]]), torch.tensor([0, 1, 0])
        )
    ]
    boxes = torch.tensor([[[0.5, 0.5, 0.1, 0.1], [0.5, 0.2, 0.3, 0.1], [0.2, 0.2, 0.1, 0.1], [0.7, 0.7, 0.2, 0.2]]])
    logits = torch.zeros(1, 4, 3)
    q, t = HungarianMatcher()(logits, boxes, targets)[0]
    assert dict(zip(t.tolist(), q.tolist(), strict=True)) == {0: 2, 1: 3, 2: 1}


def test_matching_is_batch_invariant():
    out = output()
    together = HungarianMatcher()(out.logits, out.boxes, TARGETS)
    for i, target in enumerate(TARGETS):
        alone = HungarianMatcher()(out.logits[i : i + 1], out.boxes[i : i + 1], [target])[0]
        assert alone[0].tolist() == together[i][0].tolist() and alone[1].tolist() == together[i][1].tolist()


def test_no_targets_anywhere():
    out = output()
    empty = [BoxTargets(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64))] * 3
    assert all(len(q) == len(t) == 0 for q, t in HungarianMatcher()(out.logits, out.boxes, empty))
    losses = SetCriterion(3)(out, empty)
    assert losses.terms["loss_bbox"].item() == 0 and losses.terms["loss_giou"].item() == 0
    # every query is "no object": the cross-entropy is the mean -log p(no object)
    expected = -torch.log_softmax(out.logits, -1)[..., -1].mean()
    assert losses.terms["loss_ce"].item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("class_loss", [SoftmaxCrossEntropy, SigmoidFocalLoss, IoUAwareBCELoss])
def test_evaluation_loss_is_the_datasets_whatever_the_batches(class_loss):
    """Evaluation's `{stage}/loss_*` is each term's sum over the images of the split divided by
    the split's own count (target boxes; the class weights of every query for DETR's
    cross-entropy), whatever batches the images come in: one batch gives DETR's per-batch
    figures, and so does any split of it into batches, an image without boxes on its own
    included. (Per-batch means weighted by images made the total differ by 0.2 to 10 here.)"""
    out = output()
    if class_loss().sigmoid:  # the first 3 logits as K = 3 sigmoid ones
        out = out._replace(logits=out.logits[..., :3], aux=((out.aux[0][0][..., :3], out.aux[0][1]),), sigmoid=True)
    out = out._replace(enc=out.aux[0])  # two-stage proposals: `_enc` terms too
    criterion = SetCriterion(3, class_loss=class_loss()).eval()

    def dataset_losses(sizes: list[int]) -> dict[str, float]:
        means, start = LossMeans(), 0
        for n in sizes:
            part = slice(start, start + n)
            logits, boxes = out.logits[part], out.boxes[part]
            layers = (out.aux[0][0][part], out.aux[0][1][part])
            batch = out._replace(logits=logits, boxes=boxes, aux=(layers,), enc=layers)
            means.update("val", criterion(batch, TARGETS[part]), weight=n)
            start += n
        return {k: v.item() for k, v in means.pop("val").items()}

    whole = criterion(out, TARGETS)
    expected = {"val/loss": whole.total.item(), **{f"val/{k}": v.item() for k, v in whole.terms.items()}}
    assert len(expected) == 1 + 9  # the last layer's, an earlier layer's and the proposals' terms
    assert dataset_losses([3]) == pytest.approx(expected, rel=1e-6)
    for sizes in ([1, 1, 1], [2, 1], [1, 2]):
        assert dataset_losses(sizes) == pytest.approx(expected, rel=1e-6), sizes


def test_criterion_gradients_reach_every_layer():
    out = output()
    logits = out.logits.clone().requires_grad_()
    aux_logits = out.aux[0][0].clone().requires_grad_()
    SetCriterion(3)(DetectionOutput(logits, out.boxes, ((aux_logits, out.aux[0][1]),)), TARGETS).total.backward()
    assert logits.grad.abs().sum() > 0 and aux_logits.grad.abs().sum() > 0
    assert set(SetCriterion(3, aux_loss=False)(out, TARGETS).terms) == {"loss_ce", "loss_bbox", "loss_giou"}


def test_groups_match_each_group_one_to_one():
    """Two copies of the same queries as two groups: each group gets DETR's matching, and
    the loss equals the single group's (every term averages over the groups)."""
    out = output(aux=False)
    doubled = DetectionOutput(torch.cat([out.logits, out.logits], 1), torch.cat([out.boxes, out.boxes], 1), (), 2)
    matches = HungarianMatcher()(doubled.logits, doubled.boxes, TARGETS, num_groups=2)
    for (q, t), (q1, t1) in zip(matches, DETR_MATCHES, strict=True):
        assert q.tolist() == q1 + [i + 5 for i in q1] and t.tolist() == t1 + t1
    single = SetCriterion(3, aux_loss=False)(out, TARGETS)
    grouped = SetCriterion(3, aux_loss=False)(doubled, TARGETS)
    for name in single.terms:
        assert grouped.terms[name].item() == pytest.approx(single.terms[name].item(), rel=1e-6), name


def test_losses_in_fp32_under_autocast():
    out = output()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = SetCriterion(3)(DetectionOutput(out.logits.bfloat16(), out.boxes.bfloat16(), ()), TARGETS)
    assert losses.total.dtype == torch.float32
    # bf16 inputs are rounded, so compare loosely with the fp32 reference
    assert losses.terms["loss_giou"].item() == pytest.approx(DETR_REFERENCE["loss_giou"], abs=0.05)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_box_names_the_image_and_query(bad):
    """A diverged prediction stops with the image, the query and the fix, not scipy's
    "matrix contains invalid numeric entries"."""
    out = output(aux=False)
    boxes = out.boxes.clone()
    boxes[2, 3, 1] = bad
    with pytest.raises(NonFiniteError, match=r"image 2 of the batch, query 3: predicted box .*learning rate") as err:
        SetCriterion(3)(DetectionOutput(out.logits, boxes), TARGETS)
    assert (err.value.image, err.value.query) == (2, 3)
    # an image without targets is never matched: its bad boxes do not stop the others
    boxes = out.boxes.clone()
    boxes[1, 0] = bad
    assert torch.isfinite(SetCriterion(3, aux_loss=False)(DetectionOutput(out.logits, boxes), TARGETS).total)
