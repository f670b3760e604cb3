"""``kdcollapse data {list,info,download}``: what is available, what a dataset holds, and getting it."""

from __future__ import annotations

import argparse

from kdcollapse.data import (NOT_DOWNLOADABLE, SOURCES, SPLITS, dataset_entry, download_dataset, find_root,
                             list_datasets, load_dataset)
from kdcollapse.errors import DataError


def register(subparsers: argparse._SubParsersAction) -> None:
    from kdcollapse.cli._common import HelpFormatter

    data = subparsers.add_parser(
        "data",
        help="list, inspect and download datasets",
        description="List, inspect and download the datasets kdcollapse can load.",
        formatter_class=HelpFormatter,
        epilog="examples:\n  kdcollapse data list\n  kdcollapse data info fashion_mnist\n"
        "  kdcollapse data download cifar10 --root ./data/cifar10",
    )
    commands = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    p = commands.add_parser(
        "list",
        help="every dataset, whether it is present and where",
        description="List every registered dataset, whether its files were found and where.",
        formatter_class=HelpFormatter,
        epilog="examples:\n  kdcollapse data list\n  KDCOLLAPSE_DATA=/mnt/datasets kdcollapse data list",
    )
    p.set_defaults(func=_list)

    p = commands.add_parser(
        "info",
        help="sizes, classes and input shape of a dataset",
        description="Load both splits of a dataset and print their sizes, classes, shape and mean/std.",
        formatter_class=HelpFormatter,
        epilog="examples:\n  kdcollapse data info fashion_mnist\n  kdcollapse data info digits\n"
        "  kdcollapse data info cifar100 --root ~/datasets/cifar100",
    )
    p.add_argument("name", help=f"dataset name ({', '.join(list_datasets())})")
    p.add_argument("--root", help="dataset folder (default: search the standard places)")
    p.set_defaults(func=_info)

    p = commands.add_parser(
        "download",
        help="download a dataset and verify its checksums",
        description="Download a dataset's files from their canonical sources, verify each checksum and "
        "only then move it into place. ImageNet cannot be downloaded (licence); the command says where "
        "to get it.",
        formatter_class=HelpFormatter,
        epilog="examples:\n  kdcollapse data download fashion_mnist\n"
        "  kdcollapse data download cifar10 --root ./data/cifar10\n"
        "  kdcollapse data download imagenet     # explains how to obtain it",
    )
    p.add_argument("name", help=f"dataset name ({', '.join(list_datasets())})")
    p.add_argument(
        "--root", help="target folder (default: $KDCOLLAPSE_DATA/NAME, else ~/.cache/kdcollapse/NAME)"
    )
    p.add_argument("--no-progress", action="store_true", help="do not show progress bars")
    p.set_defaults(func=_download)


def _location(name: str) -> str:
    entry = dataset_entry(name)
    if not entry.needs_files:
        return "built in" if name in ("digits", "gaussian_mixture") else "needs --root"
    try:
        return f"found  {find_root(name)}"
    except DataError:
        return "missing"


def _list(args: argparse.Namespace) -> int:
    names = list_datasets()
    rows = [(name, _location(name), dataset_entry(name).description) for name in names]
    width = max(len(r[1]) for r in rows)
    for name, where, description in rows:
        print(f"{name:<17} {where:<{width}}  {description}")
    return 0


def _info(args: argparse.Namespace) -> int:
    entry = dataset_entry(args.name)
    print(f"{args.name}: {entry.description}")
    for split in SPLITS:
        ds = load_dataset(args.name, split, args.root)
        counts = ds.labels.bincount(minlength=ds.num_classes)
        print(
            f"  {split:<5} {len(ds):>8} samples  input {tuple(ds.input_shape)}  "
            f"per class {int(counts.min())}-{int(counts.max())}"
        )
    more = ", ..." if ds.num_classes > 10 else ""
    print(f"  classes ({ds.num_classes}): {', '.join(ds.classes[:10])}{more}")
    print(f"  mean {tuple(ds.mean)}  std {tuple(ds.std)}  default augment {ds.default_augment}")
    for remote in SOURCES.get(args.name, ()):
        print(f"  source {remote.urls[0]}  ({remote.size:,} bytes, {remote.checksum})")
    return 0


def _download(args: argparse.Namespace) -> int:
    dataset_entry(args.name)
    if args.name in NOT_DOWNLOADABLE:
        print(NOT_DOWNLOADABLE[args.name])
        return 0 if args.name != "imagenet" else 1
    root = download_dataset(args.name, args.root, progress=not args.no_progress)
    print(f"{args.name}: verified files in {root}")
    return 0
