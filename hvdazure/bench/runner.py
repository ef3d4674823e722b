"""Running a benchmark: start its ranks as `hvdazure run` does, collect rank 0's result, report it.

The launching process never imports a framework: the ranks (`python -m hvdazure.bench.rank`) measure and
rank 0 writes the raw result as JSON; this process adds the machine's facts, prints the table, writes
--json and --plot.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from hvdazure.bench import machine
from hvdazure.bench.options import add_arguments, as_options


class BenchError(Exception):
    """A benchmark could not run or its ranks failed; the message is one line for the user."""


def benchmark_module(name: str) -> ModuleType:
    return importlib.import_module(f"hvdazure.bench.{name}")


def run_ranks(name: str, options: Mapping, num_proc: int, controller: str, *, tag: str = "",
              env: Mapping[str, str] | None = None, timeout_s: float | None = None,
              verbose: bool = False) -> dict:
    """Run `measure(options)` of benchmark `name` on `num_proc` ranks; return what rank 0 returned."""
    from hvdazure.launch.command import LaunchSpec
    from hvdazure.launch.supervisor import run_job

    with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
        spec_path, out_path = Path(folder) / "options.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(dict(options)))
        command = [sys.executable, "-m", "hvdazure.bench.rank", name, str(spec_path), str(out_path)]
        spec = LaunchSpec(num_proc=num_proc, command=command, controller=controller,
                          extra_env={"PYTHONUNBUFFERED": "1", **(env or {})})
        job = run_job(spec, timeout_s=timeout_s, grace_s=5.0, verbose=verbose)
        if job.exit_code != 0:
            raise BenchError(f"{name}{tag}: the job on {num_proc} ranks failed (exit code {job.exit_code})")
        if not out_path.is_file():
            raise BenchError(f"{name}{tag}: rank 0 wrote no result")
        return json.loads(out_path.read_text())


def run(args: argparse.Namespace, command: Sequence[str]) -> int:
    """Run benchmark `args.name`, print its table, write --json and --plot. Returns the exit code."""
    module = benchmark_module(args.name)
    if args.np < 1:
        raise BenchError(f"-np must be at least 1, got {args.np}")
    facts = machine.facts(args.controller, list(command))
    options = as_options(args)
    if hasattr(module, "check"):
        module.check(options)  # raises BenchError before any process starts
    collect = getattr(module, "collect", None)
    if collect is not None:  # a benchmark that starts its own jobs (overhead, throughput, launch)
        result = collect(options, timeout_s=args.timeout, verbose=args.verbose)
    else:
        result = run_ranks(args.name, options, args.np, args.controller, timeout_s=args.timeout,
                           verbose=args.verbose)
    facts["load_average_at_end"] = list(os.getloadavg())
    result = {"benchmark": args.name, "options": options, **result, "machine": facts}
    print(module.table(result), flush=True)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    if args.plot:
        module.plot(result, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def main(name: str, argv: Sequence[str] | None = None) -> int:
    """`python -m hvdazure.bench.NAME [options]`: the same as `hvdazure bench NAME [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=f"python -m hvdazure.bench.{name}",
                                     description=(benchmark_module(name).__doc__ or "").splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.name = name
    try:
        return run(args, [sys.executable, "-m", f"hvdazure.bench.{name}", *argv])
    except BenchError as exc:
        print(f"hvdazure bench: error: {exc}", file=sys.stderr)
        return 2


def progress(text: str) -> None:
    """A progress line from rank 0 during a long run (rank-tagged by the launcher)."""
    print(f"bench: {text}", flush=True)

