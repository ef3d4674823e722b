"""The documentation against the code: the examples it marks `<!-- run -->` run, the generated references
say what the code says, and the built site holds them, with no raw Markdown and no autodoc error.

The site is the one `make docs-check` built (HVDAZURE_DOCS_SITE, as `make test` sets it) or, run alone,
one built here into a temporary folder (about 10 s). Python examples run as scripts, one process each, in a
scratch folder holding `train.py` (a copy of samples/torch_digits.py) for the examples that name one.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "gen"))

import checks  # noqa: E402  (docs/gen is not a package: MkDocs loads its hook by path)
import reference  # noqa: E402

from hvdazure.cli import build_parser  # noqa: E402
from hvdazure.core.config import TrainConfig  # noqa: E402

BIN = Path(sys.executable).parent
PAGES = sorted((ROOT / "docs").rglob("*.md"))
PROSE = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *PAGES]


def _marked(language: str, marker: str) -> list[tuple[Path, checks.Fence]]:
    found = []
    for path in PROSE:
        found += [(path, f) for f in checks.fences(path.read_text())
                  if f.language == language and f.marker == marker]
    return found


def _id(item: tuple[Path, checks.Fence]) -> str:
    return f"{item[0].relative_to(ROOT)}:{item[1].line}"


PYTHON_EXAMPLES = _marked("python", "run")
SHELL_EXAMPLES = _marked("bash", "run")


# --- examples ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("examples")
    shutil.copy(ROOT / "samples" / "torch_digits.py", folder / "train.py")
    return folder


@pytest.mark.slow  # each runs a training: `make test-fast` leaves them to `make test`
@pytest.mark.parametrize("example", PYTHON_EXAMPLES, ids=_id)
def test_a_runnable_python_example_runs(example: tuple[Path, checks.Fence], scratch: Path,
                                       tmp_path: Path) -> None:
    _, fence = example
    for name in os.listdir(scratch):
        shutil.copy(scratch / name, tmp_path / name)
    script = tmp_path / "example.py"
    script.write_text(fence.code)
    # XDG_CACHE_HOME: what an example leaves in the user's cache (a dry run's files) stays in the test's
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3",
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, str(script), *fence.arguments.split()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{_id(example)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("example", SHELL_EXAMPLES, ids=_id)
def test_a_runnable_shell_example_runs_command_by_command(example: tuple[Path, checks.Fence]) -> None:
    """The quickstart's commands, from the repository's root, as a reader types them."""
    _, fence = example
    for line in fence.code.splitlines():
        command = line.split("#")[0].strip()
        if not command:
            continue
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=280,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert done.returncode == 0, f"`{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_quickstart_is_marked_runnable() -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text()
    quickstart = [f for f in checks.fences(page) if f.marker == "run"]
    assert any("hvdazure run -np 2 samples/torch_digits.py" in f.code for f in quickstart)
    assert any("hvdazure run -np 2 samples/tf_digits.py" in f.code for f in quickstart)


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_says_whether_it_runs(path: Path) -> None:
    unmarked = [f.line for f in checks.fences(path.read_text()) if f.language == "python" and not f.marker]
    assert not unmarked, (f"{path.relative_to(ROOT)}: Python blocks at lines {unmarked} need <!-- run --> "
                          "or <!-- illustration --> on the line before them")


# --- references to the code --------------------------------------------------------------------------
@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_prose_outside_the_site_names_only_what_the_code_has(path: Path) -> None:
    assert checks.stale_references(path.read_text()) == []


def test_the_checks_find_a_renamed_function_a_missing_file_a_field_and_a_bad_option() -> None:
    text = ("`hvdazure.torch.load_weightz` and `samples/no_such.py`; `--set batchsize=4`\n\n"
            "```bash\nhvdazure run -np two train.py\n```\n")
    found = checks.stale_references(text)
    assert len(found) == 4, found
    assert checks.stale_references("`hvdazure.torch.load_weights`, `samples/torch_digits.py`, "
                                   "`--set batch_size=4`") == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mpirun") is None, reason="needs mpirun, as root")
def test_the_troubleshooting_row_for_mpirun_as_root_quotes_what_mpirun_prints() -> None:
    page = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `mpirun") and "as root" in line]
    assert len(rows) == 1, rows
    quoted = rows[0].split("`")[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    printed = subprocess.run(["mpirun", "-np", "1", "true"], env=env, capture_output=True, text=True,
                             timeout=60)
    assert printed.returncode != 0
    assert quoted in printed.stdout + printed.stderr, printed.stdout + printed.stderr


def test_the_config_table_has_every_field_with_its_type_default_and_meaning() -> None:
    rows = {row.name: row for row in reference.config_fields(TrainConfig)}
    assert list(rows) == [f.name for f in dataclasses.fields(TrainConfig)]
    for f in dataclasses.fields(TrainConfig):
        row = rows[f.name]
        assert row.default == reference.describe_default(f)
        assert row.meaning, f.name
    assert rows["batch_size"].default == str(TrainConfig().batch_size)
    assert rows["lr_scaling"].type == "one of `none`, `linear`, `sqrt`"
    assert rows["max_steps"].type == "int or null" and rows["max_steps"].default == "null"
    assert rows["checkpoint_async"].default == "true"


def test_the_config_tables_group_each_field_under_its_own_heading() -> None:
    """The `# comment` above a field heads its group: tensorboard and mlflow once sat under "Preemption
    notices", the last heading above them."""
    groups = {row.name: row.group for row in reference.config_fields(TrainConfig)}
    expected = {"preemption_watch": "preemption notices", "scheduled_events_url": "preemption notices",
                "tensorboard": "logging and tracking", "mlflow": "logging and tracking",
                "mlflow_tracking_uri": "logging and tracking", "progress_bar": "logging and tracking",
                "extra": "your own settings"}
    assert {name: groups[name] for name in expected} == expected


def test_a_changed_default_or_meaning_in_the_code_changes_the_config_table(tmp_path: Path) -> None:
    source = (ROOT / "hvdazure" / "core" / "config.py").read_text()
    assert "    batch_size: int = 32\n" in source
    changed = source.replace("    batch_size: int = 32\n", "    batch_size: int = 48\n").replace(
        '"""Samples per worker per micro-batch.', '"""Per rank, per micro-batch (changed).')
    (tmp_path / "changed_config.py").write_text(changed)
    spec = importlib.util.spec_from_file_location("changed_config", tmp_path / "changed_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["changed_config"] = module
    try:
        spec.loader.exec_module(module)
        table = reference.config_table(module.TrainConfig)
    finally:
        del sys.modules["changed_config"]
    row = next(line for line in table.splitlines() if "`batch_size`" in line)
    assert "`48`" in row and "Per rank, per micro-batch (changed)." in row
    assert "`32`" not in row


def test_the_cli_reference_has_every_command_and_option_with_its_help() -> None:
    text = reference.cli_reference()
    commands, stack = [], [build_parser()]
    while stack:
        parser = stack.pop()
        commands.append(parser)
        stack += [sub for _, _, sub in reference.subcommands(parser)]
    assert {"hvdazure submit sweep", "hvdazure submit in-job-sweep", "hvdazure azure compute create",
            "hvdazure data pack"} <= {p.prog for p in commands}
    for parser in commands:
        assert f"# {parser.prog}\n" in text
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text or f", {option}" in text, f"{parser.prog} {option}"
            if action.help and action.help != "==SUPPRESS==" and "%" not in action.help \
                    and not isinstance(action, argparse._HelpAction):
                assert " ".join(action.help.split())[:40].replace("<", "&lt;").replace(">", "&gt;") in text


# --- the built site ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("HVDAZURE_DOCS_SITE")
    if built:
        path = Path(built) if Path(built).is_absolute() else ROOT / built
        assert (path / "index.html").is_file(), f"HVDAZURE_DOCS_SITE={built} holds no built site"
        return path
    path = tmp_path_factory.mktemp("site")
    done = subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-5000:]
    return path


def _page(site: Path, name: str):
    from bs4 import BeautifulSoup

    return BeautifulSoup((site / name).read_text(), "html.parser")


def test_the_built_config_reference_has_a_row_per_field_with_the_codes_default(site: Path) -> None:
    page = _page(site, "reference/config.html")
    rows = {}
    for tr in page.select("article table tr"):
        cells = [td.get_text(" ", strip=True) for td in tr.find_all("td")]
        if cells:
            rows[cells[0]] = cells
    for row in reference.config_fields(TrainConfig):
        assert row.name in rows, row.name
        assert rows[row.name][2] == row.default, row.name
        assert page.find(id=row.name) is not None, row.name


def test_the_built_cli_reference_has_a_section_per_command(site: Path) -> None:
    page = _page(site, "reference/cli.html")
    headings = {h.get_text(strip=True).rstrip("¶") for h in page.select("article h2, article h3, article h4")}
    assert {"hvdazure run", "hvdazure sweep", "hvdazure bench", "hvdazure submit", "hvdazure submit sweep",
            "hvdazure data index"} <= headings


def test_the_built_pages_hold_no_raw_markdown_markers_or_autodoc_errors(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) >= 25
    for path in pages:
        if path.name == "404.html":
            continue
        article = _page(site, str(path.relative_to(site))).find("article")
        assert article is not None, path
        for code in article.find_all(["pre", "code"]):
            code.decompose()
        text = article.get_text(" ")
        for raw in ("```", ":::", "<!--", "--8<--", "generated:", "](", "**"):
            assert raw not in text, f"{path.relative_to(site)}: raw Markdown {raw!r} in the page"
        assert "Could not collect" not in text and "could not be found" not in text, path


def test_the_api_reference_shows_the_trainers_hooks(site: Path) -> None:
    text = _page(site, "reference/api/torch.html").get_text(" ")
    for name in ("TorchTrainer", "build_model", "build_optimizer", "train_dataset", "training_step",
                 "load_weights", "convert_sync_batchnorm"):
        assert name in text, name


def test_marked_examples_are_titled_with_whether_they_run(site: Path) -> None:
    text = _page(site, "guides/pytorch.html").get_text(" ")
    assert "Runs in the test suite" in text and "Illustration: not run by the tests" in text
