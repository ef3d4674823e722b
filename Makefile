# The README's two commands: `make demo` (main job) and `make test` (whole suite). Both set up first;
# setup is idempotent and takes about a second once the environment exists.
VENV ?= .venv
SITE ?= site
export TF_CPP_MIN_LOG_LEVEL ?= 1
export NO_MKDOCS_2_WARNING ?= 1  # MkDocs 2 / Material end-of-life notice on every build (CONTRIBUTING.md)

.PHONY: setup demo demo-tf test test-fast test-unit test-distributed lint docs docs-check docs-serve doctor \
	horovod-gpu clean

setup:
	@bash scripts/setup_env.sh

demo: setup
	$(VENV)/bin/hvdazure run -np 2 samples/torch_digits.py

demo-tf: setup
	$(VENV)/bin/hvdazure run -np 2 samples/tf_digits.py

# The whole suite, what CI runs, in two parts: first test-fast's tests on every core (in-process work: no
# job, no Azurite, no training), then every other test serially (a 2-rank job uses both cores; the signal,
# timeout and partition tests measure bounded times). tests/docs/ reads the site docs-check built
# (HVDAZURE_DOCS_SITE) instead of building it again.
FAST = (unit or docs) and not slow
test: setup lint docs-check
	HVDAZURE_DOCS_SITE=$(SITE) $(VENV)/bin/pytest tests/unit tests/docs -m "$(FAST)" -q -n auto --dist loadfile
	HVDAZURE_DOCS_SITE=$(SITE) $(VENV)/bin/pytest tests -m "not ($(FAST))" --durations=30

# The edit-test loop (about 75 s on 2 cores): the unit tier and the docs' checks that run no training, no
# real ranks, no Azurite, on every core (pytest-xdist, a file per worker).
test-fast: setup
	$(VENV)/bin/pytest tests/unit tests/docs -m "$(FAST)" -q -n auto --dist loadfile

test-unit: setup
	$(VENV)/bin/pytest tests/unit

test-distributed: setup
	$(VENV)/bin/pytest tests/distributed tests/integration

# The GPU check (docs/guides/gpus.md): `gpu-check-cpu` runs all of its rows that a CPU can, here, on the
# project's Horovod (about 2 min on 2 cores), its table in gpu-check-out/; `gpu-check-bundle` assembles what it
# carries to a GPU machine (.gpu-check/) and prints the command to run it there.
.PHONY: gpu-check-cpu gpu-check-bundle
gpu-check-cpu: setup
	CUDA_VISIBLE_DEVICES= GPU_CHECK_PYTHON=$(VENV)/bin/python bash scripts/gpu_check.sh gpu-check-out

gpu-check-bundle: setup
	PYTHON=$(VENV)/bin/python bash scripts/gpu_check_bundle.sh

# ruff; the import contracts of [tool.importlinter] and the types of [tool.mypy] (both in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy

# The documentation site (mkdocs.yml): `make docs` builds it into site/ (open site/index.html in a browser),
# `make docs-serve` serves it with live reload on 127.0.0.1:8000. --strict everywhere: a broken link or
# anchor, a page not in the nav, an API name or a reference the code no longer has fails the build.
docs: setup
	$(VENV)/bin/mkdocs build --strict --site-dir $(SITE)

docs-check: docs

docs-serve: setup
	$(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8000

doctor: setup
	$(VENV)/bin/hvdazure doctor

# Horovod for PyTorch with NCCL, MPI and Gloo, built against PyPI's CUDA torch and CUDA toolkit in a venv of its
# own (~/.cache/hvdazure/venv-torch-cu130), no GPU needed; the wheel is cached (docs/guides/gpus.md).
horovod-gpu:
	@bash scripts/build_horovod_gpu.sh

clean:
	rm -rf $(VENV) $(SITE) build *.egg-info .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
