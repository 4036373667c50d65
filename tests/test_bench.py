"""The benchmark command runs end to end and prints both models and their ratio (no timing asserted)."""

import sys
from pathlib import Path

import pytest
import torch

from vitdense.bench import main
from vitdense.core.errors import ConfigError


def test_backbone_bench_prints_ratio(capsys):
    main(
        "backbone --model vit_tiny_patch16_224 --img-size 32 --batch-size 1 --iters 1 --warmup 0 --gemm-size 256".split()
    )
    out = capsys.readouterr().out.splitlines()
    lines = {line.split()[0]: line.split()[1:] for line in out[2:5]}
    assert set(lines) == {"vitdense", "timm", "ratio"}
    assert all(float(v) > 0 for row in lines.values() for v in row)
    # same weights, same computation: the activations saved for backward are the same size in fp32
    assert lines["vitdense"][2] == lines["timm"][2]
    # distance to the limit: ViT-Ti/16 at 32 px (4 patches + class token, 12 blocks) counts about 0.03
    # GFLOP a forward; each model's share of the GEMM peak is a percentage (noisy at this size: no upper bound)
    assert out[5].startswith("distance to the limit: 0.0")
    peak = {line.split()[0]: [float(v.rstrip("%")) for v in line.split()[1:]] for line in out[7:9]}
    assert set(peak) == {"vitdense", "timm"} and all(v > 0 for row in peak.values() for v in row)


def test_export_bench_prints_both_runtimes(capsys):
    main(
        "export --model vit_tiny_patch16_224 --depth 1 --img-size 32 --iters 1 --warmup 0 --tasks classification".split()
    )
    out = capsys.readouterr().out
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in out.splitlines()[2:]}
    assert set(rows) == {"classification"}
    assert all(v > 0 for row in rows.values() for v in row)


def test_detection_heads_bench_prints_every_head(capsys):
    """Every head, and with --keypoints each again with keypoints (its training step then
    supervises them: targets with keypoints)."""
    main(
        "det-heads --model vit_tiny_patch16_224 --img-size 64 --batch-size 1 --iters 1 --warmup 0 "
        "--num-queries 4 --num-groups 2 --keypoints 3 --heads".split()
        + [
            "detr (det_coco.yaml)",
            "detr (det_coco.yaml) +3 kpts",
            "lwdetr P4 (RF-DETR-B)",
            "lwdetr P4 (RF-DETR-B) +3 kpts",
        ]
    )
    out = capsys.readouterr().out
    rows = [line.rsplit(None, 5) for line in out.splitlines()[2:]]
    names = [
        "detr (det_coco.yaml)",
        "detr (det_coco.yaml) +3 kpts",
        "lwdetr P4 (RF-DETR-B)",
        "lwdetr P4 (RF-DETR-B) +3 kpts",
    ]
    assert [r[0] for r in rows] == names
    assert all(float(v) > 0 for r in rows for v in r[1:])
    assert float(rows[0][2]) == 1.0 and float(rows[0][5]) == 1.0  # the ratio columns are relative to the first head


def test_eval_bench_gives_every_way_the_same_ap(capsys):
    main("eval --images 20 --detections 20 --classes 5 --backends pycocotools".split())
    out = capsys.readouterr().out
    rows = [line.rsplit(None, 3) for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == [
        "COCOeval (pycocotools), no per-class",
        "torchmetrics (pycocotools)",
        "vitdense DetectionMeanAP (pycocotools)",
    ]
    aps = {float(r[3]) for r in rows}
    assert len(aps) == 1 and 0 < aps.pop() < 1  # one AP, and one with something to compare


@pytest.mark.parametrize("task", ["seg", "det"])
def test_train_step_bench_prints_the_ratio_to_the_peer_design(capsys, task):
    main(f"train-step --task {task} --model vit_tiny_patch16_224 --img-size 32 --iters 1 --warmup 0".split())
    out = capsys.readouterr().out.splitlines()
    rows = {line[:18].strip(): [float(v) for v in line[18:].split()] for line in out[2:]}
    peer = {"seg": "Segmenter design", "det": "DETR design"}[task]
    assert list(rows) == ["vitdense", peer, "ratio"]
    assert all(v > 0 for row in rows.values() for v in row)
    assert rows["ratio"][0] == pytest.approx(rows["vitdense"][0] / rows[peer][0], rel=1e-2)


def test_detr_peer_loss_is_vitdenses_criterion():
    """The DETR design the bench times computes the loss vitdense's criterion does (itself
    equal to DETR's), so the two sides do the same work."""
    import timm

    from vitdense.bench.peers import DETRPeer
    from vitdense.losses import SetCriterion
    from vitdense.types import BoxTargets, DetectionOutput

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, depth=1)
    peer = DETRPeer(vit, num_classes=3, num_queries=6, d=32, layers=1, heads=2, ffn=64)
    logits, boxes = torch.randn(2, 6, 4), torch.rand(2, 6, 4) * 0.5 + 0.2
    targets = [(torch.rand(n, 4) * 0.4 + 0.3, torch.randint(3, (n,))) for n in (2, 3)]
    expected = SetCriterion(num_classes=3, aux_loss=False)(
        DetectionOutput(logits, boxes), [BoxTargets(b, labels) for b, labels in targets]
    ).total
    assert peer.loss(logits, boxes, targets, num_boxes=5).item() == pytest.approx(expected.item(), rel=1e-5)


def test_data_bench_times_a_configs_pipeline(capsys):
    config = Path(__file__).parents[1] / "configs" / "demo_cls.yaml"
    main(["data", "--config", str(config), "--set", "train_size=512", "--workers", "0", "--batches", "1"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["0"] and float(rows[0][1]) > 0


def tiny_demo_cls(tmp_path: Path) -> Path:
    """configs/demo_cls.yaml at a toy size: one block, 32 px, two steps per epoch."""
    import yaml

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "demo_cls.yaml").read_text())
    config["model"]["init_args"]["backbone"]["model_args"] = {"depth": 1}
    config["model"]["init_args"]["lr_scheduler"]["init_args"]["warmup_steps"] = 1
    config["data"]["init_args"].update(img_size=32, train_size=64, val_size=16, loader={"batch_size": 32})
    path = tmp_path / "tiny_cls.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_plain_loop_bench_prints_both_curves(capsys, tmp_path):
    main(["plain-loop", "--config", str(tiny_demo_cls(tmp_path)), "--seeds", "1", "--epochs", "2"])
    out = capsys.readouterr().out.splitlines()
    assert "AdamW" in out[0] and "2 epochs" in out[0]
    rows = {line[:30].strip(): [float(v) for v in line[30:].split()] for line in out[2:]}
    assert list(rows) == ["seed 0 vitdense", "seed 0 plain", "mean vitdense", "mean plain"]
    for row in rows.values():  # two epochs of top-1 (%), then wall seconds
        assert len(row) == 3 and all(0 <= a <= 100 for a in row[:2]) and row[2] > 0
    assert rows["mean plain"] == rows["seed 0 plain"]


def test_plain_loop_model_is_vitdenses_model():
    """The plain loop's timm ViT computes what vitdense's task computes with the same weights:
    the two sides differ in the loop and the model code only."""
    import yaml

    from vitdense.bench.plain_loop import DEMO_CONFIG, Recipe, plain_model
    from vitdense.heads import ClassificationHead
    from vitdense.tasks import BackboneConfig, ClassificationTask

    recipe = Recipe.of(yaml.safe_load(DEMO_CONFIG.read_text()), epochs=1, precision="32-true")
    task = ClassificationTask(4, head=ClassificationHead, backbone=BackboneConfig(img_size=32, model_args={"depth": 1}))
    task.head.pool = recipe.pool
    peer = plain_model(Recipe(**{**vars(recipe), "model_args": {"depth": 1}}), 4, 32)
    peer.load_state_dict(
        {k.removeprefix("backbone.").replace("head.fc.", "head."): v for k, v in task.model.state_dict().items()}
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(task.eval()(x), peer.eval()(x))


def test_eomt_peer_bench_without_transformers_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it fails, installed or not
    with pytest.raises(SystemExit) as exit_info:
        main(["eomt-peer"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "transformers is not installed" in err and "pip install" in err and "Traceback" not in err


@pytest.fixture
def one_thread():
    """torch on one thread: at toy sizes the steps are thousands of tiny ops, and with two threads each
    waits for the other at every op, seconds in all when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_seg_heads_bench_prints_both_heads_and_their_ratio(capsys, one_thread):
    main(
        "seg-heads --model vit_tiny_patch16_224 --depth 2 --img-size 32 --batch-size 1 --num-classes 10 "
        "--steps 1 --warmup 0".split()
    )
    out = capsys.readouterr().out.splitlines()
    assert "2 blocks" in out[0] and "last 2 blocks" in out[0] and "fp32" in out[0] and "(1 threads" in out[0]
    train, inference = out[2:5], out[6:10]
    assert out[1].startswith("training step") and out[5].startswith("inference")

    def rows(lines):
        return {line[:52].strip(): line[52:].split() for line in lines}

    train, inference = rows(train), rows(inference)
    assert list(train) == ["Segmenter", "EoMT", "EoMT / Segmenter"]
    assert list(inference) == ["Segmenter", "EoMT", "EoMT, masks on", "EoMT / Segmenter"]
    for table in (train, inference):  # ms/step, img/s, then the ratios of both
        ms, img_s = (float(v) for v in table["EoMT / Segmenter"][:2])
        assert ms == pytest.approx(float(table["EoMT"][0]) / float(table["Segmenter"][0]), rel=0.02)
        assert img_s == pytest.approx(1 / ms, rel=0.02)
    # memory on the CPU: the activations saved for backward in training, none measured in inference
    assert all(float(v) > 0 for row in train.values() for v in row)
    assert all(row[2] == "-" for row in inference.values())


def test_seg_heads_label_maps_have_several_regions_per_image():
    from vitdense.bench.seg_heads import blocky_label_maps

    maps = blocky_label_maps(3, 50, 150, torch.Generator().manual_seed(0))
    assert maps.shape == (3, 50, 50) and maps.dtype == torch.int64
    per_image = [len(torch.unique(m)) for m in maps]
    assert all(3 <= n <= 8 for n in per_image)
    assert len(torch.unique(maps)) > max(per_image)  # images draw their own classes


def test_seg_heads_bench_warns_of_emulated_bf16(monkeypatch):
    import argparse

    from vitdense.bench import seg_heads

    args = argparse.Namespace(precision="bf16", device="cpu")
    monkeypatch.setattr(seg_heads, "native_bf16", lambda: False)
    assert "emulated" in seg_heads.bf16_warning(args)
    assert seg_heads.bf16_warning(argparse.Namespace(precision="fp32", device="cpu")) is None
    monkeypatch.setattr(seg_heads, "native_bf16", lambda: True)
    assert seg_heads.bf16_warning(args) is None


def test_rfdetr_bench_without_rfdetr_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rfdetr", None)  # importing it fails, installed or not
    with pytest.raises(SystemExit) as exit_info:
        main(["rfdetr", "--size", "base"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "rfdetr is not installed" in err and "pip install rfdetr" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cold_start_prints_the_load_as_a_multiple_of_importing_torch_and_timm(capsys, monkeypatch, tmp_path):
    """Each round times `import torch, timm` in a fresh Python beside `vitdense.load`; the
    table ends with their ratio, per round, and names the CPU (here the processes are stand-ins)."""
    from vitdense.bench import cold_start
    from vitdense.bench.common import cpu_kind

    rounds = iter([(4.0, 5.0), (3.0, 4.2), (3.5, 3.5)])  # (baseline, load) of each round

    def load(ckpt, image, precision):
        _, total = current.pop()
        return total, [0.01, total - 0.1, 0.05, 0.01]  # (the phases: import, load, two predictions)

    current = []
    monkeypatch.setattr(cold_start, "time_python_startup", lambda: 0.04)
    monkeypatch.setattr(cold_start, "time_baseline", lambda: current.append(next(rounds)) or current[-1][0])
    monkeypatch.setattr(cold_start, "time_load", load)
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    main(["cold-start", f"--ckpt_path={ckpt}", "--modes", "load", "--rounds", "3"])
    out = capsys.readouterr().out.splitlines()
    assert cpu_kind() in out[0]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in out[3:]}
    assert rows["baseline: spawn -> import torch, timm"] == ["4.00", "3.25 |"]
    assert rows["load: spawn -> first prediction / baseline (import torch, timm)"] == ["1.25x", "1.20x |"]


def test_multitask_bench_prints_the_ratio_the_parameters_and_equal_outputs(capsys, one_thread):
    """One graph with three heads against the three single-task models on the same encoder (eager;
    onnxruntime's path shares the checks): the multi-task model holds the encoder once (the singles K times, exactly), its
    outputs are the singles' (0.0 in eager fp32), and each row carries (b) / (a)."""
    import re

    from vitdense.bench.common import cpu_kind

    main(
        "multitask --backbone vit_tiny_patch16_224 --depth 4 --img-size 32 --batch 1 --repeats 1 --warmup 0 "
        "--runtimes eager".split()
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("multitask: det + seg + depth on one vit_tiny_patch16_224")
    assert out[1].startswith(f"CPU: {cpu_kind()}, ") and "bf16" in out[1] and f"torch {torch.__version__}" in out[1]
    assert "; 1 threads (torch)" in out[1]  # (the one_thread fixture's)

    def count(label: str) -> int:
        (line,) = [line for line in out if line.startswith(f"  {label}")]
        return int(re.search(r"\s([\d,]+)\s+[\d.]+$", line)[1].replace(",", ""))

    encoder, multi, singles = count("encoder"), count("multi-task model"), count("3 single-task models")
    assert multi < singles and singles - multi == 2 * encoder
    assert "  saved: 2 x the encoder's parameters (K - 1 = 2)" in out
    assert "encoder passes per forward: 1 (multi-task), 3 (3 single-task models)" in out
    assert "  eager   batch 1   0.0" in out  # (onnxruntime's rows: the command's own run, not timed here)
    memory = [line for line in out if line.startswith(("  (a)", "  (b)", "  (c)"))]
    assert len(memory) == 3 and all(line.endswith(" MB") for line in memory)
    cell = r"([\d.]+) \(([\d.]+)\)"
    rows = {}
    for line in out:
        if match := re.fullmatch(rf"(eager|onnx)\s+1\s+{cell}\s+{cell}\s+{cell}\s+([\d.]+)\s+.*", line):
            rows[match[1]] = [float(v) for v in match.groups()[1:]]
    assert list(rows) == ["eager"]
    for a, _, b, _, c, _, ratio in rows.values():
        assert a > 0 and b > 0 and c > 0
        assert ratio == pytest.approx(b / a, rel=0.05)


def test_multitask_bench_without_onnxruntime_says_how_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # importing it fails, installed or not
    with pytest.raises(SystemExit) as exit_info:
        main(["multitask"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "onnxruntime, which is not installed" in err and "pip install" in err and "--runtimes eager" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_multitask_bench_prints_no_timing_when_the_outputs_differ(capsys, monkeypatch):
    from vitdense.bench import multitask

    def differing(args):
        differences = {("eager", 1): 0.0, ("onnx", 1): 3e-4}
        params = {"encoder": 10, multitask.MULTI: 25, multitask.SINGLES: 45}
        memory = dict.fromkeys((multitask.MULTI, multitask.SINGLES, multitask.ENCODER), 1.0)
        result = multitask.MultitaskResult(params, memory, (1, 3), differences, {}, {}, (0.0, 0.0))
        result.refused = "the multi-task outputs differ from the single models' (onnx batch 1: 0.0003)"
        return result

    monkeypatch.setattr(multitask, "bench_multitask", differing)
    with pytest.raises(SystemExit) as exit_info:
        main("multitask --batch 1".split())
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert "  onnx    batch 1   0.0003" in out and "refused: the multi-task outputs differ" in out
    assert "latency" not in out and "(b)/(a)" not in out


def test_multitask_demo_runs_each_task_alone_as_the_command_line_takes_it(capsys):
    """Each task of configs/demo_multitask.yaml alone: its own settings, the scenes' labels of
    its kind, nothing the command line links from the data given twice (parsed, not trained)."""
    import yaml

    from vitdense.bench.multitask_demo import alone_config
    from vitdense.cli import main as cli

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "demo_multitask.yaml").read_text())
    for name, kind in config["data"]["init_args"]["labels"].items():
        alone = alone_config(config, name)
        assert alone["data"]["init_args"]["kind"] == kind and "num_classes" not in alone["model"]["init_args"]
        path = Path(f"{name}_alone.yaml")
        path.write_text(yaml.safe_dump(alone))
        try:
            with pytest.raises(SystemExit) as done:
                cli(["fit", "--config", str(path), "--print_config"])
        finally:
            path.unlink()
        assert done.value.code in (None, 0)
        printed = yaml.safe_load(capsys.readouterr().out)
        assert printed["data"]["init_args"]["kind"] == kind
        assert printed["model"]["class_path"] == config["model"]["init_args"]["tasks"][name]["class_path"]


def test_distill_study_fits_every_run_at_equal_cpu_time_and_prints_the_table(capsys, tmp_path):
    """The study end to end on generated Fashion-MNIST files at the smallest sizes: every run
    fitted through the CLI from the config it wrote, MAE given the distillation's CPU time, the
    table printed; a rerun reads results.json and fits nothing."""
    import json

    import yaml

    from tests.data.test_fashion_mnist import write_fashion_mnist

    write_fashion_mnist(tmp_path / "fm")
    tiny = '{"patch_size": 7, "depth": 1, "embed_dim": 16, "num_heads": 2}'
    argv = [
        "distill-study", "--root", str(tmp_path / "fm"), "--out", str(tmp_path / "out"), "--seeds", "0",
        "--batch-size", "6", "--teacher-epochs", "1", "--pretrain-steps", "3", "--calibration-steps", "5",
        "--probe-epochs", "1", "--finetune-epochs", "1", "--teacher-args", tiny, "--student-args", tiny,
    ]  # fmt: skip
    main(argv)
    first = capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {"teacher", "probe_teacher", "mae_calibration", "distill_s0", "mae_s0", "deit_s0"}
    runs |= {f"{kind}_{init}_s0" for kind in ("probe", "finetune") for init in ("random", "mae", "distill")}
    assert runs <= set(results)
    assert results["distill_s0"]["steps"] == 3
    cpu_per_step = results["mae_calibration"]["cpu_per_step"]
    assert cpu_per_step > 0 and results["mae_s0"]["steps"] == max(
        round(results["distill_s0"]["cpu_s"] / cpu_per_step), 1
    )
    assert all(0 <= results[name]["acc1"] <= 100 for name in runs if name.startswith(("probe", "finetune", "deit")))
    config = yaml.safe_load((tmp_path / "out" / "distill_s0" / "config.yaml").read_text())
    assert config["model"]["init_args"]["teacher"]["checkpoint"] == results["teacher"]["checkpoint"]
    deit = yaml.safe_load((tmp_path / "out" / "deit_s0" / "config.yaml").read_text())["model"]["init_args"]
    assert deit["distillation"] == "hard" and deit["backbone"]["name"] == "deit_tiny_distilled_patch16_224"
    finetune = yaml.safe_load((tmp_path / "out" / "finetune_mae_s0" / "config.yaml").read_text())
    assert finetune["model"]["init_args"]["backbone"]["checkpoint"] == results["mae_s0"]["checkpoint"]
    rows = ("teacher ViT", "random initialisation", "MAE", "distillation", "DeiT hard distillation")
    assert all(row in first for row in rows)
    main(argv)
    again = capsys.readouterr().out
    assert "# distill-study: teacher\n" not in again and again.splitlines()[-4:] == first.splitlines()[-4:]
    with pytest.raises(ConfigError, match="other settings.*teacher_epochs"):
        main([*argv, "--teacher-epochs", "2"])  # (the last value wins)
