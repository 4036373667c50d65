"""`python -m vitdense serve`: a real server on 127.0.0.1, asked over HTTP. Concurrent requests
(batched by the server) get the predictor's numbers; each bad request gets its own 4xx with a
message, and the server keeps answering."""

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import vitdense

#: the server's limits in this test (small, so that over-limit requests are cheap to make)
MAX_BYTES, MAX_PIXELS = 300_000, 200_000
#: seconds the server may take to start (it loads torch and the checkpoint in two processes)
START_TIMEOUT = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    """The detection demo checkpoint served on a free port: its base URL."""
    _, ckpt = trained["det"]
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "server.log").open("w")
    command = [sys.executable, "-m", "vitdense", "serve", f"--ckpt_path={ckpt}", "--host=127.0.0.1"]
    command += [f"--port={port}", f"--max_bytes={MAX_BYTES}", f"--max_pixels={MAX_PIXELS}", "--max_batch_size=8"]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited ({process.returncode}): {open(log.name).read()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not start in {START_TIMEOUT} s: {open(log.name).read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and its worker processes
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def post(url: str, body: bytes, content_type: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/predict", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def multipart(field: str, data: bytes, filename: str = "image.png") -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_concurrent_requests_get_the_predictors_numbers(server, trained):
    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 256, (int(rng.integers(24, 60)), int(rng.integers(24, 60)), 3), np.uint8) for _ in range(50)
    ]
    bodies = []
    for i, pixels in enumerate(images):  # half as files, half as base64 JSON
        if i % 2:
            bodies.append((json.dumps({"image": base64.b64encode(png(pixels)).decode()}).encode(), "application/json"))
        else:
            bodies.append(multipart("image", png(pixels)))
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda b: post(server, *b), bodies))
    expected = vitdense.load(trained["det"][1], batch_size=1)(images)  # each image alone
    for (status, answer), pixels, mine in zip(answers, images, expected, strict=True):
        assert status == 200, answer
        assert answer["task"] == "detection" and answer["size"] == list(pixels.shape[:2])
        found = answer["detections"]
        assert len(found) == len(mine)
        np.testing.assert_allclose([d["score"] for d in found], mine.scores, atol=1e-4)
        np.testing.assert_allclose([d["box"] for d in found], mine.boxes, atol=1e-2)
        assert [d["name"] for d in found] == mine.names


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        (b"hello", "text/plain", 415, "content type 'text/plain' is not accepted"),
        (b"{not json", "application/json", 400, "the body is not JSON"),
        (b'{"picture": "x"}', "application/json", 400, "no 'image' field"),
        (b'{"image": "@@@"}', "application/json", 400, "not base64"),
        (*multipart("image", b"not an image at all"), 400, "not an image that can be decoded"),
        (*multipart("image", png(np.zeros((500, 500, 3), np.uint8))), 413, "over the limit of 200000 pixels"),
        (*multipart("image", os.urandom(MAX_BYTES + 1)), 413, f"over the limit of {MAX_BYTES}"),
    ],
    ids=["content-type", "not-json", "no-field", "not-base64", "not-an-image", "too-many-pixels", "too-many-bytes"],
)
def test_a_bad_request_is_told_why_and_the_server_goes_on(server, body, content_type, status, message):
    got, answer = post(server, body, content_type)
    assert got == status and message in answer["detail"], answer
    ok, _ = post(server, *multipart("image", png(np.zeros((32, 32, 3), np.uint8))))
    assert ok == 200


def test_a_bad_request_in_a_batch_leaves_the_others_alone(server):
    """Concurrent good and bad requests, batched together: each gets its own answer."""
    good = multipart("image", png(np.full((30, 40, 3), 128, np.uint8)))
    bad = multipart("image", b"GIF89a but truncated")
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda b: post(server, *b), [good, bad] * 8))
    assert [status for status, _ in answers] == [200, 400] * 8


def test_readme_client_example(server, tmp_path, monkeypatch):
    from tests.test_readme import as_module, code_blocks

    monkeypatch.chdir(tmp_path)
    (tmp_path / "photos").mkdir()
    Image.fromarray(np.full((40, 30, 3), 200, np.uint8)).save(tmp_path / "photos" / "a.jpg")
    (code,) = code_blocks("Serving a model over HTTP")
    module = as_module("readme_serve", code.replace("http://127.0.0.1:8000", server), monkeypatch)
    assert module.answer["size"] == [40, 30] and module.answer["task"] == "detection"
