"""`hvdazure data index` and `hvdazure data pack`: one summary line on success; bad input is one line on
stderr naming the bad value, exit status 2, no traceback; `--help` loads no framework."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdazure.cli import main
from hvdazure.data.index import INDEX_NAME, load_index
from hvdazure.data.writers import write_shards

HEAVY = ("torch", "tensorflow", "keras", "horovod", "azure", "azureml", "pyarrow")


def shards(directory: Path) -> Path:
    write_shards({"x": np.arange(10)}, str(directory), "tar", samples_per_shard=4, progress=False)
    (directory / INDEX_NAME).unlink()
    return directory


def image_folder(root: Path) -> Path:
    for cls in ("dog", "cat"):
        for i in range(3):
            path = root / cls / f"{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{cls}{i}".encode())
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_index_prints_one_summary_line(tmp_path, capsys):
    data = shards(tmp_path / "data")

    code, out, _ = run(["data", "index", str(data), "--no-progress"], capsys)

    assert code == 0
    assert out == f"indexed 3 shards, 10 samples, {load_index(str(data)).num_bytes} bytes " \
                  f"({load_index(str(data)).num_bytes / 1000:.1f} KB); index: {data}/{INDEX_NAME}\n"


def test_index_to_an_output_elsewhere_as_json(tmp_path, capsys):
    data = shards(tmp_path / "data")
    output = tmp_path / "idx" / "train.json"

    argv = ["data", "index", str(data), "--output", str(output), "--no-progress", "--json"]
    code, out, _ = run(argv, capsys)

    summary = json.loads(out)
    assert code == 0
    assert summary["shards"] == 3 and summary["samples"] == 10 and summary["index"] == str(output)
    assert summary["fingerprint"] == load_index(str(output)).fingerprint()
    assert not (data / INDEX_NAME).exists()


def test_index_shows_progress_unless_told_not_to(tmp_path, capsys):
    data = shards(tmp_path / "data")

    assert "indexing" in run(["data", "index", str(data)], capsys)[2]
    assert run(["data", "index", str(data), "--no-progress"], capsys)[2] == ""


def test_pack_writes_shards_and_classes(tmp_path, capsys):
    folder, out_dir = image_folder(tmp_path / "images"), tmp_path / "out"

    code, out, _ = run(["data", "pack", str(folder), str(out_dir), "--format", "tfrecord",
                        "--samples-per-shard", "4", "--no-progress"], capsys)

    assert code == 0
    assert out.startswith("packed 2 shards, 6 samples, ") and out.endswith(f"index: {out_dir}/{INDEX_NAME}\n")
    assert json.loads((out_dir / "classes.json").read_text()) == ["cat", "dog"]
    assert [e.path for e in load_index(str(out_dir)).shards] == [f"shard-0000{i}.tfrecord" for i in (0, 1)]


def test_pack_takes_a_shard_size(tmp_path, capsys):
    folder = image_folder(tmp_path / "images")

    code, out, _ = run(["data", "pack", str(folder), str(tmp_path / "out"), "--shard-size", "1KB",
                        "--no-progress", "--json"], capsys)

    assert code == 0 and json.loads(out)["shards"] == 6  # a tar sample takes 2 KB: one a shard


@pytest.mark.parametrize(("argv", "named"), [
    (["data", "index", "{tmp}/nowhere"], "{tmp}/nowhere"),
    (["data", "index", "{tmp}/notes.zip"], "notes.zip"),
    (["data", "index", "{tmp}/empty"], "no shards"),
    (["data", "index", "{tmp}/data", "--storage-option", "oops"], "'oops'"),
    (["data", "pack", "{tmp}/images", "{tmp}/out", "--shard-size", "64XB"], "'64XB'"),
    (["data", "pack", "{tmp}/images", "{tmp}/out", "--format", "zip"], "'zip'"),
    (["data", "pack", "{tmp}/nowhere", "{tmp}/out"], "{tmp}/nowhere"),
    (["data", "pack", "{tmp}/images", "{tmp}/data"], "already holds shards"),
])
def test_bad_input_is_one_line_naming_it_and_exit_2(tmp_path, capsys, argv, named):
    shards(tmp_path / "data")
    (tmp_path / "data" / INDEX_NAME).write_text("{}")
    image_folder(tmp_path / "images")
    (tmp_path / "notes.zip").write_bytes(b"zip")
    (tmp_path / "empty").mkdir()

    code, out, err = run([arg.format(tmp=tmp_path) for arg in argv], capsys)

    assert code == 2 and out == ""
    assert err.startswith("hvdazure: error: ") and err.count("\n") == 1
    assert named.format(tmp=tmp_path) in err


def test_a_corrupt_shard_is_one_line_without_a_traceback(tmp_path):
    data = shards(tmp_path / "data")
    shard = data / "shard-00001.tar"
    shard.write_bytes(shard.read_bytes()[:700])

    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "data", "index", str(data), "--no-progress"],
                          capture_output=True, text=True)

    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"{data}/shard-00001.tar: truncated" in proc.stderr


@pytest.mark.parametrize("argv", [["data", "--help"], ["data", "index", "--help"],
                                  ["data", "pack", "--help"]])
def test_data_help_exits_zero_and_loads_no_framework(argv):
    probe = (
        "import runpy, sys, json\n"
        f"sys.argv = ['hvdazure', *{argv!r}]\n"
        "try:\n    runpy.run_module('hvdazure.cli', run_name='__main__')\n"
        "except SystemExit as e:\n    code = e.code\n"
        f"print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [0, []]


def test_indexing_tar_shards_loads_no_framework(tmp_path):
    data = shards(tmp_path / "data")
    probe = ("import sys, json\nfrom hvdazure.cli import main\n"
             f"main(['data', 'index', {str(data)!r}, '--no-progress'])\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
