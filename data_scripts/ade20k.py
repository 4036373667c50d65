#!/usr/bin/env python
"""Download, check and extract ADE20K's SceneParsing data (ADEChallengeData2016), or verify a copy.

    python data_scripts/ade20k.py                       # -> data/ade/ADEChallengeData2016
    python data_scripts/ade20k.py --out /datasets/ade   # elsewhere
    python data_scripts/ade20k.py --verify data/ade/ADEChallengeData2016 [--deep]

The archive (~923 MiB) comes from MIT's server; the download resumes where it stopped (run
the command again). MIT publishes no checksum; the MD5 below is the one torchvision-style
ADE20K loaders, GluonCV's and Segmenter's preparation scripts check against (a file that
fails is kept aside as ADEChallengeData2016.zip.bad). The archive is extracted only if no
member would land outside --out; then images and annotations are counted and paired, one
image per split decoded, and <out>/.data_scripts.json records the result, so that running
the command again does nothing.

The extracted layout, which vitdense's ADE20KDataModule reads (data.root =
<out>/ADEChallengeData2016):

    ADEChallengeData2016/images/{training,validation}/ADE_*.jpg
    ADEChallengeData2016/annotations/{training,validation}/ADE_*.png   (0 = other, 1..150 = classes)

Standalone: standard library, plus Pillow (and numpy for `--deep`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import Archive, check_decodes, make_parser, prepare_download, report, run  # noqa: E402

BASE_URL = "http://data.csail.mit.edu/places/ADEchallenge"
#: the official archive; tests replace it (md5) for their tiny archive
ARCHIVE = Archive(
    "ADEChallengeData2016.zip",
    "ADEChallengeData2016.zip",
    "7328b3957e407ddae1d3cbf487f149ef",
    967_382_037,
    "MIT CSAIL's ADE20K terms: research and educational use; the images remain their owners'",
    "https://groups.csail.mit.edu/vision/datasets/ADE20K/",
)
FOLDER = "ADEChallengeData2016"
#: images (and as many annotations) per split
COUNTS = {"training": 20210, "validation": 2000}
NUM_CLASSES = 150


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


def check(root: Path, deep: bool = False) -> list[str]:
    """verify(), then the first image of each split must decode."""
    problems = verify(root, deep=deep)
    for split in COUNTS:
        first = min((root / "images" / split).glob("*.jpg"), default=None)
        if first is not None:
            problems += check_decodes(first)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, [ARCHIVE], "data/ade", BASE_URL)
    parser.add_argument("--deep", action="store_true", help="also read every annotation (slow)")
    parser.epilog += "\n\n--verify ROOT takes the ADEChallengeData2016 folder itself; --out the folder holding it."
    args = parser.parse_args(argv)
    if args.verify is not None:
        return report(check(args.verify, deep=args.deep), args.verify)

    def check_all(archives: Sequence[Archive]) -> list[str]:
        return check(args.out / FOLDER, deep=args.deep)

    return run(lambda: prepare_download("ade20k", args, [ARCHIVE], check_all, dict(COUNTS)))


if __name__ == "__main__":
    sys.exit(main())
