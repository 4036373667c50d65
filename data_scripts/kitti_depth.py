#!/usr/bin/env python
"""Download and lay out KITTI's Eigen split for depth as BTS lays it out (the layout DPT's, AdaBins',
ZoeDepth's and Depth Anything's KITTI code read, and vitdense's KITTIDepthDataModule), or verify a copy.

    python data_scripts/kitti_depth.py                  # -> data/kitti (training + test: 61 drives)
    python data_scripts/kitti_depth.py --test-only      # Eigen's test split only (its 28 drives)
    python data_scripts/kitti_depth.py --verify data/kitti [--test-only]

Sources (downloads resume where they stopped: run the command again):

    eigen_{train,test}_files_with_gt.txt, kitti_archives_to_download.txt
                                 BTS's split files and its list of KITTI's raw-data archives, from
                                 cleinc/bts at commit 5e3406b (raw URLs pinned to it)
    data_depth_annotated.zip     KITTI's annotated depth maps (14 GB, KITTI's server); its train/
                                 and val/ folders are merged into <out>/data_depth_annotated/
    <date>_drive_<nnnn>_sync.zip KITTI's raw data (synced + rectified), one archive per drive the
                                 chosen split files use (the URLs BTS's list gives), into <out>/raw/

Only what the split files use is kept: the left colour camera (image_02) of each raw drive (the
other cameras, the Velodyne scans and OXTS are skipped), and image_02's depth maps of those
drives. Each archive is deleted once extracted and checked (--keep-archives keeps them); a drive
already extracted and checked is not downloaded again when a later one fails. (--test-only and
then a full run downloads data_depth_annotated.zip again unless --keep-archives kept it.)

Checksums: KITTI publishes none; its downloads are not checked (their MD5 and SHA-256 are
printed, for your records) and the result is checked instead: every image and depth map the
split files list must exist. The three small files' MD5s were computed here from the git blobs
of the pinned commit, whose content cannot change.

Terms: KITTI is CC BY-NC-SA 3.0 (non-commercial) and asks you to register at cvlibs.net
before downloading; cite Geiger et al., IJRR 2013 and Uhrig et al., 3DV 2017 (the depth maps).

Needs only the standard library and Pillow. <out>/.data_scripts.json records a complete run,
so that running the command again does nothing.

    <out>/raw/2011_09_26/2011_09_26_drive_0002_sync/image_02/data/0000000069.png
    <out>/data_depth_annotated/2011_09_26_drive_0002_sync/proj_depth/groundtruth/image_02/0000000069.png
    <out>/eigen_train_files_with_gt.txt, eigen_test_files_with_gt.txt
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import (  # noqa: E402
    Archive,
    DataScriptError,
    check_decodes,
    download,
    extract_zip,
    make_parser,
    prepare,
    report,
    run,
    write_marker,
)

DATASET = "kitti_eigen"
BTS = "https://raw.githubusercontent.com/cleinc/bts/5e3406b35d1497b2e55d2dd600524d1f4efacaed"
BTS_TERMS = "https://github.com/cleinc/bts (GPL-3.0)"
KITTI_TERMS = "https://www.cvlibs.net/datasets/kitti/raw_data.php (register at cvlibs.net)"
KITTI_LICENCE = "KITTI: CC BY-NC-SA 3.0 (non-commercial); cite Geiger et al. (raw) and Uhrig et al. (depth)"
TRAIN_LIST = Archive(
    "eigen_train_files_with_gt.txt",
    f"{BTS}/train_test_inputs/eigen_train_files_with_gt.txt",
    "bb76b2f96dfaac75d6f860370924a261",
    3_467_886,
    "BTS's split file",
    BTS_TERMS,
)
TEST_LIST = Archive(
    "eigen_test_files_with_gt.txt",
    f"{BTS}/train_test_inputs/eigen_test_files_with_gt.txt",
    "031e751e34f3411e16f9d3f8aa3a67fc",
    101_394,
    "BTS's split file",
    BTS_TERMS,
)
RAW_LIST = Archive(
    "kitti_archives_to_download.txt",
    f"{BTS}/utils/kitti_archives_to_download.txt",
    "0d356fe7919588b7e10e8bf1e0638fd4",
    7_100,
    "BTS's list of KITTI's raw-data archives",
    BTS_TERMS,
)
ANNOTATED = Archive(
    "data_depth_annotated.zip",
    "https://s3.eu-central-1.amazonaws.com/avg-kitti/data_depth_annotated.zip",
    "",  # none published
    14_000_000_000,  # KITTI's page says 14 GB
    KITTI_LICENCE,
    "https://www.cvlibs.net/datasets/kitti/eval_depth.php?benchmark=depth_prediction (register at cvlibs.net)",
)
#: lines each split file lists (the test split's 45 without ground truth included)
COUNTS = {"train": 23158, "test": 697}
#: the folders under <out> the DataModule reads images and depth maps from
RAW, DEPTH = "raw", "data_depth_annotated"
#: the camera the split files use (KITTI's left colour camera)
CAMERA = "image_02"
#: missing files named in a problem before the rest are only counted
SHOWN = 5


def split_lists(test_only: bool) -> list[tuple[str, Archive]]:
    return [("test", TEST_LIST)] if test_only else [("train", TRAIN_LIST), ("test", TEST_LIST)]


def listed(split_file: Path) -> list[tuple[str, str | None]]:
    """(image, depth) of each `rgb depth focal` line of a BTS split file, relative paths (depth None
    where the line says None).

    Raises:
        DataScriptError: a line without three fields (the file is not BTS's).
    """
    samples = []
    for number, line in enumerate(split_file.read_text().splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 3:
            raise DataScriptError(f"{split_file}:{number}: expected 'rgb depth focal', got {line!r}")
        samples.append((fields[0].lstrip("/"), None if fields[1] == "None" else fields[1].lstrip("/")))
    return samples


def drive_of(image: str) -> str:
    """The drive folder of an image path, e.g. "2011_09_26_drive_0002_sync" of
    "2011_09_26/2011_09_26_drive_0002_sync/image_02/data/0000000069.png"."""
    parts = PurePosixPath(image).parts
    if len(parts) < 4 or not parts[1].endswith("_sync"):
        raise DataScriptError(f"{image}: not a KITTI raw image path (<date>/<date>_drive_<nnnn>_sync/...)")
    return parts[1]


def expected_files(root: Path, lists: Path, test_only: bool) -> dict[str, list[Path]]:
    """The files under `root` each archive provides for the chosen split files (read from the folder
    `lists`): {"<drive>.zip": images, "data_depth_annotated.zip": depth maps, split file: itself}."""
    files: dict[str, list[Path]] = {}
    for _, split_file in split_lists(test_only):
        files[split_file.name] = [root / split_file.name]
        for image, depth in listed(lists / split_file.name):
            files.setdefault(f"{drive_of(image)}.zip", []).append(root / RAW / image)
            if depth is not None:
                files.setdefault(ANNOTATED.name, []).append(root / DEPTH / depth)
    return files


def raw_archives(raw_list: Path, drives: Sequence[str]) -> list[Archive]:
    """The raw-data archives of `drives` ("<drive>.zip" names), with the URLs BTS's list gives.

    Raises:
        DataScriptError: a drive the split files use is not in the list.
    """
    urls = {url.rsplit("/", 1)[-1]: url for url in raw_list.read_text().split() if url.endswith("_sync.zip")}
    missing = [d for d in drives if d not in urls]
    if missing:
        raise DataScriptError(f"{raw_list}: no URL for {', '.join(missing)} (the split files use them)")
    # sizes are not published (0: no free-space warning; the progress line uses the server's length)
    return [Archive(d, urls[d], "", 0, KITTI_LICENCE, KITTI_TERMS) for d in drives]


def missing_problem(root: Path, folder: str, files: Sequence[Path], missing: Sequence[Path], fix: str) -> str:
    """One problem naming the first few missing files (relative to `root`) and counting the rest."""
    names = ", ".join(str(p.relative_to(root)) for p in missing[:SHOWN])
    more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    return f"{root / folder}: {len(missing)} of {len(files)} listed files missing: {names}{more}; {fix}"


def verify(root: Path, test_only: bool = False) -> list[str]:
    """Problems with a prepared KITTI folder (empty when complete): the split files are there and list
    the expected number of samples, every image and depth map they list exists, the first of each decodes."""
    problems: list[str] = []
    flag = " --test-only" if test_only else ""
    fix = f"run `python data_scripts/kitti_depth.py --out {root}{flag}` again (it fetches the archives concerned)"
    for split, split_file in split_lists(test_only):
        path = root / split_file.name
        if not path.is_file():
            problems.append(f"{path}: missing split file; {fix}")
            continue
        try:
            samples = listed(path)
        except DataScriptError as err:
            problems.append(str(err))
            continue
        if len(samples) != COUNTS[split]:
            problems.append(f"{path}: lists {len(samples)} samples, expected {COUNTS[split]}")
        images = [root / RAW / image for image, _ in samples]
        depths = [root / DEPTH / depth for _, depth in samples if depth is not None]
        present = 0
        for folder, files in ((RAW, images), (DEPTH, depths)):
            missing = [p for p in files if not p.is_file()]
            present += len(files) - len(missing)
            if missing:
                problems.append(missing_problem(root, folder, files, missing, fix))
            elif files:
                problems += check_decodes(files[0])
        print(
            f"{split}: {len(samples)} samples listed ({len(depths)} with ground truth), "
            f"{present} of {len(images) + len(depths)} files present"
        )
    return problems


def raw_member(name: str) -> str | None:
    """Where a raw archive's member goes under <out>/raw (as named), or None: only the camera the
    split files use is kept."""
    parts = PurePosixPath(name).parts
    return name if len(parts) > 3 and parts[2] == CAMERA else None


def depth_member(drives: set[str]) -> Callable[[str], str | None]:
    """Where a data_depth_annotated.zip member goes under <out>/data_depth_annotated: its train/ or
    val/ folder dropped (BTS's layout merges them); only `drives` and the camera the split files use."""

    def rename(name: str) -> str | None:
        parts = PurePosixPath(name).parts
        if parts and parts[0] == DEPTH:  # (tolerate an archive that wraps everything in its own name)
            parts = parts[1:]
        if len(parts) > 5 and parts[0] in ("train", "val") and parts[1] in drives and parts[4] == CAMERA:
            return "/".join(parts[1:])
        return None

    return rename


def main(argv: list[str] | None = None) -> int:
    note = (
        "plus one <date>_drive_<nnnn>_sync.zip per drive the chosen split files use (61 for training + test,\n"
        "28 for --test-only), from the URLs in kitti_archives_to_download.txt: KITTI's raw data (sizes not\n"
        f"published: the progress line uses the server's length), no checksum published.\n      licence: {KITTI_LICENCE}\n"
        f"      terms:   {KITTI_TERMS}\n\n"
        "--base-url URL fetches every file as URL/<file name> (a mirror of all of them)."
    )
    parser = make_parser(
        __doc__, [TRAIN_LIST, TEST_LIST, RAW_LIST, ANNOTATED], "data/kitti", "(each file's own URL)", note
    )
    parser.add_argument("--test-only", action="store_true", help="only Eigen's test split (its 28 drives)")
    parser.set_defaults(base_url=None)
    args = parser.parse_args(argv)
    if args.verify is not None:
        return report(verify(args.verify, args.test_only), args.verify)
    folder = args.archives or args.out

    def obtain(archive: Archive) -> Path:
        url = f"{args.base_url.rstrip('/')}/{archive.name}" if args.base_url else archive.path
        return download(url, folder / archive.name, archive.md5, archive.size or None)

    def prepare_all() -> int:
        print(f"KITTI's terms: {KITTI_LICENCE}; {KITTI_TERMS}", file=sys.stderr)
        lists = [split_file for _, split_file in split_lists(args.test_only)] + [RAW_LIST]
        for small in lists:  # (kept: a second run finds them with the right MD5 and asks no server)
            obtain(small)
        files = expected_files(args.out, folder, args.test_only)
        drives = sorted(name for name in files if name.endswith("_sync.zip"))
        raws = raw_archives(folder / RAW_LIST.name, drives)
        wanted = [*lists, ANNOTATED, *raws]
        keep = {a.name for a in lists}

        def check(done: Sequence[Archive]) -> list[str]:
            if len(done) == len(wanted):
                return verify(args.out, args.test_only)
            paths = [p for a in done for p in files.get(a.name, [])]
            missing = [p for p in paths if not p.is_file()]
            return [missing_problem(args.out, "", paths, missing, "extracting it again")] if missing else []

        def unpack(archive: Archive, path: Path) -> None:
            if archive.name in keep:
                if archive is not RAW_LIST and path.resolve() != (args.out / archive.name).resolve():
                    args.out.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, args.out / archive.name)
                return
            drive_names = {d.removesuffix(".zip") for d in drives}
            rename = depth_member(drive_names) if archive is ANNOTATED else raw_member
            target = args.out / (DEPTH if archive is ANNOTATED else RAW)
            print(f"extracting {path} -> {target} ({CAMERA} of the split files' drives)", file=sys.stderr)
            written = extract_zip(path, target, rename)
            print(f"  {written} files", file=sys.stderr)
            problems = check([archive])
            if problems:
                raise DataScriptError(
                    f"{path}: extracted, but {problems[0]}; it is not KITTI's archive or is damaged (no checksum "
                    "is published to tell): delete it and run the script again"
                )
            # recorded and deleted one by one: a later failure does not cost this download again
            write_marker(args.out, DATASET, [archive], {})
            if not args.keep_archives:
                print(f"deleting {path} (--keep-archives keeps it)", file=sys.stderr)
                path.unlink()

        counts = {split: COUNTS[split] for split, _ in split_lists(args.test_only)}
        return prepare(DATASET, args.out, wanted, obtain, unpack, check, counts, args.force)

    return run(prepare_all)


if __name__ == "__main__":
    sys.exit(main())
