"""UniversalSegmentationTask: EoMT's annealing, its losses and evaluation, semantic on label maps."""

import base64
import io
import json
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import vitdense
from vitdense.cli import main
from vitdense.core.errors import ConfigError
from vitdense.data import LoaderConfig, SyntheticSegmentationDataModule, write_synthetic_panoptic
from vitdense.heads.eomt import EoMTHead
from vitdense.losses import MaskSetCriterion
from vitdense.metrics.common import LossMeans
from vitdense.metrics.universal import PanopticQuality
from vitdense.results.universal import PanopticResult, rgb2id
from vitdense.tasks import BackboneConfig
from vitdense.tasks.detection import MAP_KEYS
from vitdense.tasks.universal import UniversalSegmentationTask, label_map_segments
from vitdense.types import PanopticImages, PanopticSegments, SegmentTargets
from vitdense.types.collate import pad_collate

TINY = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 3})
HEAD = partial(EoMTHead, num_queries=6, num_blocks=2)
CRITERION = partial(MaskSetCriterion, num_points=64)


def task(**kwargs) -> UniversalSegmentationTask:
    torch.manual_seed(0)
    args = {"num_classes": 3, "is_thing": [True, True, False], "head": HEAD, "criterion": CRITERION, "backbone": TINY}
    return UniversalSegmentationTask(**{**args, **kwargs})


def segments(h: int, w: int, seed: int) -> SegmentTargets:
    """A stuff region, and two things (one of them a crowd when asked)."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(3, h, w, dtype=torch.bool)
    masks[0, : h // 2] = True
    y, x = (int(v) for v in torch.randint(0, h // 2, (2,), generator=g))
    masks[1, h // 2 + y // 2 : h // 2 + y // 2 + 6, x : x + 7] = True
    masks[2, 2 : 2 + h // 4, w // 2 : w // 2 + w // 4] = True
    masks[0] &= ~masks[2]
    return SegmentTargets(masks, torch.tensor([2, 0, 1]), torch.zeros(3, dtype=torch.bool))


def panoptic_batch(sizes, first=0):
    samples = []
    for i, (h, w) in enumerate(sizes):
        t = segments(h, w, first + i)
        image = torch.randn(3, h, w, generator=torch.Generator().manual_seed(first + i))
        samples.append(PanopticImages(image, t, first + i, (h, w), (2 * h, 2 * w), resized(t)))
    return pad_collate(samples)


def resized(t: SegmentTargets) -> SegmentTargets:
    """The same segments at twice the size (an evaluation annotation at its original size)."""
    masks = t.masks.repeat_interleave(2, 1).repeat_interleave(2, 2)
    return t._replace(masks=masks)


def test_annealing_follows_eomts_polynomial():
    """EoMT's `mask_annealing` (training/lightning_module.py): 1 before the start, (1 -
    progress) ** 0.9 within, 0 from the end step on; numbers from that function."""
    t = task(attn_mask_annealing_start_steps=[10, 20], attn_mask_annealing_end_steps=[20, 30])
    assert [t.mask_probability(0, s) for s in (0, 10, 15, 19, 20, 99)] == pytest.approx(
        [1.0, 1.0, 0.535887, 0.125893, 0.0, 0.0], abs=1e-6
    )
    assert t.mask_probability(1, 15) == 1.0
    with pytest.raises(ConfigError, match="one entry per joined block"):
        task(attn_mask_annealing_start_steps=[1], attn_mask_annealing_end_steps=[2])
    with pytest.raises(ConfigError, match="or neither"):
        task(attn_mask_annealing_start_steps=[1, 2])


def test_label_maps_become_one_segment_per_class_present():
    label_map = torch.tensor([[0, 0, 255], [2, 2, 7]])
    found = label_map_segments(label_map, num_classes=3)
    assert found.labels.tolist() == [0, 2]  # 255 is void; 7 is no class of 3
    assert found.masks.tolist() == [[[True, True, False], [False, False, False]], [[False] * 3, [True, True, False]]]


def test_training_loss_has_every_block_and_reaches_the_queries():
    t = task().train()
    b = panoptic_batch([(32, 32), (24, 40)])
    losses = t.compute_loss(t.forward_batch(b, "train"), b, "train")
    assert set(losses.terms) == {f"loss_{n}{s}" for n in ("ce", "mask", "dice") for s in ("", "_0", "_1")}
    losses.total.backward()
    assert t.model.head.q.weight.grad.abs().sum() > 0
    assert t.backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_evaluation_losses_are_the_images_own_whatever_the_batching():
    """Each image's loss as if it ran alone (its part of the grid, its own points): the
    dataset figure of 3 images is the same in one batch as in batches of 2 and 1."""
    t = task().eval()
    sizes = [(32, 32), (24, 40), (40, 16)]

    def figures(batches):
        means = LossMeans()
        with torch.no_grad():
            for b in batches:
                means.update("val", t.compute_loss(t.forward_batch(b, "val"), b, "val"), len(b.targets))
        return {k: float(v) for k, v in means.pop("val").items()}

    together = figures([panoptic_batch(sizes)])
    apart = figures([panoptic_batch(sizes[:2]), panoptic_batch(sizes[2:], first=2)])
    assert together.keys() == apart.keys() and "val/loss" in together
    for key in together:
        assert apart[key] == pytest.approx(together[key], rel=1e-5), key


def test_evaluation_reports_panoptic_instance_and_semantic_figures():
    t = task(evaluate=["panoptic", "instance", "semantic"]).eval()
    b = panoptic_batch([(32, 32), (24, 40)])
    with torch.no_grad():
        t.update_metrics(t.val_metrics, t.forward_batch(b, "val"), b, "val")
    result = t.val_metrics.compute()
    summary = t.summarize(result, "val")
    assert {"val/PQ", "val/PQ_th", "val/PQ_st", "val/map", "val/map_small", "val/mIoU"} <= summary.keys()
    assert t.monitor == "val/PQ"
    assert "PQ" in t.format_table(result, "val")


def test_semantic_segmentation_trains_on_label_maps():
    """The semantic task reads SegmentedImages (today's semantic data), trains with the mask
    loss and validates mIoU in sliding windows; its predictions are label maps."""
    data = SyntheticSegmentationDataModule(
        num_classes=3, img_size=32, train_size=8, val_size=3, loader=LoaderConfig(batch_size=4, num_workers=0)
    )
    t = task(segmentation="semantic", is_thing=None, num_classes=3)
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    trainer.fit(t, datamodule=data)
    assert 0 <= float(trainer.callback_metrics["val/mIoU"]) <= 1
    assert t.monitor == "val/mIoU"
    data.setup("validate")
    b = next(iter(data.val_dataloader()))
    prediction = t.eval().predict_step(b, 0)
    assert [tuple(x.shape) for x in prediction.labels] == [tuple(s) for s in b.mask_sizes.sizes]
    pixels = [np.zeros((*s, 3), np.uint8) for s in b.image_sizes.sizes]
    assert len(t.draw_batch(b, pixels, np.full((3, 3), 200, np.uint8))) == len(pixels)


# ---------------------------------------------------------------------- a panoptic model's instances
def rect(y: int, x: int, h: int, w: int, size=(48, 64)) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[y : y + h, x : x + w] = True
    return mask


#: per image of 48 x 64: the segments (mask, class, crowd) of classes 0, 1 (things) and 2 (stuff),
#: and the queries (mask, class, class logit) a model is made to find: the stuff found whole,
#: things shifted, missed or made up
SCENE = [
    (
        [(rect(0, 0, 20, 64), 2, False), (rect(26, 4, 10, 10), 0, False), (rect(26, 30, 12, 14), 1, False)],
        [(rect(0, 0, 20, 64), 2, 6.0), (rect(28, 6, 10, 10), 0, 4.0), (rect(26, 30, 12, 14), 1, 2.0)]
        + [(rect(36, 20, 8, 8), 0, 5.0), (rect(40, 50, 6, 9), 1, 3.5)],
    ),
    (
        [(rect(30, 0, 18, 64), 2, False), (rect(4, 4, 10, 10), 1, False), (rect(6, 30, 9, 12), 0, False)]
        + [(rect(4, 50, 8, 10), 0, True)],
        [(rect(28, 0, 20, 64), 2, 5.0), (rect(4, 4, 10, 10), 1, 3.0), (rect(9, 30, 9, 12), 0, 1.0)]
        + [(rect(16, 16, 7, 7), 1, 4.0), (rect(5, 51, 5, 5), 0, 4.5)],
    ),
]
CATEGORY_IDS = (3, 8, 40)


def scene_run(t: UniversalSegmentationTask, monkeypatch) -> PanopticImages:
    """`t` made to see `SCENE` (its queries' logits in place of the model's, at the images'
    original size, the model not run); the batch of its two images, with their segments for
    evaluation."""
    logits = []
    for _, queries in SCENE:
        class_logits = torch.zeros(len(queries), 4)
        for q, (_, label, logit) in enumerate(queries):
            class_logits[q, label] = logit
        logits.append((class_logits, torch.stack([torch.where(m, 3.0, -3.0) for m, _, _ in queries])))
    monkeypatch.setattr(t, "forward", lambda *args: None)
    monkeypatch.setattr(t, "per_image", lambda output, batch: [logits[i] for i in batch.index.tolist()])
    samples = []
    for i, (truth, _) in enumerate(SCENE):
        masks, labels, crowd = zip(*truth, strict=True)
        targets = SegmentTargets(torch.stack(masks), torch.tensor(labels), torch.tensor(crowd))
        samples.append(
            PanopticImages(torch.randn(3, 32, 32), SegmentTargets.empty((32, 32)), i, (32, 32), (48, 64), targets)
        )
    return pad_collate(samples)


def test_a_panoptic_models_mask_ap_is_cocoevals_on_its_things(monkeypatch, tmp_path):
    """Mask AP of a panoptic model is on its thing classes, predictions and ground truth, as
    Mask2Former's: the 12 figures it reports equal COCOeval(segm) of the instances.json its
    checkpoint asked for instances writes, against the things of the ground truth (COCO's
    instances JSON of a panoptic set), and that file holds things only. Counted as instances,
    the stuff (found whole here) would raise the AP."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from vitdense.core.preprocess import LabelInfo
    from vitdense.results.common import ResultContext
    from vitdense.results.universal import InstanceResult

    panoptic = task(evaluate=["panoptic", "instance"]).eval()
    batch = scene_run(panoptic, monkeypatch)
    with torch.no_grad():
        panoptic.update_metrics(panoptic.test_metrics, panoptic.forward_batch(batch, "test"), batch, "test")
    figures = panoptic.summarize(panoptic.test_metrics.compute(), "test")
    reported = np.array([figures[f"test/{k}"].item() for k in MAP_KEYS])

    instance = task(segmentation="instance").eval()  # the same model asked for instances
    batch = scene_run(instance, monkeypatch)
    context = ResultContext(["a", "b", "sky"], LabelInfo(category_ids=CATEGORY_IDS), [(48, 64)] * 2, image_ids=[5, 9])
    with torch.no_grad():
        results = instance.to_results(instance.predict_step(batch, 0), context)
    rows = [row for r in results for row in r.rows()]
    InstanceResult.write_table(rows, tmp_path / "instances.json")

    annotations = []
    for image_id, (truth, _) in zip((5, 9), SCENE, strict=True):
        for mask, label, crowd in truth:
            if label == 2:  # stuff: not in COCO's instances JSON
                continue
            rle = mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))
            rle["counts"] = rle["counts"].decode()
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": CATEGORY_IDS[label],
                 "segmentation": rle, "area": int(mask.sum()), "bbox": mask_utils.toBbox(rle).tolist(),
                 "iscrowd": int(crowd)}
            )  # fmt: skip
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i, "height": 48, "width": 64} for i in (5, 9)],
        "annotations": annotations,
        "categories": [{"id": 3, "name": "a"}, {"id": 8, "name": "b"}],
    }
    gt.createIndex()
    evaluator = COCOeval(gt, gt.loadRes(str(tmp_path / "instances.json")), "segm")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    assert 0.2 < evaluator.stats[0] < 0.8  # figures to compare
    np.testing.assert_allclose(
        reported, evaluator.stats, atol=1e-6, err_msg=str(dict(zip(MAP_KEYS, reported, strict=True)))
    )
    assert {r["category_id"] for r in rows} == {3, 8}  # things only


# ---------------------------------------------------------------------- the whole run, CLI to server
DEMO = Path(__file__).parents[2] / "configs" / "demo_panoptic.yaml"


def demo_config(root: Path, **trainer) -> Path:
    """demo_panoptic.yaml at 32 px, 8 training images (read by `CocoPanopticDataModule`), a
    plain 4-block ViT with 8 x 8 patches (the queries in the last 2), 8 queries, annealed
    within the run, fp32."""
    cfg = yaml.safe_load(DEMO.read_text())
    settings = {"max_steps": 4, "precision": "32-true", "enable_progress_bar": False, "log_every_n_steps": 1}
    cfg["trainer"].update({**settings, "default_root_dir": str(root), **trainer})
    cfg["trainer"]["callbacks"] = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(root / "checkpoints"), "every_n_train_steps": 2, "save_top_k": -1},
        }
    ]
    model = cfg["model"]["init_args"]
    model["head"]["init_args"]["num_queries"] = 8
    model["criterion"]["init_args"]["num_points"] = 64
    model["attn_mask_annealing_start_steps"], model["attn_mask_annealing_end_steps"] = [1, 2], [2, 4]
    # a plain ViT: the hybrid's ResNet stem multiplies the symbolic shapes export reasons about
    # (an export of the demo's own backbone takes a minute and a half on 2 cores)
    model["backbone"].update(name="vit_tiny_patch16_224", model_args={"depth": 4, "patch_size": 8})
    model["lr_scheduler"]["init_args"]["warmup_steps"] = 1
    # the demo's shapes in COCO panoptic's files, read as a user's own COCO-format set is:
    # CocoPanopticDataModule, the DataModule of eomt_coco_panoptic.yaml
    data_root = root.parent / "synthetic_panoptic"
    if not (data_root / "annotations" / "panoptic_val.json").is_file():
        for split, size in (("train", 8), ("val", 3)):
            write_synthetic_panoptic(data_root, split, size, img_size=32)
    cfg["data"] = {"class_path": "vitdense.data.CocoPanopticDataModule", "init_args": {"root": str(data_root)}}
    data = cfg["data"]["init_args"]
    for split in ("train", "val"):
        data.update({f"{split}_images": split, f"{split}_annotations": f"annotations/panoptic_{split}.json"})
        data[f"{split}_masks"] = f"annotations/panoptic_{split}"
    data.update(img_size=32, eval_size=32, scale_range=[0.75, 1.25])  # SyntheticPanopticDataModule's
    data["loader"] = {"batch_size": 2, "num_workers": 0}
    path = root / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def fitted(tiny_runs):
    """The demo (`demo_config`) fitted for 4 steps through the CLI (the session's run:
    tests/tiny_runs.py), then tested: (config, checkpoint, test figures)."""
    folder, ckpt = tiny_runs["panoptic"]
    config = folder / "run" / "config.yaml"
    cli = main(["test", "--config", str(config), f"--ckpt_path={ckpt}"])
    return config, ckpt, {k: float(v) for k, v in cli.trainer.callback_metrics.items()}


def test_predict_writes_coco_panoptic_files_that_score_as_test(fitted, tmp_path):
    """`predict` on the validation split writes COCO panoptic PNGs and their JSON; read back
    against the split's own PNGs and JSON, they score the PQ that `test` reported (the metric
    is panopticapi's, tests/test_panoptic_metrics.py)."""
    config, ckpt, figures = fitted
    main(["predict", "--config", str(config), f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}"])
    written = json.loads((tmp_path / "predictions" / "panoptic.json").read_text())["annotations"]
    gt_root = Path(yaml.safe_load(config.read_text())["data"]["init_args"]["root"])
    truth = json.loads((gt_root / "annotations" / "panoptic_val.json").read_text())
    assert sorted(a["image_id"] for a in written) == sorted(i["id"] for i in truth["images"])
    label_of = {c["id"]: k for k, c in enumerate(truth["categories"])}
    metric = PanopticQuality(len(truth["categories"]), [bool(c["isthing"]) for c in truth["categories"]])
    for annotation in written:
        gt = next(a for a in truth["annotations"] if a["image_id"] == annotation["image_id"])
        pred_ids = rgb2id(np.asarray(Image.open(tmp_path / "predictions" / "panoptic" / annotation["file_name"])))
        gt_ids = rgb2id(np.asarray(Image.open(gt_root / "annotations" / "panoptic_val" / gt["file_name"])))
        segments = annotation["segments_info"]
        pred = PanopticSegments(
            torch.from_numpy(pred_ids),
            torch.tensor([s["id"] for s in segments], dtype=torch.int64),
            torch.tensor([label_of[s["category_id"]] for s in segments], dtype=torch.int64),
            torch.tensor([s["score"] for s in segments]),
        )
        masks = torch.stack([torch.from_numpy(gt_ids == s["id"]) for s in gt["segments_info"]])
        labels = torch.tensor([label_of[s["category_id"]] for s in gt["segments_info"]])
        crowd = torch.tensor([bool(s["iscrowd"]) for s in gt["segments_info"]])
        metric.update([pred], [SegmentTargets(masks, labels, crowd)])
    result = metric.compute()
    for key in ("PQ", "SQ", "RQ", "PQ_th", "PQ_st"):
        assert float(result[key]) == pytest.approx(figures[f"test/{key}"], abs=1e-6), key


def test_load_draws_and_serves_the_panoptic_result(fitted):
    from vitdense.deploy.serve import PredictorAPI

    _, ckpt, _ = fitted
    predictor = vitdense.load(ckpt)
    image = np.random.default_rng(0).integers(0, 256, (30, 44, 3), dtype=np.uint8)
    result = predictor(image)
    assert isinstance(result, PanopticResult) and result.id_map.shape == (30, 44)
    assert set(np.unique(result.id_map)) <= {0, *result.ids.tolist()}
    assert result.draw(image).shape == (30, 44, 3)
    answer = json.loads(json.dumps(result.to_dict()))
    assert answer["task"] == "panoptic" and len(answer["segments"]) == len(result)
    api = PredictorAPI(ckpt, max_batch_size=2)  # the server's own decode -> predict -> encode
    api.setup("cpu")
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    served = api.encode_response(
        api.predict([api.decode_request({"image": base64.b64encode(buffer.getvalue()).decode()})])[0]
    )
    assert served["segments"] == answer["segments"]


def test_export_gives_the_eager_class_probabilities_and_masks(fitted, tmp_path):
    import onnxruntime

    from vitdense.deploy.export import export_checkpoint

    _, ckpt, _ = fitted
    path, traced, outputs = export_checkpoint(ckpt, "onnx", tmp_path / "eomt.onnx")
    assert outputs == ["class_probs", "mask_logits"]
    assert traced.fixed_because is None and traced.batch_fixed_because is None
    model = vitdense.load_model(ckpt).eval()
    raw = torch.rand(2, 3, 40, 24) * 255  # two images: the batch is dynamic too
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probs, masks = session.run(None, {"images": raw.numpy()})
    predictor = vitdense.load(ckpt)
    mean, std = torch.tensor(predictor.data.preprocess.mean), torch.tensor(predictor.data.preprocess.std)
    with torch.no_grad():
        expected = model.export_outputs((raw / 255 - mean[:, None, None]) / std[:, None, None])
    torch.testing.assert_close(torch.from_numpy(probs), expected[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(masks), expected[1], atol=1e-3, rtol=1e-4)
    assert masks.shape[-2:] == (40, 24)
    # OpenVINO IR, as `--format openvino` converts it from this ONNX file, in fp32
    from vitdense.deploy.runtimes import compile_openvino, onnx_to_openvino

    onnx_to_openvino(path, tmp_path / "eomt.xml")
    probs, masks = compile_openvino(tmp_path / "eomt.xml", "f32")(raw.numpy()).values()
    torch.testing.assert_close(torch.from_numpy(probs), expected[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.from_numpy(masks), expected[1], atol=1e-3, rtol=1e-4)


def test_instance_predictions_are_a_coco_results_file_cocoeval_reads(fitted, tmp_path):
    """The panoptic checkpoint asked for instances on the command line (`predict --config …
    --ckpt_path … --model.init_args.segmentation=instance`: the user's setting wins over the
    checkpoint's): `predict` writes a COCO results JSON (RLE masks, the dataset's category
    ids, things only) and no panoptic files; pycocotools evaluates it against the things of
    the split's panoptic annotation (panopticapi's conversion to COCO's instances JSON) to
    the mask AP `test` reported."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    config, ckpt, figures = fitted
    run = [f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={tmp_path}", "--model.init_args.segmentation=instance"]
    cli = main(["predict", "--config", str(config), *run])
    assert cli.model.segmentation == "instance"
    assert not (tmp_path / "predictions" / "panoptic.json").exists()
    rows = json.loads((tmp_path / "predictions" / "instances.json").read_text())
    assert rows and {"image_id", "category_id", "segmentation", "score"} <= rows[0].keys()
    assert "bbox" not in rows[0]  # loadRes would take the box's area for COCOeval's size ranges
    data_args = yaml.safe_load(config.read_text())["data"]["init_args"]
    annotations_dir = Path(data_args["root"]) / "annotations"
    truth = json.loads((annotations_dir / "panoptic_val.json").read_text())
    things = [c for c in truth["categories"] if c["isthing"]]
    assert {r["image_id"] for r in rows} == {i["id"] for i in truth["images"]}
    assert {r["category_id"] for r in rows} <= {c["id"] for c in things}
    instances = []  # the things of each PNG, as panopticapi's panoptic2detection_coco_format writes them
    for annotation in truth["annotations"]:
        ids = rgb2id(np.asarray(Image.open(annotations_dir / "panoptic_val" / annotation["file_name"])))
        for segment in annotation["segments_info"]:
            if segment["category_id"] in {c["id"] for c in things}:
                rle = mask_utils.encode(np.asfortranarray((ids == segment["id"]).astype(np.uint8)))
                rle["counts"] = rle["counts"].decode()
                instances.append({**segment, "image_id": annotation["image_id"], "segmentation": rle})
    gt = COCO()
    images = [{k: i[k] for k in ("id", "height", "width")} for i in truth["images"]]
    gt.dataset = {"images": images, "annotations": instances, "categories": things}
    gt.createIndex()
    evaluator = COCOeval(gt, gt.loadRes(rows), "segm")  # reads every RLE at its image's size
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    reported = [figures[f"test/{k}"] for k in MAP_KEYS]
    np.testing.assert_allclose(reported, evaluator.stats, atol=1e-6)


def test_a_setting_fixed_at_training_is_refused_at_predict(fitted, tmp_path, capsys):
    config, ckpt, _ = fitted
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "predict",
                "--config",
                str(config),
                f"--ckpt_path={ckpt}",
                "--model.init_args.head.init_args.num_queries=4",
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model.init_args.head.init_args.num_queries=4" in err and "was trained with 8" in err


def test_a_killed_run_resumes_exactly(tmp_path):
    """Resumed from step 2, before the second block's annealing lifts masks at random (step 3),
    the weights and the annealed probabilities end as the uninterrupted run's."""
    whole = main(["fit", "--config", str(demo_config(tmp_path / "whole", max_steps=6))])
    resumed_config = demo_config(tmp_path / "resumed", max_steps=6)
    mid = tmp_path / "whole" / "checkpoints" / "epoch=0-step=2.ckpt"
    resumed = main(["fit", "--config", str(resumed_config), f"--ckpt_path={mid}"])
    assert resumed.trainer.global_step == whole.trainer.global_step == 6
    expected = whole.model.state_dict()
    diff = max((v.float() - expected[k].float()).abs().max().item() for k, v in resumed.model.state_dict().items())
    assert diff <= 1e-6
    assert resumed.model.model.head.attn_mask_probs.tolist() == [0.0, 0.0]
