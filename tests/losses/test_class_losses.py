"""Sigmoid class losses and their matching costs against the reference implementations.

`class_losses_reference.pt` holds numbers computed once, in float64, by the references' own
code run on the same inputs (2 images, 6 queries, 3 classes; 3 and 1 targets; a fixed
matching): Deformable DETR's `sigmoid_focal_loss` as its `SetCriterion.loss_labels` calls it
(times the number of queries) and its matcher's focal class cost; RF-DETR's
`SetCriterion.loss_labels` with `ia_bce_loss=True` (rfdetr/models/lwdetr.py) and its
matcher's focal class cost (log-sigmoid form).
"""

from pathlib import Path

import pytest
import torch

from vitdense.losses import HungarianMatcher, IoUAwareBCELoss, SetCriterion, SigmoidFocalLoss, SoftmaxCrossEntropy
from vitdense.types import BoxTargets, DetectionOutput

REFERENCE = Path(__file__).with_name("class_losses_reference.pt")


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE)


def matched(ref):
    batch = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(ref["indices"])])
    query = torch.cat([q for q, _ in ref["indices"]])
    labels = torch.cat([t[1][j] for t, (_, j) in zip(ref["targets"], ref["indices"], strict=True)])
    boxes = torch.cat([t[0][j] for t, (_, j) in zip(ref["targets"], ref["indices"], strict=True)])
    return (batch, query), labels, boxes


def ious_of(pred, target):
    from torchvision.ops import box_convert, box_iou

    return box_iou(box_convert(pred, "cxcywh", "xyxy"), box_convert(target, "cxcywh", "xyxy")).diagonal()


@pytest.mark.parametrize(("loss", "key"), [(SigmoidFocalLoss(), "focal"), (IoUAwareBCELoss(), "ia_bce")])
def test_loss_equals_the_reference(ref, loss, key):
    (batch, query), labels, boxes = matched(ref)
    ious = ious_of(ref["boxes"][batch, query], boxes)
    value = loss(ref["logits"], (batch, query), labels, ious, ref["num_boxes"])
    torch.testing.assert_close(value, ref[key], rtol=1e-6, atol=1e-6)


def test_focal_matching_cost_equals_the_references(ref):
    labels = torch.cat([t[1] for t in ref["targets"]])
    cost = SigmoidFocalLoss().matching_cost(ref["logits"].flatten(0, 1), labels)
    torch.testing.assert_close(cost, ref["rfdetr_cost"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cost, ref["deformable_cost"], rtol=1e-5, atol=1e-6)  # (its logs add 1e-8)
    assert torch.equal(IoUAwareBCELoss().matching_cost(ref["logits"].flatten(0, 1), labels), cost)


def test_ia_bce_gradient_flows_through_the_negative_weights(ref):
    """As in RF-DETR's code, p^gamma on unmatched pairs is not detached: the gradient of an
    unmatched logit x is d/dx [p^gamma x - p^gamma log sigmoid(x)] with p^gamma varying too."""
    logits = ref["logits"].clone().requires_grad_()
    (batch, query), labels, boxes = matched(ref)
    IoUAwareBCELoss()(logits, (batch, query), labels, torch.ones(len(labels)), 1.0).backward()
    x = ref["logits"][0, 1, 0].clone().requires_grad_()  # query 1 of image 0 is unmatched
    p = x.sigmoid()
    (p**2 * x - p**2 * torch.nn.functional.logsigmoid(x)).backward()
    torch.testing.assert_close(logits.grad[0, 1, 0], x.grad)


def test_criterion_with_a_sigmoid_loss_matches_with_its_cost(ref):
    """SetCriterion hands its class loss to the matcher; a two-stage output's proposals are
    matched and supervised as one more layer (`_enc`); mismatched heads and losses fail early."""
    targets = [BoxTargets(b, lab) for b, lab in ref["targets"]]
    logits = ref["logits"].clone().requires_grad_()
    output = DetectionOutput(logits, ref["boxes"], (), 1, enc=(ref["logits"] * 0.5, ref["boxes"]), sigmoid=True)
    criterion = SetCriterion(3, HungarianMatcher(cost_class=2.0), class_loss=IoUAwareBCELoss())
    losses = criterion(output, targets)
    assert set(losses.terms) == {f"loss_{n}{s}" for n in ("ce", "bbox", "giou") for s in ("", "_enc")}
    matches = HungarianMatcher(cost_class=2.0)(logits, ref["boxes"], targets, 1, IoUAwareBCELoss())
    batch = torch.cat([torch.full_like(q, i) for i, (q, _) in enumerate(matches)])
    query = torch.cat([q for q, _ in matches])
    labels = torch.cat([t.labels[j] for t, (_, j) in zip(targets, matches, strict=True)])
    boxes = torch.cat([t.boxes[j] for t, (_, j) in zip(targets, matches, strict=True)])
    expected = IoUAwareBCELoss()(logits, (batch, query), labels, ious_of(ref["boxes"][batch, query], boxes), 4.0)
    torch.testing.assert_close(losses.terms["loss_ce"], expected)
    with pytest.raises(ValueError, match="class_loss to match the head"):
        SetCriterion(3)(output, targets)
    with pytest.raises(ValueError, match="class_loss to match the head"):
        SetCriterion(3, class_loss=SigmoidFocalLoss())(DetectionOutput(torch.zeros(2, 6, 4), ref["boxes"]), targets)


def test_softmax_cost_is_detrs():
    logits = torch.randn(5, 4)
    labels = torch.tensor([0, 2, 2])
    torch.testing.assert_close(SoftmaxCrossEntropy().matching_cost(logits, labels), -logits.softmax(-1)[:, labels])
