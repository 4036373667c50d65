"""`python -m vitdense serve --ckpt_path run.ckpt [--port 8000]`: a checkpoint's predictor
behind HTTP, with LitServe (Lightning's model server; `pip install vitdense[serve]`).

    POST /predict   an image, as multipart/form-data (field `image`, a file) or as JSON
                    {"image": "<base64 of the file's bytes>"}; answers the predictor's result
                    as JSON (`vitdense.results`: `to_dict()`). A multi-task checkpoint's
                    answer is {name: that task's result}, for every task or those the
                    optional field `tasks` names (JSON ["det", "seg"], a form's "det,seg")
    GET  /health    "ok" once the model is loaded
    GET  /info      the task, its classes and the server's limits

With `--slice_height N` (and SAHI's other options, `vitdense.deploy.slicing`), a detection or
instance segmentation checkpoint predicts each image in overlapping tiles of N pixels,
merged: small objects in large images.

Concurrent requests are batched (up to `--max_batch_size` images, waiting at most
`--batch_timeout` seconds for a batch to fill) and padded as the predictor pads them, so a
batched answer is the answer alone. Every bad request gets its own 4xx with a message and
leaves the others of its batch alone: a wrong content type (415), a body over `--max_bytes`
or an image over `--max_pixels` (413), malformed JSON, a missing field or bytes that are not
an image (400).

The server listens on 127.0.0.1 (this machine only) unless `--host` names another address: a
loopback one (`::1`, `localhost`), an interface's address or a name of this machine, or
`0.0.0.0` / `::` (every interface); it warns when the address is not a loopback one, since
other machines can then reach it. LitServe binds only 127.0.0.1, 0.0.0.0 and `::`; any other
address is bound here and LitServe serves the socket (`listening_socket`). With an API key
in the environment variable LIT_SERVER_API_KEY (or the one `--api_key_env NAME` names), every
request but GET /health must carry it in an `X-API-Key` header (401 without it). A refused
upload's body is read to its end (up to `DRAIN_BYTES`) before the refusal, so that the
client reads the 4xx rather than a reset connection.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any, NamedTuple

import litserve as ls
import numpy as np
from starlette.responses import JSONResponse

from vitdense.core.errors import ConfigError, DataError
from vitdense.core.images import ImageTooLarge, decode_image_bytes
from vitdense.deploy.slicing import (
    Slicing,
    add_slicing_arguments,
    check_checkpoint_sliceable,
    check_sliceable,
    slicing_from_args,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

#: what a request may be sent as
CONTENT_TYPES = ("multipart/form-data", "application/json")
HOW_TO_SEND = (
    "POST the image as multipart/form-data (a file in the field 'image') or as JSON "
    '{"image": "<base64 of the image file>"}'
)


class Rejected(Exception):
    """A request refused before it reaches the model: `status` and the message to send."""

    def __init__(self, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


#: the header that carries the API key (LitServe's name for it)
API_KEY_HEADER = "X-API-Key"
#: the environment variable the key is read from unless `--api_key_env` names another (LitServe's)
API_KEY_ENV = "LIT_SERVER_API_KEY"
#: paths answered without the key: a load balancer's health probe carries none
OPEN_PATHS = ("/health",)
#: a refused request's body is read and thrown away up to this size before the refusal is sent.
#: A server that answers and closes while the client is still sending leaves unread bytes in its
#: socket, and the kernel then resets the connection, often before the client has read the
#: answer; a client sees "connection reset" or "broken pipe" instead of the 413. A fixed cap,
#: not a multiple of --max_bytes: whatever the limit, a client that sent one large photo by
#: mistake (tens of MB) is told why; reading costs bandwidth, not memory, and past the cap the
#: server stops reading and closes (the client may then see a reset).
DRAIN_BYTES = 64 * 2**20


class _Body:
    """The request body as it arrives (ASGI `http.request` messages): how much came, and
    whether all of it did."""

    def __init__(self, receive: Callable[[], Awaitable[Message]]) -> None:
        self.receive = receive
        self.size = 0
        self.complete = False
        self.disconnected = False

    async def chunk(self) -> bytes:
        """The next piece of the body (b"" once it is complete).

        Raises:
            Rejected: the client disconnected before the body was complete.
        """
        if self.complete:
            return b""
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
            raise Rejected(400, "the client disconnected before the body was complete")
        chunk = message.get("body", b"")
        self.size += len(chunk)
        self.complete = not message.get("more_body", False)
        return chunk

    async def drain(self, limit: int) -> None:
        """Read and discard the rest of the body while no more than `limit` bytes came in all."""
        try:
            while not self.complete and self.size <= limit:
                await self.chunk()
        except Rejected:
            pass


class RequestGuard:
    """ASGI middleware in front of LitServe: the checks that need no model, each answered with
    a 4xx and JSON {"detail": message}, before LitServe sees the request.

    - `api_key` (if given): every request but those of `open_paths` must carry it in the
      X-API-Key header (401 without it or with another; compared in constant time);
    - a POST to `path` must be of a content type of `CONTENT_TYPES` (415), a body of at most
      `max_bytes` (413, counted as it arrives, also without a Content-Length) and, if JSON,
      parse (400); it is passed on with its body replayed. LitServe would answer the last three
      with a bare 500.

    A refused request's body is read up to `drain_bytes` before the answer (see `DRAIN_BYTES`),
    so that the client can read it; the connection is closed after an answer sent before the
    whole body was read (a client that waits for "100 Continue" never sends it).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str = "/predict",
        max_bytes: int = 20_000_000,
        api_key: str | None = None,
        open_paths: tuple[str, ...] = OPEN_PATHS,
        drain_bytes: int = DRAIN_BYTES,
    ) -> None:
        self.app = app
        self.path = path
        self.max_bytes = max_bytes
        # bytes, as the header arrives: no decoding to get wrong before the comparison
        self.api_key = api_key.encode() if api_key else None
        self.open_paths = open_paths
        self.drain_bytes = drain_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        guarded = scope["path"] == self.path and scope["method"] == "POST"
        incoming = _Body(receive)
        try:
            self._check_key(scope)
            body = await self._checked_body(headers, incoming) if guarded else b""
        except Rejected as err:
            if self._worth_draining(headers) and not incoming.disconnected:
                await incoming.drain(self.drain_bytes)
            await reply(send, err.status, str(err), headers=err.headers, close=not incoming.complete)
            return
        if not guarded:
            await self.app(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # (a disconnect, after the body)

        await self.app(scope, replay, send)

    def _worth_draining(self, headers: dict[str, str]) -> bool:
        """Whether reading a refused request's body lets its client read the answer: not when
        the client waits for "100 Continue" before sending it (reading would invite it), nor
        when it declares more than `drain_bytes` (the server stops there and closes anyway)."""
        if headers.get("expect", "").lower() == "100-continue":
            return False
        declared = headers.get("content-length", "")
        return not (declared.isdigit() and int(declared) > self.drain_bytes)

    def _check_key(self, scope: Scope) -> None:
        """Raises Rejected (401) unless the request carries the server's key (if it has one)."""
        if self.api_key is None:
            return
        given = [v for k, v in scope["headers"] if k.lower() == API_KEY_HEADER.lower().encode()]
        challenge = ((b"www-authenticate", b"APIKey"),)  # (a 401 must name a scheme: FastAPI's)
        if not given:
            raise Rejected(401, f"this server requires an API key: send it in the {API_KEY_HEADER} header", challenge)
        # constant time: how long a wrong key takes must not tell how much of it was right
        if not hmac.compare_digest(given[0], self.api_key):
            raise Rejected(401, f"the {API_KEY_HEADER} header does not carry this server's API key", challenge)

    async def _checked_body(self, headers: dict[str, str], incoming: _Body) -> bytes:
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in CONTENT_TYPES:
            raise Rejected(415, f"content type {content_type or '(none)'!r} is not accepted; {HOW_TO_SEND}")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise Rejected(413, f"a body of {int(declared)} bytes is over the limit of {self.max_bytes} (--max_bytes)")
        chunks = []
        while not incoming.complete:
            chunks.append(await incoming.chunk())
            if incoming.size > self.max_bytes:
                raise Rejected(413, f"a body of more than {self.max_bytes} bytes is over the limit (--max_bytes)")
        body = b"".join(chunks)
        if content_type == "application/json":
            try:
                parsed = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise Rejected(400, f"the body is not JSON ({err}); {HOW_TO_SEND}") from None
            if not isinstance(parsed, dict):
                raise Rejected(400, f"the JSON body is a {type(parsed).__name__}, not an object; {HOW_TO_SEND}")
        return body


async def reply(
    send: Callable, status: int, message: str, *, headers: tuple[tuple[bytes, bytes], ...] = (), close: bool = False
) -> None:
    """A JSON error response {"detail": message} (FastAPI's shape); `close`: ask the server to
    close the connection after it (the request's body was not read to its end)."""
    body = json.dumps({"detail": message}).encode()
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    if close:
        fields.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": fields})
    await send({"type": "http.response.body", "body": body})


def image_bytes(request: Any) -> bytes:
    """The image file's bytes from a parsed request: LitServe hands over the form of a
    multipart request and the object of a JSON one.

    Raises:
        Rejected: no `image` field, or one that is neither a file nor base64 text.
    """
    image = request.get("image") if hasattr(request, "get") else None
    if image is None:
        raise Rejected(400, f"the request has no 'image' field; {HOW_TO_SEND}")
    if isinstance(image, str):
        try:
            return base64.b64decode(image.split(",", 1)[-1] if image.startswith("data:") else image, validate=True)
        except (binascii.Error, ValueError):
            raise Rejected(400, f"the 'image' field is not base64 text; {HOW_TO_SEND}") from None
    if hasattr(image, "file"):  # an uploaded file (starlette's UploadFile)
        return image.file.read()
    raise Rejected(400, f"the 'image' field is a {type(image).__name__}; {HOW_TO_SEND}")


def decode_request_image(request: Any, max_pixels: int) -> np.ndarray | Rejected:
    """The request's image as upright [H, W, 3] uint8 pixels, or why it cannot be (returned,
    not raised: LitServe fails a whole batch when one request raises)."""
    try:
        return decode_image_bytes(image_bytes(request), max_pixels=max_pixels)
    except Rejected as err:
        return err
    except ImageTooLarge as err:
        return Rejected(413, f"{err} (--max_pixels)")
    except DataError as err:
        return Rejected(400, f"the 'image' field is {err}")


def requested_tasks(request: Any, names: list[str] | None) -> tuple[str, ...] | None | Rejected:
    """The tasks a request names in its optional `tasks` field (a JSON list, or names joined
    by commas in a form field), checked against a multi-task checkpoint's `names`: None for
    every task. A single-task server (`names` None) refuses the field rather than ignore it."""
    asked = request.get("tasks") if hasattr(request, "get") else None
    if asked is None:
        return None
    if isinstance(asked, str):
        asked = [name.strip() for name in asked.split(",") if name.strip()]
    if names is None:
        return Rejected(400, "the 'tasks' field is for a multi-task checkpoint; this server's has one task")
    if not isinstance(asked, list) or not asked or not all(isinstance(n, str) for n in asked):
        return Rejected(400, f"the 'tasks' field is not a list of task names: choose among {names}")
    unknown = [name for name in asked if name not in names]
    if unknown:
        return Rejected(400, f"the 'tasks' field names {unknown}, which this checkpoint has not: choose among {names}")
    return tuple(asked)


class PredictorAPI(ls.LitAPI):
    """A checkpoint's predictor as a LitServe API: each worker loads it on its device;
    requests are decoded in the worker and the good ones of a batch predicted as one padded
    batch, the bad ones answered with their own 4xx.

    Args:
        ckpt_path: the checkpoint.
        max_batch_size, batch_timeout: LitServe's dynamic batching.
        max_pixels: largest image (width x height) decoded; 413 beyond.
        precision: the predictor's (`vitdense.load`).
        slicing: the predictor's sliced inference (`vitdense.deploy.slicing`), or None.
    """

    def __init__(
        self,
        ckpt_path: str | Path,
        *,
        max_batch_size: int = 8,
        batch_timeout: float = 0.01,
        max_pixels: int = 40_000_000,
        precision: str = "32-true",
        slicing: Slicing | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt_path = str(ckpt_path)
        self.max_pixels = max_pixels
        self.precision = precision
        self.slicing = slicing

    def setup(self, device: str) -> None:
        from vitdense.deploy.predictor import load

        self.predictor = load(
            self.ckpt_path,
            device=device,
            batch_size=self.max_batch_size,
            precision=self.precision,
            slicing=self.slicing,
        )
        #: a multi-task checkpoint's task names (a request may name some), else None
        self.task_names: list[str] | None = getattr(self.predictor, "names", None)

    def decode_request(self, request) -> Asked | Rejected:  # noqa: ANN001
        # (unannotated: LitServe then hands over the parsed JSON object or multipart form)
        tasks = requested_tasks(request, self.task_names)
        if isinstance(tasks, Rejected):
            return tasks
        pixels = decode_request_image(request, self.max_pixels)
        return pixels if isinstance(pixels, Rejected) else Asked(pixels, tasks)

    def authorize(self) -> None:
        """LitServe's hook for its own authentication, here a no-op: `RequestGuard` checks the
        API key before a request reaches LitServe. Without it, LitServe would check
        LIT_SERVER_API_KEY again on every route, /health included, and with `!=` (not in
        constant time), and ignore a key read from `--api_key_env`."""

    def batch(self, inputs: list) -> list:
        return inputs

    def predict(self, inputs: Any) -> Any:
        asked = inputs if isinstance(inputs, list) else [inputs]  # (a list when batching)
        asked = [x if isinstance(x, Asked | Rejected) else Asked(x) for x in asked]  # (pixels alone: every task)
        good = [x for x in asked if not isinstance(x, Rejected)]
        if not good:
            results = iter([])
        elif self.task_names is None:
            results = iter(self.predictor([x.pixels for x in good]))
        else:  # the tasks any request of the batch names, each answer then cut to its own
            names = [n for n in self.task_names if any(x.tasks is None or n in x.tasks for x in good)]
            every = self.predictor([x.pixels for x in good], tasks=names)
            results = iter({n: r[n] for n in (x.tasks or self.task_names)} for x, r in zip(good, every, strict=True))
        out = [x if isinstance(x, Rejected) else next(results) for x in asked]
        return out if isinstance(inputs, list) else out[0]

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, Rejected):  # a response, not an exception: its batch's others are answered
            return JSONResponse({"detail": str(output)}, status_code=output.status)
        if isinstance(output, dict):  # a multi-task checkpoint's: {name: that task's result}
            return {name: result.to_dict() for name, result in output.items()}
        return output.to_dict()


class Asked(NamedTuple):
    """A decoded request: its image ([H, W, 3] uint8) and the tasks it names (None: all)."""

    pixels: np.ndarray
    tasks: tuple[str, ...] | None = None


#: the addresses LitServe's `run` binds itself (it refuses any other); vitdense binds the rest
#: and hands LitServe the socket (`listening_socket`)
LITSERVE_HOSTS = ("127.0.0.1", "0.0.0.0", "::")

_logger = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_addresses(host: str, resolve: Callable[..., list] = socket.getaddrinfo) -> list[Address]:
    """The addresses `--host` stands for: itself when it is an IP address, else every address
    the name resolves to (`resolve`: `socket.getaddrinfo`'s signature), in the resolver's order.

    Raises:
        ConfigError: neither an address nor a name this machine resolves.
    """
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = resolve(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:  # socket.gaierror is an OSError
        raise ConfigError(
            f"--host {host}: not an IP address, and this machine cannot resolve the name ({err}); give an "
            "address (127.0.0.1, ::1, an interface's address, 0.0.0.0 for every interface) or a name that resolves"
        ) from None
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in found))


def is_loopback(address: Address) -> bool:
    """Whether only this machine can reach `address` (127.0.0.0/8, ::1, and ::ffff:127.x.y.z,
    which `is_loopback` alone calls not loopback before Python 3.13)."""
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def host_is_loopback(host: str, resolve: Callable[..., list] = socket.getaddrinfo) -> bool:
    """Whether `--host` keeps the server to this machine: a loopback address, or a name whose
    every address is one (a name that also resolves to another address is not)."""
    return all(is_loopback(a) for a in host_addresses(host, resolve))


def exposure_warning(host: str, port: int, loopback: bool, key_env: str | None) -> str | None:
    """The line to warn with when the server listens where other machines can reach it (None: a
    loopback address), saying whether a key guards it."""
    if loopback:
        return None
    if key_env is not None:
        return f"--host {host} is not a loopback address: other machines can reach port {port} (requests need the key)"
    return (
        f"--host {host} is not a loopback address and there is no API key: anyone who reaches port {port} of this "
        f"machine can use the model; export {API_KEY_ENV}=<a key> to require one"
    )


def listening_socket(host: str, address: Address, port: int) -> socket.socket:
    """A TCP socket bound to (`address`, `port`) as uvicorn binds LitServe's own hosts
    (SO_REUSEADDR), for an address LitServe's `run` refuses: LitServe serves it when given its
    file descriptor (uvicorn's `fd`). `host`: what `--host` said (`address`, or a name of it).

    Raises:
        ConfigError: it cannot be bound (not an address of this machine, the port in use).
    """
    sock = socket.socket(socket.AF_INET6 if address.version == 6 else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((str(address), port))
    except OSError as err:
        sock.close()
        named = f"--host {host}" if host == str(address) else f"--host {host} ({address})"
        raise ConfigError(
            f"{named} --port {port}: cannot listen there ({err.strerror or err}); give an address of one of this "
            "machine's interfaces (`ip address` lists them) and a free port"
        ) from None
    return sock


class _WithoutLitServesDocsLine(logging.Filter):
    """Drops LitServe's "Swagger UI is available at http://127.0.0.1:...": when vitdense bound
    the socket, the host LitServe was told is a stand-in; vitdense logs the true URL instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Swagger UI is available at")


def api_key_from_env(name: str | None, environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The API key in the environment variable `name` (None: `API_KEY_ENV`, and no key if it is
    unset or empty).

    Raises:
        ConfigError: `name` was given and the variable is unset or empty (asking for a key and
            getting an open server would be the worst way to fail).
    """
    key = environ.get(name or API_KEY_ENV, "")
    if name is not None and not key:
        raise ConfigError(
            f"--api_key_env {name}: the environment variable {name} is {'empty' if name in environ else 'not set'}; "
            f"export {name}=<the key> before starting the server, or leave --api_key_env out for no key"
        )
    return key or None


def base_url(host: str, port: int) -> str:
    """http://host:port, an IPv6 address in brackets."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def describe_listening(host: str, port: int, key_env: str | None, loopback: bool, address: str | None = None) -> str:
    """The startup line: where the server listens and whether it wants a key (never the key).
    `loopback`: whether `host` is a loopback one (`host_is_loopback`); `address`: the address
    bound, when `host` is a name."""
    if loopback:
        where = "this machine only"
    elif host in ("0.0.0.0", "::"):
        where = "every network interface"
    else:
        where = "reachable from other machines"
    if address is not None and address != host:
        where = f"{address}, {where}"
    if key_env is None:
        access = "no API key required"
    else:
        access = (
            f"every request but GET {', '.join(OPEN_PATHS)} must carry the API key (${key_env}) in {API_KEY_HEADER}"
        )
    return f"listening on {base_url(host, port)} ({where}); {access}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vitdense serve",
        description="Serve a checkpoint's predictor over HTTP (LitServe): POST /predict an image, GET /health.",
    )
    p.add_argument("--ckpt_path", required=True, help="a checkpoint written by `python -m vitdense fit`")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on: 127.0.0.1, this machine only (the default), or any other loopback "
        "address or name (::1, localhost); an interface's address or a name of this machine, 0.0.0.0 (every "
        f"IPv4 interface) or :: (every interface) open it to a network: set an API key ({API_KEY_ENV}) first. "
        "A name is resolved and the first of its addresses bound; the server warns when it is not a loopback one",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api_key_env",
        metavar="NAME",
        default=None,
        help=f"the environment variable holding the API key that every request but GET /health must carry in "
        f"its {API_KEY_HEADER} header (401 without it); default {API_KEY_ENV}, unset or empty for no key. "
        "The key itself is never given on the command line, where other users of the machine see it",
    )
    p.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "cuda", "mps"))
    p.add_argument("--devices", default="auto", help="how many devices to run workers on ('auto': all)")
    p.add_argument("--workers_per_device", type=int, default=1)
    p.add_argument("--max_batch_size", type=int, default=8, help="concurrent requests predicted as one batch")
    p.add_argument("--batch_timeout", type=float, default=0.01, help="seconds to wait for a batch to fill")
    p.add_argument("--max_bytes", type=int, default=20_000_000, help="largest request body (413 beyond)")
    p.add_argument("--max_pixels", type=int, default=40_000_000, help="largest image, width x height (413 beyond)")
    p.add_argument("--precision", default="32-true", help="32-true, bf16-mixed or auto (see vitdense.load)")
    p.add_argument("--timeout", type=float, default=30, help="seconds a request may wait before a 504")
    add_slicing_arguments(p)
    return p


def main(argv: list[str] | None = None) -> None:
    """`python -m vitdense serve ...`: load the checkpoint (failing early on a bad one), serve until stopped."""
    args = parser().parse_args(argv)
    slicing = slicing_from_args(args)  # (bad options: one line now)
    api_key = api_key_from_env(args.api_key_env)  # before the model: a missing key fails in a second
    addresses = host_addresses(args.host)  # (a name that does not resolve: one line now, too)
    loopback = all(is_loopback(a) for a in addresses)
    address = addresses[0]  # (a name's first address, as a socket bound to the name would take)
    # LitServe binds only its three hosts: any other is bound here (a wrong address or a busy port
    # fails now) and LitServe is given the socket to serve
    sock = None if str(address) in LITSERVE_HOSTS else listening_socket(args.host, address, args.port)
    from vitdense.deploy.checkpoint import Checkpoint
    from vitdense.deploy.predictor import inference_data

    found = Checkpoint(args.ckpt_path)  # a bad path or file: one line now, not in a worker later
    if found.is_multitask:
        from vitdense.deploy.multitask import tasks_inference

        tasks_inference(found)
    else:
        inference_data(found)
    if slicing is not None and not found.is_multitask:  # a task without objects: refused before the server starts
        check_checkpoint_sliceable(found)
        if found.result_type() is None:  # (not recorded and the task's settings decide: ask the task)
            check_sliceable(found.for_inference("cpu"))
    devices = args.devices if args.devices == "auto" else int(args.devices)
    api = PredictorAPI(
        found.path,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout,
        max_pixels=args.max_pixels,
        precision=args.precision,
        slicing=slicing,
    )
    metadata = {
        "task": found.task_class,
        "classes": found.task.get("class_names") or found.task.get("num_classes"),
        # a multi-task checkpoint's tasks and each one's classes (a request may name some in 'tasks')
        "tasks": task_classes(found) if found.is_multitask else None,
        "max_bytes": args.max_bytes,
        "max_pixels": args.max_pixels,
        "max_batch_size": args.max_batch_size,
        "slicing": dataclasses.asdict(slicing) if slicing is not None else None,
    }
    server = ls.LitServer(
        api,
        accelerator=args.accelerator,
        devices=devices,
        workers_per_device=args.workers_per_device,
        timeout=args.timeout,
        model_metadata=metadata,
        middlewares=[(RequestGuard, {"path": "/predict", "max_bytes": args.max_bytes, "api_key": api_key})],
    )
    _log_to_stderr()
    key_env = (args.api_key_env or API_KEY_ENV) if api_key else None
    _logger.info(describe_listening(args.host, args.port, key_env, loopback, str(address)))
    if (warning := exposure_warning(args.host, args.port, loopback, key_env)) is not None:
        _logger.warning(warning)
    if sock is None:
        server.run(host=str(address), port=args.port, generate_client_file=False)
        return
    # the host LitServe is told is a stand-in that passes its check: its docs line would name it
    logging.getLogger("litserve.server").addFilter(_WithoutLitServesDocsLine())
    _logger.info(f"Swagger UI is available at {base_url(str(address), args.port)}/docs")
    server.run(host="127.0.0.1", port=args.port, fd=sock.fileno(), generate_client_file=False)


def task_classes(found: Any) -> dict[str, Any]:
    """{name: that task's class names (or count)} of a multi-task checkpoint."""
    specs = found.task.get("tasks") or {}
    return {
        name: (spec.get("init_args") or {}).get("class_names") or (spec.get("init_args") or {}).get("num_classes")
        for name, spec in specs.items()
    }


def _log_to_stderr() -> None:
    """This module's INFO lines on stderr (LitServe configures only its own logger)."""
    if not _logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s - vitdense.deploy.serve - %(levelname)s - %(message)s"))
        _logger.addHandler(handler)
        _logger.propagate = False  # (one line, also when the root logger has a handler)
    _logger.setLevel(logging.INFO)


if __name__ == "__main__":
    main()
