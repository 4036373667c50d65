#!/usr/bin/env python
"""Check an installed Fashion-MNIST and measure how fast vitdense reads it.

    apt-get install dataset-fashion-mnist          # Debian/Ubuntu: the four IDX files, offline
    python data_scripts/fashion_mnist.py           # reads /usr/share/datasets/fashion-mnist
    python data_scripts/fashion_mnist.py --root DIR --img-size 32 --batch-size 64

Nothing is downloaded: Debian's package `dataset-fashion-mnist` installs
train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
t10k-labels-idx1-ubyte.gz under /usr/share/datasets/fashion-mnist (any folder holding those
four names, gzipped or not, works as --root and as the DataModules' `root`).

Prints, for each split, the image count and shape, the images per class, the pixel mean and
std (the normalisation a from-scratch run may use: `data.init_args.mean` / `std`), the
SHA-256 of the decompressed images and labels (the same for any copy of the official
release, whatever its gzip headers), then the time to build `FashionMNISTDataModule`'s
training split (read and decompress) and to iterate one training epoch at --img-size on this
process alone (`num_workers: 0`, what `loader.num_workers: auto` picks on two cores).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Print the report; return the timings (seconds) and the training epoch's batch count."""
    from vitdense.data import FASHION_MNIST_CLASSES, FASHION_MNIST_ROOT, FashionMNISTDataModule, LoaderConfig
    from vitdense.data.fashion_mnist import load_fashion_mnist

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=FASHION_MNIST_ROOT, help="folder of the four IDX files")
    parser.add_argument("--img-size", type=int, default=32, help="side the 28x28 images are resized to")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)

    for split in ("train", "test"):
        images, labels = load_fashion_mnist(args.root, split)
        counts = np.bincount(labels, minlength=len(FASHION_MNIST_CLASSES))
        pixels = images.astype(np.float64) / 255
        print(f"{split}: {len(images)} images of {images.shape[1]}x{images.shape[2]} {images.dtype}")
        print("  per class: " + ", ".join(f"{n} {c}" for n, c in zip(FASHION_MNIST_CLASSES, counts, strict=True)))
        print(f"  pixel mean {pixels.mean():.4f}, std {pixels.std():.4f}")
        digest = (hashlib.sha256(images.tobytes()).hexdigest(), hashlib.sha256(labels.tobytes()).hexdigest())
        print(f"  sha256 images {digest[0][:16]}..., labels (int64) {digest[1][:16]}...")

    start = time.perf_counter()
    dm = FashionMNISTDataModule(
        root=args.root, img_size=args.img_size, loader=LoaderConfig(batch_size=args.batch_size, num_workers=0)
    )
    dm.setup("fit")
    built = time.perf_counter() - start
    start = time.perf_counter()
    batches = sum(1 for _ in dm.train_dataloader())
    epoch = time.perf_counter() - start
    print(f"train DataModule built (files read, {len(dm.train_dataset)} training images) in {built:.2f} s")
    print(
        f"one training epoch at {args.img_size} px: {batches} batches of {args.batch_size} in {epoch:.1f} s "
        f"({batches * args.batch_size / epoch:.0f} images/s, one process)"
    )
    return {"build": built, "epoch": epoch, "batches": batches}


if __name__ == "__main__":
    main()
