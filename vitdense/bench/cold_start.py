"""`cold-start`: how long a new process takes to give its first answer, from a checkpoint.

Two ways users meet it: `vitdense.load(ckpt)` + the first prediction in a fresh Python, and
`python -m vitdense serve` until its first answer to POST /predict. Each round starts new
processes (the operating system's file cache stays warm after the first round, as on a
machine that has served before; the first round is reported apart for that reason).

Beside them, measured the same way (spawn to done, on the wall clock), the floor under any
answer: a fresh Python that imports torch and timm and does nothing else (`BASELINE`);
the table ends with `vitdense.load`'s time to its first prediction as a multiple of it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from vitdense.bench.common import cpu_kind

#: the phases a fresh Python reports for `vitdense.load`, in order
LOAD_PHASES = ("import vitdense", "vitdense.load", "first prediction", "second prediction")

_LOAD_SCRIPT = """
import json, sys, time
start = time.perf_counter()
import vitdense
imported = time.perf_counter()
predictor = vitdense.load(sys.argv[1], precision=sys.argv[3])
loaded = time.perf_counter()
predictor(sys.argv[2])
first = time.perf_counter()
answered = time.time()  # (wall clock: the parent's spawn time is on the same clock)
predictor(sys.argv[2])
second = time.perf_counter()
print(json.dumps([imported - start, loaded - imported, first - loaded, second - first, answered]))
"""


#: what every vitdense process imports before it can do anything: the baseline of the ratio
BASELINE = "import torch, timm"
BASELINE_ROW = f"baseline: spawn -> {BASELINE}"
LOAD_ROW = "load: spawn -> first prediction"

_BASELINE_SCRIPT = f"""
import time
{BASELINE}
print(time.time())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "NO_ALBUMENTATIONS_UPDATE": "1"}


def time_python_startup() -> float:
    """Seconds of `python -c pass`: the floor under every figure here."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def time_baseline() -> float:
    """Seconds from spawning Python to its having imported torch and timm (`BASELINE`), on the
    wall clock as `time_load` measures: what no checkpoint can load faster than."""
    spawned = time.time()
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE_SCRIPT], check=True, capture_output=True, text=True, env=_environment()
    )
    return float(out.stdout.strip().splitlines()[-1]) - spawned


def time_load(ckpt: Path, image: Path, precision: str) -> tuple[float, list[float]]:
    """(seconds from spawning Python to its first prediction, the phases of `LOAD_PHASES`)."""
    spawned = time.time()
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_SCRIPT, str(ckpt), str(image), precision],
        check=True,
        capture_output=True,
        text=True,
        env=_environment(),
    )
    *phases, answered = json.loads(out.stdout.strip().splitlines()[-1])
    return answered - spawned, phases


def time_serve(ckpt: Path, image: Path, precision: str, timeout: float = 300) -> tuple[float, float]:
    """(seconds from spawning `python -m vitdense serve` to GET /health = 200, to the first
    200 answer of POST /predict). The request is sent as soon as /health answers."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"image": base64.b64encode(image.read_bytes()).decode()}).encode()
    env = {k: v for k, v in _environment().items() if k != "VITDENSE_API_KEY"}
    log = tempfile.TemporaryFile()  # (a pipe nobody reads while waiting could fill and stall the server)
    start = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "vitdense", "serve", "--ckpt_path", str(ckpt), "--port", str(port)]
        + ["--precision", precision],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
        start_new_session=True,  # LitServe's workers are processes of their own: stopped as one group
    )
    try:
        healthy = None
        while healthy is None:
            if server.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited: {log.read().decode(errors='replace')[-2000:]}")
            if time.perf_counter() - start > timeout:
                raise TimeoutError(f"no answer from {url}/health within {timeout} s")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        healthy = time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.02)
        request = urllib.request.Request(f"{url}/predict", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"POST /predict answered {answer.status}")
        return healthy, time.perf_counter() - start
    finally:
        stop_group(server)
        log.close()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group (the server and the workers it started), SIGKILL to
    what is left after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # workers that outlive the server
            return
        except subprocess.TimeoutExpired:
            continue


def default_image(folder: Path, size: int) -> Path:
    """A [size, size] PNG of noise: what the first request carries when no --image is given."""
    import numpy as np
    from PIL import Image

    path = folder / "cold_start.png"
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def bench_cold_start(args: argparse.Namespace) -> dict[str, list[float]]:
    """Per measured quantity, its value in each round (seconds)."""
    ckpt = Path(args.ckpt_path)
    if not ckpt.is_file():
        raise SystemExit(f"--ckpt_path {ckpt}: no such file")
    rows: dict[str, list[float]] = {"python -c pass": [], BASELINE_ROW: []}
    rows.update({name: [] for name in LOAD_PHASES})
    rows.update({LOAD_ROW: [], "serve: spawn -> /health": [], "serve: spawn -> first answer": []})
    with tempfile.TemporaryDirectory() as folder:
        image = Path(args.image) if args.image else default_image(Path(folder), args.img_size)
        for _ in range(args.rounds):
            rows["python -c pass"].append(time_python_startup())
            rows[BASELINE_ROW].append(time_baseline())
            if "load" in args.modes:
                total, phases = time_load(ckpt, image, args.precision)
                rows[LOAD_ROW].append(total)
                for name, seconds in zip(LOAD_PHASES, phases, strict=True):
                    rows[name].append(seconds)
            if "serve" in args.modes:
                healthy, answered = time_serve(ckpt, image, args.precision)
                rows["serve: spawn -> /health"].append(healthy)
                rows["serve: spawn -> first answer"].append(answered)
    return {name: values for name, values in rows.items() if values}


def ratio_to_baseline(rows: dict[str, list[float]]) -> tuple[float, float | None] | None:
    """`vitdense.load`'s spawn -> first prediction over the baseline's (`BASELINE`): (first
    round, median of the others' ratios, each round's load over the same round's baseline;
    None with one round), or None when the load was not measured."""
    loads, bases = rows.get(LOAD_ROW), rows.get(BASELINE_ROW)
    if not loads or not bases:
        return None
    ratios = [load / base for load, base in zip(loads, bases, strict=True)]
    return ratios[0], statistics.median(ratios[1:]) if len(ratios) > 1 else None


def print_cold_start(args: argparse.Namespace, rows: dict[str, list[float]]) -> None:
    print(f"cold start of {args.ckpt_path} ({args.precision}), {args.rounds} rounds; {cpu_kind()}")
    print("| measured | first round (s) | median of the others (s) |")
    print("| --- | --- | --- |")
    for name, values in rows.items():
        rest = f"{statistics.median(values[1:]):.2f}" if len(values) > 1 else "-"
        print(f"| {name} | {values[0]:.2f} | {rest} |")
    ratio = ratio_to_baseline(rows)
    if ratio is not None:
        rest = f"{ratio[1]:.2f}x" if ratio[1] is not None else "-"
        print(f"| {LOAD_ROW} / baseline ({BASELINE}) | {ratio[0]:.2f}x | {rest} |")


def add_parser(sub: argparse._SubParsersAction) -> None:
    cs = sub.add_parser("cold-start", help="seconds from a new process to its first answer: vitdense.load, serve")
    cs.add_argument("--ckpt_path", required=True, help="a checkpoint written by `python -m vitdense fit`")
    cs.add_argument("--image", default=None, help="the image predicted (default: a noise PNG of --img-size)")
    cs.add_argument("--img-size", type=int, default=256)
    cs.add_argument("--precision", default="32-true", help="the predictor's (vitdense.load, serve --precision)")
    cs.add_argument("--modes", nargs="+", choices=["load", "serve"], default=["load", "serve"])
    cs.add_argument("--rounds", type=int, default=3, help="new processes per mode; the first is reported apart")
