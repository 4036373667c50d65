"""pixel_cross_entropy against torch's F.cross_entropy (the definition it replaces)."""

import pytest
import torch
import torch.nn.functional as F

from vitdense.losses import pixel_cross_entropy


def _logits(layout: str) -> torch.Tensor:
    """[2, 5, 12, 9] logits in the memory layout named: as Segmenter returns them
    (channels-last), contiguous, or a channels-last crop (a padded image's own pixels)."""
    g = torch.Generator().manual_seed(0)
    if layout == "contiguous":
        return 4 * torch.randn(2, 5, 12, 9, generator=g)
    if layout == "channels_last":
        return (4 * torch.randn(2, 12, 9, 5, generator=g)).permute(0, 3, 1, 2)
    return (4 * torch.randn(2, 16, 11, 5, generator=g)).permute(0, 3, 1, 2)[..., :12, :9]


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "crop"])
@pytest.mark.parametrize("weighted", [False, True])
def test_equals_torch_cross_entropy(layout: str, weighted: bool) -> None:
    g = torch.Generator().manual_seed(1)
    target = torch.randint(5, (2, 12, 9), generator=g)
    target[0, :3] = 255  # ignored rows, and a whole ignored image region
    target[1, 5, 2] = 255
    weight = torch.rand(5, generator=g) + 0.5 if weighted else None
    ours, ref = _logits(layout).requires_grad_(), _logits(layout).requires_grad_()
    loss = pixel_cross_entropy(ours, target, weight, ignore_index=255)
    expected = F.cross_entropy(ref, target, weight, ignore_index=255, reduction="sum")
    (2.5 * loss).backward()
    (2.5 * expected).backward()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-6, atol=1e-6)
    assert ours.grad[0, :, :3].abs().max() == 0  # ignored pixels get no gradient


def test_bf16_logits_and_second_backward() -> None:
    """Low-precision logits are scored in fp32 (the gradient comes back in their dtype);
    a second backward through the same graph is refused, not silently wrong (the backward
    overwrites its saved log-probabilities)."""
    logits = _logits("channels_last").bfloat16().requires_grad_()
    target = torch.randint(5, (2, 12, 9), generator=torch.Generator().manual_seed(2))
    loss = pixel_cross_entropy(logits, target)
    expected = F.cross_entropy(logits.detach().float(), target, reduction="sum")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected)
    loss.backward(retain_graph=True)
    assert logits.grad.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="runs once per forward"):
        loss.backward()
