"""The DETR layers' attention path: fused (need_weights=False) and explicit give the same
output under every mask the head uses, and the path follows the backbone's rule."""

import pytest
import torch

from vitdense.heads import detr
from vitdense.heads.detr import DETRDecoderLayer, DETREncoderLayer, explicit_attention


def test_explicit_only_for_bf16_on_cpu():
    x = torch.zeros(1, 2, 8)
    assert not explicit_attention(x)
    assert explicit_attention(x.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert explicit_attention(x)


@pytest.mark.parametrize("explicit", [True, False])
def test_both_paths_agree_under_every_mask(monkeypatch, explicit):
    torch.manual_seed(0)
    B, Q, N, d, heads = 2, 6, 10, 16, 4
    decoder = DETRDecoderLayer(d, heads, 32, dropout=0.0).eval()
    encoder = DETREncoderLayer(d, heads, 32, dropout=0.0).eval()
    tgt, query_pos = torch.randn(B, Q, d), torch.randn(B, Q, d)
    memory, pos = torch.randn(B, N, d), torch.randn(B, N, d)
    padding = torch.zeros(B, N, dtype=torch.bool)
    padding[1, 7:] = True  # the second image is smaller
    groups = torch.ones(Q, Q, dtype=torch.bool)
    groups[:3, :3] = groups[3:, 3:] = False  # two query groups that do not see each other
    bias = torch.randn(B * heads, Q, N)  # the box-to-pixel bias

    def run() -> tuple[torch.Tensor, ...]:
        return (
            decoder(tgt, query_pos, memory, pos, padding),
            decoder(tgt, query_pos, memory, pos, padding, self_attn_mask=groups, cross_attn_bias=bias),
            encoder(memory, pos, padding),
        )

    monkeypatch.setattr(detr, "explicit_attention", lambda x: explicit)
    with torch.no_grad():
        chosen = run()
    monkeypatch.setattr(detr, "explicit_attention", lambda x: not explicit)
    with torch.no_grad():
        other = run()
    for a, b in zip(chosen, other, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert not torch.equal(chosen[0], chosen[1])  # the masks change the result
