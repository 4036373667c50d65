"""Windowed attention in the backbone (ViTDet's window_size, RF-DETR's num_windows)."""

import pytest
import timm
import torch

from vitdense.backbone import VisionTransformer
from vitdense.types import ImageSizes

SIZES = [(56, 40), (33, 50)]  # padded to (56, 50): 7 x 7 patches of 8 (the second image 5 x 7, the first 7 x 5)
ARGS = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2)


def vit(**kwargs) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(**{**ARGS, **kwargs}).eval()


@pytest.fixture(scope="module")
def batch():
    torch.manual_seed(1)
    sizes = ImageSizes.of(SIZES)
    images = torch.zeros(2, 3, *sizes.padded)
    for i, (h, w) in enumerate(SIZES):
        images[i, :, :h, :w] = torch.randn(3, h, w)
    return images, sizes


def reference_block_mask(grid, window, prefix, valid):
    """The dense [B, T, T] mask windowed attention stands for, written out: a patch sees the
    patches of its window and the prefix tokens, a prefix token sees everything; padding
    is never a key."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    window_id = (rows // window[0] * 1000 + cols // window[1]).flatten()
    same = window_id[:, None] == window_id[None, :]
    t = prefix + h * w
    mask = torch.ones(t, t, dtype=torch.bool)
    mask[prefix:, prefix:] = same
    return mask[None] & valid[:, None, :]


def dense_forward(model, images, sizes, masks):
    """The encoder written out with explicit attention under a given [B, T, T] mask per block."""
    x = model.add_pos_embed(model.patch_embed(images, sizes), sizes.at_stride(model.patch_size))
    for blk, mask in zip(model.blocks, masks, strict=True):
        a = blk.attn
        b, t, d = x.shape
        q, k, v = a.qkv(blk.norm1(x)).reshape(b, t, 3, a.num_heads, a.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * a.scale) @ k.transpose(-2, -1)).masked_fill(~mask[:, None], float("-inf")).softmax(-1)
        x = x + a.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        x = x + blk.mlp(blk.norm2(x))
    return model.norm(x)


@pytest.mark.parametrize("attn_impl", ["sdpa", "math"])
def test_windows_equal_dense_masked_attention(batch, attn_impl):
    """Windows of 3 x 3 tokens over a 7 x 7 grid (not a multiple), with a class token and 2
    registers, on a padded batch, block 1 global: the encoder equals explicit attention under
    the dense masks the window definition describes."""
    images, sizes = batch
    model = vit(reg_tokens=2, window_size=3, global_attn_indexes=(1,), attn_impl=attn_impl)
    p = model.num_prefix_tokens
    grid = sizes.at_stride(8).grid
    valid = torch.cat([torch.ones(2, p, dtype=torch.bool), ~sizes.at_stride(8).mask().flatten(1)], 1)
    windowed_mask = reference_block_mask(grid, (3, 3), p, valid)
    global_mask = valid[:, None, :].expand(-1, valid.shape[1], -1)
    with torch.no_grad():
        ours = model(images, sizes)
        reference = dense_forward(model, images, sizes, [windowed_mask, global_mask, windowed_mask])
    valid_patches = valid[:, p:, None]
    torch.testing.assert_close(ours.patch_tokens, (reference[:, p:] * valid_patches), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.prefix_tokens, reference[:, :p], rtol=1e-5, atol=1e-5)


def test_one_window_is_global_attention(batch):
    images, sizes = batch
    with torch.no_grad():
        plain = vit()(images, sizes).patch_tokens
        for kwargs in ({"num_windows": 1}, {"window_size": 7}, {"window_size": 100}):
            torch.testing.assert_close(vit(**kwargs)(images, sizes).patch_tokens, plain, rtol=0, atol=0)
        # 2 x 2 windows differ from it: the blocks do window
        assert not torch.allclose(vit(num_windows=2)(images, sizes).patch_tokens, plain, atol=1e-4)


def test_window_size_keeps_an_image_the_same_alone_and_padded(batch):
    images, sizes = batch
    model = vit(window_size=3, global_attn_indexes=(2,))
    with torch.no_grad():
        together = model(images, sizes)
        for i, (h, w) in enumerate(SIZES):
            alone = model(images[i : i + 1, :, :h, :w], ImageSizes.of([(h, w)]))
            gh, gw = alone.grid_size
            mine = together.spatial()[i, :, :gh, :gw]
            torch.testing.assert_close(mine, alone.spatial()[0], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(together.cls_token[i], alone.cls_token[0], rtol=1e-4, atol=1e-5)


def test_timm_weights_load_unchanged(tmp_path):
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=0)
    model = VisionTransformer(img_size=32, patch_size=16, embed_dim=192, depth=2, num_heads=3, window_size=1)
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and not [k for k in missing if not k.startswith("pos_embed_resampler")]


def test_fully_padded_windows_without_prefix_stay_finite():
    """Without prefix tokens, windows holding only padding have no key: no NaN in the output
    or the gradients."""
    model = vit(class_token=False, window_size=2).train()
    sizes = ImageSizes.of([(56, 56), (8, 8)])  # the second image is one patch: most of its windows are padding
    images = torch.randn(2, 3, 56, 56, requires_grad=True)
    out = model(images, sizes)
    out.patch_tokens.sum().backward()
    assert torch.isfinite(out.patch_tokens).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert torch.isfinite(images.grad).all()


def test_bad_window_arguments_are_named():
    with pytest.raises(ValueError, match="not both"):
        vit(window_size=2, num_windows=2)
    with pytest.raises(ValueError, match="out of range"):
        vit(window_size=2, global_attn_indexes=(5,))
