#!/usr/bin/env python
"""Prepare ImageNet-1k (ILSVRC2012) from the official tar files you downloaded, or verify a copy.

    python data_scripts/imagenet.py --tars ~/Downloads/imagenet --out data/imagenet
    python data_scripts/imagenet.py --tars DIR --splits val        # validation only (~6.3 GiB)
    python data_scripts/imagenet.py --verify data/imagenet

ImageNet cannot be downloaded without an account: sign in at
https://image-net.org/download-images.php, accept the terms of access and download the
three files listed below (ILSVRC2012, "Training images (Task 1 & 2)", "Validation images
(all tasks)" and "Development kit (Task 1 & 2)") into one folder, --tars.

The script then extracts the training tar (a tar of 1000 per-class tars nXXXXXXXX.tar, each
checked before extracting, as the outer one), sorts the 50000 flat validation images into
class folders using the devkit's ground truth (data/ILSVRC2012_validation_ground_truth.txt:
one ILSVRC2012_ID per image, in order; data/meta.mat maps an ID to its WordNet ID; the 1000
classes are the synsets without children), counts the images per split and decodes one per
split. <out>/.data_scripts.json records the result, so that running the command again does
nothing. Your tars are never modified or deleted. The devkit's MD5 is always checked; the
two image tars' only with --no-skip-checksums (reading ~145 GB takes a while).

The layout, which vitdense's ImageFolderDataModule reads (data.root = --out):

    <out>/train/<wnid>/<wnid>_<n>.JPEG              1281167 images, 1000 folders
    <out>/val/<wnid>/ILSVRC2012_val_<8 digits>.JPEG   50000 images, 1000 folders

Standalone: standard library, plus scipy to read meta.mat and Pillow to decode a sample.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import (  # noqa: E402
    Archive,
    DataScriptError,
    MissingArchiveError,
    check_folders,
    check_tar,
    count_files,
    extract_tar,
    human_size,
    make_parser,
    prepare,
    recorded,
    report,
    require_md5,
    run,
)

DATASET = "imagenet2012"
TERMS = "https://image-net.org/download-images.php"
LICENCE = "ImageNet terms of access: non-commercial research and education only; images belong to their owners"
#: the official files by what they hold; tests replace entries (md5) for their tiny tars
ARCHIVES = {
    "train": Archive("ILSVRC2012_img_train.tar", "", "1d675b47d978889d74fa0da5fadfb00e", 147_897_477_120,
                     LICENCE, TERMS),
    "val": Archive("ILSVRC2012_img_val.tar", "", "29b22e2961454d5413ddabcf34fc5622", 6_744_924_160, LICENCE, TERMS),
    "devkit": Archive("ILSVRC2012_devkit_t12.tar.gz", "", "fa75699e90414af021442c21a62c3abf", 2_568_145,
                      LICENCE, TERMS),
}  # fmt: skip
#: the files each split needs, in the order they are used
NEEDS = {"train": ("train",), "val": ("devkit", "val")}
#: .JPEG images per split folder; tests replace them
COUNTS = {"train": 1281167, "val": 50000}
META = "data/meta.mat"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG")


def archives_for(splits: Sequence[str]) -> list[Archive]:
    """The files each split needs: the training tar; the devkit and the validation tar."""
    return [ARCHIVES[key] for split in splits for key in NEEDS[split]]


def check(root: Path, archives: Sequence[Archive]) -> list[str]:
    """Problems with the split folders `archives` produce under `root`: image counts, a sample decoding."""
    splits = [split for split in COUNTS if ARCHIVES[split] in archives]
    return check_folders(root, {split: COUNTS[split] for split in splits}, "*/*.JPEG")


def require_tars(tars: Path, archives: Sequence[Archive], out: Path) -> None:
    """Raise MissingArchiveError naming every file of `archives` missing from `tars` (those an
    earlier run already prepared into `out` aside), before hours go into extracting the others."""
    missing = [a for a in archives if not (tars / a.name).is_file() and not recorded(out, DATASET, a)]
    if missing:
        names = ", ".join(f"{tars / a.name} (~{human_size(a.size)})" for a in missing)
        raise MissingArchiveError(
            f"{names}: not found. ImageNet cannot be downloaded without an account: sign in at {TERMS}, accept the "
            f"terms of access, download the missing files into {tars} and run this again"
            + ("; --splits val needs only the validation tar and the devkit" if missing == [ARCHIVES["train"]] else "")
        )


def locate(tars: Path, archive: Archive, skip_checksums: bool) -> Path:
    """The user's copy of `archive` in `tars`, its MD5 checked (always for the small devkit)."""
    path = tars / archive.name
    if not path.is_file():
        raise MissingArchiveError(f"{path}: not found (see --help)")
    if archive is ARCHIVES["devkit"] or not skip_checksums:
        require_md5(path, archive.md5)
    return path


def _member_bytes(tar: tarfile.TarFile, suffix: str, label: str) -> bytes:
    """The content of the one regular-file member of `tar` whose path ends with `suffix`."""
    for member in tar.getmembers():
        if member.isfile() and member.name.endswith(suffix):
            return tar.extractfile(member).read()
    raise DataScriptError(f"{label}: no {suffix} in it; is this the ILSVRC2012 devkit (task 1 & 2)?")


def read_devkit(path: Path) -> list[str]:
    """The WordNet ID of every validation image, from the devkit (index 0: ILSVRC2012_val_00000001).

    meta.mat's `synsets` map an ILSVRC2012_ID to a WNID; the classes are the synsets without
    children. Read from the archive, nothing is extracted.
    """
    from scipy.io import loadmat

    with tarfile.open(path) as tar:
        meta, truth = (_member_bytes(tar, suffix, str(path)) for suffix in (META, GROUND_TRUTH))
    synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
    wnids = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets.ravel() if int(s["num_children"]) == 0}
    labels = []
    for line_number, line in enumerate(truth.decode().split(), start=1):
        if int(line) not in wnids:
            raise DataScriptError(
                f"{path}: {GROUND_TRUTH} line {line_number} names ILSVRC2012_ID {line}, which is not one of the "
                f"{len(wnids)} leaf synsets of {META}; the devkit is damaged"
            )
        labels.append(wnids[int(line)])
    print(f"{path}: {len(wnids)} classes, {len(labels)} validation labels", file=sys.stderr)
    return labels


def extract_train(path: Path, out: Path) -> None:
    """Extract the tar of per-class tars `path` into `out/<wnid>/`, checking the outer and every inner tar.

    A class folder holding as many files as its tar (from an interrupted earlier run) is kept."""
    with tarfile.open(path) as outer:
        check_tar(outer, out, str(path))
        members = [m for m in outer.getmembers() if m.isfile()]
        for done, member in enumerate(members, start=1):
            if not member.name.endswith(".tar"):
                raise DataScriptError(
                    f"{path}: member {member.name!r} is not a per-class tar; is this the training tar?"
                )
            folder = out / PurePosixPath(member.name).name.removesuffix(".tar")
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                expected = sum(1 for m in inner.getmembers() if m.isfile())
                if not (folder.is_dir() and count_files(folder, "*") == expected):
                    extract_tar(inner, folder, f"{path}:{member.name}")
            print(
                f"\r  train: {done}/{len(members)} classes", end="\n" if done == len(members) else "", file=sys.stderr
            )


def sort_val(path: Path, out: Path, labels: Sequence[str]) -> None:
    """Extract the flat validation tar `path` into `out/<wnid>/`, `labels[i]` being image i + 1's class."""

    def destination(name: str) -> str:
        base = PurePosixPath(name).name
        match = VAL_NAME.fullmatch(base)
        if match is None:
            raise DataScriptError(f"{path}: member {name!r} is not named ILSVRC2012_val_<8 digits>.JPEG")
        index = int(match[1]) - 1
        if not 0 <= index < len(labels):
            raise DataScriptError(f"{path}: {name} has no label: the devkit's ground truth has {len(labels)} lines")
        return f"{labels[index]}/{base}"

    with tarfile.open(path) as tar:
        extract_tar(tar, out, str(path), rename=destination)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, ARCHIVES.values(), "data/imagenet", None)
    parser.add_argument("--tars", type=Path, metavar="DIR", help="folder holding the official files listed below")
    parser.add_argument(
        "--splits", nargs="+", choices=list(COUNTS), default=list(COUNTS), help="splits to prepare (default: train val)"
    )
    parser.add_argument(
        "--skip-checksums",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="skip the MD5 of the two image tars (default; reading ~145 GB takes long); the devkit's is always checked",
    )
    args = parser.parse_args(argv)
    archives = archives_for(args.splits)
    if args.verify is not None:
        return report(check(args.verify, archives), args.verify)
    if args.tars is None:
        parser.error(f"--tars DIR is required: the folder holding the files you downloaded from {TERMS}")

    labels: list[str] = []  # the devkit's validation labels, read once

    def unpack(archive: Archive, path: Path) -> None:
        if archive is ARCHIVES["train"]:
            extract_train(path, args.out / "train")
        elif archive is ARCHIVES["val"]:
            sort_val(path, args.out / "val", labels or read_devkit(args.tars / ARCHIVES["devkit"].name))
        else:
            labels[:] = read_devkit(path)  # before the validation tar: a damaged devkit fails early

    def prepare_all() -> int:
        require_tars(args.tars, archives, args.out)
        return prepare(
            DATASET,
            args.out,
            archives,
            obtain=lambda archive: locate(args.tars, archive, args.skip_checksums),
            unpack=unpack,
            check=lambda chosen: check(args.out, chosen),
            counts={split: COUNTS[split] for split in args.splits},
            force=args.force,
        )

    return run(prepare_all)


if __name__ == "__main__":
    sys.exit(main())
