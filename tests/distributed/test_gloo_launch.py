"""Starting a Gloo job: horovodrun's check that Horovod was built with Gloo imports TensorFlow (about 9 s of
CPU, before any rank starts); `hvdazure run --gloo` asks it once per installation (launch/horovodrun.py)."""

import importlib.util
import re

from harness import run_job

_TENSORFLOW_IMPORTED = re.compile(r"^import time:.*\|\s+tensorflow$", re.MULTILINE)


def test_a_gloo_job_after_the_first_starts_without_importing_tensorflow_in_the_launcher(tmp_path):
    script = tmp_path / "nothing.py"
    script.write_text("")
    # every Python process of the job prints its imports; the rank's script imports nothing
    env = {"HVDAZURE_CACHE": str(tmp_path / "cache"), "PYTHONPROFILEIMPORTTIME": "1"}
    first, second = (run_job(script, out_dir=tmp_path, np=1, env=env) for _ in range(2))

    assert first.returncode == 0 and second.returncode == 0, first.output + second.output
    if importlib.util.find_spec("tensorflow") is not None:
        assert _TENSORFLOW_IMPORTED.search(first.output), first.output  # horovodrun's own check, asked
    assert not _TENSORFLOW_IMPORTED.search(second.output), second.output
