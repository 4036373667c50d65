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
