"""Sliding-window inference: sizes, coverage and agreement with a single forward."""

import pytest
import torch

from vitdense.models.windows import segment_image, slide_inference, window_starts


def brute_force_count(h, w, window, stride):
    """Windows covering each pixel, by mmseg's loop written out independently."""
    count = torch.zeros(h, w)
    seen = set()
    for hi in range(max(h - window + stride - 1, 0) // stride + 1):
        for wi in range(max(w - window + stride - 1, 0) // stride + 1):
            y2, x2 = min(hi * stride + window, h), min(wi * stride + window, w)
            y1, x1 = max(y2 - window, 0), max(x2 - window, 0)
            if (y1, x1) not in seen:
                seen.add((y1, x1))
                count[y1:y2, x1:x2] += 1
    return count


@pytest.mark.parametrize("size", [(37, 53), (64, 64), (97, 131), (130, 64)])
def test_windows_cover_every_pixel_and_average_overlaps(size):
    window, stride = 64, 48
    h, w = size
    image = torch.zeros(1, 3, h, w)

    def ones(crops):  # every window votes 1 for class 0 and its own size for class 1
        b, _, ch, cw = crops.shape
        return torch.stack([torch.ones(b, ch, cw), torch.full((b, ch, cw), float(ch * cw))], 1)

    logits = slide_inference(ones, image, window, stride, num_classes=2)
    assert logits.shape == (1, 2, h, w)
    torch.testing.assert_close(logits[0, 0], torch.ones(h, w))  # sum / count of equal votes
    crop_area = min(window, h) * min(window, w)
    torch.testing.assert_close(logits[0, 1], torch.full((h, w), float(crop_area)))
    assert window_starts(h, window, stride)[-1] == max(h - window, 0)  # last window flush with the border
    counts = torch.zeros(h, w)
    for y in window_starts(h, window, stride):
        for x in window_starts(w, window, stride):
            counts[y : y + window, x : x + window] += 1
    torch.testing.assert_close(counts, brute_force_count(h, w, window, stride))


def conv_model():
    torch.manual_seed(0)
    return torch.nn.Conv2d(3, 5, kernel_size=3, padding=1)


@pytest.mark.parametrize("size", [(31, 45), (64, 64)])
def test_window_equal_to_image_is_a_single_forward(size):
    model = conv_model()
    image = torch.randn(1, 3, *size)
    with torch.no_grad():
        expected = model(image)
    out = segment_image(model, image, size, window=max(size), stride=max(size), num_classes=5)
    torch.testing.assert_close(out, expected)


def test_output_resized_to_label_size_and_tta_gives_log_probabilities():
    model = conv_model()
    image = torch.randn(1, 3, 75, 101)
    out = segment_image(model, image, (150, 203), window=48, stride=32, num_classes=5)
    assert out.shape == (1, 5, 150, 203)
    tta = segment_image(model, image, (61, 83), 48, 32, 5, scales=(0.5, 1.0, 1.5), flip=True)
    assert tta.shape == (1, 5, 61, 83)
    torch.testing.assert_close(tta.exp().sum(1), torch.ones(1, 61, 83))


def test_stride_larger_than_window_is_refused():
    with pytest.raises(ValueError, match="stride 80 > window 64"):
        slide_inference(conv_model(), torch.randn(1, 3, 100, 100), 64, 80, 5)
