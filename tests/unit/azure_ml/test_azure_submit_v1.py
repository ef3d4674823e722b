"""End-to-end submission with the legacy SDK v1 (azureml-core), up to HTTP: nothing here reaches Azure.

azureml-core talks HTTP through requests only, so one `responses` recorder plays the whole service: ARM
(workspace), the regional discovery, history, content (snapshot) and execution services, and the storage
account. `Experiment.submit` ends in a `snapshotrun` POST whose `Configuration` is the run: the tests
assert on it (mpi processCountPerNode and nodeCount, script, arguments, Docker, image, variables).
Response shapes: tests/unit/fixtures/azure/README.md.
"""

from __future__ import annotations

import json
import re

import pytest
from fakes.azureml_jobs import FAKE_TOKEN  # azureml-core reads tenant and user from it
from sdk_v1_fakes import IMAGE, SAS_SIGNATURE, submit

from hvdazure.azure import submission
from hvdazure.azure.errors import JobSpecError, SubmitError
from hvdazure.azure.spec.job import InputSpec

# azureml-core 1.61 uses APIs its dependencies deprecate (marshmallow fields, ruamel.yaml's loaders)
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
              pytest.mark.project(v1=True)]
def test_experiment_submit_uploads_a_snapshot_then_posts_the_run(project, service):
    submitted = submit()

    kinds = service.kinds()
    steps = ("GET ", "GET /computes/gpu-cluster", "POST /snapshots/getblob", "PUT blob", "POST /snapshots/ID",
             "POST /experiments/project/snapshotrun")
    order = [kinds.index(step) for step in steps]
    assert order == sorted(order)
    assert submitted.sdk == "v1"
    assert re.fullmatch(r"project_\d+_[0-9a-f]{8}", submitted.name)
    assert submitted.studio_url.startswith(f"https://ml.azure.com/runs/{submitted.name}?wsid=")


def test_the_run_configuration_is_mpi_with_processes_per_node_and_nodes(project, service):
    submit(env={"NCCL_DEBUG": "INFO"}, shm_size="16g")

    configuration = service.snapshot_run()["Configuration"]
    assert configuration["mpi"] == {"processCountPerNode": 8, "nodeCount": 2}  # ND96asr_v4: 8 GPUs per node
    assert configuration["nodeCount"] == 2
    assert (configuration["script"], configuration["arguments"]) == ("train.py", ["--set", "epochs=3"])
    assert configuration["target"] == "gpu-cluster"
    assert configuration["docker"]["useDocker"] is True
    assert configuration["docker"]["shmSize"] == "16g"
    assert configuration["environment"]["docker"]["baseImage"] == IMAGE
    assert configuration["environment"]["python"]["userManagedDependencies"] is True
    assert configuration["environment"]["environmentVariables"] == {}  # not the SDK's EXAMPLE_ENV_VAR
    assert configuration["environmentVariables"] == {
        "OMPI_MCA_mpi_yield_when_idle": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_PCI_RELAXED_ORDERING": "1",
        "UCX_IB_PCI_RELAXED_ORDERING": "on", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_a_conda_file_is_built_on_the_image_without_the_sdks_pip_defaults(project, service):
    (project / "env.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - rich==14.0.0\n")
    submit(conda_file="env.yml", processes_per_node=4)

    python = service.snapshot_run()["Configuration"]["environment"]["python"]
    assert python["userManagedDependencies"] is False
    assert python["condaDependencies"]["dependencies"] == ["python=3.11", {"pip": ["rich==14.0.0"]}]
    assert "azureml-defaults" not in json.dumps(python)


def test_the_snapshot_is_the_code_directory(project, service):
    submit()

    uploaded = {u.rsplit("/", 1)[1] for m, u, _ in service.calls if m == "PUT" and "blob.core" in u}
    assert uploaded == {"train.py"}


def test_nothing_printed_holds_the_sas_signature_or_the_token(project, service, capsys):
    submit()

    printed = capsys.readouterr()
    assert SAS_SIGNATURE not in printed.out + printed.err
    assert FAKE_TOKEN not in printed.out + printed.err


def test_an_unknown_compute_stops_before_the_snapshot(project, service):
    with pytest.raises(SubmitError, match="compute 'cpu-cluster' not found in the workspace"):
        submit(compute="cpu-cluster")

    assert not [u for m, u, _ in service.calls if "snapshot" in u or "blob.core" in u]


def test_the_run_is_named_described_and_bounded_as_asked(project, service):
    submitted = submit(name="digits-v1", description="digits, two nodes", max_duration=7200)

    assert submitted.name == "digits-v1"  # the snapshotrun POST's runId, which the fake service echoes
    assert service.snapshot_run()["Configuration"]["maxRunDurationSeconds"] == 7200
    patches = [json.loads(b) for m, u, b in service.calls if m == "PATCH" and u.endswith("/runs/digits-v1")]
    assert {"runId": "digits-v1", "description": "digits, two nodes"} in patches  # once the run exists


def test_inputs_are_refused_with_v1_before_any_request(project, service):
    with pytest.raises(JobSpecError, match="--input and --output need SDK v2"):
        submit(inputs=[InputSpec("data", "azureml:digits@latest")], script_args=["${{inputs.data}}"])

    assert service.calls == []


# --- SDK v1 is past its end of support: one line says so ----------------------------------------------------
def _end_of_support_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "end of support" in line]


def test_a_v1_submission_says_once_that_v1_is_past_its_end_of_support(project, service, capsys):
    submit()

    lines = _end_of_support_lines(capsys.readouterr().err)
    assert lines == [f"hvdazure: warning: {submission.V1_END_OF_SUPPORT}"]
    assert "azureml-core" in lines[0] and "(2026-06-30)" in lines[0]
    assert "v2 (azure-ai-ml) is the default" in lines[0] and "HyperDrive" in lines[0]


@pytest.mark.parametrize(("sdk", "told"), [("v1", 1), ("v2", 0)])
def test_the_dry_run_tells_the_end_of_support_for_v1_only(project, capsys, sdk, told):
    from hvdazure.cli import main

    assert main(["submit", "train.py", "--compute", "gpu-cluster", "-ppn", "1", "--image", IMAGE,
                 "--dry-run", "--sdk", sdk, "--output-yaml", "../job.yml"]) == 0

    assert len(_end_of_support_lines(capsys.readouterr().err)) == told
