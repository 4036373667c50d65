"""Shared test setup: everything offline, deterministic."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import re  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

CONFIGS = Path(__file__).parents[1] / "configs"

#: The suite's seconds per family on the CI machine (2 cores, AMD EPYC): setup + call + teardown
#: of the family's tests, printed after every run by `pytest_terminal_summary` below, marked when
#: over, never failed. `bash .ci/run` has 720 s, about 125 of them for the venv, pip, ruff and the
#: floors' run, so the suite has 595: these budgets (560) and the reserve (35). Set from a run on an
#: idle 2-core AMD EPYC (504 s in all), with ~10 % above each family's figure. A family over
#: budget makes its slowest tests smaller or moves them onto `tiny_runs`' shared checkpoints; a
#: new family adds its line here (and its patterns below), taking from the reserve.
BUDGETS = {
    "backbone": 25,
    "classification": 15,
    "segmentation": 25,
    "universal": 40,  # EoMT: semantic, instance, panoptic
    "detection": 35,
    "depth": 23,  # (20.1 and 22.5 s in CI runs of 2026-11-28; 7 went to the keypoints, 10 to distillation)
    "pretrain": 15,
    "deployment": 160,  # predictor, export, serve, slicing, checkpoints
    "data": 25,  # (21 s in the CI run of 2026-11-27: 10 from the reserve)
    "training": 100,  # what every family trains through: BaseTask, resuming, DDP, several nodes
    "other": 65,  # the CLI, README, imports, benchmarks, figures
    "multitask": 25,  # several tasks on one encoder, its deployment, co-annotated data, its two benchmarks
    "keypoints": 21,  # keypoint heads and queries, loss, OKS AP, keypoint data, the pose demo and recipes (20.2 s in CI, 2026-11-28)
    "distillation": 18,  # feature distillation pre-training, DeiT's distillation token, the distill-study bench's ~13 tiny fits (13.5 s in CI, 2026-11-28)
}
#: seconds kept for what is still to come
RESERVE = 3

#: which family a test counts against: patterns searched in its id ("tests/path.py::name[params]"),
#: the first family with a match taking it. Files of one family are named by path; the shared
#: ones (tests/tasks/, heads/, losses/, test_configs.py, viz/, …) go by the words of their
#: names and parameters; what nothing claims is "other".
FAMILY_PATTERNS: list[tuple[str, str]] = [
    ("multitask", r"multitask"),
    ("keypoints", r"keypoint|pose"),
    ("distillation", r"distill|deit"),
    ("deployment", r"tests/test_without_lightning\.py"),
    ("deployment", r"tests/test_(export|serve|predictor|slicing|sliding_windows|preprocess|models|checkpoints)\.py"),
    ("deployment", r"tests/test_(untrusted_files|task_contract)\.py"),
    ("data", r"^tests/data(_scripts)?/|tests/test_bad_data\.py"),
    ("backbone", r"^tests/backbone/"),
    ("training", r"tests/(tasks/)?test_(base|resume|distributed|multinode|optim|callbacks|precision)\.py"),
    ("other", r"tests/test_(cli|imports|packaging|readme|types|new_task|bench)\.py"),
    ("universal", r"eomt|panoptic|universal|mask_criterion|mask_inference|instance"),
    ("depth", r"depth|dpt|nyu|kitti"),
    ("pretrain", r"^tests/pretrain/|pretrain(?!ed)|(^|[^a-z])(mae|mpp)([^a-z]|$)"),
    ("detection", r"det(?!ermin)|detr|yolo|coco|box|deformable|pyramid|class_losses"),
    ("segmentation", r"seg|ade20k|pixel_losses"),
    ("classification", r"cls|classif|linear_probe|linprobe|probe|imagenet|cifar|mixup"),
]


def family_of(nodeid: str) -> str:
    """The family whose budget a test's seconds count against (`FAMILY_PATTERNS`)."""
    return next((family for family, pattern in FAMILY_PATTERNS if re.search(pattern, nodeid)), "other")


@pytest.hookimpl(trylast=True)  # after the slowest durations (pyproject.toml: --durations=15)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Seconds per family against its budget, after the slowest durations (printed, never failed)."""
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, set] = defaultdict(set)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown") and hasattr(report, "duration"):
                family = family_of(report.nodeid)
                seconds[family] += report.duration
                counts[family].add(report.nodeid)
    if not seconds:
        return
    terminalreporter.write_sep("=", "seconds per family (budgets: tests/conftest.py, BUDGETS)")
    for family, budget in BUDGETS.items():
        if family in seconds:
            over = "  OVER BUDGET" if seconds[family] > budget else ""
            line = f"{family:<15} {seconds[family]:7.1f} s of {budget:4.0f} s  ({len(counts[family])} tests){over}"
            terminalreporter.write_line(line)
    total, budgets = sum(seconds.values()), sum(BUDGETS.values())
    terminalreporter.write_line(f"{'total':<15} {total:7.1f} s of {budgets:4.0f} s  (+ {RESERVE:.0f} s in reserve)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def sync_as_two_processes(monkeypatch):
    """`sync(first, second)`: `first`'s list states gathered whole (`WholeListGather`) as on two
    processes, the other holding `second`'s (the gather simulated: it returns both shards)."""

    def sync(first, second) -> None:
        shards = iter([list(getattr(second, attr)) for attr in second._reductions])
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(
            torch.distributed,
            "all_gather_object",
            lambda out, obj, group=None: out.__setitem__(slice(None), [obj, next(shards)]),
        )
        first._sync_dist()

    return sync


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """The session's one cache of trained tiny models, every family (tests/tiny_runs.py):
    `tiny_runs[name]` is (the run's folder, its checkpoint), `tiny_runs.cli(name)` its
    LightningCLI; each fitted once, the first time a fixture asks for it. Ask from a fixture,
    not from a test's body: a fit inside the body would run under the test's monkeypatches
    and print into its capsys."""
    from tests.tiny_runs import TinyRuns

    return TinyRuns(tmp_path_factory.mktemp)


@pytest.fixture(scope="session")
def trained(tiny_runs):
    """The three first demos, each fitted for a step or two through the CLI (shared by the
    tests of checkpoints, predict, load, export, serve and `vitdense.viz`): {task: (its
    folder, its last.ckpt)}."""
    return {task: tiny_runs[task] for task in ("cls", "seg", "det")}


@pytest.fixture(scope="session")
def fitted_from_python(tmp_path_factory):
    """A tiny classifier fitted for one step from Python, `lightning.Trainer(...).fit(task,
    datamodule)` without the CLI, as a user's script trains one; (the task, the checkpoint
    Lightning's default ModelCheckpoint wrote)."""
    import lightning as L

    from vitdense.data import LoaderConfig, SyntheticClassificationDataModule
    from vitdense.tasks import BackboneConfig, ClassificationTask

    folder = tmp_path_factory.mktemp("python_fit")
    data = SyntheticClassificationDataModule(img_size=32, train_size=8, val_size=4, loader=LoaderConfig(batch_size=4))
    backbone = BackboneConfig(name="vit_tiny_patch16_224", img_size=32, model_args={"depth": 1})
    task = ClassificationTask(num_classes=data.num_classes, class_names=data.class_names, backbone=backbone)
    trainer = L.Trainer(
        max_steps=1,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    trainer.fit(task, datamodule=data)
    (ckpt,) = (folder / "checkpoints").glob("*.ckpt")
    return task.eval(), ckpt


@pytest.fixture(scope="session")
def older_python_checkpoint(fitted_from_python, tmp_path_factory):
    """`fitted_from_python`'s checkpoint as vitdense wrote it before tasks named their classes
    in it: no `_class_path` (nor LightningCLI's instantiator), the BackboneConfig pickled."""
    from vitdense.tasks import BackboneConfig

    _, ckpt = fitted_from_python
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        del state[key]["_class_path"], state[key]["_instantiator"]
    state["hyper_parameters"]["backbone"] = BackboneConfig(**state["hyper_parameters"]["backbone"])
    older = tmp_path_factory.mktemp("older") / "older.ckpt"
    torch.save(state, older)
    return older
