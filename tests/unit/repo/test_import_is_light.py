"""`import hvdazure` and `hvdazure --help` must not load heavy frameworks: the CLI stays fast."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "tensorflow", "keras", "horovod", "azure", "azureml")

PROBE = """
import json, sys
{action}
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})))
"""


@pytest.mark.parametrize("action", [
    "import hvdazure",
    "import hvdazure.cli, hvdazure.launch.command, hvdazure.launch.supervisor, hvdazure.doctor",
    "from hvdazure.cli import build_parser\nbuild_parser().format_help()",
])
def test_importing_hvdazure_loads_no_framework(action):
    probe = PROBE.format(action=action, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["doctor", "--help"], ["submit", "--help"],
                                  ["submit", "sweep", "--help"], ["submit", "in-job-sweep", "--help"],
                                  ["export", "--help"]])
def test_help_exits_zero_and_loads_no_framework(argv):
    probe = (
        "import runpy, sys, json\n"
        f"sys.argv = ['hvdazure', *{argv!r}]\n"
        "try:\n    runpy.run_module('hvdazure.cli', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        f"print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []]
