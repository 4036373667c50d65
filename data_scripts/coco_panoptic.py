#!/usr/bin/env python
"""Download, check and extract COCO 2017's panoptic annotations, or verify a copy.

    python data_scripts/coco_panoptic.py --out data/coco     # the annotations archive, ~821 MiB
    python data_scripts/coco_panoptic.py --verify data/coco  # check an existing copy

The images are COCO 2017's detection images: get them with `python data_scripts/coco.py
--out data/coco` (the same --out; the two scripts share its record of what is complete).

The download resumes where it stopped (run the command again). The archive's MD5 is checked
(COCO publishes none; this is the MD5 dataset tools commonly check against); a file that
fails is kept aside as <name>.bad. The archive holds the two JSONs and, zipped again, each
split's PNGs: both levels are extracted, every member of each zip checked first (nothing may
land outside --out), and the inner zips deleted once extracted. Then the PNGs per split are
counted and one per split decoded; <out>/.data_scripts.json records the result, so that
running the command again does nothing.

The layout, which vitdense's CocoPanopticDataModule reads (data.root = --out):

    <out>/train2017/*.jpg, <out>/val2017/*.jpg          (data_scripts/coco.py)
    <out>/annotations/panoptic_{train,val}2017.json
    <out>/annotations/panoptic_train2017/*.png          118287 PNGs of segment ids (RGB)
    <out>/annotations/panoptic_val2017/*.png            5000

Standalone: standard library, plus Pillow to decode a sample.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _download.py lives next to this script

from _download import (  # noqa: E402
    Archive,
    check_counts,
    check_files,
    download,
    extract,
    make_parser,
    prepare,
    report,
    run,
)

BASE_URL = "http://images.cocodataset.org"
TERMS = "https://cocodataset.org/#termsofuse"
#: the official archive; tests replace it (md5) for their tiny archive
ARCHIVE = Archive(
    "panoptic_annotations_trainval2017.zip",
    "annotations/panoptic_annotations_trainval2017.zip",
    "4170db65fc022c9c296af880dbca6055",
    860_000_000,
    "annotations: CC BY 4.0 (COCO Consortium)",
    TERMS,
)
#: the marker's dataset name: coco.py's, so that both scripts record into one <out>/.data_scripts.json
DATASET = "coco2017"
#: PNGs per split folder under <out>/annotations; tests replace them
COUNTS = {"panoptic_train2017": 118287, "panoptic_val2017": 5000}


def unpack(archive: Path, out: Path) -> None:
    """Extract the archive into `out`, then each split's inner zip of PNGs beside it (deleted after)."""
    extract(archive, out)
    for folder in COUNTS:
        inner = out / "annotations" / f"{folder}.zip"
        if inner.is_file():
            extract(inner, out / "annotations")
            inner.unlink()


def check(root: Path) -> list[str]:
    """Problems with the panoptic annotations under `root`: the JSONs, PNG counts, a PNG decoding."""
    annotations = root / "annotations"
    problems = check_files(annotations, [f"{folder}.json" for folder in COUNTS])
    return problems + check_counts(annotations, COUNTS, "*.png", decode=True)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, [ARCHIVE], "data/coco", BASE_URL)
    args = parser.parse_args(argv)
    if args.verify is not None:
        return report(check(args.verify), args.verify)
    folder = args.archives or args.out
    return run(
        lambda: prepare(
            DATASET,
            args.out,
            [ARCHIVE],
            obtain=lambda a: download(a.url(args.base_url), folder / a.name, a.md5, a.size),
            unpack=lambda a, path: unpack(path, args.out),
            check=lambda chosen: check(args.out),
            counts=dict(COUNTS),
            force=args.force,
            delete_archives=not args.keep_archives,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
