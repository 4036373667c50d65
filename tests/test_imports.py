"""Contract types and tasks import without the dataset families and their image libraries."""

import subprocess
import sys


def loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = f"import sys; {statement}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def test_types_import_nothing_heavy():
    heavy = ("torchvision", "cv2", "albumentations", "lightning", "timm", "vitdense.data", "vitdense.tasks")
    assert loaded_after("import vitdense.types", heavy) == []


def test_tasks_do_not_import_the_dataset_families():
    assert loaded_after("import vitdense.tasks", ("vitdense.data", "cv2", "albumentations")) == []
