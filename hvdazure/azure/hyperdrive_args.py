"""A trial of an SDK v1 (HyperDrive) sweep: HyperDrive's `--KEY VALUE` arguments, as the script's `--set`.

HyperDrive hands each trial its sampled values as script arguments appended after the job's own
(`--lr 0.01 --extra_hidden 64`), while hvdazure scripts take settings as `--set NAME=VALUE`. So the trial runs

    python hvdazure_hyperdrive.py --param lr=lr --param extra_hidden=extra.hidden -- train.py ARGS

(that file, written into the snapshot by `hvdazure submit sweep ... --sdk v1`, calls `main` below), and
this turns the appended `--lr 0.01 --extra_hidden 64` into `--set lr=0.01 --set extra.hidden=64` after ARGS
and runs train.py as `__main__`, in this process: every MPI rank does the same. Also runnable as
`python -m hvdazure.azure.hyperdrive_args ...`. Standard library only.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

ENTRY_FILE = "hvdazure_hyperdrive.py"  # what a v1 sweep's ScriptRunConfig runs, at the top of the snapshot
ENTRY_SOURCE = '''\
"""Written by `hvdazure submit sweep ... --sdk v1`: HyperDrive passes sampled values as `--KEY VALUE`
script arguments; hvdazure.azure.hyperdrive_args turns them into the script's `--set NAME=VALUE`."""
from hvdazure.azure.hyperdrive_args import main

main()
'''


class HyperDriveArgsError(ValueError):
    """The arguments do not say which script to run, or HyperDrive did not pass a value."""


def entry_arguments(params: dict[str, str], script: str, script_args: Sequence[str]) -> list[str]:
    """The arguments of the trial's entry file: one `--param KEY=NAME` per searched setting, then the script
    and its own arguments (HyperDrive appends `--KEY VALUE` after these)."""
    return [*(arg for key, name in params.items() for arg in ("--param", f"{key}={name}")), "--", script,
            *script_args]


def translate(argv: Sequence[str]) -> list[str]:
    """`--param KEY=NAME ... -- SCRIPT ARGS --KEY VALUE ...` -> `[SCRIPT, *ARGS, --set NAME=VALUE, ...]`.
    Only the trailing `--KEY VALUE` / `--KEY=VALUE` pairs of declared keys are taken: the script's own
    arguments stay as they are."""
    argv = list(argv)
    if "--" not in argv:
        raise HyperDriveArgsError("expected --param KEY=NAME ... -- SCRIPT [ARGS]")
    split = argv.index("--")
    head, rest = argv[:split], argv[split + 1:]
    params: dict[str, str] = {}
    if len(head) % 2 or any(flag != "--param" for flag in head[::2]):
        raise HyperDriveArgsError(f"expected --param KEY=NAME pairs before --, got {' '.join(head)}")
    for pair in head[1::2]:
        key, sep, name = pair.partition("=")
        if not sep or not key or not name:
            raise HyperDriveArgsError(f"--param expects KEY=NAME, got {pair!r}")
        params[key] = name
    if not rest:
        raise HyperDriveArgsError("no script after --")
    values: dict[str, str] = {}
    while True:
        last = rest[-1] if len(rest) > 1 else ""
        key, sep, value = last.removeprefix("--").partition("=")
        if last.startswith("--") and sep and key in params and key not in values:
            values[key] = value
            del rest[-1]
        elif len(rest) > 2 and rest[-2].startswith("--") and rest[-2][2:] in params \
                and rest[-2][2:] not in values:
            values[rest[-2][2:]] = rest[-1]
            del rest[-2:]
        else:
            break
    missing = [f"--{key}" for key in params if key not in values]
    if missing:
        raise HyperDriveArgsError(f"HyperDrive passed no value for {', '.join(missing)}")
    return [*rest, *(arg for key, name in params.items() for arg in ("--set", f"{name}={values[key]}"))]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the script with HyperDrive's values as `--set` arguments; exit 2, one line, if one is missing."""
    try:
        script_argv = translate(sys.argv[1:] if argv is None else argv)
    except HyperDriveArgsError as exc:
        sys.stderr.write(f"hvdazure: error: {exc}\n")
        raise SystemExit(2) from None
    script = Path(script_argv[0])
    sys.argv = script_argv
    sys.path[0] = str(script.resolve().parent)  # as `python SCRIPT` would: the script's own modules import
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
