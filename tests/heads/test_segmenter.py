"""Segmenter decoders: shapes, mask normalisation, padding invariance."""

import torch

from vitdense.backbone import VisionTransformer
from vitdense.heads import LinearDecoder, MaskTransformerDecoder
from vitdense.types import ImageSizes


def features(x, image_sizes=None):
    torch.manual_seed(0)
    bb = VisionTransformer(img_size=64, embed_dim=64, depth=2, num_heads=4).eval()
    with torch.no_grad():
        return bb(x, image_sizes)


def test_decoders_return_grid_logits():
    f = features(torch.randn(2, 3, 48, 80))
    for decoder in (LinearDecoder(64, 7), MaskTransformerDecoder(64, 7, depth=2).eval()):
        with torch.no_grad():
            assert decoder(f).shape == (2, 7, 3, 5)


def test_mask_transformer_masks_are_normalised_products():
    decoder = MaskTransformerDecoder(64, 5, depth=1).eval()
    captured = {}
    decoder.mask_norm.register_forward_hook(lambda m, inp, out: captured.update(products=inp[0], out=out))
    with torch.no_grad():
        decoder(features(torch.randn(1, 3, 64, 64)))
    products = captured["products"]  # scalar products of unit vectors: cosines
    assert products.abs().max() <= 1 + 1e-5
    torch.testing.assert_close(captured["out"].mean(-1), torch.zeros(1, 16), atol=1e-5, rtol=0)  # mask norm


def test_mask_transformer_ignores_padding():
    torch.manual_seed(1)
    decoder = MaskTransformerDecoder(64, 5, depth=2).eval()
    small = torch.randn(1, 3, 32, 48)
    batch = torch.zeros(2, 3, 64, 64)
    batch[0] = torch.randn(3, 64, 64)
    batch[1, :, :32, :48] = small[0]
    with torch.no_grad():
        together = decoder(features(batch, ImageSizes.of([(64, 64), (32, 48)])))
        alone = decoder(features(small))
    torch.testing.assert_close(together[1:, :, :2, :3], alone, rtol=0, atol=1e-4)


def test_mask_transformer_checkpointing_recomputes_the_same_blocks_with_less_memory():
    """With dropout on (Segmenter's 0.1), checkpointed blocks give the same masks and
    gradients (the same dropout draws) and keep far less for backward; a task turns it on
    with the backbone's `grad_checkpointing`."""
    from vitdense.bench.common import saved_activation_bytes
    from vitdense.tasks import BackboneConfig, SegmentationTask

    f = features(torch.randn(2, 3, 64, 64))
    tokens = f.patch_tokens.clone().requires_grad_(True)
    f = f._replace(patch_tokens=tokens)
    torch.manual_seed(0)
    decoder = MaskTransformerDecoder(64, 5, depth=2, drop_rate=0.1).train()
    results = {}
    for checkpointed in (False, True):
        decoder.set_grad_checkpointing(checkpointed)
        torch.manual_seed(1)  # the same dropout draws for both
        saved = saved_activation_bytes(lambda: decoder(f).pow(2).sum())
        results[checkpointed] = (saved, tokens.grad.clone())
        tokens.grad = None
        decoder.zero_grad()
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-6)
    assert results[True][0] < results[False][0] / 2
    backbone = BackboneConfig(
        name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1}, grad_checkpointing=True
    )
    assert SegmentationTask(num_classes=3, backbone=backbone).head.grad_checkpointing
