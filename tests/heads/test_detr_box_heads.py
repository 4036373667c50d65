"""DETRHead's box heads and box-to-pixel bias.

- With box refinement, one box head per decoder layer (Deformable DETR's `with_box_refine`,
  Plain-DETR, LW-DETR); each layer uses its own. Without, DETR's one shared head.
- The shared layout gives the outputs of the code before the option existed (commit
  637ce0f): `detr_box_heads_before.pt` holds what `outputs(build(name))` returned there, on
  the same seeds. Its weights (the old key layout) load into the per-layer layout and give
  the same outputs, as an old checkpoint rebuilt from its init_args does.
- The box bias in pixels (`box_bias_mode="pixels"`) equals Plain-DETR's formula, written
  out below from its `GlobalCrossAttention` (`rpe_type="linear"`), on a padded batch.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitdense.backbone import ViTFeatures
from vitdense.heads import DETRHead
from vitdense.heads.detr import BoxRelativePositionBias
from vitdense.types import ImageSizes

FIXTURE = Path(__file__).with_name("detr_box_heads_before.pt")
SMALL = dict(embed_dim=24, num_classes=3, hidden_dim=16, num_queries=5, num_heads=2, dim_feedforward=32)
HEADS = {
    "detr": dict(SMALL, dropout=0.0, dec_layers=3, num_groups=2),
    "refine": dict(SMALL, dropout=0.0, dec_layers=3, num_groups=2, box_bias=True, box_bias_hidden=8),
}
SIZES = [(64, 48), (40, 56)]  # padded to (64, 56): the first on the right, the second at the bottom


def features() -> ViTFeatures:
    """Fixed patch tokens of two images padded into one batch, at stride 8 ([2, 8 * 7, 24])."""
    sizes = ImageSizes.of(SIZES).at_stride(8)
    h, w = sizes.grid
    tokens = torch.randn(2, h * w, 24, generator=torch.Generator().manual_seed(1))
    tokens = tokens.masked_fill(sizes.mask().flatten(1)[..., None], 0.0)
    return ViTFeatures(None, tokens, (h, w), sizes, tokens[:, :0])


def build(name: str, **flags) -> DETRHead:
    """The head `name` on seed 0, its shared box head's last layer moved off zero (so that
    refinement moves the boxes)."""
    torch.manual_seed(0)
    head = DETRHead(**HEADS[name], **flags)
    torch.nn.init.normal_(head.bbox_embed.layers[-1].weight, std=0.1)
    torch.nn.init.normal_(head.bbox_embed.layers[-1].bias, std=0.1)
    return head


def outputs(head: DETRHead) -> dict[str, dict[str, torch.Tensor]]:
    """Every layer's logits and boxes, in training (2 groups) and evaluation."""
    out = {}
    with torch.no_grad():
        for mode in ("train", "eval"):
            o = head.train(mode == "train")(features())
            out[mode] = {
                "logits": o.logits,
                "boxes": o.boxes,
                "aux_logits": torch.stack([a[0] for a in o.aux]),
                "aux_boxes": torch.stack([a[1] for a in o.aux]),
            }
    return out


def write_fixture() -> None:
    """What wrote `FIXTURE`, run on the code before `share_box_head` (a shared head)."""
    torch.save({name: outputs(build(name)) for name in HEADS}, FIXTURE)


def assert_outputs_equal(ours: dict, expected: dict) -> None:
    for mode, tensors in expected.items():
        for name, value in tensors.items():
            torch.testing.assert_close(ours[mode][name], value, rtol=0, atol=1e-6, msg=f"{mode} {name}")


def layers(head: DETRHead) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer's logits [L, B, Q, K + 1] and boxes [L, B, Q, 4], in evaluation."""
    with torch.no_grad():
        out = head.eval()(features())
    return (
        torch.stack([*(a[0] for a in out.aux), out.logits]),
        torch.stack([*(a[1] for a in out.aux), out.boxes]),
    )


def test_shared_box_head_gives_the_outputs_of_the_code_before():
    before = torch.load(FIXTURE, weights_only=True)
    assert_outputs_equal(outputs(build("detr")), before["detr"])  # DETR: shared by default
    assert_outputs_equal(outputs(build("refine", share_box_head=True)), before["refine"])


def test_weights_of_a_shared_box_head_load_into_per_layer_heads():
    """What an old checkpoint does: its init_args (no `share_box_head`) rebuild per-layer heads,
    its one `bbox_embed.layers.*` loads into each of them, and the outputs are the old ones."""
    old = build("refine", share_box_head=True).state_dict()
    assert [k for k in old if k.startswith("bbox_embed")] == [
        f"bbox_embed.layers.{i}.{p}" for i in range(3) for p in ("weight", "bias")
    ]  # the layout before the option
    head = DETRHead(**HEADS["refine"])
    assert not head.share_box_head and len(head.bbox_embed) == 3
    head.load_state_dict(old)  # strict
    assert_outputs_equal(outputs(head), torch.load(FIXTURE, weights_only=True)["refine"])
    # per-layer weights cannot go into one shared head: the message says which option to set
    with pytest.raises(RuntimeError, match="share_box_head=False"):
        DETRHead(**HEADS["refine"], share_box_head=True).load_state_dict(head.state_dict())


def test_each_refinement_layer_has_its_own_box_head():
    torch.manual_seed(0)
    head = DETRHead(**HEADS["refine"])
    heads = list(head.bbox_embed)
    params = [p for h in heads for p in h.parameters()]
    assert len({p.data_ptr() for p in params}) == len(params)  # no parameter shared
    assert all(not h.layers[-1].weight.any() and not h.layers[-1].bias.any() for h in heads)  # zero offsets
    # copies of one initialised head, and the rest drawn as before: at initialisation the shared head's function
    torch.manual_seed(0)
    shared = DETRHead(**HEADS["refine"], share_box_head=True)
    for ours, theirs in zip(layers(head), layers(shared), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)

    logits, boxes = layers(head)
    for k in range(3):  # move layer k's head: layer k's boxes change, and then everything after it
        with torch.no_grad():
            head.bbox_embed[k].layers[-1].bias.add_(0.3)
        moved_logits, moved_boxes = layers(head)
        with torch.no_grad():
            head.bbox_embed[k].layers[-1].bias.sub_(0.3)
        for i in range(3):
            assert torch.equal(moved_boxes[i], boxes[i]) == (i < k), (k, i)
            assert torch.equal(moved_logits[i], logits[i]) == (i <= k), (k, i)  # layer k saw the old reference


def test_per_layer_box_heads_without_refinement():
    torch.manual_seed(0)
    head = DETRHead(**HEADS["detr"], share_box_head=False)
    logits, boxes = layers(head)
    with torch.no_grad():
        head.bbox_embed[1].layers[-1].bias.add_(0.3)
    moved_logits, moved_boxes = layers(head)
    assert torch.equal(moved_logits, logits)
    assert [torch.equal(moved_boxes[i], boxes[i]) for i in range(3)] == [True, False, True]


def plain_detr_box_rpb(boxes, mask, stride, mlp_x, mlp_y):
    """Plain-DETR's box-to-pixel bias as its code computes it (impiga/Plain-DETR,
    models/global_rpe_decomp_decoder.py `GlobalCrossAttention.forward` with rpe_type="linear",
    reference boxes scaled by the valid ratios of models/transformer.py `get_valid_ratio` as
    its `GlobalDecoder` does), padding pushed down by -100 as there.

    boxes [B, Q, 4] cxcywh of each image; mask [B, h, w] True on padding; mlp_x, mlp_y:
    [.., 2] -> [.., heads] -> logits bias [B, heads, Q, h * w]."""
    _, h, w = mask.shape
    valid_ratio = torch.stack([(~mask[:, 0, :]).sum(1) / w, (~mask[:, :, 0]).sum(1) / h], -1)  # [B, 2] (w, h)
    reference = (boxes * torch.cat([valid_ratio, valid_ratio], -1)[:, None])[:, :, None]  # [B, Q, 1, 4]
    ref_pts = torch.cat([reference[..., :2] - reference[..., 2:] / 2, reference[..., :2] + reference[..., 2:] / 2], -1)
    ref_pts[..., 0::2] *= w * stride
    ref_pts[..., 1::2] *= h * stride
    pos_x = torch.linspace(0.5, w - 0.5, w)[None, None, :, None] * stride
    pos_y = torch.linspace(0.5, h - 0.5, h)[None, None, :, None] * stride
    rpe_x, rpe_y = mlp_x(ref_pts[..., 0::2] - pos_x), mlp_y(ref_pts[..., 1::2] - pos_y)  # [B, Q, w or h, heads]
    rpe = (rpe_x[:, :, None] + rpe_y[:, :, :, None]).flatten(2, 3).permute(0, 3, 1, 2)
    return rpe + mask.flatten(1)[:, None, None] * -100.0


def test_box_bias_in_pixels_equals_plain_detr():
    torch.manual_seed(0)
    heads, stride = 4, 16
    sizes = ImageSizes.of([(160, 96), (112, 136)]).at_stride(stride)  # grids (10, 6) and (7, 9) in (10, 9)
    boxes = torch.cat([torch.rand(2, 6, 2), torch.rand(2, 6, 2) * 0.5 + 0.05], -1)  # cx, cy, w, h
    rpb = BoxRelativePositionBias(heads, 512, mode="pixels")
    for mlp in (rpb.mlp_x, rpb.mlp_y):  # Plain-DETR's cpb_mlp: Linear(2, 512), ReLU, Linear(512, heads, bias=False)
        first, last = mlp.layers
        assert last.bias is None and not first.bias.any() and abs(first.weight.std() - 0.02) < 0.002

    def cpb_mlp(mlp):
        first, last = mlp.layers
        return lambda x: F.linear(F.relu(F.linear(x, first.weight, first.bias)), last.weight)

    mask = sizes.mask()
    with torch.no_grad():
        ours = rpb(boxes, sizes).reshape(2, heads, 6, -1)
        theirs = plain_detr_box_rpb(boxes, mask, stride, cpb_mlp(rpb.mlp_x), cpb_mlp(rpb.mlp_y))
    valid = ~mask.flatten(1)[:, None, None].expand_as(ours)
    torch.testing.assert_close(ours[valid], theirs[valid], rtol=1e-5, atol=1e-5)
    # the attention both give: theirs pushes padding down by 100, the decoder masks it out
    logits = torch.randn_like(ours)
    ours_attn = (logits + ours).masked_fill(~valid, float("-inf")).softmax(-1)
    torch.testing.assert_close(ours_attn, (logits + theirs).softmax(-1), rtol=1e-5, atol=1e-6)
