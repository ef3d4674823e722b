"""`hvdazure bench` as the CLI: light help, one-line errors before any rank starts."""

import json
import subprocess
import sys

from hvdazure.cli import main

HEAVY = ("torch", "tensorflow", "keras", "horovod", "azure", "azureml")


def test_bench_help_loads_no_framework():
    probe = (
        "import runpy, sys, json\n"
        "sys.argv = ['hvdazure', 'bench', '--help']\n"
        "try:\n    runpy.run_module('hvdazure.cli', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        f"print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert "allreduce" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []]


def test_allreduce_on_one_rank_fails_in_one_line_before_any_rank_starts(capsys):
    assert main(["bench", "allreduce", "-np", "1"]) == 2

    assert capsys.readouterr().err.strip() == "hvdazure: error: allreduce needs at least 2 ranks (-np 2)"
