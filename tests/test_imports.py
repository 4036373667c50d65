"""Contract types and tasks import without the dataset families and their image libraries,
and no module imports one above it."""

import ast
import subprocess
import sys
from pathlib import Path


def loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import sys; {statement}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def test_types_import_nothing_heavy():
    heavy = ("torchvision", "cv2", "albumentations", "lightning", "timm", "vitdense.data", "vitdense.tasks")
    assert loaded_after("import vitdense.types", heavy) == []


def test_tasks_do_not_import_the_dataset_families():
    assert loaded_after("import vitdense.tasks", ("vitdense.data", "cv2", "albumentations")) == []


PACKAGE = Path(__file__).parents[1] / "vitdense"
#: the house, lowest floor first (README "Layout"): a module imports its own package and the
#: floors below, never a package beside it on its floor nor one above. Each family has a
#: module of its name in the layers it needs (types/depth.py, metrics/depth.py, ...).
FLOORS = (
    ("core",),
    ("types",),
    ("backbone",),
    ("heads", "losses", "metrics", "results", "pretrain"),
    ("models", "deploy"),
    ("data", "training"),
    ("tasks",),
    ("viz",),
    ("trainer",),
    ("cli_help",),
    ("cli",),
    ("__init__", "__main__"),
    ("bench",),
)
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def room(module: str) -> str:
    """The top-level package or module of vitdense that `module` lives in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_module(name: str) -> bool:
    """`name` is a module or package of vitdense (`from vitdense import cli` imports one)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def imports_of(path: Path) -> set[str]:
    """Every vitdense module `path` imports, at the top or inside a function (read, not run)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importing package
                base = module.rsplit(".", node.level - (path.name == "__init__.py"))[0]
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            found |= {f"{name}.{alias.name}" for alias in node.names if is_module(f"{name}.{alias.name}")}
    return {name for name in found if name.split(".")[0] == "vitdense"}


def up_arrows() -> list[str]:
    arrows = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for imported in sorted(imports_of(path)):
            here, there = room(module), room(imported)
            if here != there and FLOOR[there] >= FLOOR[here]:
                arrows.append(f"{module} -> {imported}")
    return sorted(set(arrows))


def test_every_room_has_a_floor():
    rooms = {
        p.stem if p.suffix else p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    assert rooms == set(FLOOR)


def test_imports_run_down_the_house_only():
    """Every import runs down the floors of `FLOORS` (or stays in its own package): the
    plumbing imports nothing of vitdense, the contract types only the plumbing, no model
    part imports data, training or a task, the deployment path no trainer, and only
    `python -m vitdense` and the benchmarks import the command line."""
    assert up_arrows() == []


def test_moved_module_paths_import_the_new_modules_with_a_warning():
    """Every module path of before the layer-first layout still imports (for one release),
    as the new module itself, and says where it went."""
    import importlib
    import warnings

    from vitdense.core.moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        sys.modules.pop(old, None)


def test_names_of_modules_that_became_packages_still_resolve():
    import warnings

    import pytest

    from vitdense.data.synthetic.classification import SyntheticClassificationDataModule
    from vitdense.data.transforms.common import normalization
    from vitdense.heads.factory import locate

    with pytest.warns(DeprecationWarning, match="vitdense.data.synthetic.classification"):
        assert locate("vitdense.data.synthetic.SyntheticClassificationDataModule") is SyntheticClassificationDataModule
    with pytest.warns(DeprecationWarning, match="vitdense.data.transforms.common"):
        assert locate("vitdense.data.transforms.normalization") is normalization
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError):
            locate("vitdense.data.synthetic.NoSuchName")


def test_a_checkpoint_naming_old_module_paths_loads(fitted_from_python, tmp_path):
    """A checkpoint written before the layout changed names its DataModule by the old path
    (and, older still, records no preprocessing, so that DataModule is rebuilt from it):
    `vitdense.load` gives the same answer as from the checkpoint as written today."""
    import numpy as np
    import pytest
    import torch

    import vitdense

    _, ckpt = fitted_from_python
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    data = state["datamodule_hyper_parameters"]
    assert data["_class_path"] == "vitdense.data.synthetic.classification.SyntheticClassificationDataModule"
    data["_class_path"] = "vitdense.data.synthetic.SyntheticClassificationDataModule"
    state.pop("vitdense_inference")
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    image = np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)
    expected = vitdense.load(ckpt)(image)
    with pytest.warns(DeprecationWarning, match="vitdense.data.synthetic.classification"):
        got = vitdense.load(old)(image)
    assert got.names == expected.names
    np.testing.assert_array_equal(got.classes, expected.classes)
    np.testing.assert_allclose(got.probs, expected.probs, rtol=0, atol=1e-6)
