"""Using a trained model, without the trainer: a checkpoint read back (`checkpoint`), the
predictor behind `vitdense.load` (`predictor`), sliced inference of large images
(`slicing`), export to ONNX / `.pt2` / safetensors (`export`) and its runtimes
(`runtimes`: onnxruntime, OpenVINO), and the HTTP server (`serve`)."""
