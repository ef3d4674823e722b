"""`python -m hvdazure.sweep SCRIPT --space SPACE.yaml ... -- ARGS`: one rank of a sweep, as `mpirun` starts
it (`hvdazure sweep` does, and Azure ML does for an in-job sweep). See hvdazure/sweep/worker.py."""

from __future__ import annotations

import argparse
import sys

from hvdazure.sweep.options import add_arguments, from_namespace


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m hvdazure.sweep",
                                     description="one rank of a sweep; start it with mpirun, or use "
                                                 "`hvdazure sweep -np N`")
    add_arguments(parser)
    args = parser.parse_args(argv[:split])
    args.script_args = argv[split + 1:]
    from hvdazure.sweep.worker import main as run_rank

    return run_rank(from_namespace(args))


if __name__ == "__main__":
    sys.exit(main())
