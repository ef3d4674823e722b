"""versions.env is the one place every pinned version lives: the Dockerfiles, the local setup script,
requirements/ and setup.py must agree with it, so CI exercises the recipe the images are built from."""

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from version_pins import ROOT, read_versions_env, requirement_pins, setup_py_arguments

DOCKERFILES = {kind: ROOT / f"docker/{kind}/Dockerfile" for kind in ("cpu", "torch-gpu", "tf-gpu")}
# The versions.env keys each image is built from: the CPU image has both frameworks and no CUDA; each GPU
# image has one framework on the CUDA line its wheels bring.
COMMON_PINS = {"PYTHON_VERSION", "HOROVOD_VERSION", "OPENMPI_VERSION"}
IMAGE_PINS = {
    "cpu": COMMON_PINS | {"TORCH_VERSION", "TENSORFLOW_VERSION"},
    "torch-gpu": COMMON_PINS | {"TORCH_VERSION", "TORCH_CUDA_VERSION", "TORCH_NCCL_VERSION"},
    "tf-gpu": COMMON_PINS | {"TENSORFLOW_VERSION", "TF_CUDA_VERSION", "TF_NCCL_VERSION"},
}
# What each image installs its framework(s) as, from the pins.
FRAMEWORK_SPECS = {
    "cpu": ['"torch==${TORCH_VERSION}+cpu"', '"tensorflow-cpu==${TENSORFLOW_VERSION}"'],
    "torch-gpu": ['"torch==${TORCH_VERSION}"', '"cuda-toolkit==${TORCH_CUDA_VERSION}.*"',
                  '"nvidia-nccl-cu13==${TORCH_NCCL_VERSION}.*"'],
    "tf-gpu": ['"tensorflow[and-cuda]==${TENSORFLOW_VERSION}"',
               '"nvidia-cuda-runtime-cu12==${TF_CUDA_VERSION}.*"',
               '"nvidia-nccl-cu12==${TF_NCCL_VERSION}.*"'],
}
REQUIREMENT_FILES = [ROOT / "requirements/base.txt", ROOT / "requirements/dev.txt",
                     ROOT / "docker/requirements-image.txt"]


def global_arg_defaults(dockerfile: Path) -> dict[str, str]:
    """`ARG NAME=default` lines before the first FROM, with ${NAME} references to earlier ones expanded."""
    args: dict[str, str] = {}
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM "):
            break
        if match := re.match(r"ARG (\w+)=(\S+)$", line):
            name, default = match.groups()
            args[name] = re.sub(r"\$\{(\w+)\}", lambda ref: args[ref.group(1)], default)
    return args



def setup_py_requirements(group: str) -> list[Requirement]:
    """install_requires for "install", else that extra's requirements."""
    arguments = setup_py_arguments()
    specs = arguments["install_requires"] if group == "install" else arguments["extras_require"][group]
    return [Requirement(spec) for spec in specs]



PINS = read_versions_env()


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_arg_defaults_equal_versions_env(image):
    defaults = global_arg_defaults(DOCKERFILES[image])
    keys = IMAGE_PINS[image]

    assert {key: defaults.get(key) for key in keys} == {key: PINS[key] for key in keys}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfiles_install_the_frameworks_from_the_pins_not_from_literals(image):
    text = DOCKERFILES[image].read_text()

    for spec in FRAMEWORK_SPECS[image]:
        assert spec in text
    assert '"openmpi-bin=${OPENMPI_VERSION}.*"' in text
    assert "bash /opt/hvdazure/scripts/build_horovod.sh" in text
    assert f"check_image.sh {image}" in text
    for key in sorted(IMAGE_PINS[image] - COMMON_PINS | {"HOROVOD_VERSION"}):
        assert text.count(f"{key}={PINS[key]}") == 1, f"{key} declared with its value more than once"
        if key in ("TORCH_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION"):
            assert text.count(PINS[key]) == 1, f"{PINS[key]} ({key}) written outside its ARG default"


@pytest.mark.parametrize("image", ["cpu", "torch-gpu"])
def test_cpu_and_torch_gpu_images_are_based_on_the_pinned_python(image):
    base = global_arg_defaults(DOCKERFILES[image])["BASE_IMAGE"]

    assert base.startswith(f"python:{PINS['PYTHON_VERSION']}-")


def test_torch_gpu_image_takes_cuda_from_pypi_and_builds_horovod_with_nccl():
    text = DOCKERFILES["torch-gpu"].read_text()

    assert set(re.findall(r"^FROM (\S+)", text, re.M)) == {"${BASE_IMAGE}", "deps"}  # no CUDA base image
    assert "scripts/pypi_cuda_toolkit.sh" in text
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in text
    assert "COPY --from=build /opt/cuda-toolkit" not in text  # nvcc stays in the build stage


def test_tf_gpu_image_build_and_runtime_bases_are_the_pinned_cuda_12():
    defaults = global_arg_defaults(DOCKERFILES["tf-gpu"])
    text = DOCKERFILES["tf-gpu"].read_text()

    for stage in ("BUILD_IMAGE", "RUNTIME_IMAGE"):
        assert defaults[stage].startswith(f"nvidia/cuda:{PINS['TF_CUDA_VERSION']}."), stage
    assert defaults["BUILD_IMAGE"].replace("-devel-", "-base-") == defaults["RUNTIME_IMAGE"]
    assert '"release ${TF_CUDA_VERSION},"' in text  # the build stops on another nvcc
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in text


def test_the_two_cuda_lines_are_the_ones_the_frameworks_bring():
    """PyTorch's wheels are CUDA 13 and TensorFlow's CUDA 12 (their PyPI metadata): one pin per line."""
    assert PINS["TORCH_CUDA_VERSION"].split(".")[0] == "13"
    assert PINS["TF_CUDA_VERSION"].split(".")[0] == "12"
    assert "CUDA_VERSION" not in PINS and "NCCL_VERSION" not in PINS  # the old single GPU line is gone


def test_local_setup_reads_the_same_pins():
    setup_env = (ROOT / "scripts/setup_env.sh").read_text()

    assert ". ./versions.env" in setup_env
    assert '"torch==${TORCH_VERSION}" "tensorflow-cpu==${TENSORFLOW_VERSION}"' in setup_env
    assert "scripts/build_horovod.sh" in setup_env
    for key in ("TORCH_VERSION", "TENSORFLOW_VERSION", "HOROVOD_VERSION"):
        assert PINS[key] not in setup_env


@pytest.mark.parametrize("path", REQUIREMENT_FILES, ids=lambda path: path.name)
def test_requirement_files_pin_exact_versions(path):
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-r"):
            assert re.fullmatch(r"[\w.\-\[\]]+==[\w.]+", line), f"{path.name}: not an exact pin: {line}"


def test_setup_py_admits_the_pinned_python():
    python_requires = SpecifierSet(setup_py_arguments()["python_requires"])

    assert python_requires.contains(PINS["PYTHON_VERSION"] + ".0")


@pytest.mark.parametrize(("extra", "key"), [("torch", "TORCH_VERSION"), ("tensorflow", "TENSORFLOW_VERSION")])
def test_setup_py_framework_extras_admit_the_pinned_framework(extra, key):
    (framework,) = [r for r in setup_py_requirements(extra) if r.name == extra]

    assert framework.specifier.contains(PINS[key]), f"{framework} does not admit {PINS[key]}"


@pytest.mark.parametrize(("group", "requirements"), [("install", "base.txt"), ("dev", "dev.txt")])
def test_setup_py_ranges_admit_the_requirement_pins(group, requirements):
    pins = requirement_pins(ROOT / "requirements" / requirements)

    for requirement in setup_py_requirements(group):
        pinned = pins.get(requirement.name.lower())
        if pinned:  # a range without a pin (none today) is left to the resolver
            assert requirement.specifier.contains(pinned), f"{requirement} does not admit {pinned}"
