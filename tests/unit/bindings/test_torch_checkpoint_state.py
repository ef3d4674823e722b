"""hvdazure.torch.checkpoint_content: what a checkpoint holds of a PyTorch model and optimizer, copied for a
background write into buffers reused from one save to the next, saved without the zip's CRC32 and loaded
back."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from hvdazure.torch.checkpoint_content import (
    MODEL_FILE,
    OPTIMIZER_FILE,
    StagingBuffers,
    TorchCheckpointContent,
    load_mapped,
    load_model_state,
    save_without_zip_crc,
    without_compile_prefix,
)


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _written(writers: dict) -> dict[str, bytes]:
    files = {}
    for name, write in writers.items():
        buffer = io.BytesIO()
        write(buffer)
        files[name] = buffer.getvalue()
    return files


def _load(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), weights_only=True)


def _assert_same(a: object, b: object) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_copied_state_keeps_the_values_of_the_save_while_training_changes_the_model() -> None:
    model, optimizer = _trained()
    state = TorchCheckpointContent(model, optimizer, None, torch.device("cpu"))
    before = _written(state.save_files(copy=False))
    before_model, before_optimizer = _load(before[MODEL_FILE]), _load(before[OPTIMIZER_FILE])

    writers = state.save_files(copy=True)  # the background write runs later, after more training
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    files = _written(writers)

    _assert_same(_load(files[MODEL_FILE]), before_model)
    _assert_same(_load(files[OPTIMIZER_FILE]), before_optimizer)
    live = _load(_written(state.save_files(copy=False))[MODEL_FILE])  # without a copy: the live state
    assert not torch.equal(live["0.weight"], before_model["0.weight"])


def test_staging_buffers_are_reused_from_one_save_to_the_next_and_hold_the_new_values() -> None:
    model, optimizer = _trained()
    staging = StagingBuffers()
    first = staging.copy((model.state_dict(), optimizer.state_dict()))
    pointers = [t.data_ptr() for t in _tensors(first)]
    optimizer.step()

    second = staging.copy((model.state_dict(), optimizer.state_dict()))

    assert [t.data_ptr() for t in _tensors(second)] == pointers  # no new memory
    _assert_same(second, (model.state_dict(), optimizer.state_dict()))
    assert all(t.data_ptr() != s.data_ptr() for t, s in zip(
        _tensors(second), _tensors((model.state_dict(), optimizer.state_dict())), strict=True))


def test_staging_takes_new_buffers_for_tensors_whose_shape_or_dtype_changed() -> None:
    staging = StagingBuffers()
    first = staging.copy({"w": torch.ones(3), "n": 7, "names": ["a", "b"]})
    second = staging.copy({"w": torch.ones(4, dtype=torch.float64), "n": 8, "names": ["c"]})

    assert first["w"].shape == (3,) and second["w"].shape == (4,) and second["w"].dtype == torch.float64
    assert second["n"] == 8 and second["names"] == ["c"]


def test_files_are_saved_without_the_zip_crc_and_torch_setting_is_left_as_it_was() -> None:
    from torch.utils.serialization import config

    buffer = io.BytesIO()
    save_without_zip_crc({"w": torch.arange(1000.0)}, buffer)

    assert config.save.compute_crc32 is True
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        data = [info for info in archive.infolist() if "/data/" in info.filename]
        assert data and all(info.CRC == 0 for info in data)
    _assert_same(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), {"w": torch.arange(1000.0)})


def test_load_files_puts_the_saved_state_into_the_model_and_optimizer_in_place(tmp_path) -> None:
    model, optimizer = _trained()
    content = TorchCheckpointContent(model, optimizer, None, torch.device("cpu"))
    files = _written(content.save_files(copy=False))
    paths = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths[name] = str(tmp_path / name)
    other, other_optimizer = _trained()
    other_optimizer.step()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(1.0)
    pointer = other[0].weight.data_ptr()

    TorchCheckpointContent(other, other_optimizer, None, torch.device("cpu")).load_files(paths)
    (tmp_path / MODEL_FILE).unlink()  # the model's file was mapped: nothing may still read from it

    assert other[0].weight.data_ptr() == pointer
    _assert_same(other.state_dict(), model.state_dict())
    _assert_same(other_optimizer.state_dict(), optimizer.state_dict())


def test_a_file_that_cannot_be_memory_mapped_is_read_instead(tmp_path, monkeypatch) -> None:
    path = tmp_path / MODEL_FILE
    torch.save({"w": torch.arange(6.0)}, path)

    def refuse_mmap(*args: object, **kwargs: object) -> None:  # test double of a FUSE mount's refusal
        raise RuntimeError(f"unable to mmap 1234 bytes from file <{path}>: No such device (19)")

    monkeypatch.setattr(torch.UntypedStorage, "from_file", refuse_mmap)

    _assert_same(load_mapped(str(path), torch.device("cpu")), {"w": torch.arange(6.0)})


def test_other_errors_of_a_mapped_load_are_raised_as_they_are(tmp_path) -> None:
    path = tmp_path / MODEL_FILE
    path.write_bytes(b"not a torch file")

    with pytest.raises(RuntimeError, match="zip"):
        load_mapped(str(path), torch.device("cpu"))


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _saved_model_file(content: TorchCheckpointContent) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(_written(content.save_files(copy=False))[MODEL_FILE]), weights_only=True)


def test_a_compiled_model_is_saved_under_the_uncompiled_models_keys_and_both_load_either() -> None:
    # was: `_orig_mod.0.weight`..., which the model as build_model makes it refused
    model, optimizer = _trained()
    compiled = torch.compile(model)  # nothing is compiled before it is called: this costs no compilation
    saved = _saved_model_file(TorchCheckpointContent(compiled, optimizer, None, torch.device("cpu")))
    assert list(saved) == list(model.state_dict())

    eager, _ = _trained()
    with torch.no_grad():
        eager[0].weight.add_(1.0)
    load_model_state(eager, saved)
    _assert_same(eager.state_dict(), model.state_dict())
    recompiled = torch.compile(_trained()[0])
    load_model_state(recompiled, model.state_dict())  # an eager run's checkpoint into a compiled model
    _assert_same(recompiled._orig_mod.state_dict(), model.state_dict())


def test_a_checkpoint_written_with_compiles_prefix_loads_into_the_uncompiled_model() -> None:
    model, _ = _trained()
    old = torch.compile(model).state_dict()  # what checkpoints of compiled models held before
    assert all(key.startswith("_orig_mod.") for key in old)
    assert list(without_compile_prefix(old)) == list(model.state_dict())
    other, _ = _trained()
    load_model_state(other, old)
    _assert_same(other.state_dict(), model.state_dict())


def test_a_compiled_submodules_keys_are_saved_without_the_prefix_and_loaded_back_into_it() -> None:
    model, optimizer = _trained()
    model[1] = torch.compile(model[1])  # one layer compiled: `1._orig_mod.running_mean`
    saved = _saved_model_file(TorchCheckpointContent(model, optimizer, None, torch.device("cpu")))
    assert "1.running_mean" in saved and not any("_orig_mod" in key for key in saved)
    other, _ = _trained()
    other[1] = torch.compile(other[1])
    load_model_state(other, saved)
    _assert_same(other.state_dict(), model.state_dict())


def test_keys_a_model_does_not_have_are_still_refused() -> None:
    model, _ = _trained()
    state = {**without_compile_prefix(model.state_dict()), "extra.weight": torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r"extra\.weight"):
        load_model_state(model, state)
