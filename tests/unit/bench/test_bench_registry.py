"""The benchmark protocol and its registry: every name is a Benchmark of that name, of the kind it says,
the CLI offers exactly these names, and the launching process loads no framework."""

import json
import subprocess
import sys

import pytest

from hvdazure.bench import registry
from hvdazure.bench.benchmark import Benchmark, RankBenchmark
from hvdazure.cli import build_parser

HEAVY = ("torch", "tensorflow", "keras", "horovod")


class RecordingJobs:
    """A test double of the Jobs a benchmark starts its rank jobs through: records each job, starts none."""

    timeout_s = None

    def __init__(self) -> None:
        self.jobs: list[tuple] = []

    def run_ranks(self, name, options, num_proc, *, tag="", env=None):
        self.jobs.append((name, options, num_proc, tag))
        return {"figures": "from rank 0"}

    def single_rank_processes(self, name, options, count, env):
        raise AssertionError("not expected here")


def loads_framework(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has loaded after running `code`."""
    heavy = f"sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})"
    probe = f"import sys, json\n{code}\nprint(json.dumps({heavy}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", registry.NAMES)
def test_every_registered_name_is_a_benchmark_of_that_name(name):
    benchmark = registry.load(name)

    assert isinstance(benchmark, Benchmark) and benchmark.name == name


def test_launch_starts_its_own_processes_and_every_other_benchmark_measures_on_ranks():
    kinds = {name: isinstance(registry.load(name), RankBenchmark) for name in registry.NAMES}

    assert kinds == {"allreduce": True, "overhead": True, "throughput": True, "checkpoint": True,
                     "launch": False, "data": True, "peers": False}
    with pytest.raises(TypeError, match="runs no ranks"):
        registry.load_rank_benchmark("launch")


def test_the_cli_offers_the_registered_benchmarks_and_no_other():
    parser = build_parser()

    assert [parser.parse_args(["bench", name]).name for name in registry.NAMES] == list(registry.NAMES)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "unregistered"])


def test_a_rank_benchmark_runs_one_job_of_np_ranks_by_default():
    jobs = RecordingJobs()

    result = registry.load("allreduce").run({"np": 3, "quick": True}, jobs)

    assert jobs.jobs == [("allreduce", {"np": 3, "quick": True}, 3, "")]
    assert result == {"figures": "from rank 0"}


def test_overhead_runs_one_job_per_framework_it_measures():
    jobs = RecordingJobs()

    result = registry.load("overhead").run({"np": 2, "framework": "torch", "quick": True}, jobs)

    assert jobs.jobs == [("overhead", {"np": 2, "framework": "torch", "quick": True}, 2, " (torch)")]
    assert result == {"frameworks": {"torch": {"status": "measured", "figures": "from rank 0"}}}


def test_loading_every_benchmark_loads_no_framework():
    assert loads_framework("from hvdazure.bench import registry\n"
                           "[registry.load(name) for name in registry.NAMES]") == []


def test_the_checkpoint_memory_probes_are_started_without_loading_a_framework_here():
    # the probes themselves are fresh processes; the launching process only starts them and reads their
    # figures (stubbed here: a checkpoint of 4 MB, peaks of 300 MB and more)
    code = ("from hvdazure.bench import checkpoint\n"
            "checkpoint._probe = lambda mode, mb, d, t: {'checkpoint_bytes': 4 * 2**20,\n"
            "                                            'peak_rss': (300 + len(mode)) * 2**20}\n"
            "assert set(checkpoint.memory(4, 1, None)['peak_rss_mb']) == {'baseline', 'async save',\n"
            "                                                             'blocking save', 'resume'}")

    assert loads_framework(code) == []
