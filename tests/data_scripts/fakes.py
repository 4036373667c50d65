"""Helpers of the data_scripts tests: a local HTTP server with Range support that can drop a download
halfway, the scripts loaded as modules, tiny images and archives."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

SCRIPTS = Path(__file__).parents[2] / "data_scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


@dataclass
class Server:
    """What the test server serves and saw.

    Attributes:
        root: folder served at `url`.
        requests: (path, Range header or None) of every GET, in order.
        drop_after: {path: n}: the first GET of `path` announces the whole file but sends only
            n bytes, then closes the connection.
        ignore_range: answer 200 with the whole file even to a Range request.
    """

    root: Path
    url: str = ""
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    drop_after: dict[str, int] = field(default_factory=dict)
    ignore_range: bool = False


def handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server.requests.append((self.path, self.headers.get("Range")))
            path = server.root / self.path.lstrip("/")
            if not path.is_file():
                self.send_error(404)
                return
            data = path.read_bytes()
            start = 0
            spec = self.headers.get("Range")
            if spec and not server.ignore_range:
                start = int(spec.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            cut = server.drop_after.pop(self.path, None)
            self.wfile.write(data[start:] if cut is None else data[start : start + cut])

        def log_message(self, *args) -> None:
            pass

    return Handler


def load_script(name: str) -> ModuleType:
    """data_scripts/<name>.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def jpeg_bytes(seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    """A tiny JPEG (width, height) with random pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def md5_of(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    """A zip archive at `path` holding `members` ({name: content}) as written, odd names included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data)
    return path


def tar_member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    """One member for make_tar: a regular file (`data`), a link (`kind`, `link`), a folder (DIRTYPE) ..."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, data


def make_tar(path: Path, members: dict[str, bytes] | list[tuple], mode: str = "w") -> Path:
    """A tar archive at `path` (`mode` "w:gz" for .tar.gz) from {name: content} or tar_member()s, names as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(members, dict):
        members = [tar_member(name, data) for name, data in members.items()]
    with tarfile.open(path, mode, format=tarfile.GNU_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def help_text(name: str) -> str:
    """What `python data_scripts/<name>.py --help` prints, run as users run it."""
    command = [sys.executable, str(SCRIPTS / f"{name}.py"), "--help"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout
