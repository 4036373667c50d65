"""Multi-scale deformable attention against Deformable DETR's own PyTorch code.

`deformable_reference.pt` holds inputs and outputs computed once, in float64, by Deformable
DETR's code (fundamentalvision/Deformable-DETR, `models/ops`): its `ms_deform_attn_core_pytorch`
on random values, sampling locations (some outside the maps) and weights over 3 levels of
6x5, 3x3 and 2x2; and its `MSDeformAttn.forward`, with the CUDA call replaced by that core
function, on 2 images padded into one batch (the second covers 4x3, 2x2 and 1x1 of the
maps: its padding masked out of the values, its reference points and boxes scaled by its
valid ratios), with random parameters, for reference points (x, y) and boxes (cx, cy, w, h).
"""

from pathlib import Path

import pytest
import torch

from vitdense.heads.deformable import MSDeformAttn, ms_deform_attn

REFERENCE = Path(__file__).with_name("deformable_reference.pt")


@pytest.fixture(scope="module")
def ref():
    return torch.load(REFERENCE)


def module_of(ref) -> MSDeformAttn:
    d = ref["query"].shape[-1]
    attn = MSDeformAttn(d, len(ref["shapes"]), ref["heads"], ref["points"])
    attn.load_state_dict(ref["state_dict"])
    return attn


def scaled(ref, reference: torch.Tensor) -> torch.Tensor:
    ratios = ref["ratios"] if reference.shape[-1] == 2 else torch.cat([ref["ratios"], ref["ratios"]], -1)
    return reference[:, :, None] * ratios[:, None]


def test_core_equals_deformable_detrs(ref):
    out = ms_deform_attn(ref["value"], ref["shapes"], ref["locations"], ref["weights"])
    torch.testing.assert_close(out, ref["core"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["points", "boxes"])
def test_module_equals_deformable_detrs_on_a_padded_batch(ref, kind):
    reference = ref["boxes"] if kind == "boxes" else ref["boxes"][..., :2]
    with torch.no_grad():
        out = module_of(ref)(ref["query"], scaled(ref, reference), ref["memory"], ref["shapes"], ref["mask"])
    torch.testing.assert_close(out, ref[f"{kind}_out"], rtol=0, atol=1e-5)


def test_an_image_attends_the_same_alone_and_padded(ref):
    """The second image alone (its own 4x3, 2x2, 1x1 maps, its own coordinates) gives what it
    gives padded into the batch: grid_sample reads zeros beyond the border in both cases."""
    attn = module_of(ref)
    valid = [(4, 3), (2, 2), (1, 1)]
    own = []
    start = 0
    for (h, w), (vh, vw) in zip(ref["shapes"], valid, strict=True):
        level = ref["memory"][1, start : start + h * w].view(h, w, -1)
        own.append(level[:vh, :vw].flatten(0, 1))
        start += h * w
    with torch.no_grad():
        batched = attn(ref["query"], scaled(ref, ref["boxes"]), ref["memory"], ref["shapes"], ref["mask"])[1]
        alone = attn(ref["query"][1:], ref["boxes"][1:, :, None].expand(-1, -1, 3, -1), torch.cat(own)[None], valid)[0]
    torch.testing.assert_close(alone, batched, rtol=0, atol=1e-5)


def test_gradients_reach_values_offsets_and_weights(ref):
    attn = module_of(ref)
    query = ref["query"].clone().requires_grad_()
    memory = ref["memory"].clone().requires_grad_()
    attn(query, scaled(ref, ref["boxes"]), memory, ref["shapes"], ref["mask"]).square().sum().backward()
    for p in (attn.sampling_offsets.weight, attn.attention_weights.weight, attn.value_proj.weight, query, memory):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert memory.grad[ref["mask"]].abs().max() == 0  # padding values are never read


def test_bf16_autocast_samples_in_fp32(ref):
    attn = module_of(ref)
    with torch.no_grad():
        full = attn(ref["query"], scaled(ref, ref["boxes"]), ref["memory"], ref["shapes"], ref["mask"])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = attn(ref["query"], scaled(ref, ref["boxes"]), ref["memory"], ref["shapes"], ref["mask"])
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), full, rtol=0.05, atol=0.1)


def test_initial_offsets_are_deformable_detrs_rays():
    """At initialisation head k samples along direction 2 pi k / heads (scaled so the larger
    coordinate is 1) at distances 1..P, with uniform weights."""
    attn = MSDeformAttn(16, num_levels=2, num_heads=4, num_points=2)
    bias = attn.sampling_offsets.bias.view(4, 2, 2, 2)
    expected = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    torch.testing.assert_close(bias[:, 0, 0], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(bias[:, 1, 1], 2 * expected, atol=1e-6, rtol=0)
    assert attn.attention_weights.weight.abs().sum() == 0 and attn.attention_weights.bias.abs().sum() == 0
