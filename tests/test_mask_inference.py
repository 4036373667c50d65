"""Mask classification post-processing equals Mask2Former's and EoMT's own functions (numbers
from /tmp/pqmetric_ref/mask_inference_ref.py, which runs theirs on these inputs)."""

import numpy as np
import pytest
import torch

from vitdense.models.universal import instance_inference, panoptic_inference, semantic_inference

#: classes 0 and 2 are things, 1, 3 and 4 stuff
IS_THING = (True, False, True, False, False)
#: (seed, score_threshold, overlap_threshold)
PANOPTIC_CASES = ((0, 0.8, 0.8), (1, 0.5, 0.8), (2, 0.3, 0.5), (3, 0.5, 0.8))


def logits(seed: int, queries: int = 12, size: tuple[int, int] = (15, 18)) -> tuple[torch.Tensor, torch.Tensor]:
    """Class logits [Q, K + 1], one class of each query made likely ("no object" too); mask
    logits [Q, H, W], a rectangle per query (+6) on noise around -3, so that queries overlap."""
    rng = np.random.default_rng(seed)
    h, w = size
    classes = len(IS_THING)
    cls = rng.normal(0, 1, (queries, classes + 1))
    cls[np.arange(queries), rng.integers(0, classes + 1, queries)] += rng.uniform(0, 7, queries)
    masks = rng.normal(-3, 1.5, (queries, h, w))
    for q in range(queries):
        y, x = rng.integers(0, h - 3), rng.integers(0, w - 3)
        masks[q, y : y + rng.integers(3, h // 2 + 3), x : x + rng.integers(3, w // 2 + 3)] += 6
    return torch.from_numpy(cls).float(), torch.from_numpy(masks).float()


# --- semantic ----------------------------------------------------------------------------------
def test_semantic_inference_equals_mask2formers():
    """sum over queries of softmax(class)[:K] x sigmoid(mask); batched as one image at a time."""
    class_logits, mask_logits = logits(0)
    scores = semantic_inference(class_logits, mask_logits)
    assert scores.shape == (5, 15, 18) and scores.dtype == torch.float32
    # Mask2Former's `semantic_inference` and EoMT's `to_per_pixel_logits_semantic` (equal) on these inputs
    assert scores.double().sum().item() == pytest.approx(490.01498506451026, rel=1e-6)
    expected = {(0, 0, 0): 0.056008581072092056, (1, 7, 9): 0.19834443926811218}
    expected |= {(4, 14, 17): 0.008688542991876602, (2, 3, 11): 0.4745698571205139}
    for index, value in expected.items():
        assert scores[index].item() == pytest.approx(value, rel=1e-6), index

    other = logits(1)
    batched = semantic_inference(torch.stack([class_logits, other[0]]), torch.stack([mask_logits, other[1]]))
    torch.testing.assert_close(batched[0], scores)
    torch.testing.assert_close(batched[1], semantic_inference(*other))
    half = semantic_inference(class_logits.bfloat16(), mask_logits.bfloat16())  # autocast output: float32 maths
    assert half.dtype == torch.float32


# --- panoptic ----------------------------------------------------------------------------------
#: Mask2Former's `panoptic_inference` (= EoMT's `to_per_pixel_preds_panoptic`, ids + 1) on `logits(seed)`
#: with PANOPTIC_CASES' thresholds: the kept queries, the segments' labels and the id map
PANOPTIC_EXPECTED = {
    0: (
        [0, 2, 4, 5, 7, 9],
        [2, 2, 1, 2, 2, 3],
        """
        000000000066666444
        005555555066664444
        005555555666666444
        005555055066664444
        000000333333333334
        000000333333333330
        500000333333332222
        300201000020022222
        004000020000022222
        111111103140422222
        111111100000022222
        111111100000422222
        111111100500022222
        111111100000022222
        111111100001053000
        """,
    ),
    1: (
        [0, 1, 2, 3, 5, 7, 11],  # stuff queries 0, 7, 11 (class 4) merged; query 2 dropped (won 12 of its 37)
        [4, 2, 3, 0],
        """
        000000011111100041
        000001011111100010
        010000011111100000
        000011114400004000
        000011110000000003
        000111110000000001
        000111110001300040
        001011111333333200
        000003111134333100
        002003113333333040
        004144414104100000
        004444414124222222
        004444141120220222
        004444444122222222
        004404444122222222
        """,
    ),
    2: (
        [0, 1, 3, 4, 8, 9, 10, 11],
        [0, 3, 1, 4],
        """
        040000000000020010
        000000000000000002
        000011111222222202
        000011122222222444
        000021122222224244
        000211112222224444
        020011121222222444
        000011112222024444
        000000000302004444
        200000000000004444
        000000033333304444
        000010033332224444
        000000033223222000
        040000400222222000
        400000000222022030
        """,
    ),
    3: (
        [0, 1, 2, 3, 4, 6, 7, 10, 11],
        [0, 0, 1, 0],
        """
        003000000000000042
        400003330000000000
        000023330101444444
        400003330000044444
        300003330000044444
        000203330000044444
        000003330000044444
        022202222201133333
        022222222231113333
        022222222201113333
        022222222200033333
        022222002200000000
        022222222200000000
        022222002200000003
        000000000000000000
        """,
    ),
}


@pytest.mark.parametrize(("seed", "score_threshold", "overlap_threshold"), PANOPTIC_CASES)
def test_panoptic_inference_equals_mask2formers(seed, score_threshold, overlap_threshold):
    class_logits, mask_logits = logits(seed)
    kept, labels, rows = PANOPTIC_EXPECTED[seed]
    out = panoptic_inference(class_logits, mask_logits, torch.tensor(IS_THING), score_threshold, overlap_threshold)
    expected_map = torch.tensor([[int(c) for c in row] for row in rows.split()])
    assert torch.equal(out.id_map, expected_map)
    assert out.id_map.dtype == torch.int64
    assert out.ids.tolist() == list(range(1, len(labels) + 1)) and out.labels.tolist() == labels

    # the score of a segment: the class probability of the first (kept) query that won its pixels
    probs, classes = class_logits.softmax(-1).max(-1)
    keep = classes.ne(len(IS_THING)) & (probs > score_threshold)
    assert keep.nonzero().flatten().tolist() == kept
    masks = mask_logits[keep].sigmoid()
    winner = keep.nonzero().flatten()[(probs[keep][:, None, None] * masks).argmax(0)]
    for segment, score in zip(out.ids.tolist(), out.scores.tolist(), strict=True):
        maker = winner[out.id_map == segment].min()
        assert score == probs[maker].item()


def test_panoptic_inference_without_a_kept_query_is_all_void():
    class_logits, mask_logits = logits(0)
    out = panoptic_inference(class_logits, mask_logits, torch.tensor(IS_THING), score_threshold=1.0)
    assert out.id_map.shape == (15, 18) and not out.id_map.any()
    assert out.ids.shape == out.labels.shape == out.scores.shape == (0,)
    with pytest.raises(ValueError, match=r"is_thing has shape \(4,\), expected \(5,\)"):
        panoptic_inference(class_logits, mask_logits, torch.tensor(IS_THING[:4]))


# --- instance ----------------------------------------------------------------------------------
#: Mask2Former's `instance_inference` (= EoMT's eval step) on `logits(seed)`: (query, label, score), best first
INSTANCE_EXPECTED = {
    (0, 100): [  # top 100 of 12 x 5 pairs: all 60; the first 10 here
        (0, 2, 0.8743932843208313),
        (9, 3, 0.8544725775718689),
        (2, 2, 0.8370233774185181),
        (5, 2, 0.8219943642616272),
        (4, 1, 0.7624177932739258),
        (7, 2, 0.7349264025688171),
        (10, 2, 0.695777952671051),
        (1, 2, 0.557142436504364),
        (6, 0, 0.37739458680152893),
        (6, 3, 0.1773207187652588),
    ],
    (1, 7): [
        (0, 4, 0.8795221447944641),
        (5, 0, 0.8394043445587158),
        (11, 4, 0.8356919288635254),
        (3, 3, 0.811909019947052),
        (1, 2, 0.8118419647216797),
        (7, 4, 0.8046393990516663),
        (2, 3, 0.6583691239356995),
    ],
}


@pytest.mark.parametrize(("seed", "top_k"), list(INSTANCE_EXPECTED))
def test_instance_inference_equals_mask2formers(seed, top_k):
    class_logits, mask_logits = logits(seed)
    out = instance_inference(class_logits, mask_logits, top_k)
    expected = INSTANCE_EXPECTED[(seed, top_k)]
    assert len(out.scores) == min(top_k, 12 * 5)
    assert out.labels.tolist()[: len(expected)] == [label for _, label, _ in expected]
    torch.testing.assert_close(out.scores[: len(expected)], torch.tensor([s for _, _, s in expected]))
    for mask, (query, _, _) in zip(out.masks, expected, strict=False):
        assert torch.equal(mask, mask_logits[query] > 0)
    assert out.masks.dtype == torch.bool and (out.scores.diff() <= 0).all()  # best first


def test_a_panoptic_models_instances_are_its_things_among_the_top_k():
    """Mask2Former's `instance_inference` with `panoptic_on`: the stuff pairs leave after the
    top k, so the things of the 7 best pairs remain (2 of them), in their order."""
    class_logits, mask_logits = logits(1)
    out = instance_inference(class_logits, mask_logits, 7, torch.tensor(IS_THING))
    expected = [(q, label, s) for q, label, s in INSTANCE_EXPECTED[(1, 7)] if IS_THING[label]]
    assert out.labels.tolist() == [label for _, label, _ in expected] == [0, 2]
    torch.testing.assert_close(out.scores, torch.tensor([s for _, _, s in expected]))
    assert all(torch.equal(m, mask_logits[q] > 0) for m, (q, _, _) in zip(out.masks, expected, strict=True))
    everything = instance_inference(class_logits, mask_logits, 7, [True] * 5)
    assert everything.labels.tolist() == instance_inference(class_logits, mask_logits, 7).labels.tolist()
    with pytest.raises(ValueError, match=r"is_thing has shape \(4,\), expected \(5,\)"):
        instance_inference(class_logits, mask_logits, 7, IS_THING[:4])


def test_inputs_are_checked():
    class_logits, mask_logits = logits(0)
    with pytest.raises(ValueError, match="disagree on the queries"):
        instance_inference(class_logits[:5], mask_logits)
    with pytest.raises(ValueError, match=r"\[\.\.\., Q, H, W\] expected"):
        semantic_inference(class_logits, mask_logits[0])
