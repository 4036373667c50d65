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
#: modules that may not import the layers above them: {module prefix: forbidden prefixes}
BELOW = {
    "vitdense.heads": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.backbone": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.losses": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.types": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.draw": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.checkpoint": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.callbacks": ("vitdense.tasks", "vitdense.cli", "vitdense.viz", "vitdense.trainer"),
    "vitdense.tasks": ("vitdense.cli", "vitdense.viz", "vitdense.trainer"),
}


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
            under = lambda name, prefix: name == prefix or name.startswith(prefix + ".")  # noqa: E731
            # the two command lines: `python -m vitdense`, and the benchmarks, which run recipes through it as users do
            if (
                under(imported, "vitdense.cli")
                and module != "vitdense.__main__"
                and not under(module, "vitdense.bench")
            ):
                arrows.append(f"{module} -> {imported}")
            for low, forbidden in BELOW.items():
                if under(module, low) and any(under(imported, f) for f in forbidden):
                    arrows.append(f"{module} -> {imported}")
    return sorted(set(arrows))


def test_imports_run_down_the_house_only():
    """heads, backbone, losses and types never import tasks, cli or viz; tasks never import
    cli or viz; only `python -m vitdense` imports cli, and the benchmarks (`python -m
    vitdense.bench`), which run recipes through it (the layers, as README's layout draws them)."""
    assert up_arrows() == []
