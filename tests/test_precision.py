"""precision: auto — bf16 autocast only where the hardware computes bf16."""

import logging
import os
import subprocess
import sys

import pytest

import vitdense.core.precision as precision
from vitdense.core.precision import Bf16Support, cpu_flags, resolve_precision
from vitdense.trainer import Trainer

NATIVE = Bf16Support(True, "this CPU computes bf16 natively: a bf16 matmul ran 2.0x faster than fp32")
EMULATED = Bf16Support(False, "this CPU has no native bf16: a bf16 matmul ran 60x slower than fp32")


@pytest.fixture
def cpu_support(monkeypatch):
    def use(support: Bf16Support) -> None:
        monkeypatch.setattr(precision, "cpu_bf16_support", lambda: support)

    return use


@pytest.mark.parametrize(("support", "expected"), [(NATIVE, "bf16-mixed"), (EMULATED, "32-true")])
def test_auto_follows_the_cpu(cpu_support, support, expected):
    cpu_support(support)
    resolved = resolve_precision("auto", "cpu")
    assert resolved.precision == expected and resolved.warning is None
    assert resolved.note == f"precision: {expected} ({support.reason})"


def test_explicit_bf16_on_an_emulating_cpu_runs_but_warns(cpu_support):
    cpu_support(EMULATED)
    resolved = resolve_precision("bf16-mixed", "cpu")
    assert resolved.precision == "bf16-mixed" and resolved.note is None
    assert "60x slower" in resolved.warning and "precision: auto" in resolved.warning
    cpu_support(NATIVE)
    assert resolve_precision("bf16-mixed", "cpu") == ("bf16-mixed", None, None)


def test_other_precisions_pass_through_untouched(cpu_support):
    cpu_support(EMULATED)
    for value in ("32-true", "16-mixed", 32, None):
        assert resolve_precision(value, "cpu") == (value, None, None)


def test_trainer_resolves_auto_once_and_says_so(cpu_support, caplog):
    cpu_support(EMULATED)
    with caplog.at_level(logging.INFO):
        trainer = Trainer(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.precision == "32-true"
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision:")] == [
        f"precision: 32-true ({EMULATED.reason})"
    ]
    cpu_support(NATIVE)
    assert Trainer(precision="auto", accelerator="cpu", logger=False).precision == "bf16-mixed"


def test_trainer_warns_for_bf16_on_an_emulating_cpu(cpu_support):
    cpu_support(EMULATED)
    with pytest.warns(UserWarning, match="60x slower"):
        trainer = Trainer(precision="bf16-mixed", accelerator="cpu", logger=False)
    assert trainer.precision == "bf16-mixed"


def test_hidden_bf16_hardware_is_measured_as_emulated():
    # with oneDNN and ATen limited to AVX2, bf16 is emulated on every x86 CPU: the probe must see it
    if os.uname().machine not in ("x86_64", "AMD64"):
        pytest.skip("the AVX2 limit applies to x86 CPUs")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    code = "from vitdense.core.precision import cpu_bf16_support as s; r = s(); print(r.native); print(r.reason)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    native, reason = out.stdout.strip().splitlines()
    assert native == "False"
    if (cpu_flags() or set()) & {"avx512_bf16", "amx_bf16"}:  # bf16 hardware, hidden: found by timing
        assert "slower than fp32" in reason
    else:  # none to hide: the flags decide before any timing
        assert "among its flags" in reason
