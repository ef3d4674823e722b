"""A shard's version (ShardVersion): each kind made from where it comes from, written as the text the index
has always recorded and parsed back from it; an index written before it existed loads, compares equal,
writes back byte for byte and keeps its fingerprint and cached file names; what the cache asks of two
versions (may they be the same shard?)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from hvdazure._version import __version__
from hvdazure.data.cache import LocalShards, ShardCache, ShardError, _check
from hvdazure.data.index import ShardEntry, build_index, load_index, parse_index
from hvdazure.data.shard_version import ShardVersion, VersionKind, etag, normalize_etag
from hvdazure.data.source import shard_version
from hvdazure.data.writers import write_shards

ETAG = '"0x8DC1A2B3C4D5E6F"'  # as adlfs gives it: quotes and all

# --- each kind: made, written, parsed back ------------------------------------------------------------------
ROUND_TRIPS = {
    "etag": (lambda: ShardVersion.of_etag(ETAG), ETAG, VersionKind.ETAG),
    "etag from an info dict": (lambda: ShardVersion.of_object({"etag": ETAG, "size": 5}), ETAG,
                               VersionKind.ETAG),
    "ETag key": (lambda: ShardVersion.of_object({"ETag": "abc", "size": 5}), "abc", VersionKind.ETAG),
    "file": (lambda: ShardVersion.of_file(1700000000123456789, 40), "1700000000123456789:40",
             VersionKind.FILE),
    "size only": (lambda: ShardVersion.of_size(8), "size:8", VersionKind.SIZE),
    "no ETag in the info": (lambda: ShardVersion.of_object({"etag": None, "size": 8}), "size:8",
                            VersionKind.SIZE),
}


@pytest.mark.parametrize("origin", ROUND_TRIPS)
def test_each_kind_writes_todays_text_and_parses_back_equal(origin: str) -> None:
    make, text, kind = ROUND_TRIPS[origin]
    version = make()

    assert str(version) == text and version.kind is kind
    assert ShardVersion.parse(str(version)) == version
    assert hash(ShardVersion.parse(text)) == hash(version)


def test_a_file_version_is_its_stat(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(b"x" * 7)
    stat = os.stat(path)

    version = ShardVersion.of_stat(stat)

    assert str(version) == f"{stat.st_mtime_ns}:{stat.st_size}" and version.is_file


@pytest.mark.parametrize(("text", "kind"), [
    ('"0x8DC1A2B3C4D5E6F"', VersionKind.ETAG), ("0x8DC1A2B3C4D5E6F", VersionKind.ETAG),
    ('W/"0x8D"', VersionKind.ETAG), ("d41d8cd98f00b204e9800998ecf8427e", VersionKind.ETAG),
    ("v", VersionKind.ETAG), ("1700000000123456789:40", VersionKind.FILE), ("0:0", VersionKind.FILE),
    ("size:8", VersionKind.SIZE), ("size:", VersionKind.SIZE), ("1:2:3", VersionKind.ETAG),
])
def test_every_text_an_index_holds_parses_to_its_kind_and_writes_back_unchanged(text: str,
                                                                              kind: VersionKind) -> None:
    version = ShardVersion.parse(text)

    assert version.kind is kind and str(version) == text
    assert (version.is_etag, version.is_file, version.is_size_only) == (
        kind is VersionKind.ETAG, kind is VersionKind.FILE, kind is VersionKind.SIZE)


@pytest.mark.parametrize("text", ["", "123:456", "size:8"])
def test_an_etag_that_would_read_back_as_another_kind_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not an ETag"):
        ShardVersion.of_etag(text)


def test_etag_reads_either_key_and_nothing_else() -> None:
    assert etag({"etag": ETAG}) == ETAG and etag({"ETag": "x"}) == "x"
    assert etag({"size": 3}) is None and etag({"etag": ""}) is None
    assert normalize_etag(' W/"0x8D" ') == "0x8D"


# --- an index written before ShardVersion -------------------------------------------------------------------
def legacy_index_text() -> str:
    """An index as the code before ShardVersion wrote it (to_json: compact, these keys in this order), with
    a version of every kind it made."""
    document = {"format_version": 1, "created_by": f"hvdazure {__version__}", "base": "abfs://data/train",
                "shards": [
                    {"path": "a.tar", "format": "tar", "num_samples": 2, "bytes": 100, "version": ETAG,
                     "offsets": [0, 50]},
                    {"path": "b.tfrecord", "format": "tfrecord", "num_samples": 1, "bytes": 40,
                     "version": "1700000000123456789:40", "offsets": [0]},
                    {"path": "c.parquet", "format": "parquet", "num_samples": 0, "bytes": 8,
                     "version": "size:8", "offsets": []},
                    {"path": "d.tar", "format": "tar", "num_samples": 1, "bytes": 10,
                     "version": "0x8DC1A2B3C4D5E70", "offsets": [0]}]}
    return json.dumps(document, separators=(",", ":"))


LEGACY_FINGERPRINT = "a9b0eab32f346993"  # what the code before ShardVersion gave legacy_index_text()


def test_an_index_written_before_loads_with_equal_versions_and_writes_back_byte_for_byte() -> None:
    text = legacy_index_text()

    index = parse_index(text, "/elsewhere", "legacy.json")

    recorded = [shard["version"] for shard in json.loads(text)["shards"]]
    assert [entry.version for entry in index.shards] == [ShardVersion.parse(v) for v in recorded]
    assert [str(entry.version) for entry in index.shards] == recorded
    assert [entry.version.kind for entry in index.shards] == [
        VersionKind.ETAG, VersionKind.FILE, VersionKind.SIZE, VersionKind.ETAG]
    assert index.to_json(base_recorded=True) == text  # what older code reads, unchanged
    assert index.fingerprint() == LEGACY_FINGERPRINT  # a checkpoint's recorded data fingerprint still agrees


def test_entries_made_from_the_recorded_text_equal_those_loaded() -> None:
    index = parse_index(legacy_index_text(), "/elsewhere", "legacy.json")

    for entry in index.shards:
        again = ShardEntry(entry.path, entry.format, entry.num_samples, entry.bytes, str(entry.version),
                           entry.offsets)
        assert again == entry and hash(again) == hash(entry) and isinstance(again.version, ShardVersion)


def test_a_saved_index_loads_back_equal(tmp_path: Path) -> None:
    index = parse_index(legacy_index_text(), "/elsewhere", "legacy.json")

    index.save(str(tmp_path / "index.json"))

    loaded = load_index(str(tmp_path / "index.json"))
    assert loaded == index and loaded.fingerprint() == LEGACY_FINGERPRINT
    written = json.loads((tmp_path / "index.json").read_text())
    assert written["shards"] == json.loads(legacy_index_text())["shards"]


def test_cached_copies_keep_their_names() -> None:
    # The names the code before ShardVersion gave: a cache filled by it is still found.
    cache = ShardCache("abfs://data/train", "/cache")
    directory = "/cache/abfs-data-train-649e103b78/sub"
    names = {ETAG: "a.fcf9175e528a.tar", ETAG.strip('"'): "a.fcf9175e528a.tar",
             "1700000000123456789:40": "a.69705d498340.tar", "size:8": "a.a701cb3b4589.tar"}
    for version, name in names.items():
        assert cache._final(ShardEntry("sub/a.tar", "tar", 1, 8, version, [0])) == f"{directory}/{name}"


# --- what the cache asks: may two versions be the same shard? ---------------------------------------------
MATCHES = [
    (ETAG, ETAG, True), (ETAG, ETAG.strip('"'), True), ('W/"0x8D"', "0x8D", True),
    (ETAG, '"0x8DC1A2B3C4D5E70"', False),
    ("1:100", "1:100", True), ("1:100", "2:100", False),
    (ETAG, "1:100", True), ("1:100", ETAG, True),  # ETags against mtimes: only the size can tell
    ("size:100", "size:100", True), ("size:100", ETAG, True), ("1:100", "size:100", True),
]


@pytest.mark.parametrize(("recorded", "now", "same"), MATCHES)
def test_two_versions_differ_only_when_of_one_comparable_kind(recorded: str, now: str, same: bool) -> None:
    a, b = ShardVersion.parse(recorded), ShardVersion.parse(now)

    assert a.matches(b) is same and b.matches(a) is same
    assert a.comparable(b) is (a.kind is b.kind and not a.is_size_only)


@pytest.mark.parametrize(("recorded", "now", "same"), MATCHES)
def test_the_cache_check_refuses_only_a_changed_version(recorded: str, now: str, same: bool) -> None:
    entry = ShardEntry("a.tar", "tar", 1, 100, recorded, [0])
    if same:
        _check("abfs://c/a.tar", entry, 100, ShardVersion.parse(now))
    else:
        with pytest.raises(ShardError, match=r"^shard abfs://c/a.tar changed since indexing"):
            _check("abfs://c/a.tar", entry, 100, ShardVersion.parse(now))
    with pytest.raises(ShardError, match="has 99 bytes, the index says 100"):
        _check("abfs://c/a.tar", entry, 99, ShardVersion.parse(now))


# --- every maker gives the same kind of value ---------------------------------------------------------------
def test_the_index_builder_the_readers_and_the_check_agree_on_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "a.tar"
    path.parent.mkdir()
    path.write_bytes(b"\0" * 1024)  # two end-of-archive blocks: a tar of no samples
    stat = os.stat(path)

    index = build_index(str(tmp_path / "data"), progress=False)

    size, version = shard_version(fsspec.filesystem("file"), str(path))
    assert index.shards[0].version == version == ShardVersion.of_stat(stat) and size == stat.st_size
    assert LocalShards(str(tmp_path / "data")).local_path(index.shards[0]) == str(path)


def test_an_object_store_version_is_the_etag_as_given_or_the_size() -> None:
    class Store:
        """Enough of an fsspec filesystem for shard_version: one object, with or without an ETag."""

        protocol = "memory-like"

        def __init__(self, info: dict[str, object]) -> None:
            self.info_dict = info

        def invalidate_cache(self) -> None:
            pass

        def info(self, path: str) -> dict[str, object]:
            return self.info_dict

    assert shard_version(Store({"size": 5, "etag": ETAG}), "c/a.tar") == (5, ShardVersion.of_etag(ETAG))
    assert shard_version(Store({"size": 5}), "c/a.tar") == (5, ShardVersion.of_size(5))
    assert ShardEntry("a.tar", "tar", 0, 5, ShardVersion.of_size(5), []) == ShardEntry("a.tar", "tar", 0, 5,
                                                                                        "size:5", [])


def test_shards_written_to_an_object_store_without_etags_record_their_size() -> None:
    output = f"memory://versions-{uuid.uuid4().hex}/out"  # fsspec's memory store gives no ETag
    written = write_shards({"x": np.arange(6)}, output, "tar", samples_per_shard=4, progress=False)

    assert all(entry.version == ShardVersion.of_size(entry.bytes) for entry in written.shards)
    scanned = build_index(output, output=f"{output}-check.json", progress=False)
    assert load_index(output).shards == written.shards == scanned.shards
