"""`Trainer.main()`: one training script that fits, tests, predicts or exports, chosen on its command line.

    python train.py [fit] [--config cfg.yaml] [--set FIELD=VALUE ...]
    python train.py test --checkpoint best [--output metrics.json] [--set ...]
    python train.py predict --checkpoint latest --output predictions.npz [--set ...]
    python train.py predict --checkpoint latest --output abfs://container/predictions   (shards)
    python train.py predict --output predictions.npz   (no --checkpoint: the model as build_model returns it)
    python train.py export --checkpoint best --output model.onnx [--format F] [--example x.npy] [--overwrite]

The mode is the first argument (default fit); `--checkpoint` and `--output` (and export's `--format`,
`--example`, `--overwrite`) are the mode's, everything else TrainConfig.from_cli's. The same under
`hvdazure run -np N`, mpirun or Azure ML: every rank parses its own command line, and a bad one is one line
and exit status 2 on every rank, before anything starts. Export runs in one process
(core/script/export.py, which `hvdazure export` shares).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdazure.core.config import ConfigError

MODES = ("fit", "test", "predict", "export")


@dataclass(frozen=True)
class ScriptCommand:
    """What the script's command line asks for: the mode, its options, and the config's arguments."""

    mode: str
    checkpoint: str | None
    output: str | None
    config_args: list[str]
    format: str | None = None  # export's
    example: str | None = None  # export's: a .npy / .npz file of the model's inputs
    overwrite: bool = False  # export's: replace an existing output


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def parse_command(argv: Sequence[str]) -> ScriptCommand:
    """The mode and its options out of `argv`; a ConfigError naming what is wrong."""
    args = list(argv)
    mode = args.pop(0) if args and args[0] in MODES else "fit"
    parser = _Parser(prog=f"script {mode}", add_help=False, allow_abbrev=False)
    parser.add_argument("--checkpoint")
    parser.add_argument("--output")
    if mode == "export":
        parser.add_argument("--format")
        parser.add_argument("--example")
        parser.add_argument("--overwrite", action="store_true")
    known, rest = parser.parse_known_args(args)
    if rest and not rest[0].startswith("-"):
        raise ConfigError(f"unknown mode {rest[0]!r}: the first argument is one of {', '.join(MODES)} "
                          "(default fit)")
    if mode == "fit" and (known.checkpoint or known.output):
        option = "--checkpoint" if known.checkpoint else "--output"
        raise ConfigError(f"{option} is for test, predict and export; fit resumes with --set resume=auto "
                          "(or a path)")
    if mode == "predict" and not known.output:
        raise ConfigError("predict needs --output: FILE.npz (rank 0 writes the predictions), or a new "
                          "directory or URL for shards (each rank writes its part)")
    if mode == "export":
        if not known.checkpoint or not known.output:
            raise ConfigError("export needs --checkpoint (latest, best or a path) and --output (the model's "
                              "file, or a directory for saved_model)")
        return ScriptCommand(mode, known.checkpoint, known.output, rest, known.format, known.example,
                             known.overwrite)
    if known.output and mode == "predict" and not is_shards_output(known.output) and \
            not known.output.endswith((".npz", ".npy")):
        raise ConfigError(f"--output {known.output!r}: predictions go to a .npz (.npy: one array) file, or "
                          "to a directory or URL without an extension (shards)")
    if known.output and mode == "test" and not known.output.endswith(".json"):
        raise ConfigError(f"--output {known.output!r}: test metrics are written as .json")
    if known.output and not is_shards_output(known.output):
        _check_writable(known.output)
    return ScriptCommand(mode, known.checkpoint, known.output, rest)


def is_shards_output(output: str) -> bool:
    """Whether predict's --output names where shards go (a URL, or a path without an extension) rather
    than one file."""
    return "://" in output or not Path(output).suffix


def _check_writable(output: str) -> None:
    """A ConfigError now, before any rank starts work, for an --output that cannot be written."""
    path = Path(output)
    if path.is_dir():
        raise ConfigError(f"--output {output!r} is a directory: give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if folder.exists() and not os.access(folder, os.W_OK):
        raise ConfigError(f"--output {output!r}: the folder {str(folder)!r} cannot be written")


def write_output(output: str, result: Any) -> None:
    """Rank 0's result written whole (a temporary name, then a rename): test metrics as JSON (.json),
    predictions as .npz (a dict's arrays under their names, one array as "predictions") or .npy."""
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            if path.suffix == ".json":
                file.write(json.dumps(result, indent=1).encode())
            elif path.suffix == ".npy":
                if isinstance(result, dict):
                    raise ConfigError(f"--output {output!r}: predict_step returns a dict of "
                                      f"{sorted(result)}: write .npz")
                np.save(file, result, allow_pickle=False)
            else:
                arrays = result if isinstance(result, dict) else {"predictions": result}
                np.savez(file, **arrays)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
