"""Where checkpoints go when none is configured: nowhere, except inside Azure ML (./outputs is uploaded)."""

import os

from hvdazure.core.checkpoint.trainer_checkpoints import default_checkpoint_dir
from hvdazure.core.environments import detect_environment


def test_no_checkpoint_dir_means_no_checkpoints_outside_azure_ml(monkeypatch):
    for name in ("AZUREML_RUN_ID", "AZ_BATCHAI_MPI_MASTER_NODE", "AZ_BATCH_MASTER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert default_checkpoint_dir(None, detect_environment()) is None


def test_inside_azure_ml_checkpoints_default_to_outputs_checkpoints(monkeypatch):
    monkeypatch.setenv("AZUREML_RUN_ID", "run-123")
    assert default_checkpoint_dir(None, detect_environment()) == os.path.join("outputs", "checkpoints")


def test_a_configured_checkpoint_dir_always_wins(monkeypatch):
    monkeypatch.setenv("AZUREML_RUN_ID", "run-123")
    assert default_checkpoint_dir("abfs://container/run1", detect_environment()) == "abfs://container/run1"
