"""The options of `hvdazure data index` and `hvdazure data pack` (what runs them: commands.py).

argparse only: the CLI builds its parser from here, and `hvdazure --help` loads neither pyarrow nor fsspec.
"""

from __future__ import annotations

import argparse
from typing import TypeVar

P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one


def add_parser(sub: argparse._SubParsersAction[P]) -> tuple[P, P]:
    """`hvdazure data index` and `hvdazure data pack`: make and index the shards ShardedDataset reads.
    Returns their parsers, for the CLI to give each what runs it."""
    data = sub.add_parser("data", help="sharded datasets: index shards, pack a folder of files into shards",
                          description="Sharded datasets bigger than memory (hvdazure.data.ShardedDataset): "
                                      "WebDataset-style .tar, TFRecord (.tfrecord, .tfrecords) and .parquet "
                                      "shards on local disk or an object store (abfs://, az://).")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    index = actions.add_parser(
        "index", help="scan every shard and write the index (samples, offsets, sizes, versions)",
        description="Scan every shard of SOURCE (a directory, searched recursively, a glob in quotes, a "
                    "file, or an abfs:// / az:// URL of any of them) and write hvdazure-index.json next to "
                    "the shards, or to --output. Prints one line: shards, samples, bytes, where the index "
                    "is.",
        epilog="examples:\n  hvdazure data index data/train\n"
               "  hvdazure data index 'abfs://datasets/imagenet/train-*.tar' --output index/train.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    index.add_argument("source", metavar="SOURCE", help="the shards: directory, glob, file or URL")
    index.add_argument("--output", metavar="URL",
                       help="where the index goes: a .json file or a directory (default: next to the shards)")
    pack = actions.add_parser(
        "pack", help="pack a folder of files in class subfolders (like ImageFolder) into shards",
        description="Write the files of FOLDER/CLASS/... into shards in OUTPUT (a directory or an abfs:// "
                    "URL, holding no shards yet), and index them: each file is one sample {its extension: "
                    "its bytes, cls: its class's number}, classes numbered by name (saved as classes.json "
                    "next to the index), files shuffled with a fixed seed.",
        epilog="example:\n  hvdazure data pack images/train shards/train --format tar --shard-size 64MB",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    pack.add_argument("folder", metavar="FOLDER", help="a folder with one subfolder per class")
    pack.add_argument("output", metavar="OUTPUT", help="the directory or URL the shards go to")
    pack.add_argument("--format", default="tar", help="tar (default), tfrecord or parquet")
    size = pack.add_mutually_exclusive_group()
    size.add_argument("--shard-size", metavar="SIZE",
                      help="fill shards up to SIZE: 64MB (default), 256MiB, 1GB, bytes")
    size.add_argument("--samples-per-shard", type=int, metavar="N", help="N samples a shard instead")
    pack.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                      help="write class by class (a shard then holds few classes)")
    for parser in (index, pack):
        parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                            help="an fsspec storage option, e.g. account_name=NAME (repeatable; credentials "
                                 "are better left to the environment)")
        parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return index, pack
