"""trainer.predict() and trainer.test() on real ranks, both bindings: every sample predicted once, in
dataset order, byte for byte the same at 3 ranks as at 1 (float64), from the trained model, from a
checkpoint without fit(), and the refusals (workers/predict_job.py)."""

import numpy as np
import pytest
from distributed.harness import run_job

N_PREDICT = 101  # workers/predict_job.py: batch_size 8, 3 ranks


def _predictions(out, rank, name):
    with np.load(out / f"predictions-{rank}-{name}.npz") as stored:
        return {key: stored[key] for key in stored.files}


def _index_and_values(predictions):
    """(the predicted sample indices, the predicted values) of either worker's output."""
    if "index" in predictions:  # torch: a dict
        return predictions["index"], predictions["y"]
    return predictions["all"][:, 0], predictions["all"][:, 1:]  # TensorFlow: one array [index, y]


@pytest.mark.parametrize(("framework", "controller"), [("torch", "gloo"), ("tensorflow", "mpi")])
def test_predict_and_test_are_exact_at_any_world_size(tmp_path, framework, controller):
    checkpoints = tmp_path / "ckpt"
    three, one = tmp_path / "three", tmp_path / "one"
    three.mkdir(), one.mkdir()
    job = run_job("predict_job.py", framework, "train", str(checkpoints), out_dir=three, np=3,
                  controller=controller, timeout=240)
    assert job.returncode == 0, job.output
    alone = run_job("predict_job.py", framework, "load", str(checkpoints), out_dir=one, np=1,
                    controller=controller, timeout=240)
    assert alone.returncode == 0, alone.output

    reference = _predictions(one, 0, "loaded")
    index, values = _index_and_values(reference)
    assert index.tolist() == list(range(N_PREDICT))  # each sample once, in dataset order
    assert values.dtype == np.float64 and values.shape == (N_PREDICT, 1)
    for rank in range(3):
        for name in ("trained", "latest"):  # every rank returns the whole, the same bytes as 1 rank
            got = _predictions(three, rank, name)
            assert got.keys() == reference.keys()
            for key in got:
                assert got[key].tobytes() == reference[key].tobytes(), (rank, name, key)

    report, alone_report = job.reports[0], alone.reports[0]
    assert report["trained_test"] == report["trained_eval"]  # the same numbers as fit()'s evaluation
    assert report["latest_test"] == report["trained_test"]
    assert alone_report["loaded_test"] == pytest.approx(report["trained_test"], rel=1e-12)
    assert report["train_dataset_calls"] == [1, 0] and alone_report["train_dataset_calls"] == [0]
    assert report["unloaded"] == ("ConfigError: predict() before fit() needs checkpoint=: 'latest', 'best' "
                                  "(of the config's checkpoint_dir) or a checkpoint's path; the model as "
                                  "built is untrained")
    assert report["other_model"].startswith(
        f"CheckpointError: {checkpoints}: its model does not fit this trainer's build_model(): ")
    assert "\n" not in report["other_model"]
    assert all(job.reports[rank] == report for rank in range(3))  # the same outcome on every rank
