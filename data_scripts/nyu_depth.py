#!/usr/bin/env python
"""Download and lay out NYU Depth v2 as BTS lays it out (the layout DPT's, AdaBins', ZoeDepth's and
Depth Anything's NYU code read, and vitdense's NYUDepthDataModule), or verify a copy.

    python data_scripts/nyu_depth.py                    # -> data/nyu_depth_v2 (training + test)
    python data_scripts/nyu_depth.py --test-only        # Eigen's 654 test images only (a 2.8 GB download)
    python data_scripts/nyu_depth.py --verify data/nyu_depth_v2 [--test-only]

Sources (downloads resume where they stopped: run the command again):

    sync.zip                     BTS's training set: 24231 frames of the raw scenes, RGB and
                                 depth in mm (Google Drive file 1AysroWpfISmm-yRFGBgFTrLy6FjQwvwP,
                                 cleinc/bts pytorch/README.md), unzipped into <out>/sync/
    nyu_depth_v2_labeled.mat     NYU's official labeled set (1449 frames; NYU's server), from
                                 which the 654 test frames of Eigen's split are written as BTS's
                                 extract_official_train_test_set_from_mat.py writes them: RGB
                                 with its 7-pixel border blacked out (JPEG), the raw depth x 1000
                                 as a 16-bit PNG, under <out>/official_splits/test/<scene type>/
    splits.mat, nyudepthv2_{train,test}_files_with_gt.txt
                                 from cleinc/bts at commit 5e3406b (raw URLs pinned to it)

Checksums: neither NYU nor BTS publishes one for sync.zip or the .mat file; those downloads are
not checked (their MD5 and SHA-256 are printed, for your records) and the result is checked
instead: every file both split files list must exist. The three small files' MD5s were
computed here from the git blobs of the pinned commit, whose content cannot change.

Writing the test frames needs h5py and scipy (pip install h5py scipy); the rest needs only the
standard library and Pillow. <out>/.data_scripts.json records a complete run, so that running
the command again does nothing.

    <out>/sync/<scene>/rgb_00000.jpg, sync_depth_00000.png              (training)
    <out>/official_splits/test/<scene type>/rgb_00045.jpg, sync_depth_00045.png   (test)
    <out>/nyudepthv2_train_files_with_gt.txt, nyudepthv2_test_files_with_gt.txt
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import (  # noqa: E402
    Archive,
    DataScriptError,
    check_decodes,
    download,
    extract,
    make_parser,
    prepare,
    report,
    run,
)

BTS = "https://raw.githubusercontent.com/cleinc/bts/5e3406b35d1497b2e55d2dd600524d1f4efacaed"
NYU_TERMS = "https://cs.nyu.edu/~fergus/datasets/nyu_depth_v2.html"
BTS_TERMS = "https://github.com/cleinc/bts (GPL-3.0)"
#: the files, in the order they are needed (splits.mat before the .mat it splits)
TRAIN_LIST = Archive(
    "nyudepthv2_train_files_with_gt.txt",
    f"{BTS}/train_test_inputs/nyudepthv2_train_files_with_gt.txt",
    "a390ad7bfd5441cc9be37f59a384b4db",
    1_855_580,
    "BTS's split file",
    BTS_TERMS,
)
TEST_LIST = Archive(
    "nyudepthv2_test_files_with_gt.txt",
    f"{BTS}/train_test_inputs/nyudepthv2_test_files_with_gt.txt",
    "97fc4ddef437228b1f9fc9b8054b778f",
    41_047,
    "BTS's split file",
    BTS_TERMS,
)
SPLITS = Archive(
    "splits.mat", f"{BTS}/utils/splits.mat", "08e3c3aea27130ac7c01ffd739a4535f", 2_626, "Eigen's split", BTS_TERMS
)
LABELED = Archive(
    "nyu_depth_v2_labeled.mat",
    "http://horatio.cs.nyu.edu/mit/silberman/nyu_depth_v2/nyu_depth_v2_labeled.mat",
    "",  # none published
    2_972_037_809,  # NYU's page says 2.8 GB
    "NYU Depth v2: for research; cite Silberman et al., ECCV 2012",
    NYU_TERMS,
)
SYNC = Archive(
    "sync.zip",
    "https://drive.usercontent.google.com/download?id=1AysroWpfISmm-yRFGBgFTrLy6FjQwvwP&export=download&confirm=t",
    "",  # none published
    34_000_000_000,  # approximate (not published either): the progress line uses the server's length
    "NYU Depth v2 frames as BTS synchronised them: for research",
    NYU_TERMS,
)
#: samples each split file lists
COUNTS = {"train": 24231, "test": 654}
#: the border of NYU's RGB frames without valid pixels, blacked out as BTS does: rows, columns kept
KEPT = (slice(7, 474), slice(7, 632))


def archives(test_only: bool) -> list[Archive]:
    return [TEST_LIST, SPLITS, LABELED] if test_only else [TRAIN_LIST, TEST_LIST, SPLITS, LABELED, SYNC]


def listed(split_file: Path) -> list[str]:
    """The image and depth paths a BTS split file lists (relative; 'None' depths left out)."""
    paths = []
    for line in split_file.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3:
            paths += [f.lstrip("/") for f in fields[:2] if f != "None"]
    return paths


def verify(root: Path, test_only: bool = False) -> list[str]:
    """Problems with a prepared NYU folder (empty when complete): the split files are there, list
    the expected number of samples, every file they list exists, and the first image decodes."""
    problems: list[str] = []
    splits = [("test", TEST_LIST, root / "official_splits" / "test")]
    if not test_only:
        splits.insert(0, ("train", TRAIN_LIST, root / "sync"))
    for split, split_file, folder in splits:
        path = root / split_file.name
        if not path.is_file():
            problems.append(f"{path}: missing split file")
            continue
        files = listed(path)
        if len(files) != 2 * COUNTS[split]:
            problems.append(f"{path}: lists {len(files) // 2} samples, expected {COUNTS[split]}")
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            problems.append(f"{folder}: {len(missing)} of {len(files)} listed files missing, first {missing[0]}")
        elif files:
            problems += check_decodes(folder / files[0])
        print(f"{split}: {len(files) // 2} samples listed, {len(files) - len(missing)} files present")
    return problems


def write_test_frames(labeled: Path, splits: Path, out: Path) -> int:
    """Eigen's test frames of NYU's labeled .mat into `out/<scene type>/`, as BTS's
    extract_official_train_test_set_from_mat.py writes them (frame i, 0-based: rgb_{i:05d}.jpg
    with the border outside rows 7:474, cols 7:632 black; sync_depth_{i:05d}.png, rawDepths x
    1000 as uint16). Returns the number written. (BTS encodes with OpenCV, here Pillow at the
    same JPEG quality, 95: pixels may differ by a level or so; the depth PNGs are identical.)"""
    try:
        import h5py
        import numpy as np
        import scipy.io
        from PIL import Image
    except ImportError as err:
        raise DataScriptError(f"writing the test frames needs h5py and scipy ({err}): pip install h5py scipy") from err
    test = {int(i) for i in np.ravel(scipy.io.loadmat(str(splits))["testNdxs"])}  # 1-based
    written = 0
    with h5py.File(labeled, "r") as mat:
        images, depths = mat["images"], mat["rawDepths"]  # [N, 3, W, H] and [N, W, H] (MATLAB's order)
        scenes = ["".join(chr(c) for c in np.ravel(mat[ref])) for ref in np.ravel(mat["sceneTypes"])]
        for i in range(images.shape[0]):
            if i + 1 not in test:
                continue
            folder = out / scenes[i]
            folder.mkdir(parents=True, exist_ok=True)
            depth_mm = (np.asarray(depths[i]).T * 1000.0).astype(np.uint16)  # as BTS: truncated, not rounded
            Image.fromarray(depth_mm).save(folder / f"sync_depth_{i:05d}.png")
            rgb = np.asarray(images[i]).T  # [H, W, 3]
            framed = np.zeros_like(rgb)
            framed[KEPT] = rgb[KEPT]
            Image.fromarray(framed).save(folder / f"rgb_{i:05d}.jpg", quality=95)
            written += 1
    print(f"wrote {written} test frames under {out}", file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, archives(False), "data/nyu_depth_v2", "(each file's own URL)")
    parser.add_argument("--test-only", action="store_true", help="only Eigen's 654 test frames (no sync.zip)")
    parser.set_defaults(base_url=None)
    parser.epilog += "\n\n--base-url URL fetches every file as URL/<file name> (a mirror of all five)."
    args = parser.parse_args(argv)
    if args.verify is not None:
        return report(verify(args.verify, args.test_only), args.verify)
    folder = args.archives or args.out
    wanted = archives(args.test_only)

    def obtain(archive: Archive) -> Path:
        url = f"{args.base_url.rstrip('/')}/{archive.name}" if args.base_url else archive.path
        return download(url, folder / archive.name, archive.md5, archive.size)

    def unpack(archive: Archive, path: Path) -> None:
        if archive is SYNC:
            extract(path, args.out)
        elif archive is LABELED:
            write_test_frames(path, folder / SPLITS.name, args.out / "official_splits" / "test")
        elif archive in (TRAIN_LIST, TEST_LIST):
            args.out.mkdir(parents=True, exist_ok=True)
            if path.resolve() != (args.out / archive.name).resolve():
                shutil.copyfile(path, args.out / archive.name)

    def check(done: Sequence[Archive]) -> list[str]:
        return verify(args.out, args.test_only)

    counts = {"test": COUNTS["test"]} if args.test_only else dict(COUNTS)

    def prepare_all() -> int:
        # the split files stay (the DataModule reads them); the rest is deleted unless --keep-archives
        status = prepare("nyu_depth_v2", args.out, wanted, obtain, unpack, check, counts, args.force)
        if status == 0 and not args.keep_archives:
            for archive in wanted:
                path = folder / archive.name
                if archive not in (TRAIN_LIST, TEST_LIST) and path.exists():
                    print(f"deleting {path} (--keep-archives keeps it)", file=sys.stderr)
                    path.unlink()
        return status

    return run(prepare_all)


if __name__ == "__main__":
    sys.exit(main())
