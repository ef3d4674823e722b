"""Every test tier can import the test doubles in tests/fakes/ as `fakes.<module>`, and shares `torch_runs`:
the runs of tests/distributed/workers/torch_job.py that tests in several folders start identically.

The tiers (CONTRIBUTING.md, "The test tiers"): every test gets exactly one tier marker, from its folder or,
where a test does more than its folder's tier allows, from its own mark: `unit` (no process of a job, under a
second each), `storage` (Azurite), `distributed` (real ranks), `multinode` (two nodes of namespaces), `docs`
(the site and its examples). A `unit`-tier test that starts a job's launcher (mpirun, horovodrun, `hvdazure
run`) without a `distributed` mark fails, naming the command: the tier is what a test does, not where it is.
`make test` ends with the slowest files and the time each tier took.
"""

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from distributed.harness import TorchRuns  # noqa: E402

TIERS = ("unit", "storage", "distributed", "multinode", "docs")
_FOLDER_TIER = {"unit": "unit", "storage": "storage", "distributed": "distributed",
                "integration": "distributed", "multinode": "multinode", "docs": "docs"}
_LAUNCHERS = ("mpirun", "mpiexec", "horovodrun", "hvdazure.launch.horovodrun")


@pytest.fixture(scope="session")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> TorchRuns:
    """Each distinct run once per session (see TorchRuns): a reference run, or the first half of a resume."""
    return TorchRuns(tmp_path_factory.mktemp("torch-runs"))


def tier_of(item: pytest.Item) -> str:
    """The test's own tier mark if it has one (the highest, if several), else its folder's tier."""
    marked = [t for t in TIERS if item.get_closest_marker(t) is not None]
    if "azurite" in getattr(item, "fixturenames", ()):
        marked.append("storage")  # a test of any folder that talks to the Blob emulator
    if marked:
        return max(marked, key=TIERS.index)
    folder = Path(str(item.fspath)).relative_to(_TESTS).parts[0]
    return _FOLDER_TIER.get(folder, "unit")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_tier_seconds] = defaultdict(float)
    config.stash[_tier_counts] = defaultdict(int)
    config.stash[_file_seconds] = defaultdict(float)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        item.stash[_tier] = tier
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "multinode" and item.get_closest_marker("distributed") is None:
            item.add_marker(pytest.mark.distributed)  # multi-process too: `-m "not distributed"` skips it


def _starts_a_job(args: object, cwd: object = None) -> str | None:
    """The command line, if `args` (as given to subprocess.Popen) starts a job: a launcher (mpirun,
    horovodrun) asked for more than its version, or `hvdazure run` given a command or a script that exists
    (one refused before it starts, a missing script say, starts none)."""
    parts = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if "--version" in parts or "--check-build" in parts:
        return None
    if any(Path(p).name in _LAUNCHERS for p in parts):
        return " ".join(parts)
    for i, part in enumerate(parts[:-1]):
        if part == "hvdazure.cli" and parts[i + 1] == "run":
            rest = parts[i + 2:]
            folder = Path(str(cwd)) if cwd is not None else Path.cwd()
            if "--" in rest or any(a.endswith(".py") and (folder / a).is_file() for a in rest):
                return " ".join(parts)
    return None


@pytest.fixture(autouse=True)
def _unit_tests_start_no_job(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the unit tier, starting mpirun, horovodrun or `hvdazure run` fails the test: mark it distributed."""
    if request.node.stash.get(_tier, "unit") != "unit":
        return
    real_init = subprocess.Popen.__init__

    def init(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        command = _starts_a_job(args, kwargs.get("cwd"))
        if command is not None:
            pytest.fail(f"a unit test started a job ({command}): mark it @pytest.mark.distributed "
                        f"(tests/conftest.py says why)", pytrace=False)
        real_init(self, args, *rest, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess.Popen, "__init__", init)


_tier = pytest.StashKey[str]()
_tier_seconds = pytest.StashKey[dict]()
_tier_counts = pytest.StashKey[dict]()
_file_seconds = pytest.StashKey[dict]()
_started = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    start = time.monotonic()
    yield
    tier = item.stash.get(_tier, "unit")
    took = time.monotonic() - start
    item.config.stash[_tier_seconds][tier] += took
    item.config.stash[_tier_counts][tier] += 1
    item.config.stash[_file_seconds][item.nodeid.split("::")[0]] += took


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    seconds, counts = config.stash[_tier_seconds], config.stash[_tier_counts]
    if not counts:
        return
    parts = [f"{tier} {counts[tier]} tests {seconds[tier] / 60:.1f} min" for tier in TIERS if counts[tier]]
    total = time.monotonic() - _started
    slowest = sorted(config.stash[_file_seconds].items(), key=lambda kv: -kv[1])[:12]
    if len(config.stash[_file_seconds]) > 1:
        files = ", ".join(f"{Path(name).name} {seconds:.0f}s" for name, seconds in slowest)
        terminalreporter.write_line(f"slowest files: {files}")
    terminalreporter.write_line(f"time per tier: {'; '.join(parts)}; all {total / 60:.1f} min")
