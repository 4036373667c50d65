"""Segmenter decoders: shapes, mask normalisation, padding invariance."""

import torch

from vitdense.backbone import VisionTransformer
from vitdense.heads import LinearDecoder, MaskTransformerDecoder


def features(x, pad_mask=None):
    torch.manual_seed(0)
    bb = VisionTransformer(img_size=64, embed_dim=64, depth=2, num_heads=4).eval()
    with torch.no_grad():
        return bb(x, pad_mask=pad_mask)


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
    mask = torch.ones(2, 64, 64, dtype=torch.bool)
    mask[0] = False
    mask[1, :32, :48] = False
    with torch.no_grad():
        together = decoder(features(batch, mask))
        alone = decoder(features(small))
    torch.testing.assert_close(together[1:, :, :2, :3], alone, rtol=0, atol=1e-4)
