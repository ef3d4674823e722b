"""hvdazure.core.environments: which launcher started this process, where in the job it put it, and what that
environment decides (default checkpoint directory, preemption watch)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdazure.core.environments import ENVIRONMENTS, ClusterInfo, detect_cluster, detect_environment
from hvdazure.core.environments.scheduled_events import SCHEDULED_EVENTS_URL, ScheduledEventsNotices

REPO_ROOT = Path(__file__).resolve().parents[3]
FIXTURES = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "cluster_env").glob("*.json"))

OPEN_MPI_RANK_1_OF_2 = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
GLOO_RANK_2_OF_4 = {
    "HOROVOD_RANK": "2",
    "HOROVOD_SIZE": "4",
    "HOROVOD_LOCAL_RANK": "0",
    "HOROVOD_LOCAL_SIZE": "2",
    "HOROVOD_CROSS_RANK": "1",
    "HOROVOD_CROSS_SIZE": "2",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.4",
}
PYTORCH_RANK_5_OF_8 = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "AZUREML_RUN_ID": "run"}


def _fixture(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: path.stem)
def test_recorded_environment_is_described_exactly(path: Path) -> None:
    fixture = _fixture(path)
    assert fixture["_source"]
    assert detect_cluster(fixture["env"]) == ClusterInfo(**fixture["expected"])


def test_fixtures_cover_every_launcher() -> None:
    launchers = {_fixture(path)["expected"]["launcher"] for path in FIXTURES}
    assert launchers == {"azureml", "horovodrun", "openmpi", "mpich"}


def test_empty_environment_is_a_single_process() -> None:
    info = detect_cluster({})
    assert info == ClusterInfo(0, 1, 0, 1, 0, 1, None, "single")
    assert info.is_main
    assert not info.is_multi_node


def test_reads_os_environ_when_given_no_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(OPEN_MPI_RANK_1_OF_2))
    info = detect_cluster()
    assert (info.launcher, info.rank, info.is_main) == ("openmpi", 1, False)


def test_environments_are_asked_in_priority_order() -> None:
    assert [environment.name for environment in ENVIRONMENTS] == [
        "azureml",
        "horovodrun",
        "openmpi",
        "mpich",
        "single",
    ]


def test_azureml_wins_over_the_open_mpi_it_runs() -> None:
    info = detect_cluster({**OPEN_MPI_RANK_1_OF_2, "AZUREML_RUN_ID": "run"})
    assert (info.launcher, info.rank, info.size, info.local_rank) == ("azureml", 1, 2, 1)


def test_horovodrun_gloo_variables_alone_mean_horovodrun() -> None:
    info = detect_cluster(GLOO_RANK_2_OF_4)
    assert info == ClusterInfo(2, 4, 0, 2, 1, 2, "10.0.0.4", "horovodrun")
    assert info.is_multi_node


def test_horovodrun_started_under_mpirun_takes_its_own_ranks() -> None:
    info = detect_cluster({**OPEN_MPI_RANK_1_OF_2, **GLOO_RANK_2_OF_4})
    assert (info.launcher, info.rank, info.size) == ("horovodrun", 2, 4)


def test_azureml_master_addr_drops_the_azure_batch_port() -> None:
    info = detect_cluster({**OPEN_MPI_RANK_1_OF_2, "AZ_BATCH_MASTER_NODE": "10.0.0.4:6000"})
    assert (info.launcher, info.master_addr) == ("azureml", "10.0.0.4")


def test_azureml_prefers_the_multi_node_master_over_the_single_node_variable() -> None:
    env = {**OPEN_MPI_RANK_1_OF_2, "AZ_BATCHAI_MPI_MASTER_NODE": "localhost",
           "AZ_BATCH_MASTER_NODE": "10.0.0.4:6000"}
    assert detect_cluster(env).master_addr == "10.0.0.4"


def test_azureml_single_node_master_may_be_localhost() -> None:
    info = detect_cluster({**OPEN_MPI_RANK_1_OF_2, "AZ_BATCHAI_MPI_MASTER_NODE": "localhost"})
    assert (info.launcher, info.master_addr, info.num_nodes) == ("azureml", "localhost", 1)


def test_mlflow_variables_alone_do_not_mean_an_azure_ml_job() -> None:
    # an Azure ML compute instance, or a user's own tracking server, sets these outside any job
    env = {"MLFLOW_TRACKING_URI": "azureml://example", "MLFLOW_RUN_ID": "run", **OPEN_MPI_RANK_1_OF_2}
    assert detect_cluster(env).launcher == "openmpi"


def test_azureml_job_without_a_distribution_is_one_process() -> None:
    assert detect_cluster({"AZUREML_RUN_ID": "run"}) == ClusterInfo(0, 1, 0, 1, 0, 1, None, "azureml")


def test_azureml_pytorch_job_without_node_variables_is_one_node() -> None:
    info = detect_cluster(PYTORCH_RANK_5_OF_8)
    assert (info.local_size, info.node_rank, info.num_nodes) == (8, 0, 1)


def test_azureml_pytorch_job_takes_processes_per_node_from_local_world_size() -> None:
    info = detect_cluster({**PYTORCH_RANK_5_OF_8, "LOCAL_WORLD_SIZE": "4"})
    assert (info.local_size, info.node_rank, info.num_nodes) == (4, 1, 2)


def test_mpich_falls_back_to_pmi_local_variables() -> None:
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"}
    assert detect_cluster(env) == ClusterInfo(3, 4, 1, 2, 1, 2, None, "mpich")


@pytest.mark.parametrize(
    ("env", "expected_in_message"),
    [
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK='x'"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_RANK": "2"}, "OMPI_COMM_WORLD_RANK=2"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_RANK": "-1"}, "OMPI_COMM_WORLD_RANK=-1"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_SIZE": "0"}, "OMPI_COMM_WORLD_SIZE=0"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_SIZE": ""}, "OMPI_COMM_WORLD_SIZE=''"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "OMPI_COMM_WORLD_LOCAL_RANK=2"),
        ({**OPEN_MPI_RANK_1_OF_2, "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "OMPI_COMM_WORLD_LOCAL_SIZE=3"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
        ({**GLOO_RANK_2_OF_4, "HOROVOD_CROSS_RANK": "2"}, "HOROVOD_CROSS_RANK=2"),
        ({**GLOO_RANK_2_OF_4, "HOROVOD_LOCAL_SIZE": "two"}, "HOROVOD_LOCAL_SIZE='two'"),
        ({"PMI_RANK": "0", "PMI_SIZE": "1.5"}, "PMI_SIZE='1.5'"),
        ({**OPEN_MPI_RANK_1_OF_2, "AZ_BATCH_MASTER_NODE": "10.0.0.4"}, "AZ_BATCH_MASTER_NODE='10.0.0.4'"),
        ({**PYTORCH_RANK_5_OF_8, "RANK": "8"}, "RANK=8"),
        ({**PYTORCH_RANK_5_OF_8, "NODE_RANK": "1"}, "NODE_RANK='1'"),
        ({**PYTORCH_RANK_5_OF_8, "AZUREML_NODE_COUNT": "3"}, "AZUREML_NODE_COUNT=3"),
        ({**PYTORCH_RANK_5_OF_8, "AZUREML_NODE_COUNT": "2", "NODE_RANK": "2"}, "NODE_RANK=2"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_malformed_value_raises_one_line_naming_the_variable(env: dict, expected_in_message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected_in_message)) as error:
        detect_cluster(env)
    assert "\n" not in str(error.value)


def test_importing_the_module_pulls_in_no_framework() -> None:
    forbidden = ("torch", "tensorflow", "keras", "horovod", "azure", "azureml")
    code = (
        "import sys, hvdazure.core.environments\n"
        f"print(sorted({{name.split('.')[0] for name in sys.modules}} & {set(forbidden)!r}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "[]"


# --- what each environment decides ----------------------------------------------------------------------
AZURE_ML = {"AZUREML_RUN_ID": "run"}
LAUNCHERS = {"horovodrun": GLOO_RANK_2_OF_4, "openmpi": OPEN_MPI_RANK_1_OF_2,
             "mpich": {"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
             "single": {}}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda path: path.stem)
def test_the_detected_environment_is_the_one_that_describes_the_process(path: Path) -> None:
    env = _fixture(path)["env"]
    assert detect_environment(env).name == detect_cluster(env).launcher


def test_detect_environment_reads_only_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", {**OPEN_MPI_RANK_1_OF_2, **AZURE_ML})
    assert detect_environment({}).name == "single"
    assert detect_environment().name == "azureml"


def test_inside_azure_ml_checkpoints_default_to_the_uploaded_outputs_folder() -> None:
    assert detect_environment(AZURE_ML).default_checkpoint_dir() == os.path.join("outputs", "checkpoints")


@pytest.mark.parametrize("name", LAUNCHERS)
def test_a_plain_launcher_has_no_default_checkpoint_dir(name: str) -> None:
    environment = detect_environment(LAUNCHERS[name])
    assert environment.name == name
    assert environment.default_checkpoint_dir() is None


def test_an_azure_ml_job_is_known_by_its_run_id_across_restarts_and_a_plain_launcher_s_by_none() -> None:
    assert detect_environment(AZURE_ML).job_id(AZURE_ML) == "run"
    assert all(detect_environment(env).job_id(env) is None for env in LAUNCHERS.values())


def test_azure_ml_watches_scheduled_events_at_azures_address_unless_told_otherwise() -> None:
    notices = detect_environment(AZURE_ML).preemption_notices(None, None)
    assert isinstance(notices, ScheduledEventsNotices)
    assert notices.client.url == SCHEDULED_EVENTS_URL
    assert SCHEDULED_EVENTS_URL == "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"


def test_azure_ml_reads_notices_at_a_configured_url() -> None:
    notices = detect_environment(AZURE_ML).preemption_notices(True, "http://127.0.0.1:1/se")
    assert isinstance(notices, ScheduledEventsNotices)
    assert notices.client.url == "http://127.0.0.1:1/se"


def test_azure_ml_watches_no_preemption_when_turned_off() -> None:
    assert detect_environment(AZURE_ML).preemption_notices(False, None) is None


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize("watch", [None, False])
def test_a_plain_launcher_watches_no_preemption_unless_asked(name: str, watch: bool | None) -> None:
    assert detect_environment(LAUNCHERS[name]).preemption_notices(watch, None) is None


@pytest.mark.parametrize("name", LAUNCHERS)
def test_a_plain_launcher_asked_to_watch_reads_scheduled_events(name: str) -> None:
    notices = detect_environment(LAUNCHERS[name]).preemption_notices(True, None)
    assert isinstance(notices, ScheduledEventsNotices)
    assert notices.client.url == SCHEDULED_EVENTS_URL
