"""hvdazure.torch's model export (torch/model_export.py): each format's artifact, reloaded here on its own,
computes what the model does, also on another batch size; an export that computes other numbers is
refused and leaves nothing behind."""

import os

import numpy as np
import onnxruntime
import pytest
import torch

from hvdazure.core.script.model_export import ExportError
from hvdazure.torch.model_export import export_model


class TwoHeads(torch.nn.Module):
    """Two outputs (a tuple), a BatchNorm in eval mode: more than a Linear to get right."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU())
        self.logits, self.score = torch.nn.Linear(16, 3), torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.body(x)
        return self.logits(h), torch.sigmoid(self.score(h))


class CountsItsCalls(torch.nn.Module):
    """Its output depends on how often it was called: a trace bakes in the count of the tracing call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


def _reloaded_outputs(path, format, x):
    if format == "onnx":
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x.numpy()})
    module = torch.jit.load(path) if format == "torchscript" else torch.export.load(path).module()
    with torch.no_grad():
        return [t.numpy() for t in module(x)]


@pytest.mark.parametrize("format", ["onnx", "torchscript", "exported_program"])
def test_the_artifact_computes_what_the_model_does_on_another_batch_size_too(tmp_path, format):
    model = TwoHeads().eval()
    path = str(tmp_path / f"model.{format}")
    exported = export_model(model, (torch.randn(8, 6),), path, format)

    assert exported.path == path and exported.max_abs_difference < 1e-5
    x = torch.randn(13, 6)  # not the example's batch size
    with torch.no_grad():
        expected = [t.numpy() for t in model(x)]
    for got, want in zip(_reloaded_outputs(path, format, x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert sorted(os.listdir(tmp_path)) == [f"model.{format}"]  # no temporary file beside it


def test_a_compiled_model_is_exported_as_the_model_it_compiled(tmp_path):
    model = TwoHeads().eval()
    path = str(tmp_path / "model.torchscript")
    export_model(torch.compile(model), (torch.randn(8, 6),), path, "torchscript")  # nothing is compiled

    x = torch.randn(5, 6)
    with torch.no_grad():
        expected = [t.numpy() for t in model(x)]
    for got, want in zip(_reloaded_outputs(path, "torchscript", x), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_onnx_export_prints_none_of_the_exporters_notes(tmp_path, capfd, recwarn):
    export_model(TwoHeads().eval(), (torch.randn(8, 6),), str(tmp_path / "model.onnx"), "onnx")

    printed = "".join(capfd.readouterr())
    assert "torchvision is not installed" not in printed
    future = [str(w.message) for w in recwarn if issubclass(w.category, FutureWarning)]
    assert not future, future


def test_an_export_that_computes_other_numbers_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(ExportError, match="the torchscript export computes other numbers than the model: "
                                          "largest absolute difference"):
        export_model(CountsItsCalls(), (torch.ones(2, 3),), str(tmp_path / "m.pt"), "torchscript")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("format", "example", "message"), [
    ("tflite", (torch.ones(2, 6),), "format 'tflite': one of onnx, torchscript, exported_program"),
    ("onnx", torch.ones(2, 6), r"the example input is a tuple of the model's positional inputs, e.g. \(x,\)"),
])
def test_what_cannot_be_exported_is_one_line(tmp_path, format, example, message):
    with pytest.raises(ExportError, match=message):
        export_model(TwoHeads(), example, str(tmp_path / "m"), format)
