"""The hybrid stem encodes each image of a padded batch as if it were alone."""

import pytest
import torch

from vitdense.backbone import create_backbone
from vitdense.types.collate import pad_stack


@pytest.fixture(scope="module")
def hybrid():
    torch.manual_seed(0)
    # the detection demo's architecture, shallower: ResNet stem + group norms, 2 x 2 patches
    return create_backbone("vit_tiny_r_s16_p8_224", img_size=64, model_args={"depth": 2, "patch_size": 2}).eval()


def test_hybrid_batch_of_mixed_sizes_matches_each_image_alone(hybrid):
    images = [torch.randn(3, 64, 48), torch.randn(3, 37, 61), torch.randn(3, 64, 48), torch.randn(3, 20, 24)]
    batch, sizes = pad_stack(images)
    with torch.no_grad():
        together = hybrid(batch, sizes)
        for b, img in enumerate(images):
            alone = hybrid(img[None])
            h, w = alone.grid_size
            tokens = together.patch_tokens[b].reshape(*together.grid_size, -1)[:h, :w]
            torch.testing.assert_close(tokens, alone.patch_tokens[0].reshape(h, w, -1), rtol=0, atol=1e-5)
            torch.testing.assert_close(together.cls_token[b], alone.cls_token[0], rtol=0, atol=1e-5)
        # batch 1 vs batch 4: the same numbers for the images of the batch of 4
        first_two = hybrid(*pad_stack(images[:2]))
    torch.testing.assert_close(first_two.cls_token, together.cls_token[:2], rtol=0, atol=1e-5)


def test_hybrid_without_padding_is_one_call(hybrid, monkeypatch):
    calls = []
    embed = hybrid.patch_embed
    monkeypatch.setattr(embed, "_run", lambda x, stages, f=embed._run: calls.append(x.shape) or f(x, stages))
    with torch.no_grad():
        hybrid(*pad_stack([torch.randn(3, 32, 32)] * 3))
        hybrid(*pad_stack([torch.randn(3, 32, 32), torch.randn(3, 16, 32), torch.randn(3, 32, 32)]))
    assert calls == [(3, 3, 32, 32), (2, 3, 32, 32), (1, 3, 16, 32)]  # images of one size run together


def test_stage_maps_of_a_padded_batch_are_each_image_alone():
    """`forward_stages` (DPT-Hybrid's 1/4 and 1/8 maps): each image's stage maps computed
    alone, zero beyond it; the tokens are `forward`'s."""
    from vitdense.backbone import VisionTransformer
    from vitdense.backbone.hybrid import HybridEmbed

    torch.manual_seed(0)
    vit = VisionTransformer(img_size=32, embed_dim=16, depth=1, num_heads=2, patch_embed=HybridEmbed((1, 1), 1, 3, 16))
    vit.eval()
    assert vit.patch_embed.stage_channels(0) == 256 and vit.patch_embed.stage_channels(1) == 512
    images = [torch.randn(3, 32, 48), torch.randn(3, 21, 30), torch.randn(3, 32, 48)]
    batch, sizes = pad_stack(images)
    with torch.no_grad():
        together = vit(batch, sizes, stem_stages=(1, 0))  # in the order asked
        torch.testing.assert_close(together.patch_tokens, vit(batch, sizes).patch_tokens, rtol=0, atol=0)
        assert [tuple(m.shape) for m in together.stem_features] == [(3, 512, 4, 6), (3, 256, 8, 12)]
        for b, image in enumerate(images):
            alone = vit(image[None], stem_stages=(1, 0))
            for got, own in zip(together.stem_features, alone.stem_features, strict=True):
                h, w = own.shape[-2:]  # ceil(H / s) x ceil(W / s): 21 x 30 -> 6 x 8 at stride 4
                torch.testing.assert_close(got[b, :, :h, :w], own[0], rtol=0, atol=1e-5)
                assert not got[b, :, h:].any() and not got[b, :, :, w:].any()
    with pytest.raises(ValueError, match="has 2 stages; stage 2 does not exist"):
        vit(images[0][None], stem_stages=(2,))


def test_a_plain_patch_embedding_has_no_stage_maps(hybrid):
    from vitdense.backbone import VisionTransformer

    with pytest.raises(ValueError, match="only a hybrid patch embedding has CNN stages"):
        VisionTransformer(img_size=32, embed_dim=16, depth=1, num_heads=2)(torch.randn(1, 3, 32, 32), stem_stages=(0,))
    with pytest.raises(ValueError, match="has 0 stages"):  # the stem alone (no ResNet stages)
        hybrid(torch.randn(1, 3, 32, 32), stem_stages=(0,))
