"""`python -m vitdense export`: onnxruntime, `torch.export.load` and OpenVINO's CPU plugin
give the eager model's numbers, normalisation included, on three input sizes per task and on
batches of 1 and 3 (the graphs are dynamic in both); the float16 ONNX file stays close."""

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from vitdense.cli import main
from vitdense.deploy.export import describe, dynamic_lines, exportable, save, trace
from vitdense.deploy.runtimes import compile_openvino, onnx_to_openvino, to_half
from vitdense.models.detection import read_detections
from vitdense.tasks import BackboneConfig, ClassificationTask, DetectionTask, LinearProbeTask, SegmentationTask

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SIZES = [(32, 32), (48, 32), (32, 64)]  # the export size, then others (whole patches)
FORMATS = {"onnx": "onnx", "pt2": "pt2", "openvino": "xml"}  # format: file suffix
HALF = ["probe", "seg"]  # also written as float16 ONNX
BACKBONE = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})
DINOV3 = BackboneConfig(name="vit_small_patch16_dinov3", model_args={"depth": 1, "embed_dim": 64, "num_heads": 2})


def tiny_models():
    from functools import partial

    from vitdense.heads import DETRHead, LWDETRHead, MultiLevelProjector
    from vitdense.losses import SetCriterion, SigmoidFocalLoss

    probe = LinearProbeTask(num_classes=3, lrs=[0.1, 0.01], backbone=BACKBONE)
    probe.best_head.fill_(1)
    detr = partial(DETRHead, hidden_dim=64, num_heads=4, dim_feedforward=128, num_queries=5, dec_layers=1)
    return {
        "cls": ClassificationTask(num_classes=3, backbone=BACKBONE).model,
        "probe": probe.model,
        "seg": SegmentationTask(num_classes=3, backbone=BACKBONE).model,
        # RoPE (DINOv3: registers, no position table), dynamic in ONNX
        "seg_dinov3": SegmentationTask(num_classes=3, backbone=DINOV3).model,
        # (with keypoints: a fourth output, each detection's [K, 3])
        "det": DetectionTask(num_classes=3, head=partial(detr, num_keypoints=3), backbone=BACKBONE).model,
        "lwdetr": DetectionTask(
            num_classes=3,
            head=partial(
                LWDETRHead,
                neck=partial(MultiLevelProjector, feature_indexes=(0,), scale_factors=(2.0, 1.0), num_blocks=1),
                hidden_dim=32,
                num_queries=4,
                num_groups=2,
                num_heads=2,
                num_cross_heads=2,
                dim_feedforward=64,
                dec_layers=1,
                num_keypoints=2,  # (RF-DETR's keypoint queries, through their own neck)
            ),
            criterion=partial(SetCriterion, class_loss=SigmoidFocalLoss()),
            selection="top_k",
            backbone=BACKBONE,
        ).model,
    }


def eager(task: str, model, images: torch.Tensor) -> list[np.ndarray]:
    """The plain model's outputs on images 0..255, normalised here (not by the wrapper)."""
    x = (images / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():
        if task == "cls":
            return [model(x).softmax(-1).numpy()]
        if task == "probe":
            return [model(x)[1].softmax(-1).numpy()]
        if task.startswith("seg"):
            return [model(x).numpy()]
        sizes = [tuple(images.shape[-2:])] * len(images)
        found = read_detections(model(x), sizes, model.selection, model.top_k)
        outputs = [found.boxes, found.scores, found.labels] + ([found.keypoints] if found.keypoints else [])
        return [torch.stack(out).numpy() for out in outputs]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("export")
    out = {}
    for task, model in tiny_models().items():
        model.eval()
        wrapper = exportable(model, MEAN, STD)
        traced = trace(wrapper, *SIZES[0])
        names = list(model.export_names) if task in ("det", "lwdetr") else ["out"]
        written = {}
        for fmt in ("onnx", "pt2"):
            # (the command's own check at another size is test_the_command_exports_a_checkpoint's: here
            # the written file runs at three sizes in the test)
            written[fmt] = save(traced, wrapper, folder / f"{task}.{fmt}", fmt, names)
        # the IR converted from that ONNX file, as `--format openvino` does (the command's own path,
        # ONNX in a temporary folder then its check, is test_the_command_exports_a_checkpoint's)
        onnx_to_openvino(folder / f"{task}.onnx", folder / f"{task}.xml")
        written["openvino"] = written["onnx"]
        if task in HALF:
            to_half(folder / f"{task}.onnx", folder / f"{task}-fp16.onnx")
        out[task] = model, folder, traced, written
    return out


@functools.cache
def runner(fmt: str, path):
    """The written file, loaded once for every size it runs at."""
    if fmt == "onnx":
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda images: session.run(None, {"images": images.numpy()})
    if fmt == "openvino":  # fp32 asked for: the CPU plugin's default is bf16 on CPUs with AVX512-BF16 or AMX
        compiled = compile_openvino(path, "f32")
        return lambda images: list(compiled(images.numpy()).values())
    module = torch.export.load(path).module()

    def run(images):
        with torch.no_grad():
            out = module(images)
        return [x.numpy() for x in (out if isinstance(out, tuple) else (out,))]

    return run


def outputs_of(fmt: str, path, images: torch.Tensor) -> list[np.ndarray]:
    return runner(fmt, path)(images)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("task", ["cls", "probe", "seg", "seg_dinov3", "det", "lwdetr"])
def test_the_exported_graph_equals_eager(exported, task, fmt):
    """One image at the export size and two more, then three different images in one batch
    (traced on 2: a batch of 1 is what torch.export treats apart, and what a graph whose
    batch was fixed to its example's refuses). The command checks a graph on one image at
    another size and otherwise exports a fixed one, saying why: tests/test_export.py's models
    all stay dynamic."""
    model, folder, _, written = exported[task]
    # every family on a plain ViT and on DINOv3 (RoPE): dynamic in every format, .pt2 included
    # (it came out fixed while the check at another size read the example's size off the graph);
    # the OpenVINO IR too, once the antialiased bicubic resample of the position table (which its
    # CPU plugin computes without antialiasing) is replaced by its exact form
    # (vitdense.deploy.runtimes)
    assert written[fmt].fixed_because is None, written[fmt].fixed_because
    assert written[fmt].batch_fixed_because is None, written[fmt].batch_fixed_because
    generator = torch.Generator().manual_seed(1)
    for batch, size in [(1, SIZES[0]), (1, SIZES[1]), (1, SIZES[2]), (3, SIZES[1])]:
        images = torch.rand(batch, 3, *size, generator=generator) * 255
        got = outputs_of(fmt, folder / f"{task}.{FORMATS[fmt]}", images)
        for mine, reference in zip(got, eager(task, model, images), strict=True):
            assert mine.shape == reference.shape, (batch, size)
            np.testing.assert_allclose(mine, reference, atol=1e-4, rtol=0, err_msg=f"{task} {fmt}: {batch} at {size}")


@pytest.mark.parametrize("task", HALF)
def test_half_onnx_is_float16_inside_and_close_to_eager(exported, task):
    """Weights in float16, `images` and the output float32; within 1% of the output's range of
    the eager model: float16 rounds each value to 2^-11 (5e-4) relative, and the error of a few
    dozen rounded ops grows to a few 1e-3 (measured: 5e-5 on probabilities, 3e-3 on logits of
    range 1.4, on these models)."""
    model, folder, _, _ = exported[task]
    half = onnx.load(str(folder / f"{task}-fp16.onnx"))
    weights = [t for t in half.graph.initializer if len(t.dims) >= 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    session = ort.InferenceSession(str(folder / f"{task}-fp16.onnx"), providers=["CPUExecutionProvider"])
    assert [i.type for i in session.get_inputs()] == ["tensor(float)"]
    images = torch.rand(2, 3, *SIZES[1], generator=torch.Generator().manual_seed(2)) * 255
    (got,) = session.run(None, {"images": images.numpy()})
    (reference,) = eager(task, model, images)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-2 * np.ptp(reference), rtol=0)


def test_half_is_for_onnx_only(trained, capsys):
    with pytest.raises(SystemExit):
        main(["export", f"--ckpt_path={trained['cls'][1]}", "--format=openvino", "--half"])
    err = capsys.readouterr().err
    assert err.startswith("vitdense: error: --half --format openvino: float16 is written for ONNX only")


class ImageByImage(torch.nn.Module):
    """A classifier whose graph runs its images one by one (a Python loop over the batch)."""

    export_names = ("probs",)

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.backbone = model, model.backbone

    def export_outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.cat([self.model(image[None]) for image in images]).softmax(-1),)


def test_a_batch_that_cannot_stay_symbolic_is_fixed_to_one_with_the_reason(exported):
    """A loop over the images needs their number: torch.export refuses the dynamic batch, and
    the graph is traced on one image, with the reason said (the sizes, fixed by choice here,
    keep theirs)."""
    wrapper = exportable(ImageByImage(exported["cls"][0]), MEAN, STD)
    traced = trace(wrapper, 32, 32, dynamic=False)
    assert traced.fixed_because == "--no-dynamic"
    assert traced.batch_fixed_because.startswith("torch.export cannot keep the batch symbolic through this model (")
    assert "batch" in traced.batch_fixed_because[60:]  # torch's words on the dimension it specialised
    said = describe(traced, ["probs"]) + dynamic_lines(traced)
    assert said[0].startswith("  input  images [1, 3, 32, 32]") and said[1] == "  output probs [1, 3]"
    assert said[-1].startswith("  the batch is FIXED to 1 image (a dynamic batch failed: torch.export cannot keep")


def test_the_command_exports_a_checkpoint(trained, tmp_path, capsys):
    """The command's path (here to OpenVINO IR: the ONNX file, converted, then checked against
    the model on one image at another size: "dynamic" is said only if that check passed),
    what it says, and the file it writes run by the runtime on a batch of another size."""
    _, ckpt = trained["cls"]
    main(["export", f"--ckpt_path={ckpt}", "--format=openvino", f"--output={tmp_path / 'cls.xml'}", "--height=48"])
    said = capsys.readouterr().out
    assert f"wrote {tmp_path / 'cls.xml'} (openvino, " in said and (tmp_path / "cls.bin").is_file()
    assert "images [batch, 3, height, width]" in said and "output probs [batch, 4]" in said
    assert "height and width are dynamic" in said and "the batch is dynamic" in said
    compiled = compile_openvino(tmp_path / "cls.xml", "f32")
    (probs,) = compiled(np.full((2, 3, 32, 80), 128, np.float32)).values()
    assert probs.shape == (2, 4) and np.abs(probs.sum(-1) - 1).max() < 1e-5


def test_a_bad_format_is_one_line(trained, capsys):
    with pytest.raises(SystemExit):
        main(["export", f"--ckpt_path={trained['cls'][1]}", "--format=tflite"])
    err = capsys.readouterr().err
    assert (
        err.startswith("vitdense: error: --format tflite: expected onnx, pt2, openvino or weights")
        and "Traceback" not in err
    )
