"""core/script/model_export.py: the check both bindings' exports pass before an artifact is put in place."""

from pathlib import Path

import numpy as np
import pytest

from hvdazure.core.script.model_export import ExportError, check_outputs, put_in_place, written_beside


def test_outputs_within_tolerance_pass_with_the_largest_difference():
    worst = check_outputs("onnx", [np.array([1.0, 2.0 + 1e-7])], [np.array([1.0, 2.0])], 1e-5, 1e-6)
    assert worst == pytest.approx(1e-7)


@pytest.mark.parametrize(("got", "message"), [
    ([np.array([1.0, 2.5])], r"the onnx export computes other numbers than the model: largest absolute "
                             r"difference 0\.5"),
    ([np.array([[1.0, 2.0]])], r"the onnx export returns \[\(1, 2\)\], the model \[\(2,\)\]"),
    ([np.array([1.0, 2.0]), np.array([0.0])], r"returns \[\(2,\), \(1,\)\], the model \[\(2,\)\]"),
])
def test_other_numbers_or_shapes_are_refused(got, message):
    with pytest.raises(ExportError, match=message):
        check_outputs("onnx", got, [np.array([1.0, 2.0])], 1e-5, 1e-6)


def test_only_an_artifact_put_in_place_stays(tmp_path):
    target = tmp_path / "model.onnx"
    with written_beside(target) as partial:
        Path(partial).write_text("checked")
        put_in_place(partial, target)
    with written_beside(tmp_path / "other.onnx") as partial:
        Path(partial).write_text("refused")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert target.read_text() == "checked"
