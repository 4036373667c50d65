"""`data`: a config's training pipeline in samples/s per number of loader workers."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from vitdense.bench.common import cpu_kind


def bench_data(args: argparse.Namespace) -> dict[int, float]:
    """{workers: training samples per second} of the DataModule in `args.config`'s `data`
    section (built as the CLI builds it), over `args.batches` batches after the first (worker
    start-up excluded)."""
    import dataclasses

    import yaml
    from jsonargparse import ArgumentParser
    from lightning import LightningDataModule

    parser = ArgumentParser()
    parser.add_argument("--data", type=LightningDataModule)
    section = yaml.safe_load(Path(args.config).read_text())["data"]
    for override in args.set or []:  # key=value under init_args, e.g. root=/data/coco
        key, value = override.split("=", 1)
        section.setdefault("init_args", {})[key] = yaml.safe_load(value)
    parsed = parser.parse_object({"data": section})
    datamodule = getattr(parser, "instantiate", parser.instantiate_classes)(parsed).data
    datamodule.prepare_data()
    datamodule.setup("fit")
    results = {}
    for workers in args.workers:
        datamodule.loader = dataclasses.replace(datamodule.loader, num_workers=workers)
        batches = iter(datamodule.train_dataloader())
        next(batches)
        start, samples = time.perf_counter(), 0
        for _, batch in zip(range(args.batches), batches, strict=False):  # (or until the epoch ends)
            samples += int(batch.image.shape[0])
        results[workers] = samples / (time.perf_counter() - start)
        del batches
    return results


def print_data(args: argparse.Namespace, results: dict[int, float]) -> None:
    print(f"training samples/s of {args.config}'s data, {args.batches} batches after the first, on {cpu_kind()}")
    print(f"{'workers':>8}{'samples/s':>12}{'per worker':>12}")
    for workers, rate in results.items():
        print(f"{workers:8d}{rate:12.1f}{rate / max(workers, 1):12.1f}")
