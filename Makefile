# The README's two commands: `make demo` (main job) and `make test` (whole suite). Both set up first;
# setup is idempotent and takes about a second once the environment exists.
VENV ?= .venv
export TF_CPP_MIN_LOG_LEVEL ?= 1

.PHONY: setup demo demo-tf test test-unit test-distributed lint doctor clean

setup:
	@bash scripts/setup_env.sh

demo: setup
	$(VENV)/bin/hvdazure run -np 2 samples/torch_digits.py

demo-tf: setup
	$(VENV)/bin/hvdazure run -np 2 samples/tf_digits.py

test: setup lint
	$(VENV)/bin/pytest tests --durations=30

test-unit: setup
	$(VENV)/bin/pytest tests/unit

test-distributed: setup
	$(VENV)/bin/pytest tests/distributed tests/integration

# ruff; the import contracts of [tool.importlinter] and the types of [tool.mypy] (both in pyproject.toml)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/mypy

doctor: setup
	$(VENV)/bin/hvdazure doctor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache .import_linter_cache
