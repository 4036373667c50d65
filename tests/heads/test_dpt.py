"""DPTHead against isl-org/DPT's `DPTDepthModel` (commit cd3fe90, MIT).

`dpt_reference.pt` holds DPT's outputs for a tiny ViT-B/16-shaped model (D=32, 12 blocks,
2 heads, native 64 x 64, hooks (2, 5, 8, 11), out_channels (8, 16, 24, 32), features 16)
on one 64 x 96 image, for each readout, computed by /tmp/dpthead_ref/make_reference.py
with weights from `reference_weights` below (drawn in sorted-name order from one seed).
DPT resamples its square position table to the input's grid with bilinear interpolation;
here that table, resampled the same way (`dpt_resize_pos_embed`), is the backbone's native
one, so vitdense's own (bicubic) resampling is not involved. The maps equal DPT's exactly (max
difference 0.0). /tmp/dpthead_ref/check_transformers.py checked `dpt_state_dict_from_transformers`
the same way against transformers 5.24's `DPTForDepthEstimation` (square 64 x 64 input: its
plain ViT lays tokens on a square grid only): max difference 0.0.

`dpt_hybrid_reference.pt` holds DPT-Hybrid's (`DPTDepthModel(backbone="vitb_rn50_384")`,
readout "project") output for the same ViT-B-shaped encoder behind a ResNetV2 stem of one
block per stage (timm's R50 layout cut to (1, 1, 1): stages of 256, 512 and 1024 channels,
stride 16), hooks (0, 1, 8, 11) = stages 0 and 1 of the ResNet, then blocks 8 and 11,
out_channels (256, 512, 24, 32), on the same image, computed by
/tmp/depth2_ref/make_hybrid_reference.py (DPT at the same commit, timm 1.0.31's hybrid
VisionTransformer standing in for timm 0.4's `vit_base_resnet50_384`): max difference 0.0.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitdense.backbone import VisionTransformer
from vitdense.backbone.hybrid import HybridEmbed
from vitdense.heads import DPTHead
from vitdense.heads.dpt import dpt_state_dict_from_transformers, split_dpt_checkpoint
from vitdense.types import ImageSizes

FIXTURE = Path(__file__).with_name("dpt_reference.pt")
HYBRID_FIXTURE = Path(__file__).with_name("dpt_hybrid_reference.pt")
HYBRID_LAYERS, HYBRID_OUT_CHANNELS = (1, 1, 1), (256, 512, 24, 32)
D, DEPTH, HEADS, NATIVE = 32, 12, 2, 64
OUT_CHANNELS, FEATURES = (8, 16, 24, 32), 16
IMAGE = (64, 96)
WEIGHT_SEED, INPUT_SEED = 0, 1


def reference_weights(shapes: dict[str, tuple[int, ...]], seed: int = WEIGHT_SEED) -> dict[str, torch.Tensor]:
    """Random weights by name, drawn in sorted-name order (the reference script uses the same):
    matrices and kernels N(0, 1/fan), norm weights 1 + N(0, 0.1), the rest N(0, 0.1), position
    embeddings and class token N(0, 0.5). Large enough that the depth stays mostly positive."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        w = torch.randn(shape, generator=g)
        if name.endswith(("pos_embed", "cls_token")):
            w = 0.5 * w
        elif len(shape) > 1:
            w = w / math.sqrt(math.prod(shape[1:]))
        elif "norm" in name and name.endswith("weight"):
            w = 1 + 0.1 * w
        else:
            w = 0.1 * w
        out[name] = w
    return out


def dpt_resize_pos_embed(pos_embed: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """DPT's `_resize_pos_embed` (dpt/vit.py): the square table bilinearly resampled."""
    old = int(math.sqrt(pos_embed.shape[1] - 1))
    table = pos_embed[0, 1:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    table = F.interpolate(table, size=grid, mode="bilinear").permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)
    return torch.cat([pos_embed[:, :1], table], 1)


def backbone() -> VisionTransformer:
    return VisionTransformer(img_size=IMAGE, patch_size=16, embed_dim=D, depth=DEPTH, num_heads=HEADS)


def head(readout: str = "project", **kwargs) -> DPTHead:
    return DPTHead(D, features=FEATURES, readout=readout, out_channels=OUT_CHANNELS, **kwargs)


def hybrid_backbone() -> VisionTransformer:
    embed = HybridEmbed(HYBRID_LAYERS, patch_size=1, embed_dim=D)
    return VisionTransformer(img_size=IMAGE, embed_dim=D, depth=DEPTH, num_heads=HEADS, patch_embed=embed)


def hybrid_head() -> DPTHead:
    """DPT-Hybrid's head: hooks (0, 1, 8, 11), the first two the ResNet's stages."""
    return DPTHead(D, features=FEATURES, out_channels=HYBRID_OUT_CHANNELS, stage_maps=2, depth=DEPTH)


def dpt_shapes(vit: VisionTransformer, dpt: DPTHead) -> dict[str, tuple[int, ...]]:
    """The names and shapes of DPT's state dict for this model (its square native table)."""
    shapes = {f"pretrained.model.{k}": tuple(v.shape) for k, v in vit.state_dict().items()}
    shapes["pretrained.model.pos_embed"] = (1, 1 + (NATIVE // 16) ** 2, D)
    shapes.update({k: tuple(v.shape) for k, v in dpt.state_dict().items()})
    return shapes


def load_reference_weights(vit: VisionTransformer, dpt: DPTHead) -> dict[str, torch.Tensor]:
    """DPT's weights into both modules; returns DPT's state dict."""
    state = reference_weights(dpt_shapes(vit, dpt))
    vit_state, head_state = split_dpt_checkpoint(state)
    vit_state["pos_embed"] = dpt_resize_pos_embed(vit_state["pos_embed"], (IMAGE[0] // 16, IMAGE[1] // 16))
    vit.load_state_dict(vit_state)
    dpt.load_state_dict(head_state)
    return state


def reference_input() -> torch.Tensor:
    return torch.randn(1, 3, *IMAGE, generator=torch.Generator().manual_seed(INPUT_SEED))


def run(vit: VisionTransformer, dpt: DPTHead, x: torch.Tensor, image_sizes: ImageSizes | None = None) -> torch.Tensor:
    return dpt(vit(x, image_sizes, intermediates=dpt.block_hooks, stem_stages=dpt.stage_hooks))


@pytest.fixture(scope="module")
def reference() -> dict:
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[VisionTransformer, DPTHead]]:
    torch.manual_seed(0)
    out = {}
    for readout in ("project", "add", "ignore"):
        vit, dpt = backbone().eval(), head(readout).eval()
        load_reference_weights(vit, dpt)
        out[readout] = (vit, dpt)
    return out


@pytest.mark.parametrize("readout", ["project", "add", "ignore"])
def test_equals_dpt(models, reference, readout):
    vit, dpt = models[readout]
    with torch.no_grad():
        out = run(vit, dpt, reference_input())
    assert out.shape == (1, 1, *IMAGE)  # DPT: the input resolution
    expected = reference[readout]
    if readout == "project":  # the whole map
        assert (expected > 0).float().mean() > 0.4  # not a trivially zero (ReLU-clipped) map
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    else:  # every 4th pixel and the sum
        torch.testing.assert_close(out[..., ::4, ::4], expected["sub"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out.sum(), expected["sum"], atol=1e-2, rtol=1e-5)


def test_readouts_differ(reference):
    assert not torch.allclose(reference["project"][..., ::4, ::4], reference["add"]["sub"])
    assert not torch.allclose(reference["add"]["sub"], reference["ignore"]["sub"])


@pytest.fixture(scope="module")
def small() -> tuple[VisionTransformer, DPTHead]:
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, patch_size=16, embed_dim=16, depth=4, num_heads=2)
    dpt = DPTHead(16, num_outputs=2, features=8, hooks=(0, 1, 2, 3), out_channels=(4, 4, 8, 8), non_negative=False)
    return vit, dpt


@pytest.mark.parametrize("size", [(32, 64), (48, 80)])
def test_output_shape_non_square(small, size):
    vit, dpt = small
    with torch.no_grad():
        out = run(vit, dpt, torch.randn(2, 3, *size))
    # 16 x the patch grid; odd grids (48 x 80 -> 3 x 5) too, which DPT's exact 2x upsampling cannot fuse
    assert out.shape == (2, 2, *size)


def test_gradients_reach_all_parts(small):
    vit, dpt = small
    vit.zero_grad(), dpt.zero_grad()
    run(vit, dpt, torch.randn(1, 3, 32, 64)).square().mean().backward()
    missing = [n for n, p in [*dpt.named_parameters(), *vit.named_parameters()] if p.grad is None or not p.grad.any()]
    # DPT's deepest fusion block has no skip input: its first residual unit is never used; DPT
    # reads raw block outputs, so the backbone's final norm is unused too
    unused = [n for n, _ in dpt.named_parameters() if n.startswith("scratch.refinenet4.resConfUnit1.")]
    assert sorted(missing) == sorted([*unused, "norm.bias", "norm.weight"])


def test_padded_batch_runs_and_padding_tokens_are_zeroed(small):
    vit, dpt = small
    x = torch.randn(2, 3, 32, 64)
    x[1, :, :, 32:] = 0
    sizes = ImageSizes(((32, 64), (32, 32)), (32, 64))
    with torch.no_grad():
        out = run(vit, dpt, x, sizes)
        first = run(vit, dpt, x[:1])
    assert out.shape == (2, 2, 32, 64) and torch.isfinite(out).all()
    # the first (unpadded) image is its own; the padded one is not what it gives alone (see DPTHead)
    torch.testing.assert_close(out[:1], first, atol=1e-5, rtol=1e-5)


TINY = {"features": 8, "out_channels": (4, 4, 8, 8)}


def test_hooks_errors(small):
    vit, _ = small
    with pytest.raises(ValueError, match=r"hooks \[12\] are out of range for a backbone of depth 4"):
        DPTHead(16, hooks=(0, 1, 2, 12), depth=4, **TINY)
    with pytest.raises(ValueError, match="out of range for depth 4"):  # without depth: the backbone says it
        vit(torch.randn(1, 3, 32, 32), intermediates=DPTHead(16, hooks=(0, 1, 2, 12), **TINY).hooks)
    with pytest.raises(ValueError, match="need 4 entries"):
        DPTHead(16, hooks=(0, 1, 2), **TINY)
    with pytest.raises(ValueError, match="intermediates=head.block_hooks"):
        DPTHead(16, **TINY)(vit(torch.randn(1, 3, 32, 32)))


def test_transformers_names_map_to_dpt():
    """transformers' DPTForDepthEstimation names (a tiny model's, listed by hand) -> DPT's."""
    hf = {
        "dpt.embeddings.cls_token": torch.zeros(1, 1, 4),
        "dpt.encoder.layer.0.attention.attention.query.weight": torch.full((4, 4), 1.0),
        "dpt.encoder.layer.0.attention.attention.key.weight": torch.full((4, 4), 2.0),
        "dpt.encoder.layer.0.attention.attention.value.weight": torch.full((4, 4), 3.0),
        "dpt.encoder.layer.0.layernorm_after.bias": torch.zeros(4),
        "neck.reassemble_stage.readout_projects.2.0.weight": torch.zeros(4, 8),
        "neck.reassemble_stage.layers.0.resize.weight": torch.zeros(1),
        "neck.convs.3.weight": torch.zeros(1),
        "neck.fusion_stage.layers.0.residual_layer2.convolution1.bias": torch.zeros(1),
        "neck.fusion_stage.layers.3.projection.weight": torch.zeros(1),
        "head.head.4.bias": torch.zeros(1),
    }
    out = dpt_state_dict_from_transformers(hf)
    assert set(out) == {
        "pretrained.model.cls_token",
        "pretrained.model.blocks.0.attn.qkv.weight",
        "pretrained.model.blocks.0.norm2.bias",
        "pretrained.act_postprocess3.0.project.0.weight",
        "pretrained.act_postprocess1.4.weight",
        "scratch.layer4_rn.weight",
        "scratch.refinenet4.resConfUnit2.conv1.bias",
        "scratch.refinenet1.out_conv.weight",
        "scratch.output_conv.4.bias",
    }
    assert out["pretrained.model.blocks.0.attn.qkv.weight"][:, 0].tolist() == [1.0] * 4 + [2.0] * 4 + [3.0] * 4


@pytest.fixture(scope="module")
def hybrid() -> tuple[VisionTransformer, DPTHead]:
    torch.manual_seed(0)
    vit, dpt = hybrid_backbone().eval(), hybrid_head().eval()
    load_reference_weights(vit, dpt)
    return vit, dpt


def test_hybrid_equals_dpt_hybrid(hybrid):
    """DPT-Hybrid: the 1/4 and 1/8 maps are the ResNet's stages 0 and 1 as they are (DPT's
    `act_postprocess1/2` are identities, no parameters), blocks 8 and 11 reassembled."""
    vit, dpt = hybrid
    assert dpt.hooks == (0, 1, 8, 11) and dpt.stage_hooks == (0, 1) and dpt.block_hooks == (8, 11)
    assert not any(
        k.startswith(("pretrained.act_postprocess1", "pretrained.act_postprocess2")) for k in dpt.state_dict()
    )
    with torch.no_grad():
        out = run(vit, dpt, reference_input())
    expected = torch.load(HYBRID_FIXTURE, weights_only=True)["project"]
    assert out.shape == (1, 1, *IMAGE) and (expected > 0).float().mean() > 0.4
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_hybrid_head_needs_the_stage_maps(hybrid):
    vit, dpt = hybrid
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad(), pytest.raises(ValueError, match="stem_stages=head.stage_hooks"):
        dpt(vit(x, intermediates=dpt.hooks))  # the four hooks as blocks: no stage maps
    with pytest.raises(ValueError, match="stage_maps=3"):
        DPTHead(D, stage_maps=3)
