"""`hvdazure bench checkpoint --url abfs://...` on Azurite, in its --quick configuration: save and load
on the store against the same bytes written and read with fsspec, in the shape of the local figures, and
nothing left behind in the container. No timing is asserted."""

import json
import math
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from storage.azurite import forget_filesystems

pytestmark = pytest.mark.distributed


def test_bench_checkpoint_on_a_store_reports_save_and_load_against_the_stores_floor(
        blob_url: str, tmp_path: Path) -> None:
    url, out = f"{blob_url}/bench", tmp_path / "checkpoint.json"
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "bench", "checkpoint", "-np", "1", "--mpi",
                           "--quick", "--url", url, "--json", str(out)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    result = json.loads(out.read_text())
    assert result["url"] == url and result["options"]["url"] == url
    times = result["save_load_s"]
    assert set(times) == {"write (fsspec)", "hvdazure save", "hvdazure save + retention", "read (fsspec)",
                          "hvdazure load"}
    assert all(len(values) == result["repeats"] and min(values) > 0 for values in times.values())
    summary = result["summary"]
    for figure in ("save_vs_floor", "save_with_retention_vs_floor", "load_vs_floor"):
        assert math.isfinite(summary[figure]["median"]) and summary[figure]["median"] > 0
    assert "hvdazure save / write (fsspec) (the store's floor)" in proc.stdout
    forget_filesystems()
    fs, container = fsspec.core.url_to_fs(blob_url)
    assert fs.find(container) == []  # the benchmark's folder is deleted
