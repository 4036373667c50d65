"""The hybrid stem encodes each image of a padded batch as if it were alone."""

import pytest
import torch

from vitdense.backbone import create_backbone
from vitdense.data.collate import pad_stack


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
    monkeypatch.setattr(embed, "_embed", lambda x, f=embed._embed: calls.append(x.shape) or f(x))
    with torch.no_grad():
        hybrid(*pad_stack([torch.randn(3, 32, 32)] * 3))
        hybrid(*pad_stack([torch.randn(3, 32, 32), torch.randn(3, 16, 32), torch.randn(3, 32, 32)]))
    assert calls == [(3, 3, 32, 32), (2, 3, 32, 32), (1, 3, 16, 32)]  # images of one size run together
