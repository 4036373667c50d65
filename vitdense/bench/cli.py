"""`python -m vitdense.bench COMMAND`: the argument parser of every benchmark."""

from __future__ import annotations

import argparse

import torch

from vitdense.bench.backbone import bench_backbone, print_backbone
from vitdense.bench.cold_start import add_parser as add_cold_start
from vitdense.bench.cold_start import bench_cold_start, print_cold_start
from vitdense.bench.common import PRECISIONS
from vitdense.bench.data import bench_data, print_data
from vitdense.bench.detection import bench_det_heads, print_det_heads
from vitdense.bench.distillation import add_parser as add_distill_study
from vitdense.bench.distillation import run_study
from vitdense.bench.eomt import run_eomt_peer
from vitdense.bench.evaluation import bench_eval, print_eval
from vitdense.bench.export import bench_export, print_export
from vitdense.bench.export_accuracy import bench_export_accuracy, print_export_accuracy
from vitdense.bench.multitask import HEADS, run_multitask
from vitdense.bench.multitask_demo import bench_multitask_demo, print_multitask_demo
from vitdense.bench.plain_loop import DEMO_CONFIG, bench_plain_loop, print_plain_loop
from vitdense.bench.rfdetr import SIZES, run_rfdetr
from vitdense.bench.seg_heads import run_seg_heads
from vitdense.bench.sliced import bench_sliced, print_sliced
from vitdense.bench.train_step import bench_train_step, print_train_step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m vitdense.bench",
        description="Benchmarks that print figures and the ratio against the peer they measure.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    bb = sub.add_parser("backbone", help="vitdense encoder vs timm forward_features, same weights")
    bb.add_argument("--model", default="vit_small_patch16_224", help="timm model name")
    bb.add_argument("--img-size", type=int, default=224)
    bb.add_argument("--batch-size", type=int, default=8)
    bb.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    bb.add_argument("--grad-checkpointing", action="store_true")
    bb.add_argument("--iters", type=int, default=10, help="timed rounds per model")
    bb.add_argument("--warmup", type=int, default=2)
    bb.add_argument("--gemm-size", type=int, default=2048, help="side of the square GEMM whose rate is the peak")
    bb.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ex = sub.add_parser("export", help="eager vs onnxruntime latency of each task's exported graph")
    ex.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    ex.add_argument("--img-size", type=int, default=224)
    ex.add_argument("--batch-size", type=int, default=1, help="images per run (ms are per batch)")
    ex.add_argument(
        "--no-dynamic-batch", dest="dynamic_batch", action="store_false",
        help="export the graph with its batch fixed to 1 (as `export --no-dynamic-batch`), e.g. to compare",
    )  # fmt: skip
    ex.add_argument("--depth", type=int, default=None, help="blocks of the encoder (default: the model's)")
    ex.add_argument("--tasks", nargs="+", default=["classification", "segmentation", "detection"])
    ex.add_argument("--iters", type=int, default=10, help="timed rounds per runtime")
    ex.add_argument("--warmup", type=int, default=2)
    ea = sub.add_parser(
        "export-accuracy",
        help="a checkpoint's ONNX fp32 / fp16 and OpenVINO f32 / bf16 graphs on its validation split: AP or mIoU",
    )
    ea.add_argument("--ckpt_path", required=True, help="a detection or segmentation checkpoint (run from its folder)")
    ea.add_argument(
        "--formats", nargs="+", default=["onnx", "onnx-fp16", "openvino", "openvino-bf16"],
        help="besides eager (openvino-bf16 only where the CPU computes bf16)",
    )  # fmt: skip
    ea.add_argument("--limit", type=int, default=None, help="the first N validation images (default: all)")
    dh = sub.add_parser("det-heads", help="training-step time and memory of each detection head, same backbone")
    dh.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    dh.add_argument("--img-size", type=int, default=640)
    dh.add_argument("--batch-size", type=int, default=2)
    dh.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    dh.add_argument("--heads", nargs="*", default=None, help="a subset of the heads, by name")
    dh.add_argument("--num-queries", type=int, default=300, help="queries per group")
    dh.add_argument("--num-groups", type=int, default=13, help="Group DETR groups in training")
    dh.add_argument("--keypoints", type=int, default=0, help="K > 0: each head again with a K-keypoint head")
    dh.add_argument("--iters", type=int, default=5, help="timed rounds per head")
    dh.add_argument("--warmup", type=int, default=1)
    dh.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ts = sub.add_parser("train-step", help="a task's training step vs the design a user would otherwise run")
    ts.add_argument("--task", choices=["cls", "seg", "det"], required=True)
    ts.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    ts.add_argument("--img-size", type=int, default=None, help="default: cls 224, seg 512, det 512")
    ts.add_argument("--batch-size", type=int, default=2)
    ts.add_argument("--num-classes", type=int, default=None, help="default: cls 1000, seg 150, det 80")
    ts.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype")
    ts.add_argument("--grad-checkpointing", action="store_true", help="in both backbones")
    ts.add_argument("--iters", type=int, default=6, help="timed rounds per model")
    ts.add_argument("--warmup", type=int, default=1)
    ts.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    da = sub.add_parser("data", help="training samples/s of a config's DataModule, per number of loader workers")
    da.add_argument("--config", required=True, help="a vitdense YAML; its data section is used")
    da.add_argument("--set", nargs="*", help="data init_args overrides, key=value (e.g. root=/data/ade)")
    da.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    da.add_argument("--batches", type=int, default=20)
    ev = sub.add_parser("eval", help="COCO AP with per-class figures: vitdense vs torchmetrics vs COCOeval directly")
    ev.add_argument("--images", type=int, default=5000)
    ev.add_argument("--detections", type=int, default=100, help="detections per image")
    ev.add_argument("--classes", type=int, default=80)
    ev.add_argument("--backends", nargs="+", default=["pycocotools", "faster_coco_eval"])
    pl = sub.add_parser(
        "plain-loop", help="a classification recipe through vitdense vs a plain PyTorch + timm loop, per seed"
    )
    pl.add_argument("--config", default=str(DEMO_CONFIG), help="a vitdense classification YAML (default: demo_cls)")
    pl.add_argument("--seeds", type=int, default=3, help="runs per side, seeds 0 .. N-1")
    pl.add_argument("--epochs", type=int, default=None, help="default: the config's max_epochs")
    pl.add_argument("--precision", default=None, help="trainer precision (default: the config's, auto resolved)")
    pl.add_argument("--set", nargs="*", help="data init_args overrides, key=value (e.g. train_size=640)")
    eo = sub.add_parser(
        "eomt-peer", help="EoMT inference: vitdense vs transformers' EomtForUniversalSegmentation, same weights, CPU"
    )
    eo.add_argument("--img-size", type=int, default=512, help="square (transformers' EoMT takes square images)")
    eo.add_argument("--batch-size", type=int, default=1)
    eo.add_argument("--embed-dim", type=int, default=384, help="ViT-S by default")
    eo.add_argument("--depth", type=int, default=12)
    eo.add_argument("--num-heads", type=int, default=6)
    eo.add_argument("--patch-size", type=int, default=16)
    eo.add_argument("--reg-tokens", type=int, default=4, help="register tokens (DINOv2 reg4)")
    eo.add_argument("--num-queries", type=int, default=100)
    eo.add_argument("--num-blocks", type=int, default=3, help="last blocks the queries join")
    eo.add_argument("--num-classes", type=int, default=150)
    eo.add_argument("--iters", type=int, default=10, help="timed rounds per model")
    eo.add_argument("--warmup", type=int, default=2)
    sh = sub.add_parser(
        "seg-heads", help="semantic segmentation: Segmenter's decoder vs EoMT, training and inference step, same ViT"
    )
    sh.add_argument("--model", default="vit_small_patch16_224", help="timm model name (random weights)")
    sh.add_argument("--depth", type=int, default=None, help="blocks of the encoder (default: the model's)")
    sh.add_argument("--img-size", type=int, default=512, help="training crop and the inference window")
    sh.add_argument("--batch-size", type=int, default=2)
    sh.add_argument("--num-classes", type=int, default=150, help="K (ADE20K's 150 by default)")
    sh.add_argument("--num-queries", type=int, default=100, help="EoMT's queries (its semantic setting)")
    sh.add_argument(
        "--precision", choices=sorted(PRECISIONS), default="fp32", help="autocast dtype (bf16 on CPU: CPU autocast)"
    )
    sh.add_argument("--steps", type=int, default=6, help="timed rounds per model")
    sh.add_argument("--warmup", type=int, default=1)
    sh.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_cold_start(sub)
    sl = sub.add_parser(
        "sliced", help="sliced inference (SAHI's) vs the whole image: AP and AR_small of small objects in large images"
    )
    sl.add_argument("--ckpt_path", "--ckpt-path", required=True, help="a detection checkpoint (the demo's: 64 px)")
    sl.add_argument("--num-images", type=int, default=12, help="generated images")
    sl.add_argument("--size", type=int, default=2048, help="their side in pixels")
    sl.add_argument("--objects", type=int, default=40, help="objects per image (12-24 px each)")
    sl.add_argument("--tile", type=int, default=64, help="tile side (the demo's training size)")
    sl.add_argument("--overlap", type=float, default=0.2, help="tile overlap ratio")
    sl.add_argument("--confidence-threshold", type=float, default=0.1, help="tiles' detections kept from this score")
    sl.add_argument("--slice-batch-size", type=int, default=64, help="tiles per forward pass")
    sl.add_argument("--seed", type=int, default=0)
    sl.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    sl.add_argument("--precision", default="32-true", help="the predictor's: 32-true, bf16-mixed or auto")
    rf = sub.add_parser(
        "rfdetr", help="LW-DETR detector: vitdense vs RF-DETR's own code (rfdetr), same size, random weights, CPU"
    )
    rf.add_argument("--size", choices=list(SIZES), default="nano", help="rfdetr's model size (its config)")
    rf.add_argument("--batch-size", type=int, default=2, help="of the training step (inference: 1)")
    rf.add_argument("--num-classes", type=int, default=80, help="class logits of both")
    rf.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="autocast dtype (bf16 on CPU: CPU autocast)"
    )
    rf.add_argument("--measure", nargs="+", choices=["train", "infer", "onnx"], default=["train", "infer", "onnx"])
    rf.add_argument("--threads", type=int, default=None, help="torch and onnxruntime threads (default: torch's)")
    rf.add_argument("--iters", type=int, default=5, help="timed rounds per model")
    rf.add_argument("--warmup", type=int, default=1)
    md = sub.add_parser(
        "multitask-demo", help="configs/demo_multitask.yaml jointly vs each task alone on the same scenes, per seed"
    )
    md.add_argument("--config", default="configs/demo_multitask.yaml")
    md.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    md.add_argument("--max-epochs", type=int, default=None, help="default: the config's")
    md.add_argument("--out", default="runs/multitask_demo", help="where each run writes its logs")
    mt = sub.add_parser(
        "multitask",
        help="one graph with K heads on one encoder vs the K single-task models: latency, parameters, memory",
    )
    mt.add_argument("--backbone", default="vit_small_patch16_224", help="timm model name (random weights)")
    mt.add_argument("--depth", type=int, default=None, help="blocks of the encoder (default: the model's; DPT reads 4)")
    mt.add_argument("--img-size", type=int, default=224)
    mt.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes (ms are per batch)")
    mt.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS), help="K of them, on one encoder")
    mt.add_argument("--runtimes", nargs="+", choices=["eager", "onnx"], default=["eager", "onnx"])
    mt.add_argument(
        "--exporter", choices=["dynamo", "torchscript"], default="dynamo",
        help="ONNX: vitdense.deploy.export's (dynamo, what `python -m vitdense export` writes) or torch's TorchScript "
        "exporter (quicker to write)",
    )  # fmt: skip
    mt.add_argument("--threads", type=int, default=None, help="torch and onnxruntime threads (default: torch's)")
    mt.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size and runtime")
    mt.add_argument("--warmup", type=int, default=1)
    add_distill_study(sub)
    args = parser.parse_args(argv)
    if args.command == "backbone":
        print_backbone(args, bench_backbone(args))
    elif args.command == "export":
        if not args.dynamic_batch and args.batch_size != 1:
            parser.error(f"export --no-dynamic-batch --batch-size {args.batch_size}: a batch-1 graph runs 1 image")
        print_export(args, bench_export(args))
    elif args.command == "export-accuracy":
        print_export_accuracy(args, *bench_export_accuracy(args))
    elif args.command == "det-heads":
        print_det_heads(args, bench_det_heads(args))
    elif args.command == "train-step":
        defaults = {"cls": (224, 1000), "seg": (512, 150), "det": (512, 80)}[args.task]
        args.img_size = args.img_size or defaults[0]
        args.num_classes = args.num_classes or defaults[1]
        print_train_step(args, bench_train_step(args))
    elif args.command == "data":
        print_data(args, bench_data(args))
    elif args.command == "plain-loop":
        print_plain_loop(args, *bench_plain_loop(args))
    elif args.command == "eval":
        print_eval(args, bench_eval(args))
    elif args.command == "eomt-peer":
        run_eomt_peer(args)
    elif args.command == "seg-heads":
        run_seg_heads(args)
    elif args.command == "cold-start":
        print_cold_start(args, bench_cold_start(args))
    elif args.command == "sliced":
        print_sliced(bench_sliced(args), args)
    elif args.command == "rfdetr":
        run_rfdetr(args)
    elif args.command == "multitask-demo":
        runs = bench_multitask_demo(args.config, args.seeds, args.out, args.max_epochs)
        print_multitask_demo(runs, args.seeds)
    elif args.command == "distill-study":
        run_study(args)
    elif args.command == "multitask":
        if len(set(args.heads)) != len(args.heads):
            parser.error(f"multitask --heads {' '.join(args.heads)}: each head once")
        run_multitask(args)
