"""A model file on Blob storage named as a checkpoint (core/checkpoint/weights.py's refuse_a_file): one line
saying what it is, as for a local file, on Azurite."""

from __future__ import annotations

import fsspec
import pytest

from hvdazure.core.checkpoint.weights import NotACheckpoint, exported_file, recorded_config


def test_a_blob_that_is_a_model_file_is_one_line_saying_what_it_is(blob_url: str) -> None:
    url = f"{blob_url}/models/scorer.safetensors"
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, b"weights from elsewhere")
    line = (f"{url} is a safetensors file, not an hvdazure checkpoint (a directory with a manifest.json): "
            "load it in build_model: model.load_state_dict(safetensors.torch.load_file(path))")
    with pytest.raises(NotACheckpoint) as refused, exported_file(url, "latest", "model.pt"):
        pass
    assert str(refused.value) == line
    with pytest.raises(NotACheckpoint, match="is a safetensors file"):
        recorded_config(url)
