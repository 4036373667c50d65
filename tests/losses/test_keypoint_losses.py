"""RF-DETR's keypoint terms and matching cost against rfdetr's own code, and the keypoint terms
inside DETR's set criterion (matching and loss) on DETRHead and LWDETRHead outputs."""

from functools import partial
from pathlib import Path

import pytest
import torch

from vitdense.backbone import VisionTransformer
from vitdense.heads import DETRHead, LWDETRHead, MultiLevelProjector
from vitdense.heads.keypoints import KeypointHead
from vitdense.losses import HungarianMatcher, SetCriterion, SigmoidFocalLoss
from vitdense.losses.keypoints import KeypointLoss
from vitdense.types import BoxTargets, DetectionOutput

# inputs (4 objects, 5 keypoints, the last object without labelled keypoints; 6 queries) and
# what rfdetr 1.11.2's `compute_l1_keypoint_loss` / `compute_keypoint_matching_cost` give for
# them (computed once with the rfdetr wheel's module, saved with its inputs)
REFERENCE = torch.load(Path(__file__).with_name("keypoint_losses_reference.pt"), weights_only=True)


def test_terms_equal_rf_detr():
    ours = KeypointLoss.per_object(REFERENCE["pred"], REFERENCE["target"], REFERENCE["area"])
    assert ours.keys() == REFERENCE["loss"].keys()
    for name, value in REFERENCE["loss"].items():
        torch.testing.assert_close(ours[name], value.float(), atol=1e-6, rtol=0, msg=name)
    # the object without labelled keypoints has no location or NLL term, but its findable /
    # visible terms (every keypoint "not findable") count
    assert ours["loss_keypoints_l1"][-1] == 0 and ours["loss_keypoints_nll"][-1] == 0
    assert ours["loss_keypoints_findable"][-1] > 0


def test_matching_cost_equals_rf_detr():
    weights = {"l1": 2.0, "findable": 0.5, "visible": 3.0, "nll": 0.25}
    loss = KeypointLoss(weights["l1"], weights["findable"], weights["visible"], weights["nll"])
    cost = loss.matching_cost(REFERENCE["query_pred"], REFERENCE["target"], REFERENCE["area"])
    expected = sum(weights[name] * value for name, value in REFERENCE["cost"].items())
    torch.testing.assert_close(cost, expected.float(), atol=2e-6, rtol=0)


def test_unlabelled_keypoints_pass_no_gradient():
    """A keypoint with v = 0 (x = y = 0 by convention) moves nothing but its findable and
    visible logits, however far the prediction is (RF-DETR masks it before any product)."""
    pred = REFERENCE["pred"].float().clone().requires_grad_()
    target = REFERENCE["target"].float()
    sum(KeypointLoss.per_object(pred, target, REFERENCE["area"]).values()).sum().backward()
    unlabelled = target[..., 2] == 0
    assert unlabelled.any()
    assert (pred.grad[unlabelled][:, [0, 1, 4, 5, 6]] == 0).all()
    assert (pred.grad[unlabelled][:, 2:4] != 0).all()


def keypoint_targets() -> list[BoxTargets]:
    g = torch.Generator().manual_seed(3)
    targets = []
    for n in (2, 0, 3):
        boxes = torch.rand(n, 4, generator=g) * 0.4 + 0.2
        keypoints = torch.rand(n, 5, 3, generator=g)
        keypoints[..., 2] = torch.randint(0, 3, (n, 5), generator=g).float()
        keypoints[..., :2] = torch.where(keypoints[..., 2:] > 0, keypoints[..., :2], 0.0)
        targets.append(BoxTargets(boxes, torch.randint(0, 2, (n,), generator=g), keypoints))
    return targets


def test_criterion_adds_the_keypoint_terms_and_cost():
    """With keypoints in the output, every decoder layer's matching adds RF-DETR's keypoint
    cost and its loss the four terms, summed over the matched objects / the batch's boxes."""
    torch.manual_seed(0)
    targets = keypoint_targets()
    b, q = 3, 6
    logits, boxes = torch.randn(b, q, 3), torch.rand(b, q, 4) * 0.5 + 0.25
    keypoints = torch.randn(b, q, 5, 7) * 0.3
    aux = ((torch.randn(b, q, 3), torch.rand(b, q, 4) * 0.5 + 0.25),)
    aux_keypoints = (torch.randn(b, q, 5, 7) * 0.3,)
    output = DetectionOutput(logits, boxes, aux, keypoints=keypoints, aux_keypoints=aux_keypoints)
    kp_loss = KeypointLoss(loss_l1=2.0, loss_nll=0.5)
    criterion = SetCriterion(2, keypoint_loss=kp_loss)
    losses = criterion(output, targets)
    for suffix, (layer_logits, layer_boxes), layer_keypoints in (
        ("", (logits, boxes), keypoints),
        ("_0", aux[0], aux_keypoints[0]),
    ):
        # the matching: box costs plus the keypoint cost, per image
        matcher = HungarianMatcher()
        box_cost = matcher.cost_matrix(layer_logits, layer_boxes, targets)
        full = matcher.cost_matrix(layer_logits, layer_boxes, targets, None, layer_keypoints, kp_loss)
        tgt = torch.cat([t.keypoints for t in targets])
        area = torch.cat([t.boxes[:, 2] * t.boxes[:, 3] for t in targets])
        extra = kp_loss.matching_cost(layer_keypoints.flatten(0, 1), tgt, area).view(b, q, -1)
        torch.testing.assert_close(full, box_cost + extra)
        matches = matcher(layer_logits, layer_boxes, targets, 1, None, layer_keypoints, kp_loss)
        # the terms: per matched object, summed, over the batch's 5 boxes
        per_object = KeypointLoss.per_object(
            torch.cat([layer_keypoints[i, qi] for i, (qi, _) in enumerate(matches)]),
            torch.cat([t.keypoints[j] for t, (_, j) in zip(targets, matches, strict=True)]),
            torch.cat([t.boxes[j, 2] * t.boxes[j, 3] for t, (_, j) in zip(targets, matches, strict=True)]),
        )
        for name, value in per_object.items():
            torch.testing.assert_close(losses.terms[name + suffix], kp_loss.weights[name] * value.sum() / 5)
    assert losses.total == pytest.approx(float(sum(losses.terms.values())), rel=1e-6)


def test_keypoints_need_keypoint_targets():
    output = DetectionOutput(torch.randn(1, 4, 3), torch.rand(1, 4, 4), keypoints=torch.randn(1, 4, 5, 7))
    plain = [BoxTargets(torch.tensor([[0.5, 0.5, 0.2, 0.2]]), torch.tensor([0]))]
    with pytest.raises(ValueError, match="the head predicts keypoints .* but the targets have none"):
        SetCriterion(2)(output, plain)


def test_keypoint_head_starts_at_box_centres():
    head = KeypointHead(16, 5)
    boxes = torch.tensor([[[0.3, 0.6, 0.2, 0.4]]], requires_grad=True)
    out = head(torch.randn(1, 1, 16), boxes)
    assert out.shape == (1, 1, 5, 7)
    torch.testing.assert_close(out[0, 0, :, :2], torch.tensor([[0.3, 0.6]] * 5))
    assert (out[..., 2:] == 0).all()  # logits 1/2, identity precision factor
    out[..., :2].sum().backward()
    assert boxes.grad is None or (boxes.grad == 0).all()  # keypoints do not move the box


@pytest.mark.parametrize("head_type", ["detr", "lwdetr"])
def test_detection_heads_predict_keypoints_on_every_layer(head_type):
    """Both DETR heads give [B, G*Q, K, 7] keypoints for the last layer and each earlier one,
    placed relative to that layer's boxes, trained through the criterion (every keypoint
    weight gets a gradient; LW-DETR's two-stage proposals have keypoints of their own heads,
    its denoising queries' keypoints theirs)."""
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2).eval()
    small = dict(hidden_dim=32, num_queries=5, num_groups=2, num_heads=2, dim_feedforward=64, dec_layers=2)
    if head_type == "detr":
        head, criterion = DETRHead(24, 2, num_keypoints=5, **small), SetCriterion(2)
    else:
        neck = partial(MultiLevelProjector, feature_indexes=(0, 1), scale_factors=(1.0, 0.5), num_blocks=1)
        head = LWDETRHead(24, 2, neck=neck, num_cross_heads=2, dn_groups=2, num_keypoints=5, **small)
        criterion = SetCriterion(2, class_loss=SigmoidFocalLoss())
    # move the keypoint head off its zero start, so that where it places keypoints shows
    if head_type == "detr":
        torch.nn.init.normal_(head.keypoint_embed.mlp[-2].weight, std=0.1)
    else:  # (and the proposals', or the layers before their zero last layer would get no gradient yet)
        for mlp in [head.keypoint_embed, *head.enc_out_keypoint_embed]:
            torch.nn.init.normal_(mlp.layers[-1].weight, std=0.1)
    images = torch.randn(3, 3, 32, 32)
    features = vit(images, intermediates=getattr(head, "feature_indexes", ()), norm_intermediates=True)
    targets = keypoint_targets()
    head.train()
    output = head(features, targets) if head_type == "lwdetr" else head(features)
    assert output.keypoints.shape == (3, 10, 5, 7)
    assert len(output.aux_keypoints) == 1 and output.aux_keypoints[0].shape == (3, 10, 5, 7)
    # DETR's relative to the layer's own box, LW-DETR's to the queries' reference boxes (as RF-DETR)
    offsets = (output.keypoints[..., :2] - output.boxes[..., None, :2]) / output.boxes[..., None, 2:]
    assert offsets.abs().max() > 0
    losses = criterion(output, targets)
    assert {"loss_keypoints_l1", "loss_keypoints_nll_0"} <= losses.terms.keys()
    # LW-DETR's denoising queries learn their targets' keypoints too (their own keypoint queries)
    assert (
        ("loss_keypoints_l1_dn" in losses.terms)
        == ("loss_keypoints_nll_dn_0" in losses.terms)
        == (head_type == "lwdetr")
    )
    # the two-stage proposals' keypoints, from their own heads (RF-DETR's enc_out_keypoint_embed)
    assert ("loss_keypoints_l1_enc" in losses.terms) == (head_type == "lwdetr")
    losses.total.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.keypoint_embed.parameters())
    if head_type == "lwdetr":
        assert output.enc_keypoints.shape == (3, 10, 5, 7)
        # the keypoint queries' whole stream learns: initialisers, positions, every layer, their neck
        stream = [head.keypoint_decoder, head.keypoint_query_initializer, head.keypoint_query_initializer_enc]
        stream += [head.keypoint_neck, head.enc_out_keypoint_embed]
        named = [(n, p) for m in stream for n, p in m.named_parameters()] + [("pos", head.keypoint_pos_embed)]
        assert not [n for n, p in named if p.grad is None or p.grad.abs().sum() == 0]
    head.eval()
    with torch.no_grad():
        out = head(features)
    assert out.keypoints.shape == (3, 5, 5, 7) and out.aux_keypoints[0].shape == (3, 5, 5, 7)
    assert out.dn is None
