"""DetectionTask: COCO AP equal to pycocotools' own, batch-independent detections, COCO export."""

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from vitdense.core.errors import ConfigError, NonFiniteError
from vitdense.core.preprocess import LabelInfo
from vitdense.data import CocoDetection, load_coco, pad_collate, write_synthetic_coco
from vitdense.data.transforms.detection import detection_eval_transforms
from vitdense.heads import DETRHead
from vitdense.heads.detr import inverse_sigmoid
from vitdense.models.detection import postprocess
from vitdense.results.common import ResultContext
from vitdense.results.detection import DetectionResult
from vitdense.tasks import BackboneConfig, DetectionTask
from vitdense.training.callbacks import COCOResultsWriter
from vitdense.types import DetectionOutput

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 2, "patch_size": 8})
SMALL_HEAD = partial(DETRHead, hidden_dim=32, num_heads=2, dim_feedforward=64, num_queries=12, dec_layers=2)
MEAN = STD = (0.5, 0.5, 0.5)
CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.fixture
def coco_val(tmp_path):
    """A small COCO-format split with a crowd region and images without objects."""
    path = write_synthetic_coco(tmp_path, "val2017", 12, img_size=40, num_classes=3, seed=3)
    data = json.loads(path.read_text())
    img = data["images"][0]
    data["annotations"].append(
        {
            "id": 999,
            "image_id": img["id"],
            "category_id": 5,
            "bbox": [2.0, 3.0, 15.0, 12.0],
            "area": 150.0,
            "iscrowd": 1,
        }
    )
    path.write_text(json.dumps(data))
    index = load_coco(path, tmp_path / "val2017")
    assert any(len(i.eval_labels) == 0 for i in index.images)
    return path, CocoDetection(index, detection_eval_transforms(MEAN, STD, 32, None))


def task(head=SMALL_HEAD):
    return DetectionTask(num_classes=3, class_names=["circle", "square", "triangle"], head=head, backbone=TINY)


@pytest.mark.parametrize("backend", ["pycocotools", "faster_coco_eval"])
def test_map_equals_pycocotools_on_the_original_annotations(coco_val, backend, monkeypatch):
    """Both torchmetrics backends (faster_coco_eval is the `[coco]` extra, in `[dev]` too)."""
    pytest.importorskip(backend)
    monkeypatch.setattr("vitdense.tasks.detection.map_backend", lambda: backend)
    path, dataset = coco_val
    model = task()
    assert model.val_metrics["map"]._coco_backend.backend == backend
    rng = torch.Generator().manual_seed(0)
    everything = []
    for start in range(0, len(dataset), 4):
        batch = pad_collate([dataset[i] for i in range(start, min(start + 4, len(dataset)))])
        # detections near each object (jittered, sometimes with the wrong class) and random ones
        q = 12
        boxes = torch.rand(len(batch.targets), q, 4, generator=rng) * 0.4 + 0.2
        logits = 2 * torch.randn(len(batch.targets), q, 4, generator=rng)
        for i, t in enumerate(batch.targets):
            n = min(len(t.boxes), q)
            boxes[i, :n] = (t.boxes[:n] + 0.01 * torch.randn(n, 4, generator=rng)).clamp(0.01, 0.99)
            logits[i, torch.arange(n), t.labels[:n]] += 3
        output = DetectionOutput(logits, boxes)
        model.update_metrics(model.val_metrics, output, batch, "val")
        everything.append(model.detections(output, batch))
    ours = model.summarize(model.val_metrics.compute(), "val")

    gt = COCO(str(path))
    labels = LabelInfo(category_ids=tuple(dataset.index.category_ids))
    results = []  # the rows `predict` writes (DetectionResult.rows), read by pycocotools
    for found in everything:
        ids = [dataset.index.image_ids[i] for i in found.index.tolist()]
        context = ResultContext(model.class_names, labels, sizes=[(0, 0)] * len(ids), image_ids=ids)
        results += [row for result in DetectionResult.from_prediction(found, context) for row in result.rows()]
    evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    keys = ["map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100"]
    keys += ["mar_small", "mar_medium", "mar_large"]
    assert 0.05 < evaluator.stats[0] < 0.95  # a figure with something to compare
    for k, reference in zip(keys, evaluator.stats, strict=True):
        assert ours[f"val/{k}"].item() == pytest.approx(reference, abs=1e-6), k


def detr_postprocess(logits, boxes, sizes):
    """DETR's `PostProcess` (models/detr.py), written out: per query, the most probable real
    class and its probability; boxes (cx, cy, w, h) -> (x1, y1, x2, y2) times (W, H, W, H)."""
    prob = torch.softmax(logits, -1)
    scores, labels = prob[..., :-1].max(-1)
    cx, cy, w, h = boxes.unbind(-1)
    xyxy = torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)
    scale = torch.tensor([[width, height, width, height] for height, width in sizes], dtype=torch.float32)
    return xyxy * scale[:, None, :], scores, labels


def test_per_query_selection_is_detrs_postprocess():
    torch.manual_seed(1)
    logits, boxes = 3 * torch.randn(2, 12, 5), torch.rand(2, 12, 4) * 0.5 + 0.25
    sizes = [(40, 60), (480, 640)]
    found = postprocess(DetectionOutput(logits, boxes), sizes)  # the default: DETR's
    ref_boxes, ref_scores, ref_labels = detr_postprocess(logits, boxes, sizes)
    for i in range(2):
        assert found[0][i].shape == (12, 4) and found[1][i].shape == (12,)
        order = ref_scores[i].argsort(descending=True, stable=True)  # every query kept, best first
        assert torch.all(found[1][i][:-1] >= found[1][i][1:])
        torch.testing.assert_close(found[1][i], ref_scores[i, order], rtol=0, atol=1e-7)
        assert found[2][i].tolist() == ref_labels[i, order].tolist()
        torch.testing.assert_close(found[0][i], ref_boxes[i, order], rtol=1e-6, atol=1e-4)
    # top_k: the best (query, class) pairs, so one query may give two classes
    boxes_k, scores_k, labels_k = postprocess(DetectionOutput(logits, boxes), sizes, "top_k", top_k=30)
    probs = torch.softmax(logits, -1)[..., :-1]
    for i in range(2):
        assert boxes_k[i].shape == (30, 4) and labels_k[i].shape == (30,)
        torch.testing.assert_close(scores_k[i], probs[i].flatten().sort(descending=True).values[:30])
    assert len(postprocess(DetectionOutput(logits, boxes), sizes, "top_k", top_k=100)[1][0]) == 12 * 4
    with pytest.raises(ConfigError, match="selection"):
        DetectionTask(num_classes=3, head=SMALL_HEAD, backbone=TINY, selection="top")


def test_configs_say_which_selection():
    """DETR's recipe reads detections as DETR does; the demo keeps its published top-k."""
    det = yaml.safe_load((CONFIGS / "det_coco.yaml").read_text())["model"]["init_args"]
    demo = yaml.safe_load((CONFIGS / "demo_det.yaml").read_text())["model"]["init_args"]
    assert det.get("selection", "per_query") == "per_query" and demo["selection"] == "top_k"


def test_detections_do_not_depend_on_the_batch(coco_val):
    _, dataset = coco_val
    model = task().eval()
    sizes = {dataset[i].image.shape[-2:] for i in range(4)}
    assert len(sizes) > 1  # the batch of 4 pads some images
    with torch.no_grad():
        together = model.predict_step(pad_collate([dataset[i] for i in range(4)]), 0)
        for i in range(4):
            alone = model.predict_step(pad_collate([dataset[i]]), 0)
            torch.testing.assert_close(alone.scores[0], together.scores[i], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(alone.boxes[0], together.boxes[i], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("box_bias", [False, True])
def test_groups_in_training_only(box_bias):
    model = task(head=partial(SMALL_HEAD, num_groups=3, box_bias=box_bias))
    images = torch.randn(2, 3, 32, 40)
    model.train()
    out = model(images)
    assert out.logits.shape == (2, 36, 4) and out.num_groups == 3 and len(out.aux) == 1
    assert torch.all((out.boxes > 0) & (out.boxes < 1))
    model.eval()
    out = model(images)
    assert out.logits.shape == (2, 12, 4) and out.num_groups == 1


def test_groups_do_not_see_each_other():
    """Group 1's outputs are the same whether or not the other groups run alongside it."""
    torch.manual_seed(0)
    model = task(head=partial(SMALL_HEAD, num_groups=3, box_bias=True, dropout=0.0))
    images = torch.randn(2, 3, 32, 40)
    grouped = model.train()(images)
    alone = model.eval()(images)
    torch.testing.assert_close(grouped.logits[:, :12], alone.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grouped.boxes[:, :12], alone.boxes, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["normalised", "pixels"])
def test_box_bias_under_padding_and_autocast(coco_val, mode):
    _, dataset = coco_val
    model = task(head=partial(SMALL_HEAD, box_bias=True, box_bias_mode=mode)).eval()
    batch = pad_collate([dataset[i] for i in range(4)])
    with torch.no_grad():
        together = model.predict_step(batch, 0)
        alone = model.predict_step(pad_collate([dataset[1]]), 0)
        torch.testing.assert_close(alone.scores[0], together.scores[1], atol=1e-5, rtol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model.forward_batch(batch, "val")
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.boxes).all()


@pytest.mark.parametrize("box_bias", [False, True])
def test_box_path_in_fp32_under_bf16_autocast(box_bias):
    """Under bf16 autocast the decoder's layers run in bf16, but logits and boxes (and the
    reference boxes and their refinement) are the fp32 computation on its hidden states: bf16
    boxes would be up to 2^-9 of the image off, a pixel and more at COCO's sizes."""
    torch.manual_seed(0)
    model = task(head=partial(SMALL_HEAD, box_bias=box_bias, dropout=0.0)).eval()
    head = model.head
    for i in range(len(head.decoder)):  # offsets that are not 0 (one box head per layer with box_bias)
        torch.nn.init.normal_(head.box_head(i).layers[-1].weight, std=0.1)
    hidden, ffn = [], []
    head.decoder_norm.register_forward_hook(lambda module, args, out: hidden.append(out))
    head.decoder[0].linear2.register_forward_hook(lambda module, args, out: ffn.append(out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 3, 32, 40))
    assert ffn[0].dtype == torch.bfloat16  # the decoder's layers did run in bf16
    assert out.boxes.dtype == out.logits.dtype == torch.float32
    assert all(b.dtype == lg.dtype == torch.float32 for lg, b in out.aux)
    hs = torch.stack(hidden).float()  # [L, B, Q, d]: the decoder's outputs the heads saw
    with torch.no_grad():  # the same heads in fp32, outside autocast
        logits = head.class_embed(hs)
        if box_bias:  # iterative refinement from the learned first reference, written out
            reference, boxes = head.ref_point(head.query_embed.weight).sigmoid().expand(2, -1, -1), []
            for i, layer_hidden in enumerate(hs):
                reference = torch.sigmoid(torch.log(reference / (1 - reference)) + head.bbox_embed[i](layer_hidden))
                boxes.append(reference)
        else:
            boxes = head.bbox_embed(hs).sigmoid()
    torch.testing.assert_close(out.logits, logits[-1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.boxes, boxes[-1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.aux[0][1], boxes[0], rtol=1e-5, atol=1e-6)


def test_a_near_full_size_box_still_refines_under_bf16():
    """A side of 0.999 is 1 in bf16, whose inverse sigmoid is inf: the box would stay 1."""
    assert torch.isfinite(inverse_sigmoid(torch.tensor([0.999, 1.0], dtype=torch.bfloat16))).all()
    model = task(head=partial(SMALL_HEAD, box_bias=True, dropout=0.0)).eval()
    head = model.head
    start = math.log(0.999 / 0.001)
    with torch.no_grad():  # every query starts at side 0.999; each of the 2 layers shrinks it by -0.5 in logit
        head.ref_point.weight.zero_()
        head.ref_point.bias.copy_(torch.tensor([0.0, 0.0, start, start]))
        for box_head in head.bbox_embed:  # weight: 0 at init
            box_head.layers[-1].bias.copy_(torch.tensor([0.0, 0.0, -0.5, -0.5]))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(2, 3, 32, 40))
    first, last = torch.sigmoid(torch.tensor(start - 0.5)), torch.sigmoid(torch.tensor(start - 1.0))  # 0.9983, 0.9973
    torch.testing.assert_close(out.aux[0][1][..., 2:], first.expand(2, 12, 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(out.boxes[..., 2:], last.expand(2, 12, 2), rtol=0, atol=1e-6)


def test_a_checkpoint_with_one_box_head_for_all_layers_loads(tmp_path):
    """A checkpoint written before per-layer box heads (one `bbox_embed` for every layer; its
    head's init_args without `share_box_head`) rebuilds with one box head per layer holding
    copies of the old one: the same outputs."""
    import lightning as L

    torch.manual_seed(0)
    old = task(head=partial(SMALL_HEAD, box_bias=True, dropout=0.0, share_box_head=True)).eval()
    torch.nn.init.normal_(old.head.bbox_embed.layers[-1].weight, std=0.1)  # offsets that are not 0
    hparams = dict(old.hparams)
    hparams["head"] = {**hparams["head"], "init_args": dict(hparams["head"]["init_args"])}
    del hparams["head"]["init_args"]["share_box_head"]  # what the old code recorded
    path = tmp_path / "old.ckpt"
    state = {"state_dict": old.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": L.__version__}
    torch.save(state, path)
    assert any(".bbox_embed.layers." in k for k in state["state_dict"])
    new = DetectionTask.load_from_checkpoint(path).eval()
    assert not new.head.share_box_head and len(new.head.bbox_embed) == 2
    images = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        ours, theirs = new(images), old(images)
    torch.testing.assert_close(ours.boxes, theirs.boxes, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours.aux[0][1], theirs.aux[0][1], rtol=0, atol=1e-6)


def test_non_finite_box_names_the_dataset_sample(coco_val):
    _, dataset = coco_val
    batch = pad_collate([dataset[i] for i in (5, 1, 4)])
    i = next(i for i, t in enumerate(batch.targets) if len(t.labels))  # an image that gets matched
    boxes = torch.full((3, 12, 4), 0.5)
    boxes[i, 7, 2] = float("nan")
    with pytest.raises(
        NonFiniteError, match=rf"train sample {int(batch.index[i])} of the dataset, image {i} .*query 7"
    ):
        task().compute_loss(DetectionOutput(torch.zeros(3, 12, 4), boxes), batch, "train")


def test_coco_results_writer(coco_val, tmp_path):
    path, dataset = coco_val
    model = task().eval()
    writer = COCOResultsWriter(
        str(tmp_path / "out" / "dets.json"), draw_dir=str(tmp_path / "drawn"), score_threshold=0.0
    )

    class Trainer:  # what the writer reads from Lightning's trainer
        world_size, global_rank = 1, 0
        predict_dataloaders = torch.utils.data.DataLoader(dataset)
        datamodule = None

    writer.on_predict_start(Trainer, model)
    batch = pad_collate([dataset[i] for i in range(3)])
    with torch.no_grad():
        found = model.predict_step(batch, 0)
    writer.write_on_batch_end(Trainer, model, found, None, batch, 0)
    writer.on_predict_end(Trainer, model)
    results = json.loads((tmp_path / "out" / "dets.json").read_text())
    assert len(results) == sum(len(s) for s in found.scores)
    assert {r["category_id"] for r in results} <= {1, 3, 5}
    loaded = COCO(str(path)).loadRes(results)  # pycocotools accepts the file as it is
    assert len(loaded.getAnnIds()) == len(results)
    assert len(list((tmp_path / "drawn").glob("*.jpg"))) == 3
    # boxes at the original size: the first image's detections lie within its stored size
    entry = dataset.index.images[0]
    assert found.boxes[0][:, 2].max() <= entry.width * 1.001 and found.boxes[0][:, 3].max() <= entry.height * 1.001
    assert np.isfinite([r["score"] for r in results]).all()
