"""Benchmarks that print figures and the ratio against the peer they measure.

    python -m vitdense.bench backbone --model vit_small_patch16_224 --img-size 224 --batch-size 8
    python -m vitdense.bench export --model vit_small_patch16_224 --img-size 224
    python -m vitdense.bench det-heads --model vit_small_patch16_224 --img-size 640 --batch-size 2
    python -m vitdense.bench eval --images 5000
    python -m vitdense.bench data --config configs/demo_det.yaml --workers 0 1 2
    python -m vitdense.bench train-step --task seg --model vit_small_patch16_224 --img-size 512
    python -m vitdense.bench plain-loop --config configs/demo_cls.yaml --seeds 3 --epochs 2
    python -m vitdense.bench eomt-peer --img-size 512
    python -m vitdense.bench seg-heads --model vit_small_patch16_224 --img-size 512 --batch-size 2
    python -m vitdense.bench multitask --backbone vit_small_patch16_224 --img-size 224 --batch 1 8

`backbone` times vitdense's encoder against timm's `forward_features` with the same
weights, in one process, alternating the two every round so that drift of the machine
(thermal, other load) hits both alike. It reports the median images/s of inference and of
a training step (forward + backward), the memory of the training step, and
vitdense / timm for each. Memory is the peak allocated on CUDA; on CPU, where torch keeps
no allocator statistics, it is the size of the activations autograd saves for backward
(the part of training memory that depends on the implementation).

`det-heads` times a detection training step (forward, the task's loss, backward) of each
detection head on the same backbone at a COCO-like size, alternating the heads every round:
median ms, saved-activation MB (CPU) or peak MB (CUDA), and the ratio to the first head.

`train-step` times a task's training step (forward, loss, backward) against the design a
user would otherwise run (`vitdense.bench.peers`: timm for classification, Segmenter's for
segmentation, DETR's for detection), the same backbone weights and inputs, alternating:
median images/s, memory, and vitdense / peer.

`data` times a config's training data pipeline (its DataModule, as the CLI builds it) in
samples/s for each number of loader workers, so `loader.num_workers` can be set from it.

`eval` times COCO's AP with per-class figures on a synthetic set (5,000 images, 100
detections each, 80 classes): COCOeval run directly (all classes at once), torchmetrics'
`MeanAveragePrecision(class_metrics=True)` (COCOeval once, then again per class) and
vitdense's `DetectionMeanAP` (COCOeval once, per-class figures from its arrays), per backend.

`plain-loop` trains a classification recipe (default `configs/demo_cls.yaml`) through
vitdense's CLI and through the plain PyTorch loop with timm's ViT that people would
otherwise write — the same model (same outputs for the same weights), initialisation
scheme, optimizer, warmup + cosine schedule, precision and DataModule datasets — for each
of N seeds, and prints validation top-1 by epoch for both, their means and wall times: does
the pipeline learn as fast as the plain loop (`vitdense.bench.plain_loop`)?

`eomt-peer` times EoMT's inference step (fp32, CPU, ViT-S with 100 queries in its last 3
blocks at 512 x 512 by default) in vitdense and in transformers' `EomtForUniversalSegmentation`
with the same weights, alternating: median ms, images/s, vitdense / transformers, and the
largest difference of their mask logits. transformers is not a vitdense dependency: without
it the command says how to install it and exits with status 2.

`seg-heads` times semantic segmentation's two designs on the same ViT (random weights, the
same in both): Segmenter's mask transformer decoder after the encoder (`SegmentationTask`) and
EoMT's 100 queries in the encoder's last blocks (`UniversalSegmentationTask(segmentation=
"semantic")`, Mask2Former's loss on 12,544 points per mask). The training step is fit's
(`forward_batch`, `compute_loss`, backward, the task's optimizer stepped) on random images and
blocky label maps of 8 classes each; inference is `model(images)` against `model.semantic(images)`
on one window, EoMT after its masked attention is annealed away and, in a third row, with it on.
Median ms/step, img/s, training memory, and EoMT / Segmenter for both steps, with the CPU's
kind, torch's threads and the precision (`--precision bf16`: CPU autocast, emulated and slow
on CPUs without AVX512-BF16 or AMX, which the command warns of).

`multitask` times one graph with K heads on one encoder (`MultiTaskModel`: detection,
segmentation, depth) against the K single-task models on copies of the same encoder, run one
after another, and the encoder alone, in eager PyTorch and onnxruntime at each batch size:
median (min) ms, the ratio singles / multi-task and what ideal sharing ((K - 1) encoder passes
saved) would give; parameter totals (the encoder once vs K times) and the peak RSS of one eager
forward. It first checks that the multi-task outputs equal the single models' (0.0 in eager,
1e-4 in onnxruntime) and prints no timing otherwise (`vitdense.bench.multitask`).

`multitask-demo` trains configs/demo_multitask.yaml jointly and each of its tasks alone on the
same co-annotated scenes, seed by seed, and prints each task's figure joint and alone, at equal
steps and at equal wall time (`vitdense.bench.multitask_demo`).

`export` times each task's exported graph (`python -m vitdense export`, fixed size, batch 1)
in onnxruntime against the same wrapper in eager PyTorch, alternating, median ms.
"""

from vitdense.bench.cli import main

__all__ = ["main"]
