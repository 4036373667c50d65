#!/usr/bin/env python
"""Download, check and extract ADE20K's SceneParsing data (ADEChallengeData2016), or verify a copy.

    python data_scripts/ade20k.py                       # -> data/ade/ADEChallengeData2016
    python data_scripts/ade20k.py --out /datasets/ade   # elsewhere
    python data_scripts/ade20k.py --verify data/ade/ADEChallengeData2016 [--deep]

The archive (roughly 1 GB) comes from MIT's server. MIT publishes no checksum; the MD5 and
SHA-1 below are the ones torchvision-style ADE20K loaders, GluonCV's and Segmenter's
preparation scripts check against. The SHA-256 is printed for your records.

The extracted layout, which vitdense's ADE20KDataModule reads:

    ADEChallengeData2016/images/{training,validation}/ADE_*.jpg
    ADEChallengeData2016/annotations/{training,validation}/ADE_*.png   (0 = other, 1..150 = classes)

Standalone: standard library, plus numpy and Pillow for `--deep`.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

URL = "http://data.csail.mit.edu/places/ADEchallenge/ADEChallengeData2016.zip"
MD5 = "7328b3957e407ddae1d3cbf487f149ef"
SHA1 = "219e1696abb36c8ba3a3afe7fb2f4b4606a897c7"
FOLDER = "ADEChallengeData2016"
#: images (and as many annotations) per split
COUNTS = {"training": 20210, "validation": 2000}
NUM_CLASSES = 150


def download(url: str, dest: Path) -> None:
    """Stream `url` to `dest` through a `.part` file, so an interrupted download never looks complete."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {url} -> {dest}")
    with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done, last = 0, 0.0
        while chunk := response.read(1 << 20):
            out.write(chunk)
            done += len(chunk)
            if time.monotonic() - last > 2:
                last = time.monotonic()
                share = f" ({100 * done / total:.0f}%)" if total else ""
                print(f"  {done / 2**20:,.0f} MiB{share}", flush=True)
    if total and done != total:
        raise OSError(f"{url}: got {done} bytes of {total}; run again to retry")
    part.replace(dest)


def checksums(path: Path) -> dict[str, str]:
    """MD5, SHA-1 and SHA-256 of a file, in one pass."""
    digests = {name: hashlib.new(name) for name in ("md5", "sha1", "sha256")}
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            for digest in digests.values():
                digest.update(chunk)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def check_archive(path: Path) -> None:
    """Raise if the archive's MD5 or SHA-1 differ from the known ones; print all three digests."""
    print(f"checking {path} ({path.stat().st_size:,} bytes)")
    sums = checksums(path)
    for name, value in sums.items():
        print(f"  {name:6s} {value}")
    if sums["md5"] != MD5 or sums["sha1"] != SHA1:
        raise ValueError(
            f"{path}: checksum mismatch (expected md5 {MD5}, sha1 {SHA1}); the download is corrupt or "
            "truncated: delete it and run again"
        )


def extract(archive: Path, out: Path) -> Path:
    """Extract `archive` into `out`, refusing members that would land outside it."""
    out = out.resolve()
    print(f"extracting {archive} -> {out}")
    with zipfile.ZipFile(archive) as zf:
        for member in zf.namelist():
            if not (out / member).resolve().is_relative_to(out):
                raise ValueError(f"{archive}: member {member!r} points outside {out}; refusing to extract")
        zf.extractall(out)
    return out / FOLDER


def verify(root: Path, deep: bool = False) -> list[str]:
    """Problems with an extracted ADEChallengeData2016 folder (an empty list when it is complete).

    Checks that every split holds the expected number of images, that images and annotations
    pair up by name and, with `deep`, that every annotation is a single-channel PNG of its
    image's size with labels in 0..150 (slow: reads every file).
    """
    problems: list[str] = []
    if not root.is_dir():
        return [f"{root}: no such directory; expected the extracted {FOLDER} folder"]
    for split, expected in COUNTS.items():
        image_dir, ann_dir = root / "images" / split, root / "annotations" / split
        missing = [d for d in (image_dir, ann_dir) if not d.is_dir()]
        if missing:
            problems += [f"{d}: missing folder" for d in missing]
            continue
        images = {p.stem: p for p in image_dir.glob("*.jpg")}
        annotations = {p.stem: p for p in ann_dir.glob("*.png")}
        if len(images) != expected:
            problems.append(f"{image_dir}: {len(images)} .jpg images, expected {expected}")
        if len(annotations) != expected:
            problems.append(f"{ann_dir}: {len(annotations)} .png annotations, expected {expected}")
        for stems, folder, what in (
            (sorted(images.keys() - annotations.keys()), ann_dir, "annotations"),
            (sorted(annotations.keys() - images.keys()), image_dir, "images"),
        ):
            if stems:
                shown = ", ".join(stems[:5]) + (", ..." if len(stems) > 5 else "")
                problems.append(f"{folder}: {len(stems)} {what} missing ({shown})")
        if deep:
            problems += _deep_check(images, annotations)
        print(f"{split}: {len(images)} images, {len(annotations)} annotations")
    return problems


def _deep_check(images: dict[str, Path], annotations: dict[str, Path]) -> list[str]:
    import numpy as np
    from PIL import Image

    problems = []
    for stem in sorted(images.keys() & annotations.keys()):
        try:
            with Image.open(images[stem]) as img:
                size = img.size
            with Image.open(annotations[stem]) as ann:
                mode, ann_size, labels = ann.mode, ann.size, np.asarray(ann)
        except OSError as err:
            problems.append(f"{stem}: unreadable ({err})")
            continue
        if mode not in ("L", "P"):
            problems.append(f"{annotations[stem]}: mode {mode}, expected a single-channel PNG")
        elif labels.max() > NUM_CLASSES:
            problems.append(f"{annotations[stem]}: label {labels.max()} above {NUM_CLASSES}")
        if ann_size != size:
            problems.append(f"{annotations[stem]}: {ann_size} but its image is {size} (W, H)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("data/ade"), help="folder to extract into (default: data/ade)")
    parser.add_argument("--zip", type=Path, default=None, help="archive path (default: <out>/ADEChallengeData2016.zip)")
    parser.add_argument("--keep-zip", action="store_true", help="keep the archive after extracting it")
    parser.add_argument("--verify", type=Path, metavar="ROOT", help="only verify an extracted ADEChallengeData2016")
    parser.add_argument("--deep", action="store_true", help="with verification, also read every annotation")
    args = parser.parse_args(argv)

    if args.verify is None:
        archive = args.zip or args.out / f"{FOLDER}.zip"
        if archive.exists():
            print(f"{archive} exists; not downloading it again")
        else:
            download(URL, archive)
        check_archive(archive)
        root = extract(archive, args.out)
        if not args.keep_zip:
            archive.unlink()
    else:
        root = args.verify
    problems = verify(root, deep=args.deep)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if problems:
        print(f"{root}: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"{root}: complete ({', '.join(f'{n} {s}' for s, n in COUNTS.items())} images with annotations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
