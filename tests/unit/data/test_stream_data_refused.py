"""Data without random access (a torch IterableDataset, a tf.data pipeline of unknown length) is refused
with one line that points to hvdazure.data.ShardedDataset and `hvdazure data pack`, not a traceback."""

from __future__ import annotations

import sys

import pytest

from hvdazure.core.backend import DataError
from hvdazure.core.errors import show_user_errors_in_one_line
from hvdazure.core.trainer import loop_of


def _points_to_sharded_data(message: str) -> None:
    assert "\n" not in message
    assert "hvdazure.data.ShardedDataset" in message and "hvdazure data pack" in message, message


def test_a_data_error_that_ends_the_script_prints_one_line(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    show_user_errors_in_one_line()

    with pytest.raises(SystemExit) as exited:  # bad input: status 2, as a ConfigError
        sys.excepthook(DataError, DataError("train_dataset() returned a Stream"), None)

    assert exited.value.code == 2
    assert capsys.readouterr().err == "hvdazure: error: train_dataset() returned a Stream\n"


class TestTorch:
    torch = pytest.importorskip("torch")

    @staticmethod
    def load(train: object, evaluate: object = None) -> object:
        from hvdazure.torch import TorchTrainer

        class Trainer(TorchTrainer):
            def train_dataset(self) -> object:
                return train

            def eval_dataset(self) -> object:
                return evaluate

        return loop_of(Trainer()).backend.load_datasets()

    def test_an_iterable_dataset_from_train_dataset_is_refused_naming_sharded_data(self) -> None:
        from torch.utils.data import IterableDataset

        class Stream(IterableDataset):
            def __iter__(self):  # type: ignore[no-untyped-def]
                return iter(range(3))

        with pytest.raises(DataError, match=r"^train_dataset\(\) returned a Stream, a stream") as raised:
            self.load(Stream())
        _points_to_sharded_data(str(raised.value))

    def test_anything_without_len_from_eval_dataset_is_refused(self) -> None:
        from torch.utils.data import TensorDataset
        train = TensorDataset(self.torch.zeros(4, 1))

        with pytest.raises(DataError, match=r"^eval_dataset\(\) returned a generator") as raised:
            self.load(train, (x for x in range(3)))
        _points_to_sharded_data(str(raised.value))

    def test_a_map_style_dataset_gets_the_uniform_order_of_its_length(self) -> None:
        from torch.utils.data import TensorDataset

        from hvdazure.core.sample_plan import UniformOrder

        assert self.load(TensorDataset(self.torch.zeros(7, 1))) == UniformOrder(7)


class TestTensorFlow:
    tf = pytest.importorskip("tensorflow")

    @pytest.mark.parametrize(("pipeline", "kind"), [
        (lambda tf: tf.data.Dataset.range(10).filter(lambda x: x % 2 == 0), "of unknown length"),
        (lambda tf: tf.data.Dataset.range(10).repeat(), "infinite"),
    ])
    def test_a_pipeline_without_a_known_length_is_refused_naming_sharded_data(self, pipeline, kind) -> None:
        from hvdazure.tensorflow.data import ArrayData

        with pytest.raises(DataError, match=f"^train_dataset\\(\\) is a tf.data.Dataset {kind}") as raised:
            ArrayData(pipeline(self.tf), "train_dataset()")
        _points_to_sharded_data(str(raised.value))
        assert "assert_cardinality" in str(raised.value)  # the way round for data that fits in memory

    def test_a_finite_pipeline_is_still_read_into_memory(self) -> None:
        from hvdazure.tensorflow.data import ArrayData

        data = ArrayData(self.tf.data.Dataset.range(5), "train_dataset()")

        assert len(data) == 5 and data.take([4, 0]).tolist() == [4, 0]
