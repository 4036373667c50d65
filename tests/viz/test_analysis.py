"""The paper's analyses equal a straightforward computation, element by element, from a small
model's raw attention matrices and weights."""

import math

import numpy as np
import pytest
import torch

from vitdense.backbone import VisionTransformer
from vitdense.viz import analysis


@pytest.fixture(scope="module")
def attentions():
    """A 3-block ViT's softmax attention on 2 images: 2 heads, a 4 x 4 grid of 8 px patches,
    plus the class token (T = 17)."""
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=3, num_heads=2).eval()
    with torch.no_grad():
        for p in model.parameters():  # far from uniform attention
            p.normal_(0, 0.5)
        features = model(torch.randn(2, 3, 32, 32), attentions=[0, 1, 2])
    assert features.grid_size == (4, 4)
    return [a.double() for a in features.attentions]


def test_raw_attention_rows_are_distributions(attentions):
    for attention in attentions:
        assert attention.shape == (2, 2, 17, 17)
        torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, 17, dtype=torch.float64))


def naive_rollout(layers, image, fusion="mean", residual=True):
    """Abnar & Zuidema's recipe with lists and loops."""
    t = layers[0].shape[-1]
    result = [[float(i == j) for j in range(t)] for i in range(t)]
    for attention in layers:
        heads = attention[image].tolist()
        fused = [[0.0] * t for _ in range(t)]
        for i in range(t):
            for j in range(t):
                values = [head[i][j] for head in heads]
                fused[i][j] = {"mean": sum(values) / len(values), "max": max(values), "min": min(values)}[fusion]
                if residual:
                    fused[i][j] += float(i == j)
            row = sum(fused[i])
            fused[i] = [v / row for v in fused[i]] if residual else fused[i]
        result = [[sum(fused[i][k] * result[k][j] for k in range(t)) for j in range(t)] for i in range(t)]
    return result


@pytest.mark.parametrize("fusion,residual", [("mean", True), ("max", True), ("min", False)])
def test_rollout_equals_the_straightforward_product(attentions, fusion, residual):
    rolled = analysis.attention_rollout(attentions, fusion, residual)
    for image in range(2):
        expected = torch.tensor(naive_rollout(attentions, image, fusion, residual), dtype=torch.float64)
        torch.testing.assert_close(rolled[image].double(), expected, rtol=1e-5, atol=1e-6)
    if residual and fusion == "mean":  # rows of a product of row-stochastic matrices sum to 1
        torch.testing.assert_close(rolled.sum(-1).double(), torch.ones(2, 17, dtype=torch.float64))


def naive_distance(attention, head, grid=(4, 4), patch=8, prefix=1):
    """Mean over images and query patches of sum_k w_qk * |centre_q - centre_k| (pixels),
    w renormalised over the patches."""
    centres = [((r + 0.5) * patch, (c + 0.5) * patch) for r in range(grid[0]) for c in range(grid[1])]
    per_query = []
    for image in range(attention.shape[0]):
        rows = attention[image, head].tolist()
        for q in range(len(centres)):
            weights = rows[prefix + q][prefix:]
            total = sum(weights)
            per_query.append(sum(w / total * math.dist(centres[q], centres[k]) for k, w in enumerate(weights)))
    return sum(per_query) / len(per_query)


def test_mean_attention_distance_equals_the_straightforward_average(attentions):
    for attention in attentions:
        found = analysis.mean_attention_distance(attention, 1, (4, 4), (8, 8))
        expected = [naive_distance(attention, head) for head in range(2)]
        torch.testing.assert_close(found, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_mean_attention_distance_of_known_patterns():
    t = 1 + 9
    only_self = torch.eye(t)[None, None]  # every patch attends to itself: distance 0
    assert analysis.mean_attention_distance(only_self, 1, (3, 3), (16, 16)).item() == 0
    uniform = torch.full((1, 1, t, t), 1 / t)  # the mean distance between two of the 9 centres
    centres = [(r * 16, c * 16) for r in range(3) for c in range(3)]
    pairs = sum(math.dist(a, b) for a in centres for b in centres) / 81
    assert analysis.mean_attention_distance(uniform, 1, (3, 3), (16, 16)).item() == pytest.approx(pairs)


def test_cls_attention_is_the_class_tokens_row_over_the_patches(attentions):
    maps = analysis.cls_attention(attentions[0], 1, (4, 4))
    assert maps.shape == (2, 2, 4, 4)
    assert maps[1, 0, 2, 3] == attentions[0][1, 0, 0, 1 + 2 * 4 + 3]
    torch.testing.assert_close(analysis.fuse_heads(maps, "mean"), maps.mean(1))
    assert torch.equal(analysis.fuse_heads(maps, 1), maps[:, 1])
    with pytest.raises(ValueError, match="head 2 is out of range for 2 heads"):
        analysis.fuse_heads(maps, 2)


def test_pos_embed_similarity_is_the_cosine_of_each_pair():
    table = torch.randn(6, 5)
    similarity = analysis.pos_embed_similarity(table, (2, 3))
    a, b = table[1].tolist(), table[5].tolist()
    cosine = sum(x * y for x, y in zip(a, b, strict=True)) / math.hypot(*a) / math.hypot(*b)
    assert similarity[0, 1, 1, 2].item() == pytest.approx(cosine, abs=1e-6)  # (0, 1) vs (1, 2)
    assert torch.allclose(similarity.reshape(6, 6).diagonal(), torch.ones(6))


def test_filter_components_are_numpys_principal_axes():
    weight = torch.randn(40, 3, 4, 4) * torch.linspace(0.1, 3, 48).reshape(3, 4, 4)
    components, explained = analysis.filter_components(weight, 5)
    samples = weight.reshape(40, -1).double().numpy()
    covariance = np.cov(samples, rowvar=False)
    values, vectors = np.linalg.eigh(covariance)  # ascending
    for i in range(5):
        axis = vectors[:, -1 - i]
        found = components[i].reshape(-1).double().numpy()
        assert abs(abs(found @ axis) - 1) < 1e-5  # the same axis, up to sign
        assert explained[i].item() == pytest.approx(values[-1 - i] / values.sum(), rel=1e-5)
