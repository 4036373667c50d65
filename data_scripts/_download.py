"""Shared helpers of the dataset scripts: resumable downloads, checksums, safe extraction, checks.

Standard library only (plus Pillow, a dependency of vitdense, to decode one sample image), so
that `python data_scripts/<dataset>.py --help` works in any Python 3.10+.

The flow every script follows (`prepare`):

1. if `<out>/.data_scripts.json` records the requested archives and the extracted files still
   pass their checks, print "already present and verified" and stop (no network);
2. per archive: obtain it (download with resume, or find the user's copy), check its MD5,
   extract it after checking every member (nothing may land outside the target folder);
3. check the result (files per split, one sample per split decodes), record it in the marker,
   delete the downloaded archives unless `--keep-archives`.
"""

from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import http.client
import json
import os
import posixpath
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

MARKER = ".data_scripts.json"
#: seconds to wait before the first retry of a dropped download (then twice as long, ...)
RETRY_WAIT = 1.0
#: seconds between two updates of the progress line
PROGRESS_EVERY = 0.5
_CHUNK = 1 << 20


class DataScriptError(Exception):
    """A problem the user can act on; the scripts print its message and exit with status 1."""


class ChecksumError(DataScriptError, ValueError):
    """An archive's checksum differs from the published one."""


class UnsafeArchiveError(DataScriptError, ValueError):
    """An archive member would be written outside the target folder, or is a device or fifo."""


class MissingArchiveError(DataScriptError, FileNotFoundError):
    """An archive the user has to provide is not there."""


class DownloadError(DataScriptError, OSError):
    """A download failed for good (after retries, or with an HTTP error)."""


@dataclass(frozen=True)
class Archive:
    """One official archive of a dataset.

    Attributes:
        name: file name on disk, e.g. "val2017.zip".
        path: location relative to the dataset's base URL, e.g. "zips/val2017.zip".
        md5: the published (or widely used) MD5 of the official file; "" where none is published
            (the download is then not checked: its MD5 and SHA-256 are printed for the user's records).
        size: approximate size in bytes (for --help, free-space warnings and progress when
            the server sends no length).
        licence: short licence / terms text for --help.
        terms: URL of the full terms.
    """

    name: str
    path: str
    md5: str
    size: int
    licence: str
    terms: str

    def url(self, base_url: str) -> str:
        """The archive's URL under `base_url` (the official host or a mirror)."""
        return base_url.rstrip("/") + "/" + self.path.lstrip("/")


def human_size(size: float) -> str:
    """`size` bytes in binary units, e.g. "18.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- checksums


def checksums(path: Path) -> dict[str, str]:
    """MD5 and SHA-256 of a file, read once."""
    digests = {name: hashlib.new(name) for name in ("md5", "sha256")}
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            for digest in digests.values():
                digest.update(chunk)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def md5_of(path: Path) -> str:
    """`path`'s MD5, with MD5 and SHA-256 printed (the latter for users' records)."""
    print(f"checking {path} ({human_size(path.stat().st_size)})", file=sys.stderr)
    sums = checksums(path)
    print(f"  md5    {sums['md5']}\n  sha256 {sums['sha256']}", file=sys.stderr)
    return sums["md5"]


def require_md5(path: Path, md5: str) -> None:
    """Raise ChecksumError unless `path`'s MD5 is `md5` (the file is left where it is)."""
    actual = md5_of(path)
    if actual != md5.lower():
        raise ChecksumError(
            f"{path}: MD5 {actual}, expected {md5}; the file is damaged or not the official "
            "archive: download it again (--help says where)"
        )


# --------------------------------------------------------------------------- download


class _Progress:
    """A carriage-return progress line on stderr: bytes, percent, MB/s; at most every PROGRESS_EVERY s."""

    def __init__(self, name: str, start: int, total: int | None) -> None:
        self.name, self.start, self.total = name, start, total
        self.began = self.last = time.monotonic()

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        rate = (done - self.start) / max(now - self.began, 1e-6) / 1e6
        of = f" / {human_size(self.total)} ({100 * done / self.total:5.1f}%)" if self.total else ""
        print(f"\r  {self.name}: {human_size(done)}{of}  {rate:6.1f} MB/s", end="\n" if final else "", file=sys.stderr)
        sys.stderr.flush()


def _content_total(response: http.client.HTTPResponse, offset: int) -> int | None:
    """Full size of the file from a 200's Content-Length or a 206's Content-Range."""
    content_range = response.headers.get("Content-Range", "")
    if content_range.startswith("bytes ") and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None


def _fetch_once(url: str, part: Path, size: int | None, timeout: float) -> None:
    """One request appending to `part` from its current length; raises on a short read."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:  # nothing left to send: the .part is complete (or too long)
            return
        raise DownloadError(f"{url}: HTTP {err.code} {err.reason}") from err
    with response:
        if offset and response.status == 200:
            print(f"  {url}: the server ignores ranges; starting again from 0", file=sys.stderr)
            offset = 0
        elif offset and not response.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
            raise DownloadError(f"{url}: asked for bytes {offset}-, got {response.headers.get('Content-Range')}")
        total = _content_total(response, offset) or size
        name = part.name.removesuffix(".part")
        if offset:
            print(f"  resuming {name} at {human_size(offset)}", file=sys.stderr)
        progress = _Progress(name, offset, total)
        done = offset
        with open(part, "ab" if offset else "wb") as out:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                done += len(chunk)
                progress.update(done)
        progress.update(done, final=True)
    if total and done < total and response.headers.get("Content-Length"):
        raise ConnectionError(f"connection closed after {done:,} of {total:,} bytes")


def download(url: str, dest: Path, md5: str, size: int | None = None, retries: int = 5, timeout: float = 60) -> Path:
    """Download `url` to `dest`, resuming, and check its MD5.

    Data goes to `<dest>.part`; an existing `.part` is resumed with `Range: bytes=N-` (a
    server answering 200 restarts it from 0, one answering 416 has nothing left to send). A
    dropped connection is resumed up to `retries` times. When the MD5 matches, `.part`
    becomes `dest`; when not, it becomes `<dest>.bad` (kept for inspection) and
    ChecksumError says what to do. A `dest` already present with the right MD5 is kept
    without any request.

    Args:
        size: expected size in bytes, for the progress line when the server sends none.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, bad = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".bad")
    if dest.exists():
        if not md5:  # nothing to compare with; only a complete download is ever renamed to dest
            print(f"{dest}: present (no checksum is published); not downloading it again", file=sys.stderr)
            return dest
        if md5_of(dest) == md5.lower():
            print(f"{dest}: present with the right MD5; not downloading it again", file=sys.stderr)
            return dest
        dest.replace(bad)
        print(f"{dest}: wrong MD5; moved aside to {bad}, downloading it again", file=sys.stderr)
    if size and shutil.disk_usage(dest.parent).free < size - (part.stat().st_size if part.exists() else 0):
        print(f"WARNING: {dest.parent} has less free space than the {human_size(size)} of {url}", file=sys.stderr)
    print(f"downloading {url} -> {dest}", file=sys.stderr)
    for attempt in range(retries + 1):
        try:
            _fetch_once(url, part, size, timeout)
            break
        except (ConnectionError, TimeoutError, http.client.HTTPException, urllib.error.URLError) as err:
            if isinstance(err, urllib.error.HTTPError) or attempt == retries:
                raise DownloadError(
                    f"{url}: download failed ({err}); {part} keeps what arrived: run the script again to resume"
                ) from err
            wait = RETRY_WAIT * 2**attempt
            print(f"\n  {url}: {err}; resuming in {wait:.0f} s ({attempt + 1}/{retries})", file=sys.stderr)
            time.sleep(wait)
    actual = md5_of(part)
    if md5 and actual != md5.lower():
        part.replace(bad)
        raise ChecksumError(
            f"{url}: the downloaded file has MD5 {actual}, expected {md5}; it is corrupt or not the official "
            f"archive. Kept aside as {bad} (not used; delete it when done). Run the script again to download it "
            "afresh, or use --base-url for another mirror"
        )
    part.replace(dest)
    return dest


# --------------------------------------------------------------------------- safe extraction


def _inside(out: str, relative: str) -> bool:
    """Whether `relative` (a POSIX path, `..` allowed) joined to `out` stays within `out`, lexically."""
    joined = posixpath.normpath(posixpath.join(out, relative))
    return joined == out or joined.startswith(out.rstrip("/") + "/")


def _path_problem(name: str, out: str) -> str | None:
    """Why member `name` may not be extracted into `out`, or None."""
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        return "has an absolute path"
    if not _inside(out, name.replace("\\", "/")):
        return "climbs out of the target folder with '..'"
    return None


def _tar_member_problem(member: tarfile.TarInfo, out: str) -> str | None:
    """Why tar `member` may not be extracted into `out` (path, link target or type), or None."""
    problem = _path_problem(member.name, out)
    if problem:
        return problem
    if member.ischr() or member.isblk() or member.isfifo():
        return "is a device or fifo"
    if member.issym():
        if PurePosixPath(member.linkname).is_absolute():
            return f"is a symlink to the absolute path {member.linkname!r}"
        # a symlink's target is relative to the folder holding it
        if not _inside(out, posixpath.join(posixpath.dirname(member.name), member.linkname)):
            return f"is a symlink to {member.linkname!r}, outside the target folder"
    if member.islnk():
        # a hard link's target is relative to the archive's root
        if PurePosixPath(member.linkname).is_absolute() or not _inside(out, member.linkname):
            return f"is a hard link to {member.linkname!r}, outside the target folder"
    return None


def _below_link(name: str, links: set[str]) -> bool:
    """Whether `name` lies below one of the archive's own symlinks (which could point anywhere later)."""
    parts = PurePosixPath(posixpath.normpath(name)).parts
    return any(posixpath.join(*parts[:i]) in links for i in range(1, len(parts)))


def _refusal(label: str, name: str, problem: str, out: Path) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{label}: member {name!r} {problem}; refusing to extract anything from this archive (target {out}); "
        "the official archives hold no such member: get the file again"
    )


def check_tar(tar: tarfile.TarFile, out: Path, label: str, rename: Callable[[str], str | None] | None = None) -> None:
    """Raise UnsafeArchiveError naming `label` and the member if any member of `tar` is unsafe.

    Unsafe: an absolute path, `..` leading out of `out`, a symlink or hard link whose target
    is outside `out`, a device or fifo, or a path through one of the archive's own symlinks.
    With `rename`, the renamed paths are checked too.
    """
    root = posixpath.normpath(out.resolve().as_posix())
    members = tar.getmembers()
    links = {posixpath.normpath(m.name) for m in members if m.issym() or m.islnk()}
    for member in members:
        problem = _tar_member_problem(member, root)
        if problem is None and _below_link(member.name, links):
            problem = "lies below a link of the same archive"
        new_name = rename(member.name) if rename and member.isfile() else None
        if problem is None and new_name is not None:
            problem = _path_problem(new_name, root)
        if problem:
            raise _refusal(label, member.name, problem, out)


def extract_tar(tar: tarfile.TarFile, out: Path, label: str, rename: Callable[[str], str | None] | None = None) -> int:
    """Check every member of `tar` (check_tar), then extract it into `out`; returns the number of members.

    `rename` maps a regular file's name to the path it gets under `out` (None: skip it); other
    members are skipped when it is given. tarfile's "data" filter, where available, guards a
    second time (and drops set-uid bits and the like).
    """
    check_tar(tar, out, label, rename)
    out.mkdir(parents=True, exist_ok=True)
    guard = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    count = 0
    for member in tar.getmembers():
        if rename is not None:
            new_name = rename(member.name) if member.isfile() else None
            if new_name is None:
                continue
            member = copy.copy(member)
            member.name = new_name
        tar.extract(member, out, **guard)
        count += 1
    return count


def check_zip(
    archive: zipfile.ZipFile, out: Path, label: str, rename: Callable[[str], str | None] | None = None
) -> None:
    """Raise UnsafeArchiveError naming `label` and the member if a member's path is absolute or climbs out
    (with `rename`, the renamed path of each file too)."""
    root = posixpath.normpath(out.resolve().as_posix())
    for info in archive.infolist():
        problem = _path_problem(info.filename, root)
        new_name = rename(info.filename) if rename and not info.is_dir() else None
        if problem is None and new_name is not None:
            problem = _path_problem(new_name, root)
        if problem:
            raise _refusal(label, info.filename, problem, out)


def extract_zip(archive: Path, out: Path, rename: Callable[[str], str | None] | None = None) -> int:
    """Check every member of the zip `archive` (check_zip), then extract it into `out`; returns the
    number of members written.

    `rename` maps a file's name to the path it gets under `out` (None: skip it); folders are then
    created as their files need them (as extract_tar's `rename`)."""
    with zipfile.ZipFile(archive) as zf:
        check_zip(zf, out, str(archive), rename)
        out.mkdir(parents=True, exist_ok=True)
        if rename is None:
            zf.extractall(out)
            return len(zf.namelist())
        count = 0
        for info in zf.infolist():
            new_name = None if info.is_dir() else rename(info.filename)
            if new_name is None:
                continue
            target = out / new_name
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
            count += 1
        return count


def extract(archive: Path, out: Path) -> int:
    """Extract a zip or tar(.gz) archive into `out` after checking every member; returns the member count.

    Raises:
        UnsafeArchiveError: a member is unsafe (see check_tar, check_zip); nothing is written.
        DataScriptError: `archive` is neither a zip nor a tar archive.
    """
    print(f"extracting {archive} -> {out}", file=sys.stderr)
    if zipfile.is_zipfile(archive):
        return extract_zip(archive, out)
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            return extract_tar(tf, out, str(archive))
    raise DataScriptError(f"{archive}: neither a zip nor a tar archive; delete it and run again")


# --------------------------------------------------------------------------- checks of the result


def count_files(folder: Path, pattern: str) -> int:
    """Number of files matching the glob `pattern` (e.g. "*.jpg", "*/*.JPEG") below `folder`."""
    return sum(1 for _ in glob.iglob(os.path.join(glob.escape(str(folder)), pattern)))


def check_counts(root: Path, expected: dict[str, int], pattern: str, decode: bool = False) -> list[str]:
    """Problems with the number of `pattern` files in each folder `root/<key>` (empty when all match);
    with `decode`, the first of each folder (by name) must decode too."""
    problems = []
    for folder, count in expected.items():
        path = root / folder
        if not path.is_dir():
            problems.append(f"{path}: missing folder (expected {count} files matching {pattern})")
            continue
        files = glob.glob(os.path.join(glob.escape(str(path)), pattern))
        if len(files) != count:
            problems.append(f"{path}: {len(files)} files matching {pattern}, expected {count}")
        if decode and files:
            problems += check_decodes(Path(min(files)))
    return problems


def check_decodes(path: Path) -> list[str]:
    """Problems decoding the image `path` with Pillow (empty when it decodes)."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, SyntaxError, ValueError) as err:
        return [f"{path}: does not decode as an image ({err})"]
    return []


def check_folders(root: Path, expected: dict[str, int], pattern: str) -> list[str]:
    """check_counts, and one sample per folder must decode."""
    return check_counts(root, expected, pattern, decode=True)


def check_files(root: Path, names: Iterable[str]) -> list[str]:
    """Problems with the files `root/<name>`: missing or empty."""
    problems = []
    for name in names:
        path = root / name
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{path}: {'empty file' if path.is_file() else 'missing file'}")
    return problems


def report(problems: Sequence[str], root: Path) -> int:
    """Print `problems` on stderr; the exit status (0 when there are none)."""
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if problems:
        print(f"{root}: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"{root}: complete and checked")
    return 0


# --------------------------------------------------------------------------- marker and the common flow


def read_marker(out: Path) -> dict:
    """The marker's content, or {} when it is missing or unreadable."""
    try:
        return json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def write_marker(out: Path, dataset: str, archives: Sequence[Archive], counts: dict[str, int]) -> None:
    """Record in `<out>/.data_scripts.json` that `archives` were extracted and `counts` checked (merged with
    what an earlier run recorded for the same dataset)."""
    old = read_marker(out)
    old = old if old.get("dataset") == dataset else {}
    record = {
        "dataset": dataset,
        "archives": old.get("archives", {}) | {a.name: a.md5 for a in archives},
        "counts": old.get("counts", {}) | counts,
        "verified": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (out / MARKER).write_text(json.dumps(record, indent=2) + "\n")


def recorded(out: Path, dataset: str, archive: Archive) -> bool:
    """Whether the marker records `archive` (same MD5) as extracted and checked for `dataset`."""
    marker = read_marker(out)
    return marker.get("dataset") == dataset and marker.get("archives", {}).get(archive.name) == archive.md5


def prepare(
    dataset: str,
    out: Path,
    archives: Sequence[Archive],
    obtain: Callable[[Archive], Path],
    unpack: Callable[[Archive, Path], object],
    check: Callable[[Sequence[Archive]], list[str]],
    counts: dict[str, int],
    force: bool = False,
    delete_archives: bool = False,
) -> int:
    """The common flow (see the module's docstring); returns the exit status.

    Args:
        obtain: the local path of an archive (downloading it, or finding the user's copy).
        unpack: extracts an obtained archive into place.
        check: problems with what the given archives produce under `out` (empty: complete).
        counts: what the check expects, recorded in the marker.
        force: ignore the marker: obtain, extract and check everything again.
        delete_archives: delete the obtained archives once everything checked out.
    """
    todo = [a for a in archives if force or not (recorded(out, dataset, a) and not check([a]))]
    if not todo:
        print(f"already present and verified: {out}")
        return 0
    for archive in archives:
        if archive not in todo:
            print(f"{archive.name}: already extracted and verified in {out}; skipping it", file=sys.stderr)
    paths = []
    for archive in todo:
        path = obtain(archive)
        unpack(archive, path)
        paths.append(path)
    status = report(check(archives), out)
    if status == 0:
        write_marker(out, dataset, archives, counts)
        if delete_archives:
            for path in paths:
                print(f"deleting {path} (--keep-archives keeps it)", file=sys.stderr)
                path.unlink()
    return status


def run(main: Callable[[], int]) -> int:
    """Call a script's `main`, turning a DataScriptError into its message and exit status 1."""
    try:
        return main()
    except DataScriptError as err:
        print(f"\nerror: {err}", file=sys.stderr)
        return 1


def archives_epilog(archives: Iterable[Archive], note: str = "") -> str:
    """--help's list of archives: name, size, MD5, licence and the URL of the terms."""
    lines = ["archives (sizes approximate):"]
    for a in archives:
        checksum = f"md5 {a.md5}" if a.md5 else "no checksum published"
        lines += [f"  {a.name:32s} ~{human_size(a.size):11s} {checksum}", f"      licence: {a.licence}"]
        lines += [f"      terms:   {a.terms}"]
    return "\n".join(lines) + ("\n\n" + note if note else "")


def make_parser(
    doc: str, archives: Iterable[Archive], default_out: str, base_url: str | None, note: str = ""
) -> argparse.ArgumentParser:
    """The options every script shares; `base_url` None for a dataset that cannot be downloaded
    (no --base-url, --keep-archives: the user's own archives are never deleted)."""
    parser = argparse.ArgumentParser(
        description=doc, epilog=archives_epilog(archives, note), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(default_out), help=f"target folder (default: {default_out})")
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"ignore <out>/{MARKER} (the record of an earlier complete run) and extract and check again",
    )
    parser.add_argument(
        "--verify", type=Path, metavar="ROOT", help="only check an existing copy at ROOT (no download, no marker)"
    )
    if base_url is not None:
        parser.add_argument(
            "--archives",
            type=Path,
            metavar="DIR",
            help="folder for the archives (default: <out>); an archive already there with the right MD5 is used",
        )
        parser.add_argument(
            "--keep-archives",
            action="store_true",
            help="keep the archives after a successful extraction and check (default: delete them to free space)",
        )
        parser.add_argument("--base-url", default=base_url, help=f"mirror to download from (default: {base_url})")
    return parser


def prepare_download(
    dataset: str,
    args: argparse.Namespace,
    archives: Sequence[Archive],
    check: Callable[[Sequence[Archive]], list[str]],
    counts: dict[str, int],
) -> int:
    """`prepare` for datasets downloaded from `args.base_url` into `args.archives` (default `args.out`) and
    extracted into `args.out`, with the options of make_parser."""
    folder = args.archives or args.out
    return prepare(
        dataset,
        args.out,
        archives,
        obtain=lambda a: download(a.url(args.base_url), folder / a.name, a.md5, a.size),
        unpack=lambda a, path: extract(path, args.out),
        check=check,
        counts=counts,
        force=args.force,
        delete_archives=not args.keep_archives,
    )
