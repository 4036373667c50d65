"""timm's Eva family (DINOv3, EVA-02, PE-Core, RoPE-ViT) as vitdense encoders: equal to timm's
`forward_features` from saved timm weights, padded batches equal to each image alone, RoPE's
coordinate augmentation, windows, checkpointing, refusals."""

import pytest
import torch

from tests.backbone.test_parity import assert_matches_timm, timm_reference
from vitdense.backbone import create_backbone
from vitdense.backbone.rope import _dinov3_traced
from vitdense.core.errors import ConfigError
from vitdense.types.collate import pad_stack

# (timm name, architecture overrides: 2 blocks and narrow where the model is wide) -- one per RoPE
# and block kind: DINOv3 (centred coordinates, registers, LayerScale, no table, no qkv bias),
# EVA-02 Ti (index grid against a reference shape, packed SwiGLU, q/v bias, table) and B (separate
# q/k/v, SwiGLU with its inner norm), PE-Core (AttentionRope, norm_pre, patch embedding without
# bias, 'xy' grid with offset), RoPE-ViT mixed (learned per-block frequencies) with a table (ape)
FAMILIES = {
    "dinov3": ("vit_small_patch16_dinov3_qkvb", {"depth": 2}),
    "eva02_ti": ("eva02_tiny_patch14_224", {"depth": 2}),
    "eva02_b": ("eva02_base_patch14_224", {"depth": 2, "embed_dim": 192, "num_heads": 3}),
    "pe_core": ("vit_pe_core_tiny_patch16_384", {"depth": 2}),
    "rope_mixed": ("vit_small_patch16_rope_mixed_ape_224", {"depth": 2}),
}


def perturbed_reference(name: str, args: dict) -> torch.nn.Module:
    """timm's model with every parameter moved off its initial value (zero biases and unit
    norms would hide a missing term)."""
    torch.manual_seed(0)
    ref = timm_reference(name, **args)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return ref


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(timm reference, vitdense encoder loaded from the reference's saved weights)."""
    name, args = FAMILIES[request.param]
    ref = perturbed_reference(name, args)
    path = tmp_path_factory.mktemp(request.param) / "w.pth"
    torch.save(ref.state_dict(), path)
    return ref, create_backbone(name, checkpoint=path, model_args=args).eval()


def test_forward_matches_timm(family):
    ref, ours = family
    p = ours.patch_size[0]
    # non-square, off the native grid, and not multiples of the patch size
    assert_matches_timm(ours, ref, [(5 * p, 7 * p), (9 * p + 3, 4 * p - 5)])


def test_padded_batch_matches_each_image_alone(family):
    """Each image takes the rotary coordinates (and table) of its own grid; padding is never attended."""
    _, ours = family
    p = ours.patch_size[0]
    images = [torch.randn(3, 4 * p, 6 * p), torch.randn(3, 7 * p - 3, 3 * p), torch.randn(3, 2 * p, 2 * p)]
    batch, sizes = pad_stack(images)
    with torch.no_grad():
        together = ours(batch, sizes)
        for b, img in enumerate(images):
            alone = ours(img[None])
            h, w = alone.grid_size
            tokens = together.patch_tokens[b].reshape(*together.grid_size, -1)[:h, :w]
            torch.testing.assert_close(tokens, alone.patch_tokens[0].reshape(h, w, -1), rtol=0, atol=2e-5)
            torch.testing.assert_close(together.prefix_tokens[b], alone.prefix_tokens[0], rtol=0, atol=2e-5)


def test_forward_intermediates_match_timm(family):
    ref, ours = family
    x = torch.randn(1, 3, 3 * ours.patch_size[0], 5 * ours.patch_size[0])
    with torch.no_grad():
        for kwargs in ({"indices": 2}, {"indices": [0], "norm": True, "output_fmt": "NLC"}):
            final, inter = ref.forward_intermediates(x, return_prefix_tokens=True, **kwargs)
            our_final, our_inter = ours.forward_intermediates(x, return_prefix_tokens=True, **kwargs)
            torch.testing.assert_close(our_final, final, rtol=0, atol=1e-5)
            for (a, a_prefix), (b, b_prefix) in zip(our_inter, inter, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
                torch.testing.assert_close(a_prefix, b_prefix, rtol=0, atol=1e-5)


def test_dinov3_coordinates_are_each_images_own():
    """DINOv3's rotary coordinates are (r + 0.5) / h_i mapped to [-1, 1] over each image's own grid."""
    ours = create_backbone("vit_small_patch16_dinov3", model_args={"depth": 1})
    _, sizes = pad_stack([torch.zeros(3, 32, 64), torch.zeros(3, 64, 32)])
    rope = ours.rotary(sizes.at_stride(ours.patch_size))  # [1, B, 4*4, 1, 2 * head_dim]
    alone = ours.rope.get_embed(shape=[2, 4])  # the first image's 2 x 4 grid
    torch.testing.assert_close(rope[0, 0, :, 0].reshape(4, 4, -1)[:2], alone.reshape(2, 4, -1))
    assert not rope[0, 0, :, 0].reshape(4, 4, -1)[2:].any()  # padding rows: zeros
    centred = ours.rope.get_embed(shape=[4, 2])
    assert not torch.allclose(centred.reshape(4, 2, -1)[:2], alone.reshape(2, 4, -1)[:, :2])


def test_rope_coordinate_augmentation_in_training_only():
    """timm's / DINOv3's shift, jitter and rescale of the rotary coordinates: drawn anew per
    training forward, never in evaluation."""
    args = {"depth": 1, "rope_shift_coords": 0.5, "rope_jitter_coords": 1.5, "rope_rescale_coords": 2.0}
    ours = create_backbone("vit_small_patch16_dinov3", model_args=args)
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        ours.eval()
        assert torch.equal(ours(x).patch_tokens, ours(x).patch_tokens)
        ours.train()
        torch.manual_seed(0)
        first = ours(x).patch_tokens
        assert not torch.allclose(first, ours(x).patch_tokens)
        torch.manual_seed(0)
        assert torch.equal(first, ours(x).patch_tokens)  # seeded: reproducible (resumable training)


def test_windowed_rope_batch_invariant_and_checkpointing_same_gradients():
    """ViTDet windows over a RoPE encoder: the rotation happens before the windows are cut, so
    an image padded into a batch keeps its features; checkpointed blocks give the same gradients."""
    args = {"depth": 2, "window_size": 2, "global_attn_indexes": [1]}
    ours = create_backbone("vit_small_patch16_dinov3", model_args=args).eval()
    images = [torch.randn(3, 64, 48), torch.randn(3, 32, 80)]
    batch, sizes = pad_stack(images)
    with torch.no_grad():
        together = ours(batch, sizes)
        alone = ours(images[0][None])
    h, w = alone.grid_size
    tokens = together.patch_tokens[0].reshape(*together.grid_size, -1)[:h, :w]
    torch.testing.assert_close(tokens, alone.patch_tokens[0].reshape(h, w, -1), rtol=0, atol=2e-5)

    grads = []
    for enable in (False, True):
        ours.zero_grad()
        ours.set_grad_checkpointing(enable)
        ours(batch, sizes).patch_tokens.square().mean().backward()
        grads.append(ours.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_layer_ids_and_no_weight_decay_cover_eva_parameters():
    ours = create_backbone("vit_small_patch16_rope_mixed_224", model_args={"depth": 2})
    assert ours.layer_id("rope.freqs") == 0 and ours.layer_id("blocks.1.gamma_2") == 2
    assert {"rope.freqs", "blocks.0.gamma_1", "reg_token"} - {"reg_token"} <= ours.no_weight_decay()
    ours.freeze(1)
    assert not ours.rope.freqs.requires_grad and not ours.blocks[0].attn.qkv.weight.requires_grad
    assert ours.blocks[1].attn.qkv.weight.requires_grad


@pytest.mark.parametrize(
    ("name", "args", "reason"),
    [
        ("vit_base_patch16_sapiens2", {}, "RmsNorm as block norm"),
        ("eva02_enormous_patch14_clip_224", {"depth": 1, "embed_dim": 64, "num_heads": 2}, "EvaBlockPostNorm"),
    ],
)
def test_unsupported_eva_features_are_refused_with_the_reason(name, args, reason):
    with pytest.raises(ConfigError, match=reason):
        create_backbone(name, model_args=args)


def test_dinov3_rope_built_for_export_equals_timms():
    """The DINOv3 embedding vitdense builds while exporting (symbolic sizes) is timm's."""
    rope = create_backbone("vit_small_patch16_dinov3", model_args={"depth": 1}).rope
    for grid in [(3, 5), (7, 2), (1, 1)]:
        torch.testing.assert_close(_dinov3_traced(rope, grid), rope.get_embed(shape=list(grid)), rtol=0, atol=1e-6)


def test_dinov3_checkpoint_in_metas_own_layout_loads(tmp_path):
    """A file as facebookresearch/dinov3 saves it (storage tokens, ls1.gamma, one qkv bias with
    the key's zeros and its bias_mask, mask_token, rope_embed.periods) goes through timm's
    converter to the same features as timm's layout."""
    name, args = FAMILIES["dinov3"]
    ref = perturbed_reference(name, args)
    meta = {"mask_token": torch.zeros(1, ref.embed_dim), "rope_embed.periods": torch.ones(16)}
    for key, value in ref.state_dict().items():
        if key.endswith("attn.q_bias"):
            v_bias = ref.state_dict()[key.replace("q_bias", "v_bias")]
            meta[key.replace("q_bias", "qkv.bias")] = torch.cat([value, torch.zeros_like(value), v_bias])
            meta[key.replace("q_bias", "qkv.bias_mask")] = torch.ones(3 * value.numel())
        elif not key.endswith("attn.v_bias"):
            key = key.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma")
            meta[key.replace("gamma_2", "ls2.gamma")] = value
    torch.save({"teacher": None, "model": meta}, tmp_path / "dinov3_vits16.pth")
    ours = create_backbone(name, checkpoint=tmp_path / "dinov3_vits16.pth", model_args=args).eval()
    assert_matches_timm(ours, ref, [(48, 80)], batch=1)
