"""Running a benchmark from the launching process: check its options, run it, report it.

The launching process never imports a framework: a benchmark's ranks (jobs.py, rank.py) measure and rank 0
writes the raw result as JSON; this process adds the machine's facts, prints the table, writes --json and
--plot.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from hvdazure.bench import machine, registry
from hvdazure.bench.benchmark import BenchError
from hvdazure.bench.jobs import LocalJobs
from hvdazure.bench.options import add_arguments, as_options
from hvdazure.launch.controller import default_controller


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run benchmark `args.name`, print its table, write --json and --plot. Returns the exit code."""
    benchmark = registry.load(args.name)
    args.controller = args.controller or default_controller()  # as `hvdazure run` chooses
    if args.np < 1:
        raise BenchError(f"-np must be at least 1, got {args.np}")
    facts = machine.facts(args.controller, list(command))
    options = as_options(args)
    benchmark.check(options)  # raises BenchError before any process starts
    result = benchmark.run(options, LocalJobs(args.controller, timeout_s=args.timeout, verbose=args.verbose))
    facts["load_average_at_end"] = list(os.getloadavg())
    result = {"benchmark": args.name, "options": options, **result, "machine": facts}
    print(benchmark.table(result), flush=True)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    if args.plot:
        benchmark.plot(result, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """`python -m hvdazure.bench.NAME [options]`: the same as `hvdazure bench NAME [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    module = registry.module_name(name)
    summary = (importlib.import_module(module).__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=summary)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.name = name
    try:
        return run(args, [sys.executable, "-m", module, *argv])
    except BenchError as exc:
        print(f"hvdazure bench: error: {exc}", file=sys.stderr)
        return 2
