"""The DETR layers' attention path: fused (need_weights=False) and explicit give the same
output under every mask the head uses, and one rule (`fused_attention`) picks the path for
the backbone's attention and the DETR layers alike."""

import pytest
import torch

from vitdense.backbone.attention import Attention, fused_attention
from vitdense.heads import detr
from vitdense.heads.detr import DETRDecoderLayer, DETREncoderLayer


@pytest.mark.parametrize("amx", [False, True])
def test_explicit_only_for_bf16_or_dropout_on_cpu(monkeypatch: pytest.MonkeyPatch, amx: bool) -> None:
    """fp32 and fp16 fused; attention dropout on CPU explicit (torch has no fused CPU kernel
    with it); bf16 (the dtype, or autocast's) explicit on a CPU without AMX, and with AMX
    only for training sequences of up to 1024 queries."""
    monkeypatch.setattr("vitdense.backbone.attention._cpu_has_amx", lambda: amx)
    x, long = torch.zeros(1, 2, 8), torch.zeros(1, 1025, 8)
    assert fused_attention(x) and fused_attention(long)
    assert not fused_attention(x, dropout=0.1) and not fused_attention(long, dropout=0.1)
    assert not fused_attention(x.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_attention(x)  # fp32 inputs that autocast computes in bf16
        assert fused_attention(long) == amx
        assert not fused_attention(long, dropout=0.1)
        with torch.no_grad():
            assert fused_attention(x) == amx
    with torch.autocast("cpu", dtype=torch.float16):
        assert fused_attention(x)


def test_dropout_reaches_the_rule_in_training_only(monkeypatch):
    """The backbone's attention and the DETR layers hand the rule their attention dropout
    while training, 0 in evaluation."""
    seen = []
    rule = lambda x, dropout=0.0: seen.append(dropout) or True  # noqa: E731
    monkeypatch.setattr(detr, "fused_attention", rule)
    monkeypatch.setattr("vitdense.backbone.attention.fused_attention", rule)
    layers = Attention(8, 2, attn_drop=0.1), DETREncoderLayer(8, 2, 16, 0.2)
    for train in (True, False):
        layers[0].train(train)(torch.zeros(1, 3, 8))
        layers[1].train(train)(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), None)
    assert seen == [0.1, 0.2, 0.0, 0.0]


def test_backbone_and_decoder_take_the_same_path(monkeypatch):
    calls = []
    monkeypatch.setattr(detr, "fused_attention", lambda x, dropout=0.0: calls.append("detr") or True)
    monkeypatch.setattr(
        "vitdense.backbone.attention.fused_attention", lambda x, dropout=0.0: calls.append("vit") or True
    )
    with torch.no_grad():
        Attention(8, 2)(torch.zeros(1, 3, 8))
        DETREncoderLayer(8, 2, 16, 0.0)(torch.zeros(1, 3, 8), torch.zeros(1, 3, 8), None)
    assert calls == ["vit", "detr"]


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

    monkeypatch.setattr(detr, "fused_attention", lambda x, dropout=0.0: not explicit)
    with torch.no_grad():
        chosen = run()
    monkeypatch.setattr(detr, "fused_attention", lambda x, dropout=0.0: explicit)
    with torch.no_grad():
        other = run()
    for a, b in zip(chosen, other, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert not torch.equal(chosen[0], chosen[1])  # the masks change the result
