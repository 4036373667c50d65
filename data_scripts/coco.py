#!/usr/bin/env python
"""Download, check and extract COCO 2017 (detection: images + annotations), or verify a copy.

    python data_scripts/coco.py --out data/coco              # train + val, ~19 GiB of archives
    python data_scripts/coco.py --out data/coco --splits val  # val images + annotations only (~1 GiB)
    python data_scripts/coco.py --verify data/coco            # check an existing copy

Downloads resume where they stopped (run the command again). Each archive's MD5 is checked
(COCO publishes none; these are the MD5s the widely used dataset tools such as torchvision's
and mmdetection's check against); a file that fails is kept aside as <name>.bad. Archives
are extracted only if no member would land outside --out. Then the number of images per
split is counted and one image per split decoded; <out>/.data_scripts.json records the
result, so that running the command again does nothing.

The layout, which vitdense's COCODataModule reads (data.root = --out):

    <out>/train2017/*.jpg                           118287 images
    <out>/val2017/*.jpg                             5000 images
    <out>/annotations/instances_{train,val}2017.json

Standalone: standard library, plus Pillow to decode a sample.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import Archive, check_files, check_folders, make_parser, prepare_download, report, run  # noqa: E402

BASE_URL = "http://images.cocodataset.org"
TERMS = "https://cocodataset.org/#termsofuse"
IMAGE_LICENCE = "Flickr terms of use; each image keeps its own licence, listed in the annotations' `licenses`"
#: the archives by what they hold; tests replace entries (md5) for their tiny archives
ARCHIVES = {
    "train": Archive("train2017.zip", "zips/train2017.zip", "cced6f7f71b7629ddf16f17bbcfab6b2", 19_336_861_798,
                     IMAGE_LICENCE, TERMS),
    "val": Archive("val2017.zip", "zips/val2017.zip", "442b8da7639aecaf257c1dceb8ba8c80", 815_585_330,
                   IMAGE_LICENCE, TERMS),
    "annotations": Archive("annotations_trainval2017.zip", "annotations/annotations_trainval2017.zip",
                           "f4bbac642086de4f52a3fdda2de5fa2c", 252_907_541,
                           "annotations: CC BY 4.0 (COCO Consortium)", TERMS),
}  # fmt: skip
#: image folder of each split
FOLDERS = {"train": "train2017", "val": "val2017"}
#: .jpg images per image folder; tests replace them
COUNTS = {"train2017": 118287, "val2017": 5000}


def archives_for(splits: Sequence[str]) -> list[Archive]:
    """The archives holding `splits`' images, and the annotations (one archive for both splits)."""
    return [ARCHIVES[split] for split in splits] + [ARCHIVES["annotations"]]


def check(root: Path, archives: Sequence[Archive]) -> list[str]:
    """Problems with what `archives` put under `root`: image counts, a sample decoding, the instances JSONs."""
    problems = []
    for split, folder in FOLDERS.items():
        if ARCHIVES[split] in archives:
            problems += check_folders(root, {folder: COUNTS[folder]}, "*.jpg")
    if ARCHIVES["annotations"] in archives:
        problems += check_files(root / "annotations", [f"instances_{folder}.json" for folder in FOLDERS.values()])
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, ARCHIVES.values(), "data/coco", BASE_URL)
    parser.add_argument(
        "--splits", nargs="+", choices=list(FOLDERS), default=list(FOLDERS), help="splits to get (default: train val)"
    )
    args = parser.parse_args(argv)
    archives = archives_for(args.splits)
    if args.verify is not None:
        return report(check(args.verify, archives), args.verify)
    counts = {FOLDERS[split]: COUNTS[FOLDERS[split]] for split in args.splits}
    return run(lambda: prepare_download("coco2017", args, archives, lambda chosen: check(args.out, chosen), counts))


if __name__ == "__main__":
    sys.exit(main())
