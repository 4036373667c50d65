"""`python -m vitdense serve --ckpt_path run.ckpt [--port 8000]`: a checkpoint's predictor
behind HTTP, with LitServe (Lightning's model server; `pip install vitdense[serve]`).

    POST /predict   an image, as multipart/form-data (field `image`, a file) or as JSON
                    {"image": "<base64 of the file's bytes>"}; answers the predictor's result
                    as JSON (`vitdense.results`: `to_dict()`)
    GET  /health    "ok" once the model is loaded
    GET  /info      the task, its classes and the server's limits

Concurrent requests are batched (up to `--max_batch_size` images, waiting at most
`--batch_timeout` seconds for a batch to fill) and padded as the predictor pads them, so a
batched answer is the answer alone. Every bad request gets its own 4xx with a message and
leaves the others of its batch alone: a wrong content type (415), a body over `--max_bytes`
or an image over `--max_pixels` (413), malformed JSON, a missing field or bytes that are not
an image (400).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import litserve as ls
import numpy as np
from starlette.responses import JSONResponse

from vitdense.data.images import ImageTooLarge, decode_image_bytes
from vitdense.errors import DataError

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

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestGuard:
    """ASGI middleware in front of `path`: refuses, with a 4xx and a message, a POST of a
    content type other than `CONTENT_TYPES` (415), a body over `max_bytes` (413, counted as
    it arrives, also without a Content-Length) and JSON that does not parse (400); passes the
    rest on with its body replayed. LitServe would answer all three with a bare 500."""

    def __init__(self, app: ASGIApp, *, path: str = "/predict", max_bytes: int = 20_000_000) -> None:
        self.app = app
        self.path = path
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = await self._checked_body(headers, receive)
        except Rejected as err:
            await reply(send, err.status, str(err))
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # (a disconnect, after the body)

        await self.app(scope, replay, send)

    async def _checked_body(self, headers: dict[str, str], receive: Callable) -> bytes:
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type not in CONTENT_TYPES:
            raise Rejected(415, f"content type {content_type or '(none)'!r} is not accepted; {HOW_TO_SEND}")
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise Rejected(413, f"a body of {int(declared)} bytes is over the limit of {self.max_bytes} (--max_bytes)")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Rejected(400, "the client disconnected before the body was complete")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise Rejected(413, f"a body of more than {self.max_bytes} bytes is over the limit (--max_bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if content_type == "application/json":
            try:
                parsed = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise Rejected(400, f"the body is not JSON ({err}); {HOW_TO_SEND}") from None
            if not isinstance(parsed, dict):
                raise Rejected(400, f"the JSON body is a {type(parsed).__name__}, not an object; {HOW_TO_SEND}")
        return body


async def reply(send: Callable, status: int, message: str) -> None:
    """A JSON error response {"detail": message} (FastAPI's shape)."""
    body = json.dumps({"detail": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
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


class PredictorAPI(ls.LitAPI):
    """A checkpoint's predictor as a LitServe API: each worker loads it on its device;
    requests are decoded in the worker and the good ones of a batch predicted as one padded
    batch, the bad ones answered with their own 4xx.

    Args:
        ckpt_path: the checkpoint.
        max_batch_size, batch_timeout: LitServe's dynamic batching.
        max_pixels: largest image (width x height) decoded; 413 beyond.
        precision: the predictor's (`vitdense.load`).
    """

    def __init__(
        self,
        ckpt_path: str | Path,
        *,
        max_batch_size: int = 8,
        batch_timeout: float = 0.01,
        max_pixels: int = 40_000_000,
        precision: str = "32-true",
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.ckpt_path = str(ckpt_path)
        self.max_pixels = max_pixels
        self.precision = precision

    def setup(self, device: str) -> None:
        from vitdense.predictor import Predictor

        self.predictor = Predictor.from_checkpoint(
            self.ckpt_path, device=device, batch_size=self.max_batch_size, precision=self.precision
        )

    def decode_request(self, request) -> np.ndarray | Rejected:  # noqa: ANN001
        # (unannotated: LitServe then hands over the parsed JSON object or multipart form)
        return decode_request_image(request, self.max_pixels)

    def batch(self, inputs: list) -> list:
        return inputs

    def predict(self, inputs: Any) -> Any:
        images = inputs if isinstance(inputs, list) else [inputs]  # (a list when batching)
        good = [x for x in images if not isinstance(x, Rejected)]
        results = iter(self.predictor(good) if good else [])
        out = [x if isinstance(x, Rejected) else next(results) for x in images]
        return out if isinstance(inputs, list) else out[0]

    def unbatch(self, output: list) -> list:
        return output

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, Rejected):  # a response, not an exception: its batch's others are answered
            return JSONResponse({"detail": str(output)}, status_code=output.status)
        return output.to_dict()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m vitdense serve",
        description="Serve a checkpoint's predictor over HTTP (LitServe): POST /predict an image, GET /health.",
    )
    p.add_argument("--ckpt_path", required=True, help="a checkpoint written by `python -m vitdense fit`")
    p.add_argument("--host", default="0.0.0.0", help="interface to listen on (127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--accelerator", default="auto", choices=("auto", "cpu", "cuda", "mps"))
    p.add_argument("--devices", default="auto", help="how many devices to run workers on ('auto': all)")
    p.add_argument("--workers_per_device", type=int, default=1)
    p.add_argument("--max_batch_size", type=int, default=8, help="concurrent requests predicted as one batch")
    p.add_argument("--batch_timeout", type=float, default=0.01, help="seconds to wait for a batch to fill")
    p.add_argument("--max_bytes", type=int, default=20_000_000, help="largest request body (413 beyond)")
    p.add_argument("--max_pixels", type=int, default=40_000_000, help="largest image, width x height (413 beyond)")
    p.add_argument("--precision", default="32-true", help="32-true, bf16-mixed or auto (see vitdense.load)")
    p.add_argument("--timeout", type=float, default=30, help="seconds a request may wait before a 504")
    return p


def main(argv: list[str] | None = None) -> None:
    """`python -m vitdense serve ...`: load the checkpoint (failing early on a bad one), serve until stopped."""
    args = parser().parse_args(argv)
    from vitdense.checkpoint import Checkpoint
    from vitdense.predictor import inference_data

    found = Checkpoint(args.ckpt_path)  # a bad path or file: one line now, not in a worker later
    inference_data(found)
    devices = args.devices if args.devices == "auto" else int(args.devices)
    api = PredictorAPI(
        found.path,
        max_batch_size=args.max_batch_size,
        batch_timeout=args.batch_timeout,
        max_pixels=args.max_pixels,
        precision=args.precision,
    )
    metadata = {
        "task": found.task_class,
        "classes": found.task.get("class_names") or found.task.get("num_classes"),
        "max_bytes": args.max_bytes,
        "max_pixels": args.max_pixels,
        "max_batch_size": args.max_batch_size,
    }
    server = ls.LitServer(
        api,
        accelerator=args.accelerator,
        devices=devices,
        workers_per_device=args.workers_per_device,
        timeout=args.timeout,
        model_metadata=metadata,
        middlewares=[(RequestGuard, {"path": "/predict", "max_bytes": args.max_bytes})],
    )
    server.run(host=args.host, port=args.port, generate_client_file=False)


if __name__ == "__main__":
    main()
