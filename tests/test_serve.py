"""`python -m vitdense serve`: a real server, started with its default host and an API key,
asked over HTTP. Concurrent requests (batched by the server) get the predictor's numbers; each
bad request gets its own 4xx with a message, and the server keeps answering; it listens on
127.0.0.1 only and wants the key everywhere but /health."""

import base64
import contextlib
import http.client
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitdense

#: the server's limits in this test (small, so that over-limit requests are cheap to make)
MAX_BYTES, MAX_PIXELS = 100_000, 200_000
#: the test server's API key (from the environment, as a user gives it)
KEY = "test-key-" + uuid.uuid4().hex
#: seconds the server may take to start (it loads torch and the checkpoint in two processes)
START_TIMEOUT = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(ckpt, log_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`python -m vitdense serve --ckpt_path=<ckpt> <args>` on a free port, logging to
    `log_path`, until the block ends (then stopped with its worker processes): its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "vitdense", "serve", f"--ckpt_path={ckpt}", f"--port={port}", *args]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if process.poll() is not None:
                    pytest.fail(f"the server exited ({process.returncode}): {log_path.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"the server did not start in {START_TIMEOUT} s: {log_path.read_text()[-3000:]}")
                time.sleep(0.5)
            yield url
        finally:
            os.killpg(process.pid, signal.SIGTERM)  # the server and its worker processes
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server_process(trained, tmp_path_factory):
    """The detection demo checkpoint served on a free port, with no `--host` (the default) and
    the key `KEY` in LIT_SERVER_API_KEY: (its base URL, its log file)."""
    _, ckpt = trained["det"]
    log = tmp_path_factory.mktemp("serve") / "server.log"
    limits = [f"--max_bytes={MAX_BYTES}", f"--max_pixels={MAX_PIXELS}", "--max_batch_size=8"]
    with running_server(ckpt, log, *limits, env={"LIT_SERVER_API_KEY": KEY}) as url:
        yield url, log


@pytest.fixture(scope="module")
def server(server_process) -> str:
    """The test server's base URL."""
    return server_process[0]


def post(url: str, body: bytes, content_type: str) -> tuple[int, dict]:
    headers = {"Content-Type": content_type, "X-API-Key": KEY}
    request = urllib.request.Request(f"{url}/predict", data=body, headers=headers)
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
    # the README's example is for a server without a key (the default); this one has one
    monkeypatch.setenv("LIT_SERVER_API_KEY", KEY)
    opener = urllib.request.build_opener()
    opener.addheaders = [("X-API-Key", KEY)]
    monkeypatch.setattr(urllib.request, "_opener", opener)
    (code,) = code_blocks("Serving a model over HTTP")
    module = as_module("readme_serve", code.replace("http://127.0.0.1:8000", server), monkeypatch)
    assert module.answer["size"] == [40, 30] and module.answer["task"] == "detection"


def get(url: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    """(status, body, headers) of a GET."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


@pytest.mark.parametrize("path", ["/info", "/predict", "/", "/docs", "/openapi.json"])
@pytest.mark.parametrize("key", [None, "wrong", KEY[:-1], KEY + "x"], ids=["no-key", "wrong", "prefix", "longer"])
def test_every_path_but_health_needs_the_key(server, path, key):
    headers = {} if key is None else {"X-API-Key": key}
    if path == "/predict":
        body, content_type = multipart("image", png(np.zeros((32, 32, 3), np.uint8)))
        request = urllib.request.Request(f"{server}{path}", body, {**headers, "Content-Type": content_type})
        with pytest.raises(urllib.error.HTTPError) as raised:
            urllib.request.urlopen(request, timeout=30)
        status, answer, answer_headers = raised.value.code, raised.value.read(), dict(raised.value.headers)
    else:
        status, answer, answer_headers = get(f"{server}{path}", headers)
    assert status == 401, answer
    assert answer_headers["content-type"] == "application/json" and answer_headers["www-authenticate"] == "APIKey"
    detail = json.loads(answer)["detail"]
    assert "X-API-Key" in detail and KEY not in detail


def test_with_the_key_info_answers_and_health_is_open(server):
    status, answer, _ = get(f"{server}/info", {"X-API-Key": KEY})
    assert status == 200 and json.loads(answer)["model"]["max_bytes"] == MAX_BYTES
    assert get(f"{server}/health", {})[:2] == (200, b"ok")  # a load balancer's probe carries no key


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` (Linux's /proc/net/tcp*), as
    hexadecimal strings: "0100007F" is 127.0.0.1, "00000000" 0.0.0.0."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # (TEST-NET-1: any routable address does)
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_the_server_listens_on_this_machine_only_by_default(server_process):
    from vitdense.deploy.serve import parser

    assert parser().parse_args(["--ckpt_path=x"]).host == "127.0.0.1"
    url, log = server_process
    port = int(url.rsplit(":", 1)[1])
    if Path("/proc/net/tcp").exists():
        assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and not 0.0.0.0 or ::
    if (address := non_loopback_address()) is not None:
        with pytest.raises(ConnectionRefusedError), socket.create_connection((address, port), timeout=5):
            pass
    lines = log.read_text()
    assert f"listening on http://127.0.0.1:{port} (this machine only); every request but GET /health" in lines
    assert "(LIT_SERVER_API_KEY) in X-API-Key" in lines.replace("$", "") and KEY not in lines


def can_bind(address: str) -> bool:
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "localhost"])
def test_another_host_when_asked(trained, monkeypatch, host):
    """`--host` reaches LitServe's `run`: its own three hosts as they are (it binds them; a name
    resolving to one of them too), any other address bound here and handed over as the socket
    (uvicorn's `fd`), with no key needed."""
    import litserve

    from vitdense import serve

    ran = {}

    def run(self, **kwargs):
        ran.update(kwargs)
        if "fd" in kwargs:  # (the socket is closed once main returns)
            with socket.socket(fileno=os.dup(kwargs["fd"])) as bound:
                ran["bound"] = bound.getsockname()[:2]

    if host == "::1" and not can_bind("::1"):
        pytest.skip("no IPv6 loopback on this machine")
    monkeypatch.setattr(litserve.LitServer, "run", run)
    monkeypatch.delenv("LIT_SERVER_API_KEY", raising=False)
    port = free_port()
    serve.main([f"--ckpt_path={trained['det'][1]}", f"--host={host}", f"--port={port}"])
    address = str(serve.host_addresses(host)[0])
    if address in serve.LITSERVE_HOSTS:
        assert ran["host"] == address and "fd" not in ran
    else:
        assert ran["bound"] == (address, port) and ran["host"] == "127.0.0.1"  # (LitServe's check passed)
    assert ran["port"] == port


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("127.0.0.2", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
    ],
)
def test_a_host_other_machines_can_reach_is_warned_about(host, loopback):
    from vitdense.deploy.serve import exposure_warning, host_is_loopback

    assert host_is_loopback(host) is loopback
    warning = exposure_warning(host, 8000, host_is_loopback(host), None)
    if loopback:
        assert warning is None and exposure_warning(host, 8000, True, "LIT_SERVER_API_KEY") is None
    else:
        assert warning.startswith(f"--host {host} is not a loopback address and there is no API key: anyone")
        keyed = exposure_warning(host, 8000, False, "LIT_SERVER_API_KEY")
        assert (
            keyed
            == f"--host {host} is not a loopback address: other machines can reach port 8000 (requests need the key)"
        )


def test_a_name_is_loopback_only_when_all_its_addresses_are():
    from vitdense.core.errors import ConfigError
    from vitdense.deploy.serve import host_is_loopback

    def resolving_to(*addresses):
        return lambda host, port, type: [(socket.AF_INET6, type, 6, "", (a, 0)) for a in addresses]

    def unresolvable(host, port, type):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    assert host_is_loopback("box", resolving_to("127.0.0.1", "::1"))
    assert not host_is_loopback("box", resolving_to("127.0.1.1", "192.168.1.5"))
    with pytest.raises(ConfigError, match=r"--host nosuch: not an IP address, and this machine cannot resolve the"):
        host_is_loopback("nosuch", unresolvable)


def test_an_address_this_machine_does_not_have_is_one_line():
    from ipaddress import ip_address

    from vitdense.core.errors import ConfigError
    from vitdense.deploy.serve import listening_socket

    elsewhere = "203.0.113.7"  # (TEST-NET-3: documentation only, on no interface)
    with pytest.raises(ConfigError, match=rf"--host {elsewhere} --port 8123: cannot listen there \(.+\); give an"):
        listening_socket(elsewhere, ip_address(elsewhere), 8123)


def test_the_parser_takes_any_host():
    from vitdense.deploy.serve import parser

    for host in ("::1", "localhost", "10.1.2.3", "server.example"):
        assert parser().parse_args(["--ckpt_path=x", f"--host={host}"]).host == host


def test_the_key_comes_from_the_environment_variable_named():
    from vitdense.core.errors import ConfigError
    from vitdense.deploy.serve import api_key_from_env

    assert api_key_from_env(None, {}) is None and api_key_from_env(None, {"LIT_SERVER_API_KEY": ""}) is None
    assert api_key_from_env(None, {"LIT_SERVER_API_KEY": "k"}) == "k"
    assert api_key_from_env("MY_KEY", {"MY_KEY": "m", "LIT_SERVER_API_KEY": "k"}) == "m"
    for environ, why in [({}, "not set"), ({"MY_KEY": ""}, "empty")]:
        with pytest.raises(ConfigError, match=f"--api_key_env MY_KEY: the environment variable MY_KEY is {why}"):
            api_key_from_env("MY_KEY", environ)


def send_large_body(url: str, size: int, *, chunked: bool, key: str | None) -> tuple[int, dict]:
    """POST `size` bytes to /predict in 16 kB pieces as urllib does it (`Connection: close`),
    declared (Content-Length) or chunked, then read the answer: (status, its JSON)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.putrequest("POST", "/predict")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Connection", "close")  # the server closes after its answer: the case that reset
        if key is not None:
            connection.putheader("X-API-Key", key)
        connection.putheader(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(size))))
        connection.endheaders()
        piece = b"x" * 16384
        for start in range(0, size, len(piece)):
            part = piece[: size - start]
            connection.send(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        if chunked:
            connection.send(b"0\r\n\r\n")
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("chunked", "key", "status"),
    [(False, KEY, 413), (True, KEY, 413), (False, None, 401)],
    ids=["content-length", "chunked", "no-key"],
)
def test_a_refusal_of_a_large_body_is_always_read(server, chunked, key, status):
    """A body 20 times --max_bytes, refused: the client reads the answer every time (the
    server answered and closed while the client was still sending, and in about half the tries
    the client saw a reset or a broken pipe instead of the 413)."""
    answers = [send_large_body(server, 20 * MAX_BYTES, chunked=chunked, key=key) for _ in range(20)]
    assert [got for got, _ in answers] == [status] * 20
    assert all(("over the limit" if status == 413 else "X-API-Key") in answer["detail"] for _, answer in answers)
