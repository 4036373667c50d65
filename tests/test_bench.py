"""The benchmark command runs end to end and prints both models and their ratio (no timing asserted)."""

from vitdense.bench import main


def test_backbone_bench_prints_ratio(capsys):
    main("backbone --model vit_tiny_patch16_224 --img-size 32 --batch-size 1 --iters 1 --warmup 0".split())
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert set(lines) == {"vitdense", "timm", "ratio"}
    assert all(float(v) > 0 for row in lines.values() for v in row)
    # same weights, same computation: the activations saved for backward are the same size in fp32
    assert lines["vitdense"][2] == lines["timm"][2]


def test_export_bench_prints_both_runtimes(capsys):
    main("export --model vit_tiny_patch16_224 --img-size 32 --iters 1 --warmup 0 --tasks classification".split())
    out = capsys.readouterr().out
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in out.splitlines()[2:]}
    assert set(rows) == {"classification"}
    assert all(v > 0 for row in rows.values() for v in row)


def test_detection_heads_bench_prints_every_head(capsys):
    main(
        "det-heads --model vit_tiny_patch16_224 --img-size 64 --batch-size 1 --iters 1 --warmup 0 "
        "--num-queries 4 --num-groups 2".split()
    )
    out = capsys.readouterr().out
    rows = [line.rsplit(None, 3) for line in out.splitlines()[2:]]
    names = ["detr (det_coco.yaml)", "detr+groups+boxrpb", "lwdetr P4 (RF-DETR-B)", "lwdetr P3-P5"]
    assert [r[0] for r in rows] == names
    assert all(float(v) > 0 for r in rows for v in r[1:])
    assert float(rows[0][2]) == 1.0  # the ratio column is relative to the first head


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
