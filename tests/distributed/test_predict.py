"""trainer.predict() and trainer.test() on real ranks, both bindings: every sample predicted once, in
dataset order, byte for byte the same at 3 ranks as at 1 (float64), from the trained model, from a
checkpoint without fit(), and the refusals (workers/predict_job.py)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from distributed.harness import run_job

from hvdazure.data import ShardedDataset

N_PREDICT = 101  # workers/predict_job.py: batch_size 8, 3 ranks


def _predictions(out, rank, name):
    with np.load(out / f"predictions-{rank}-{name}.npz") as stored:
        return {key: stored[key] for key in stored.files}


def _index_and_values(predictions):
    """(the predicted sample indices, the predicted values) of either worker's output."""
    if "index" in predictions:  # torch: a dict
        return predictions["index"], predictions["y"]
    return predictions["all"][:, 0], predictions["all"][:, 1:]  # TensorFlow: one array [index, y]


@pytest.fixture(scope="module", params=[("torch", "gloo"), ("tensorflow", "mpi")], ids=lambda p: p[0])
def jobs(request, tmp_path_factory):
    """A 3-rank job that trains, predicts and tests, then a 1-rank one that predicts and tests from its
    checkpoints: (framework, the checkpoint directory, both jobs with their report folders)."""
    framework, controller = request.param
    tmp_path = tmp_path_factory.mktemp(framework)
    checkpoints, three, one = tmp_path / "ckpt", tmp_path / "three", tmp_path / "one"
    three.mkdir(), one.mkdir()
    job = run_job("predict_job.py", framework, "train", str(checkpoints), out_dir=three, np=3,
                  controller=controller, timeout=240)
    assert job.returncode == 0, job.output
    alone = run_job("predict_job.py", framework, "load", str(checkpoints), out_dir=one, np=1,
                    controller=controller, timeout=240)
    assert alone.returncode == 0, alone.output
    return framework, checkpoints, (job, three), (alone, one)


def test_predict_and_test_are_exact_at_any_world_size(jobs):
    framework, checkpoints, (job, three), (alone, one) = jobs

    reference = _predictions(one, 0, "loaded")
    index, values = _index_and_values(reference)
    assert index.tolist() == list(range(N_PREDICT))  # each sample once, in dataset order
    assert values.dtype == np.float64 and values.shape == (N_PREDICT, 1)
    for rank in range(3):
        for name in ("trained", "latest", "pretrained"):  # every rank returns the whole, as 1 rank does
            got = _predictions(three, rank, name)
            assert got.keys() == reference.keys()
            for key in got:
                assert got[key].tobytes() == reference[key].tobytes(), (rank, name, key)

    report, alone_report = job.reports[0], alone.reports[0]
    assert report["trained_test"] == report["trained_eval"]  # the same numbers as fit()'s evaluation
    assert report["latest_test"] == report["trained_test"]
    assert alone_report["loaded_test"] == pytest.approx(report["trained_test"], rel=1e-12)
    assert report["train_dataset_calls"] == [1, 0] and alone_report["train_dataset_calls"] == [0]
    # build_model loaded the trained weights from a plain file on rank 0: without checkpoint=, every rank
    # predicted and tested with rank 0's model, and said so once per call
    assert report["pretrained_test"] == report["trained_test"]
    assert job.output.count("predict(): the model as build_model() returns it (rank 0's weights, sent to "
                            "every rank)") == 1
    assert "test(): the model as build_model() returns it" in job.output
    pretrained, kind, how = {
        "torch": ("pretrained.pt", "a PyTorch file",
                  "model.load_state_dict(torch.load(path, weights_only=True))"),
        "tensorflow": ("pretrained.weights.h5", "a Keras HDF5 file", "model.load_weights(path)")}[framework]
    assert report["plain_file"] == (  # the file named as checkpoint=: what it is, and how to load it
        f"NotACheckpoint: {three / pretrained} is {kind}, not an hvdazure checkpoint (a directory with a "
        f"manifest.json): load it in build_model: {how}; then predict() without checkpoint= uses that model")
    assert report["other_model"].startswith(
        f"CheckpointError: {checkpoints}: its model does not fit this trainer's build_model(): ")
    assert "\n" not in report["other_model"]
    assert report["train_seven"] == 7.0  # trainer.log_metrics from a callback, reduced into the history
    if framework == "tensorflow":
        assert report["log_in_compiled_step"] == (
            "HookReturnError: log_metrics inside training_step, which runs compiled (tf.function): return "
            "the metric in training_step's dict instead")
    assert all(job.reports[rank] == report for rank in range(3))  # the same outcome on every rank


@pytest.mark.parametrize("jobs", [("torch", "gloo")], indirect=True, ids=["torch"])  # main() is the core's
def test_the_scripts_command_line_predicts_and_tests_from_a_checkpoint(jobs, tmp_path):
    """Trainer.main() (workers/script_modes_job.py, the same torch trainer): `predict` at 2 ranks into a
    .npz and at 3 ranks into shards writes the same predictions as predict() at 1, `test` at 1 rank the
    same metrics as at 3."""
    _, checkpoints, (job, _), (_, one) = jobs
    predicted, metrics = tmp_path / "out" / "predictions.npz", tmp_path / "metrics.json"
    run = run_job("script_modes_job.py", "predict", "--checkpoint", str(checkpoints), "--output",
                  str(predicted), out_dir=tmp_path, np=2)
    assert run.returncode == 0, run.output
    assert f"predict: wrote {predicted}" in run.output
    with np.load(predicted) as stored:
        assert sorted(stored.files) == ["index", "y"]
        assert stored["y"].tobytes() == _predictions(one, 0, "loaded")["y"].tobytes()
    shards = tmp_path / "as-shards"
    run = run_job("script_modes_job.py", "predict", "--checkpoint", str(checkpoints), "--output", str(shards),
                  out_dir=tmp_path, np=3, controller="mpi")
    assert run.returncode == 0, run.output
    written = ShardedDataset(str(shards))
    assert [written[i]["index"] for i in range(len(written))] == list(range(N_PREDICT))
    assert b"".join(written[i]["y"].tobytes() for i in range(N_PREDICT)) == \
        _predictions(one, 0, "loaded")["y"].tobytes()
    run = run_job("script_modes_job.py", "test", "--checkpoint", str(checkpoints), "--output", str(metrics),
                  "--set", "checkpoint_dir=null", out_dir=tmp_path, np=1)
    assert run.returncode == 0, run.output
    assert json.loads(metrics.read_text()) == pytest.approx(job.reports[0]["trained_test"], rel=1e-12)
    assert not [p.name for p in tmp_path.rglob(".*")]  # written whole: no temporary file left


def test_the_exports_compute_the_predictions(jobs):
    """The trained model exported by trainer.export (ONNX, .keras) and the checkpoint's by export (an
    ExportedProgram, a SavedModel), each loaded here on its own, predict the 101 samples as predict() did."""
    framework, _, (_, three), (_, one) = jobs
    _, values = _index_and_values(_predictions(one, 0, "loaded"))
    x = _prediction_inputs()
    if framework == "torch":
        import onnxruntime
        import torch

        session = onnxruntime.InferenceSession(str(three / "model.onnx"), providers=["CPUExecutionProvider"])
        by_onnx = session.run(None, {session.get_inputs()[0].name: x})[0]
        with torch.no_grad():
            by_program = torch.export.load(str(one / "model.pt2")).module()(torch.from_numpy(x)).numpy()
        outputs = {"onnx": by_onnx, "exported_program": by_program}
    else:
        import keras
        import tensorflow as tf

        keras.config.set_floatx("float64")
        saved = tf.saved_model.load(str(one / "saved_model"))
        outputs = {"keras": np.asarray(keras.models.load_model(three / "model.keras")(x, training=False)),
                   "saved_model": np.asarray(saved.serve(x))}
    for format, got in outputs.items():
        np.testing.assert_allclose(got, values, rtol=1e-12, atol=1e-12, err_msg=format)  # float64 all through
    assert not list(three.glob(".*")) and not list(one.glob(".*"))  # no temporary artifact left behind


# A user's training script for each checkpoint's model (workers/predict_job.py's regression, float64). Its
# training data's size is only in the config the checkpoint records (extra.n_train): a KeyError unless the
# export builds the trainer with it. The torch one runs Trainer.main(), the Keras one a fit() of its own.
SCRIPTS = {"torch": """
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset

    from hvdazure.torch import TorchTrainer


    class Regression(TorchTrainer):
        def build_model(self):
            return torch.nn.Linear(3, 1, dtype=torch.float64)

        def build_optimizer(self, params, lr):
            return torch.optim.SGD(params, lr=lr)

        def train_dataset(self):
            n, rng = self.config.extra["n_train"], np.random.default_rng(1)
            return TensorDataset(torch.arange(n), torch.tensor(rng.normal(size=(n, 3))),
                                 torch.tensor(rng.normal(size=(n, 1))))

        def training_step(self, model, batch):
            _, x, y = batch
            return torch.nn.functional.mse_loss(model(x), y)


    if __name__ == "__main__":
        Regression.main(epochs=1, batch_size=8)
    """, "tensorflow": """
    import keras
    import numpy as np

    from hvdazure import TrainConfig
    from hvdazure.tensorflow import TensorFlowTrainer

    keras.config.set_floatx("float64")


    class Regression(TensorFlowTrainer):
        def build_model(self):
            return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

        def build_optimizer(self, lr):
            return keras.optimizers.SGD(learning_rate=lr)

        def train_dataset(self):
            n, rng = self.config.extra["n_train"], np.random.default_rng(1)
            return np.arange(n), rng.normal(size=(n, 3)), rng.normal(size=(n, 1))

        def training_step(self, model, batch):
            _, x, y = batch
            return keras.ops.mean(keras.ops.square(model(x, training=True) - y))


    if __name__ == "__main__":
        Regression(TrainConfig(epochs=1, checkpoint_dir="checkpoints")).fit()
    """}


def _command(*args, cwd):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_hvdazure_export_writes_the_checkpoints_model(jobs, tmp_path):
    """`hvdazure export CHECKPOINTS OUTPUT --script train.py` of the shared jobs' checkpoints: the ONNX and
    .keras files, loaded here on their own, predict the 101 samples as predict() from the checkpoint did,
    and not as the model as built (untrained) does; the script's main block never ran."""
    framework, checkpoints, _, (_, one) = jobs
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPTS[framework]))
    output = tmp_path / ("model.onnx" if framework == "torch" else "model.keras")
    done = _command("-m", "hvdazure.cli", "export", str(checkpoints), str(output), "--script", "train.py",
                    "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    reported = json.loads(done.stdout)
    assert reported["path"] == str(output) and reported["checkpoint"].startswith(f"{checkpoints}/step-")
    _, values = _index_and_values(_predictions(one, 0, "loaded"))
    got, untrained = _exported_and_untrained_outputs(framework, output, _prediction_inputs())
    np.testing.assert_allclose(got, values, rtol=1e-12, atol=1e-12)
    assert np.abs(untrained - values).max() > 1e-3  # the model as built is not what was exported
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["train.py", output.name])  # no fit ran


@pytest.mark.parametrize("jobs", [("torch", "gloo")], indirect=True, ids=["torch"])  # main() is the core's
def test_a_scripts_export_mode_and_the_refusals_of_a_damaged_checkpoint(jobs, tmp_path):
    """`python train.py export --checkpoint latest` (Trainer.main) writes the same model as TorchScript; the
    same export of a checkpoint whose weights lost a bit is one line, exit status 2, and writes nothing."""
    _, checkpoints, _, (_, one) = jobs
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPTS["torch"]))
    done = _command("train.py", "export", "--checkpoint", "latest", "--output", "model.pt", "--set",
                    f"checkpoint_dir={checkpoints}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "export: exported model.pt (torchscript)" in done.stdout + done.stderr
    got, _ = _exported_and_untrained_outputs("torch", tmp_path / "model.pt", _prediction_inputs())
    np.testing.assert_allclose(got, _index_and_values(_predictions(one, 0, "loaded"))[1], rtol=1e-12,
                               atol=1e-12)

    damaged = tmp_path / "damaged"
    shutil.copytree(checkpoints, damaged)
    (weights,) = damaged.glob("step-*/model.pt")
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    refused = _command("-m", "hvdazure.cli", "export", str(damaged), "again.onnx", "--script", "train.py",
                       cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == f"hvdazure: error: no valid checkpoint in {damaged}"
    assert not (tmp_path / "again.onnx").exists() and not list(tmp_path.glob(".again*"))


def _exported_and_untrained_outputs(framework, path, x):
    """What the exported artifact at `path` computes on `x`, loaded on its own, and what the script's
    model as built (seeded as the trainer seeds it, config seed 0) computes."""
    if framework == "torch":
        import torch

        with torch.no_grad():
            if path.suffix == ".onnx":
                import onnxruntime

                session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                got = session.run(None, {session.get_inputs()[0].name: x})[0]
            else:
                got = torch.jit.load(str(path))(torch.from_numpy(x)).numpy()
            torch.manual_seed(0)
            untrained = torch.nn.Linear(3, 1, dtype=torch.float64)(torch.from_numpy(x)).numpy()
        return got, untrained
    import keras

    keras.config.set_floatx("float64")
    got = np.asarray(keras.models.load_model(path)(x, training=False))
    keras.utils.set_random_seed(0)
    untrained = np.asarray(keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])(x, training=False))
    return got, untrained


def _prediction_inputs():
    """The 101 inputs workers/predict_job.py predicts (its predict_dataset, seed 3), float64."""
    rng = np.random.default_rng(3)
    return rng.normal(size=(N_PREDICT, 3))
