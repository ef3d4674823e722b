"""launch/horovodrun.py: horovodrun's "was Horovod built with Gloo?" check, asked once per installation."""

from pathlib import Path

from hvdazure.launch.horovodrun import cache_file, cached_check, installation_key


def _counting(answer):
    calls = []

    def check(verbose=False):
        calls.append(verbose)
        return answer

    return check, calls


def test_the_answer_is_asked_once_and_then_read_back_for_the_same_installation(tmp_path: Path) -> None:
    check, calls = _counting(True)
    path = tmp_path / "cache" / "gloo.json"

    assert cached_check(check, "install-1", path)(verbose=True) is True
    assert cached_check(check, "install-1", path)() is True  # another job: read back
    assert calls == [True]


def test_another_installation_is_asked_again_and_a_negative_answer_is_kept_too(tmp_path: Path) -> None:
    path = tmp_path / "gloo.json"
    cached_check(_counting(True)[0], "install-1", path)()
    check, calls = _counting(False)

    assert cached_check(check, "install-2", path)() is False
    assert cached_check(check, "install-2", path)() is False
    assert calls == [False]


def test_an_unreadable_or_unwritable_cache_means_asking_every_time(tmp_path: Path) -> None:
    (tmp_path / "gloo.json").write_text("{not json")
    check, calls = _counting(True)
    unwritable = tmp_path / "a-file" / "gloo.json"
    (tmp_path / "a-file").write_text("")

    assert cached_check(check, "k", tmp_path / "gloo.json")() is True
    assert cached_check(check, "k", unwritable)() is True
    assert cached_check(check, "k", unwritable)() is True
    assert len(calls) == 3


def test_the_key_names_every_extension_file_and_changes_when_one_does(tmp_path: Path) -> None:
    library = tmp_path / "torch" / "mpi_lib_v2.cpython-311-x86_64-linux-gnu.so"
    library.parent.mkdir()
    library.write_bytes(b"v1")
    before = installation_key(tmp_path)
    library.write_bytes(b"v2 longer")

    assert str(library) in before and installation_key(tmp_path) != before


def test_the_answer_is_kept_in_hvdazures_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HVDAZURE_CACHE", str(tmp_path / "hvdazure"))
    assert cache_file() == tmp_path / "hvdazure" / "horovod-gloo-built.json"
    monkeypatch.delenv("HVDAZURE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_file() == tmp_path / "xdg" / "hvdazure" / "horovod-gloo-built.json"


def test_horovods_launcher_imports_where_python_has_no_distutils() -> None:
    """Python 3.12 has no distutils (the GPU check's machine); Horovod 0.28.1's launcher imports
    distutils.spawn. Here (3.11) distutils is hidden from the import system in a child process."""
    import subprocess
    import sys

    script = """
import sys
class NoDistutils:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('distutils', '_distutils_hack', 'setuptools'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoDistutils())
for name in [m for m in sys.modules if m.split('.')[0] in ('distutils', '_distutils_hack', 'setuptools')]:
    del sys.modules[name]
from hvdazure.launch.horovodrun import provide_distutils_spawn
if sys.argv[1] == 'provided':
    provide_distutils_spawn()
import horovod.runner.launch
from distutils.spawn import find_executable
print(find_executable('sh'))
"""
    without = subprocess.run([sys.executable, "-c", script, "plain"], capture_output=True, text=True)
    assert without.returncode != 0 and "distutils" in without.stderr  # what Python 3.12 would meet
    provided = subprocess.run([sys.executable, "-c", script, "provided"], capture_output=True, text=True)
    assert provided.returncode == 0, provided.stderr
    assert provided.stdout.strip().endswith("/sh")
