"""`python -m vitdense export --format openvino` and `--half`: OpenVINO's CPU plugin and
onnxruntime on the float16 file give the eager model's numbers (tests/test_export.py's tiny
models and reference), and the accuracy bench reads a checkpoint's own validation split."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.test_export import MEAN, STD, eager, tiny_models
from vitdense.cli import main
from vitdense.export import check_dynamic, exportable, save, trace
from vitdense.export_runtimes import compile_openvino, onnx_to_openvino, to_half

SIZES = [(32, 32), (48, 32)]  # the export size, then another (dynamic graphs)
TASKS = ["cls", "probe", "seg", "det", "lwdetr"]
HALF = ["probe", "seg"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each tiny model exported once: the classifier through the command's path (`save` to
    IR, then its check at another size), the others to ONNX converted to IR, and (HALF) to
    float16 ONNX."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("runtimes")
    models = tiny_models()
    out = {}
    for task in TASKS:
        model = models[task].eval()
        wrapper = exportable(model, MEAN, STD)
        names = ["boxes", "scores", "labels"] if task in ("det", "lwdetr") else ["out"]
        traced = trace(wrapper, *SIZES[0])
        if task == "cls":
            written = save(traced, wrapper, folder / "cls.xml", "openvino", names)
            written = check_dynamic(written, wrapper, folder / "cls.xml", "openvino", names)
        else:
            written = save(traced, wrapper, folder / f"{task}.onnx", "onnx", names)
            onnx_to_openvino(folder / f"{task}.onnx", folder / f"{task}.xml")
        assert written.fixed_because is None, written.fixed_because
        if task in HALF:
            to_half(folder / f"{task}.onnx", folder / f"{task}-fp16.onnx")
        out[task] = model, folder
    return out


@pytest.mark.parametrize("task", TASKS)
def test_openvino_equals_eager(exported, task):
    """fp32 inference (vitdense's runner asks for it; the CPU plugin's default is bf16 on
    AVX512-BF16 CPUs) at the export size and at another grid, where the position table is
    resampled (bicubic with antialiasing, which OpenVINO's own Interpolate gets wrong)."""
    model, folder = exported[task]
    compiled = compile_openvino(folder / f"{task}.xml", "f32")
    generator = torch.Generator().manual_seed(1)
    for size in SIZES:
        images = torch.rand(1, 3, *size, generator=generator) * 255
        got = list(compiled(images.numpy()).values())
        for mine, reference in zip(got, eager(task, model, images), strict=True):
            assert mine.shape == reference.shape, size
            np.testing.assert_allclose(mine, reference, atol=1e-4, rtol=0, err_msg=f"{task} at {size}")


@pytest.mark.parametrize("task", HALF)
def test_half_onnx_is_float16_inside_and_close_to_eager(exported, task):
    """Weights in float16, `images` and the output float32; within 1% of the output's range of
    the eager model: float16 rounds each value to 2^-11 (5e-4) relative, and the error of a few
    dozen rounded ops grows to a few 1e-3 (measured: 5e-5 on probabilities, 3e-3 on logits of
    range 1.4, on these models)."""
    model, folder = exported[task]
    half = onnx.load(str(folder / f"{task}-fp16.onnx"))
    weights = [t for t in half.graph.initializer if len(t.dims) >= 2]
    assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)
    session = ort.InferenceSession(str(folder / f"{task}-fp16.onnx"), providers=["CPUExecutionProvider"])
    assert [i.type for i in session.get_inputs()] == ["tensor(float)"]
    images = torch.rand(1, 3, *SIZES[1], generator=torch.Generator().manual_seed(2)) * 255
    (got,) = session.run(None, {"images": images.numpy()})
    (reference,) = eager(task, model, images)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-2 * np.ptp(reference), rtol=0)


def test_half_is_for_onnx_only(trained, capsys):
    with pytest.raises(SystemExit):
        main(["export", f"--ckpt_path={trained['cls'][1]}", "--format=openvino", "--half"])
    err = capsys.readouterr().err
    assert err.startswith("vitdense: error: --half --format openvino: float16 is written for ONNX only")


def test_the_accuracy_bench_reads_the_checkpoints_validation_split(trained, monkeypatch):
    """A trained segmentation checkpoint (the hybrid demo: its ONNX is the TorchScript
    fallback's, fixed) on its own validation images: the fp32 runtimes give eager's mIoU and
    outputs; the float16 file runs (onnxruntime's session at ORT_ENABLE_ALL crashes on it)
    and differs, within float16's few 1e-3 relative of these O(1) logits."""
    import argparse

    from vitdense.bench.export_accuracy import bench_export_accuracy

    folder, ckpt = trained["seg"]
    monkeypatch.chdir(folder)  # the data's root is relative to where it was fitted
    args = argparse.Namespace(ckpt_path=str(ckpt), formats=["onnx", "onnx-fp16", "openvino"], limit=2)
    family, results = bench_export_accuracy(args)
    assert family == "segmentation" and list(results) == ["eager", "onnx", "onnx-fp16", "openvino"]
    for name in ("onnx", "openvino"):
        assert results[name].metrics == pytest.approx(results["eager"].metrics, abs=1e-6), name
        assert results[name].max_diff["logits"] < 1e-4, name
    assert 0 < results["onnx-fp16"].max_diff["logits"] < 0.05
    assert len(results["eager"].ms) == 2
