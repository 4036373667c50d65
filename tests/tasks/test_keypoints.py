"""Keypoint detection end to end, as a user meets it: the pose demo fitted through the CLI, then
`test` and `predict` from its checkpoint; every keypoint figure `test` reports is recomputed by
pycocotools' COCOeval from the files `predict` wrote, and `vitdense.load` answers as `predict`."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from vitdense.cli import main
from vitdense.data.synthetic.keypoints import FIGURE
from vitdense.metrics.keypoints import KEYPOINT_AP_KEYS, evaluate_keypoints

CONFIG = str(Path(__file__).parents[2] / "configs" / "demo_pose.yaml")
SMALL = [
    "--data.init_args.img_size=32",
    "--data.init_args.train_size=8",
    "--data.init_args.val_size=3",
    "--data.init_args.loader.batch_size=4",
    "--model.init_args.backbone.model_args={depth: 2, patch_size: 2}",
    "--model.init_args.head.init_args.neck.init_args.feature_indexes=[0, 1]",
    "--trainer.enable_progress_bar=false",
]


def truth_from(results: list[dict], truth: dict) -> dict:
    """A ground truth made of the model's own best detections per image, their keypoints moved
    by 0, 0.5 and 1.5 pixels (an untrained model finds none of the real figures: AP 0 = 0 would
    prove little), some keypoints unlabelled or not visible."""
    annotations = []
    rng = np.random.default_rng(0)
    for image in truth["images"]:
        found = sorted((r for r in results if r["image_id"] == image["id"]), key=lambda r: -r["score"])
        for k, r in enumerate(found[:3]):
            points = np.asarray(r["keypoints"], dtype=np.float64).reshape(-1, 3)
            points[:, :2] += (0.0, 0.5, 1.5)[k]
            points[:, 2] = rng.choice([0, 1, 2, 2, 2], len(points))
            points[points[:, 2] == 0, :2] = 0
            x, y, w, h = r["bbox"]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": r["category_id"],
                    "bbox": [x, y, w, h],
                    "area": max(w * h, 1.0),
                    "iscrowd": 0,
                    "keypoints": points.ravel().tolist(),
                    "num_keypoints": int((points[:, 2] > 0).sum()),
                }
            )
    return {**truth, "annotations": annotations}


def test_pose_demo_tests_and_predicts_and_the_files_give_its_figures(tiny_runs, tmp_path, monkeypatch):
    folder, ckpt = tiny_runs["pose"]
    assert tiny_runs.cli("pose").trainer.global_step == 2
    monkeypatch.chdir(tmp_path)  # the demo writes runs/ relative to the working folder
    data = tmp_path / "synthetic_pose"  # (the run's files are shared: its data is copied, then changed)
    shutil.copytree(folder / "data" / "synthetic_pose", data)
    args = [*SMALL, f"--data.init_args.root={data}", f"--ckpt_path={folder / ckpt}"]
    out = tmp_path / "out" / "detections.json"
    writer = ["--trainer.callbacks+=vitdense.training.callbacks.COCOResultsWriter"]
    writer += [f"--trainer.callbacks.output_file={out}"]
    main(["predict", "--config", CONFIG, *args, *writer])
    keypoint_file = out.with_name("detections.keypoints.json")
    results = json.loads(keypoint_file.read_text())
    assert results and all("bbox" not in r and len(r["keypoints"]) == 3 * 13 for r in results)
    boxes = json.loads(out.read_text())  # detections.json keeps the boxes (box AP) and the keypoints
    assert [b["keypoints"] for b in boxes] == [r["keypoints"] for r in results]

    truth_path = data / "annotations" / "person_keypoints_val.json"
    truth_path.write_text(json.dumps(truth_from(boxes, json.loads(truth_path.read_text()))))
    tested = main(["test", "--config", CONFIG, *args])
    reported = {k: float(tested.trainer.callback_metrics[f"test/keypoint_{k}"]) for k in KEYPOINT_AP_KEYS}
    recomputed = evaluate_keypoints(truth_path, keypoint_file, sigmas=FIGURE.sigmas)
    assert 0.2 < reported["map"] < 1
    assert reported == pytest.approx(recomputed, abs=1e-6)


def test_load_and_the_server_answer_with_keypoints(tiny_runs):
    """`vitdense.load` gives each detection's keypoints with the schema the checkpoint
    recorded; the server's API answers the same JSON."""
    import base64

    from PIL import Image

    import vitdense
    from vitdense.deploy.serve import PredictorAPI

    folder, ckpt = tiny_runs["pose"]
    image = folder / "data" / "synthetic_pose" / "val" / "000000.png"
    result = vitdense.load(folder / ckpt)(Image.open(image))
    assert result.keypoint_schema == FIGURE  # recorded in the checkpoint: names, skeleton, flips, sigmas
    assert result.keypoints.shape == (len(result), 13, 3) and len(result) == 20
    assert ((result.keypoints[..., 2] >= 0) & (result.keypoints[..., 2] <= 1)).all()  # scores
    answer = result.to_dict()
    assert answer["keypoint_names"] == list(FIGURE.names)
    assert np.allclose(answer["detections"][0]["keypoints"], result.keypoints[0])
    assert result.above(0).draw(Image.open(image)).shape == (*result.size, 3)

    api = PredictorAPI(folder / ckpt, max_batch_size=2)
    api.setup("cpu")
    request = api.decode_request({"image": base64.b64encode(image.read_bytes()).decode()})
    (served,) = [api.encode_response(a) for a in api.predict([request])]
    assert served["keypoint_names"] == answer["keypoint_names"]
    np.testing.assert_allclose(
        [d["keypoints"] for d in served["detections"]], [d["keypoints"] for d in answer["detections"]], atol=1e-4
    )
