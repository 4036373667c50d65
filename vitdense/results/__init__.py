"""What a task predicts for one image, as a typed result: the one place where a task
family says how its prediction becomes something people use.

A result type (`Result`) declares, for its family:

    from_prediction(prediction, context)  the task's `predict_step` output -> one result per image
    to_dict()                             plain JSON (what `python -m vitdense serve` answers)
    write(folder, name, options)          the image's own files (`python -m vitdense predict`)
    rows() / write_table(rows, path)      its lines in the run's table (CSV, COCO JSON), if any

and a task names its type (`BaseTask.result_type`); `vitdense.load`, `predict`'s writer
(`vitdense.callbacks.ResultWriter`) and the server hold no list of task types. The export
graph's outputs are the plain model's (`export_outputs` in `vitdense.models`).

    ClassificationResult  top-k classes, names, probabilities          -> classes.csv
    SegmentationResult    label map [H, W] (class indices), `overlay`  -> masks/<name>.png
    DetectionResult       boxes [k, 4] (x1, y1, x2, y2) pixels, scores  -> detections.json, drawn/
    PanopticResult        segment ids [H, W] + segments                -> panoptic/<name>.png, panoptic.json
    InstanceResult        masks [k, H, W] + scores                     -> instances.json, drawn/
    DepthResult           depth [H, W] metres (or inverse depth)       -> depth/<name>.png, depth.csv

One module per family (`vitdense.results.classification`, `.segmentation`, `.detection`,
`.universal`: panoptic and instance results, `.depth`), the shared parts in
`vitdense.results.common`. It imports nothing of Lightning: a result is plain NumPy and
Python values.

Every name is imported on first use (PEP 562): importing one family's module does not import
the others.
"""

from __future__ import annotations

from vitdense.core.moved import lazy_exports

#: each public name and the module that defines it
_WHERE = {
    "ResultContext": "vitdense.results.common",
    "WriteOptions": "vitdense.results.common",
    "Result": "vitdense.results.common",
    "Origin": "vitdense.results.common",
    "ClassificationResult": "vitdense.results.classification",
    "SegmentationResult": "vitdense.results.segmentation",
    "DetectionResult": "vitdense.results.detection",
    "rgb2id": "vitdense.results.universal",
    "id2rgb": "vitdense.results.universal",
    "category_id": "vitdense.results.universal",
    "panoptic_png": "vitdense.results.universal",
    "instance_results": "vitdense.results.universal",
    "mask_box": "vitdense.results.universal",
    "rle_box": "vitdense.results.universal",
    "PanopticResult": "vitdense.results.universal",
    "InstanceResult": "vitdense.results.universal",
    "UINT16_MAX": "vitdense.results.depth",
    "DepthResult": "vitdense.results.depth",
}

__all__ = sorted(_WHERE)

__getattr__ = lazy_exports(__name__, _WHERE)
