"""Behaviour of the encoder itself: padding, batch invariance, attention, caching, training switches."""

import pytest
import torch
import torch.nn.functional as F

from vitdense.backbone import VisionTransformer, ViTFeatures
from vitdense.types import ImageSizes
from vitdense.types.collate import pad_stack


def tiny(**kwargs) -> VisionTransformer:
    args = dict(img_size=64, patch_size=16, embed_dim=48, depth=3, num_heads=3)
    return VisionTransformer(**(args | kwargs)).eval()


def pad_batch(images: list[torch.Tensor]) -> tuple[torch.Tensor, ImageSizes]:
    """Top-left aligned zero padding and the batch's sizes, as the collate makes them."""
    return pad_stack(images)


@pytest.mark.parametrize(
    "kwargs", [{}, {"dist_token": True, "reg_tokens": 2}, {"no_embed_class": True, "init_values": 0.1}]
)
def test_padded_batch_matches_each_image_alone(kwargs):
    model = tiny(**kwargs)
    images = [torch.randn(3, 64, 80), torch.randn(3, 37, 50), torch.randn(3, 96, 33)]
    batch, sizes = pad_batch(images)
    with torch.no_grad():
        together = model(batch, sizes)
        padding = together.padding()
        for b, img in enumerate(images):
            alone = model(img[None])
            h, w = alone.grid_size
            assert (~padding[b]).sum() == h * w  # exactly the image's own tokens are not padding
            tokens = together.patch_tokens[b].reshape(*together.grid_size, -1)[:h, :w]
            torch.testing.assert_close(tokens, alone.patch_tokens[0].reshape(h, w, -1), rtol=0, atol=1e-5)
            torch.testing.assert_close(together.prefix_tokens[b], alone.prefix_tokens[0], rtol=0, atol=1e-5)
            assert not together.patch_tokens[b][padding[b]].any()  # padding is zeroed


def test_no_padding_tokens_when_no_token_is_only_padding():
    model = tiny()
    x = torch.randn(2, 3, 64, 64)
    sizes = ImageSizes(((64, 64), (60, 64)), (64, 64))  # padding inside the last row of patches
    with torch.no_grad():
        f = model(x, sizes)
    assert f.padding() is None and f.image_sizes.grids == ((4, 4), (4, 4))
    assert f.patch_tokens.shape == (2, 16, 48)
    assert f.spatial().shape == (2, 48, 4, 4)


def test_features_shapes_and_prefix_order():
    model = tiny(dist_token=True, reg_tokens=4)
    with torch.no_grad():
        f = model(torch.randn(2, 3, 48, 80))
    assert isinstance(f, ViTFeatures)
    assert f.grid_size == (3, 5)
    assert f.patch_tokens.shape == (2, 15, 48)
    assert f.prefix_tokens.shape == (2, 6, 48)
    torch.testing.assert_close(f.cls_token, f.prefix_tokens[:, 0])
    gap = tiny(class_token=False)
    with torch.no_grad():
        g = gap(torch.randn(1, 3, 64, 64))
    assert g.cls_token is None and g.prefix_tokens.shape == (1, 0, 48)


def test_intermediates_and_attentions():
    model = tiny()
    images = [torch.randn(3, 64, 64), torch.randn(3, 32, 48)]
    batch, sizes = pad_batch(images)
    with torch.no_grad():
        f = model(batch, sizes, intermediates=(0, -1), attentions=(-1,))
        plain = model(batch, sizes)
    padding = f.padding()
    assert len(f.intermediates) == 2 and f.intermediates[0].shape == (2, 17, 48)
    # the last block's raw output, normed, is what the features hold
    torch.testing.assert_close(model.norm(f.intermediates[1])[:, 1:][~padding], f.patch_tokens[~padding])
    # asking for attention (unfused path) does not change the result
    torch.testing.assert_close(f.patch_tokens, plain.patch_tokens, rtol=0, atol=1e-5)
    (attn,) = f.attentions
    assert attn.shape == (2, 3, 17, 17)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, 17))
    keys_padded = F.pad(padding, (1, 0), value=False)
    assert attn[1][..., keys_padded[1]].abs().max() == 0  # padded keys get no weight
    assert attn[0].min() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_and_math_attention_agree(dtype):
    images = [torch.randn(3, 64, 64), torch.randn(3, 40, 64)]
    batch, sizes = pad_batch(images)
    outs = []
    for impl in ("sdpa", "math"):
        torch.manual_seed(0)
        model = tiny(attn_impl=impl)
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            outs.append(model(batch, sizes).patch_tokens.float())
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=tol)


def test_pos_embed_resampled_per_grid_and_cached_only_without_grad():
    model = tiny()
    resampler = model.pos_embed_resampler
    with torch.no_grad():
        a = resampler.resample(model.pos_embed, (3, 5))
        assert resampler.resample(model.pos_embed, (3, 5)) is a  # cached
        assert resampler.resample(model.pos_embed, (4, 4)) is model.pos_embed  # native grid
        model.pos_embed.add_(1.0)  # an optimizer step: the cache must not serve stale values
        b = resampler.resample(model.pos_embed, (3, 5))
    torch.testing.assert_close(b, a + 1.0, rtol=0, atol=1e-5)
    model.train()
    x = torch.randn(1, 3, 48, 80)
    model(x).patch_tokens.sum().backward()
    assert model.pos_embed.grad is not None and model.pos_embed.grad.abs().sum() > 0
    model.pos_embed.grad = None
    model(x).patch_tokens.sum().backward()  # a second step on the same grid still gets gradients
    assert model.pos_embed.grad.abs().sum() > 0


def test_copies_start_with_empty_cache():
    import copy

    model = tiny()
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert model.pos_embed_resampler._cache
    assert not copy.deepcopy(model).pos_embed_resampler._cache


def test_grad_checkpointing_gives_same_gradients():
    x = torch.randn(2, 3, 64, 48)
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = tiny().train()
        model.set_grad_checkpointing(ckpt)
        model(x).patch_tokens.pow(2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_freeze_layer_ids_and_no_weight_decay():
    model = tiny(depth=4)
    assert model.num_layers == 6
    assert model.layer_id("cls_token") == model.layer_id("patch_embed.proj.weight") == 0
    assert model.layer_id("blocks.2.mlp.fc1.weight") == 3
    assert model.layer_id("norm.weight") == 5
    model.freeze(2)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert "pos_embed" in frozen and "blocks.1.attn.qkv.weight" in frozen
    assert "blocks.2.attn.qkv.weight" not in frozen and "norm.weight" not in frozen
    model.freeze()
    assert not any(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="between 0 and depth=4"):
        model.freeze(5)
    nwd = model.no_weight_decay()
    assert {"pos_embed", "cls_token", "norm.weight", "blocks.0.attn.qkv.bias"} <= nwd
    assert "blocks.0.attn.qkv.weight" not in nwd and "patch_embed.proj.weight" not in nwd


def test_drop_path_increases_linearly_and_only_trains():
    model = tiny(depth=3, drop_path_rate=0.2)
    assert [getattr(b.drop_path1, "drop_prob", 0.0) for b in model.blocks] == pytest.approx([0.0, 0.1, 0.2])
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x).patch_tokens, model(x).patch_tokens)  # eval: deterministic
        model.train()
        assert not torch.allclose(model(x).patch_tokens, model(x).patch_tokens)


def test_image_sizes_that_do_not_describe_the_batch_are_rejected():
    with pytest.raises(ValueError, match="describe 1 images padded to"):
        tiny()(torch.randn(2, 3, 32, 32), ImageSizes.of([(32, 32)]))
    with pytest.raises(ValueError, match=r"padded to \(32, 30\)"):
        tiny()(torch.randn(2, 3, 32, 32), ImageSizes.of([(32, 30), (20, 20)]))


def test_out_of_range_block_index_is_refused():
    with pytest.raises(ValueError, match="block index 3 is out of range for depth 3"):
        tiny()(torch.randn(1, 3, 32, 32), intermediates=(3,))
