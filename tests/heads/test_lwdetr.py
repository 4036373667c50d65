"""LWDETRHead against RF-DETR's own decoder, and its padding, group and refinement contracts.

`rf_detr_reference.pt` holds the outputs of RF-DETR's code (rfdetr 1.4.1: `Transformer` of
models/transformer.py and `LWDETR.forward` of models/lwdetr.py, with its PyTorch
`MSDeformAttn`), run once on two fixed feature levels (8x6 and 4x3, width 16, batch 2,
no padding) with two-stage selection, box reparameterisation, 10 queries, 2 query groups,
2 decoder layers, in training (both groups) and evaluation (the first), both with its
default `lite_refpoint_refine=True` and with iterative refinement; its parameters (moved off
their initial values by a fixed random draw) are stored in vitdense's names
(`from_rf_detr`).
"""

from functools import partial
from pathlib import Path

import pytest
import torch
from torchvision.ops import box_convert

from vitdense.backbone import VisionTransformer, create_backbone
from vitdense.heads import LWDETRHead, MultiLevelProjector
from vitdense.heads.lwdetr import denoising_queries, from_rf_detr, refine_boxes
from vitdense.heads.pyramid import FeatureLevels
from vitdense.types import BoxTargets, ImageSizes

REFERENCE = Path(__file__).with_name("rf_detr_reference.pt")
HEAD = dict(
    num_classes=3,
    hidden_dim=16,
    num_queries=10,
    num_groups=2,
    num_heads=2,
    num_cross_heads=2,
    num_points=2,
    dim_feedforward=32,
    dec_layers=2,
)


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE)


def head_like_rf_detr(ref, refine: bool) -> LWDETRHead:
    neck = partial(MultiLevelProjector, feature_indexes=(0,), scale_factors=(2.0, 1.0), num_blocks=1)
    head = LWDETRHead(16, neck=neck, refine_references=refine, **HEAD)
    missing, unexpected = head.load_state_dict(ref["state_dict"], strict=False)
    assert not unexpected and all(k.startswith("neck.") for k in missing)
    return head


@pytest.mark.parametrize("refine", [False, True], ids=["lite", "refine"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_decoder_equals_rf_detrs(ref, refine, train):
    head = head_like_rf_detr(ref, refine).train(train)
    maps = tuple(ref["maps"])
    levels = FeatureLevels(maps, tuple(ImageSizes.full(2, (64, 48)).at_stride(s) for s in (8, 16)))
    with torch.no_grad():
        out = head.decode(levels)
    expected = ref[f"{'refine' if refine else 'lite'}_{'train' if train else 'eval'}"]
    assert out.num_groups == (2 if train else 1) and out.sigmoid
    torch.testing.assert_close(out.logits, expected["logits"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.boxes, expected["boxes"], rtol=1e-4, atol=1e-5)
    for (logits, boxes), (ref_logits, ref_boxes) in zip(out.aux, expected["aux"], strict=True):
        torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(boxes, ref_boxes, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.enc[0], expected["enc"][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.enc[1], expected["enc"][1], rtol=1e-4, atol=1e-5)


KEYPOINT_REFERENCE = Path(__file__).with_name("rf_detr_keypoints_reference.pt")


@pytest.mark.parametrize("downscale", [1, 2])
def test_keypoint_queries_equal_rf_detrs(downscale):
    """The GroupPose keypoint decoder against RF-DETR's own: `rf_detr_keypoints_reference.pt`
    holds rfdetr 1.11.2's `Transformer` + `LWDETR.forward` (PyPI wheel) with its keypoint
    preview's stream (`use_grouppose_keypoints`, 3 keypoints, `dual_projector_kp_only`: the
    keypoints sample their own levels, `keypoint_cross_attn`, one class) on the levels above,
    keypoint width hidden_dim / `downscale`, its parameters moved off their initial values
    by a seeded draw (layer scales 0.5), mapped by `from_rf_detr`; in training (both groups)
    and evaluation. RF-DETR's 8th keypoint channel is the class logit it sums into the logits."""
    ref = torch.load(KEYPOINT_REFERENCE)
    case = ref[f"downscale{downscale}"]
    neck = partial(MultiLevelProjector, feature_indexes=(0,), scale_factors=(2.0, 1.0), num_blocks=1)
    head = LWDETRHead(16, neck=neck, **{**HEAD, "num_classes": 1}, num_keypoints=3, keypoint_dim_downscale=downscale)
    missing, unexpected = head.load_state_dict(case["state_dict"], strict=False)
    assert not unexpected and all(k.startswith(("neck.", "keypoint_neck.")) for k in missing)
    sizes = tuple(ImageSizes.full(2, (64, 48)).at_stride(s) for s in (8, 16))
    for train in (True, False):
        with torch.no_grad():
            out = head.train(train).decode(
                FeatureLevels(tuple(ref["maps"]), sizes), keypoint_levels=FeatureLevels(tuple(ref["kp_maps"]), sizes)
            )
        expected = case["train" if train else "eval"]
        close = partial(torch.testing.assert_close, rtol=1e-4, atol=1e-5)
        close(out.logits, expected["logits"])
        close(out.boxes, expected["boxes"])
        close(out.keypoints, expected["keypoints"][..., :7])
        for keypoints, (_, _, ref_keypoints) in zip(out.aux_keypoints, expected["aux"], strict=True):
            close(keypoints, ref_keypoints[..., :7])
        close(out.enc[0], expected["enc"][0])
        close(out.enc[1], expected["enc"][1])
        close(out.enc_keypoints, expected["enc"][2][..., :7])


def test_from_rf_detr_refuses_what_it_cannot_map():
    """Keypoints per class (a class mask between their queries) and the inter-instance
    keypoint attention have no counterpart: named, not dropped."""
    with pytest.raises(ValueError, match="per class"):
        from_rf_detr({"transformer.decoder.keypoint_class_mask": torch.tensor([[False, True], [True, False]])})
    with pytest.raises(ValueError, match="inter-instance"):
        from_rf_detr({"transformer.decoder.layers.0.inter_inst_kp_attn.in_proj_weight": torch.zeros(1)})
    assert from_rf_detr({"transformer.decoder.keypoint_class_mask": torch.zeros(4, 4, dtype=torch.bool)}) == {}


SIZES = [(64, 48), (40, 56)]  # padded to (64, 56): the first on the right, the second at the bottom


def build(hybrid: bool):
    torch.manual_seed(0)
    if hybrid:  # the demo's ResNet stem + ViT (each image's stem runs at its own size)
        vit = create_backbone("vit_tiny_r_s16_p8_224", img_size=64, model_args={"depth": 2, "patch_size": 2}).eval()
    else:
        vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2).eval()
    neck = partial(MultiLevelProjector, feature_indexes=(0, 1), scale_factors=(2.0, 1.0, 0.5), num_blocks=1)
    head = LWDETRHead(vit.embed_dim, neck=neck, **{**HEAD, "num_queries": 6})
    with torch.no_grad():  # move the zero-initialised heads, so that boxes and references vary
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return vit, head


@pytest.fixture(scope="module")
def model():
    return build(hybrid=False)


def detect(model, images, sizes):
    vit, head = model
    return head(vit(images, sizes, intermediates=head.feature_indexes, norm_intermediates=True))


@pytest.mark.parametrize("hybrid", [False, True], ids=["plain", "hybrid"])
def test_an_image_gives_the_same_detections_alone_and_padded(hybrid):
    model = build(hybrid)
    torch.manual_seed(1)
    sizes = ImageSizes.of(SIZES)
    images = torch.zeros(2, 3, *sizes.padded)
    for i, (h, w) in enumerate(SIZES):
        images[i, :, :h, :w] = torch.randn(3, h, w)
    model[1].eval()
    with torch.no_grad():
        together = detect(model, images, sizes)
        for i, (h, w) in enumerate(SIZES):
            alone = detect(model, images[i : i + 1, :, :h, :w], ImageSizes.of([(h, w)]))
            torch.testing.assert_close(together.logits[i], alone.logits[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(together.boxes[i], alone.boxes[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(together.enc[1][i], alone.enc[1][0], rtol=1e-4, atol=1e-4)


def test_the_first_group_is_the_deployed_model(model):
    """In training the other groups neither see the first nor change its selection: the
    first group's outputs equal evaluation's (dropout 0)."""
    _, head = model
    images, sizes = torch.randn(2, 3, 40, 48), ImageSizes.full(2, (40, 48))
    with torch.no_grad():
        grouped = detect(model, images, sizes) if head.train() else None
        alone = detect(model, images, sizes) if head.eval() else None
    q = head.num_queries
    assert grouped.logits.shape[1] == 2 * q and alone.logits.shape[1] == q
    torch.testing.assert_close(grouped.logits[:, :q], alone.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped.boxes[:, :q], alone.boxes, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grouped.enc[1][:, :q], alone.enc[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("refine", [True, False])
def test_each_layer_attends_around_the_previous_box_when_refining(model, refine):
    """With `refine_references`, layer 2 attends around layer 1's reference moved by the box
    head on layer 1's output (before the decoder norm, as RF-DETR's loop does; valid ratios
    are 1 here); without (RF-DETR's default), around the first references, as layer 1 does."""
    _, head = model
    seen, outputs = [], []
    hooks = [
        layer.cross_attn.register_forward_hook(lambda m, args, out: seen.append(args[1])) for layer in head.decoder
    ]
    hooks.append(head.decoder[0].register_forward_hook(lambda m, args, out: outputs.append(out)))
    head.eval().refine_references = refine
    try:
        with torch.no_grad():
            detect(model, torch.randn(1, 3, 40, 48), None)
    finally:
        for hook in hooks:
            hook.remove()
        head.refine_references = False
    first, second = seen[0][:, :, 0], seen[1][:, :, 0]
    with torch.no_grad():
        moved = refine_boxes(first, head.bbox_embed(outputs[0]), reparam=True)
    if refine:
        torch.testing.assert_close(second, moved, rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(first, second) and not torch.allclose(second, moved)


def dn_head(**kwargs) -> tuple[VisionTransformer, LWDETRHead]:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2).eval()
    neck = partial(MultiLevelProjector, feature_indexes=(0, 1), scale_factors=(1.0, 0.5), num_blocks=1)
    return vit, LWDETRHead(24, neck=neck, **{**HEAD, "num_queries": 6, "dn_groups": 3, **kwargs}).train()


TARGETS = [
    BoxTargets(torch.tensor([[0.5, 0.5, 0.2, 0.3], [0.3, 0.3, 0.1, 0.1]]), torch.tensor([1, 2])),
    BoxTargets(torch.tensor([[0.4, 0.6, 0.2, 0.2]]), torch.tensor([0])),
]


def run(model, images, sizes, targets=None):
    vit, head = model
    features = vit(images, sizes, intermediates=head.feature_indexes, norm_intermediates=True)
    return head(features, targets)


def test_matching_queries_do_not_see_the_denoising_ones():
    """With denoising queries added in training, the matching queries' outputs (all groups)
    and the two-stage proposals are those of the same head trained without them."""
    model = dn_head()
    images, sizes = torch.randn(2, 3, 48, 40), ImageSizes.of([(48, 40), (33, 40)])
    with torch.no_grad():
        plain = run(model, images, sizes)
        denoised = run(model, images, sizes, TARGETS)
    assert plain.dn is None and denoised.dn is not None
    torch.testing.assert_close(denoised.logits, plain.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(denoised.boxes, plain.boxes, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(denoised.aux[0][1], plain.aux[0][1], rtol=1e-5, atol=1e-5)
    # 3 groups x 2 targets at most: image 0's 2 targets in each group, image 1's 1 (and a padding query)
    assert [q.tolist() for q, _ in denoised.dn.matches] == [[0, 1, 2, 3, 4, 5], [0, 2, 4]]
    assert denoised.dn.layers[-1][0].shape == (2, 6, 3)


def test_denoising_queries_without_noise_start_on_their_targets():
    """Without noise, a fresh head's denoising queries predict their own targets (the box head
    starts at zero offsets): no box loss; an image's queries do not depend on another image's
    number of targets (padding denoising queries are seen by no one)."""
    from vitdense.losses import IoUAwareBCELoss, SetCriterion

    model = dn_head(dn_label_noise=0.0, dn_box_noise=0.0, dropout=0.0)
    images, sizes = torch.randn(2, 3, 48, 40), ImageSizes.of([(48, 40), (33, 40)])
    images[1, :, 33:] = 0  # padded as the collate pads
    with torch.no_grad():
        out = run(model, images, sizes, TARGETS)
        losses = SetCriterion(3, class_loss=IoUAwareBCELoss())(out, TARGETS)
        alone = run(model, images[1:, :, :33, :40], ImageSizes.of([(33, 40)]), TARGETS[1:])
    assert losses.terms["loss_bbox_dn"] < 1e-5 and losses.terms["loss_giou_dn"] < 1e-4  # (fp32 rounding)
    assert losses.terms["loss_bbox_dn_0"] < 1e-5 and losses.terms["loss_ce_dn"] > 0.01
    queries = out.dn.matches[1][0]  # image 1: queries 0, 2, 4 padded in the batch, 0, 1, 2 alone
    torch.testing.assert_close(out.dn.layers[-1][0][1, queries], alone.dn.layers[-1][0][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.dn.layers[-1][1][1, queries], alone.dn.layers[-1][1][0], rtol=1e-4, atol=1e-4)


def test_noise_moves_labels_and_boxes_within_their_bounds():
    torch.manual_seed(0)
    many = [BoxTargets(torch.tensor([[0.5, 0.5, 0.4, 0.2]]).repeat(200, 1), torch.zeros(200, dtype=torch.int64))]
    noised = denoising_queries(many, 1, 4, label_noise=0.5, box_noise=1.0)
    flipped = (noised.labels != 0).float().mean()
    assert 0.3 < flipped < 0.45  # redrawn half the time, to another class 3 times in 4: 0.375
    corners = box_convert(noised.boxes[0], "cxcywh", "xyxy")
    assert (corners[:, 0] >= 0.1 - 1e-6).all() and (corners[:, 0] <= 0.5 + 1e-6).all()  # x1 = 0.3 +- 0.2
    assert corners[:, 0].std() > 0.05


def test_the_task_hands_the_targets_over_in_training_only():
    from vitdense.losses import SetCriterion, SigmoidFocalLoss
    from vitdense.tasks import BackboneConfig, DetectionTask
    from vitdense.types import DetectedImages

    neck = partial(MultiLevelProjector, feature_indexes=(0, 1), scale_factors=(1.0,), num_blocks=1)
    settings = {k: v for k, v in HEAD.items() if k != "num_classes"}  # (the task gives it)
    head = partial(LWDETRHead, neck=neck, **{**settings, "num_queries": 4, "dn_groups": 2})
    task = DetectionTask(
        num_classes=3,
        head=head,
        criterion=partial(SetCriterion, class_loss=SigmoidFocalLoss()),
        backbone=BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 2, "patch_size": 8}),
        selection="top_k",
    )
    batch = DetectedImages(torch.randn(2, 3, 40, 40), tuple(TARGETS), torch.arange(2), ImageSizes.full(2, (40, 40)))
    trained = task.train().forward_batch(batch, "train")
    assert trained.dn is not None and "loss_ce_dn" in task.compute_loss(trained, batch, "train").terms
    assert task.eval().forward_batch(batch, "val").dn is None
