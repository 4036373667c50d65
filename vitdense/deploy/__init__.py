"""Using a trained model, without the trainer: a checkpoint read back (`checkpoint`), the
predictor behind `vitdense.load` (`predictor`), sliced inference of large images
(`slicing`), export to ONNX / `.pt2` / safetensors (`export`) and its runtimes
(`runtimes`: onnxruntime, OpenVINO), and the HTTP server (`serve`). None of it imports
Lightning, torchmetrics, scipy or the task classes for a checkpoint that records its plain
model (`checkpoint.record_model`: every built-in task's); `python -m vitdense export` and
`serve` start without them too."""
