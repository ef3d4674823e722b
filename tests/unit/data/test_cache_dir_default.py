"""Where a node caches dataset shards when no cache_dir is given: HVDAZURE_CACHE_DIR, else the environment's
local disk (Azure ML: the job's temporary directory on the node's SSD), else ~/.cache/hvdazure/shards."""

from __future__ import annotations

import os

import pytest

from hvdazure.core.environments import ENVIRONMENTS, default_cache_dir, detect_environment

HOME = {"HOME": "/home/user"}
AZURE_ML = {**HOME, "AZUREML_RUN_ID": "run-123", "AZ_BATCHAI_JOB_TEMP": "/mnt/batch/tasks/shared/job/temp",
            "AZ_BATCH_NODE_SHARED_DIR": "/mnt/batch/tasks/shared"}


def test_outside_azure_ml_shards_are_cached_under_the_users_cache_directory() -> None:
    assert default_cache_dir(HOME) == "/home/user/.cache/hvdazure/shards"
    assert default_cache_dir({**HOME, "XDG_CACHE_HOME": "/scratch/cache"}) == "/scratch/cache/hvdazure/shards"


def test_inside_azure_ml_shards_are_cached_in_the_jobs_temporary_directory_on_the_local_ssd() -> None:
    assert default_cache_dir(AZURE_ML) == "/mnt/batch/tasks/shared/job/temp/hvdazure/shards"


def test_inside_azure_ml_without_a_job_temp_the_nodes_shared_directory_is_used() -> None:
    env = {key: value for key, value in AZURE_ML.items() if key != "AZ_BATCHAI_JOB_TEMP"}
    assert default_cache_dir(env) == "/mnt/batch/tasks/shared/hvdazure/shards"


def test_inside_azure_ml_with_neither_variable_the_users_cache_directory_is_used() -> None:
    assert default_cache_dir({**HOME, "AZUREML_RUN_ID": "run-123"}) == "/home/user/.cache/hvdazure/shards"


@pytest.mark.parametrize("env", [HOME, AZURE_ML], ids=["plain", "azureml"])
def test_hvdazure_cache_dir_wins_everywhere(env: dict[str, str]) -> None:
    assert default_cache_dir({**env, "HVDAZURE_CACHE_DIR": "/data/cache"}) == "/data/cache"


@pytest.mark.parametrize("environment", ENVIRONMENTS, ids=lambda environment: environment.name)
def test_every_environment_answers_with_an_absolute_directory(environment: object) -> None:
    assert os.path.isabs(environment.default_cache_dir(HOME))  # type: ignore[attr-defined]


def test_the_process_environment_is_read_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HVDAZURE_CACHE_DIR", "/from/the/environment")
    assert default_cache_dir() == "/from/the/environment"
    assert detect_environment({}).default_cache_dir({"HOME": "/h"}) == "/h/.cache/hvdazure/shards"
