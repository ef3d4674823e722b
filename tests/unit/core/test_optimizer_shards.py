"""core/optimizer_shards.py: how `zero_stage` splits a group's trained tensors over the ranks (FlatPartition:
every element owned by exactly one rank, contiguously, in order, each rank's share within 2% of an even
1/N), and the state file a sharded checkpoint holds (written piece by piece in any order, read back by byte
ranges, and readable by the safetensors library). Sharding on real ranks: tests/distributed/test_zero.py."""

from __future__ import annotations

import itertools
import json
import random
import struct

import numpy as np
import pytest

from hvdazure.core.optimizer_shards import (
    ALIGN_BYTES,
    FORMAT,
    FlatPartition,
    StateFile,
    StateFileWriter,
    entry_name,
    even_share,
    layout,
)

# (numels of one group's tensors, world size): odd sizes, tensors smaller and larger than a slice, one
# tensor alone, a world bigger than the whole group
SPLITS = [((7, 13, 1, 100), 2), ((7, 13, 1, 100), 3), ((1000,), 4), ((3,), 8), ((5, 5, 5), 7),
          ((65, 1, 64, 129), 5), ((10_007,), 1), ((1, 1, 1, 1, 1, 1), 4)]


def owned(partition: FlatPartition) -> dict[int, list[tuple[int, int]]]:
    """rank -> the (tensor index, element) pairs it owns, in its slice's order."""
    return {rank: [(p.index, p.start + i) for p in partition.pieces(rank) for i in range(p.length)]
            for rank in range(partition.world)}


@pytest.mark.parametrize(("numels", "world"), SPLITS)
@pytest.mark.parametrize("element_size", [8, 4, 2])
def test_every_element_is_owned_by_exactly_one_rank_in_flat_order(numels, world, element_size):
    partition = FlatPartition(tuple(range(10, 10 + len(numels))), numels, world, element_size)

    by_rank = owned(partition)
    flat = [pair for rank in range(world) for pair in by_rank[rank]]  # the ranks' slices end to end
    assert flat == [(10 + i, e) for i, numel in enumerate(numels) for e in range(numel)]


@pytest.mark.parametrize(("numels", "world"), SPLITS)
@pytest.mark.parametrize("element_size", [8, 4, 2])
def test_a_ranks_pieces_are_contiguous_and_the_padding_comes_only_at_the_end(numels, world, element_size):
    partition = FlatPartition(tuple(range(len(numels))), numels, world, element_size)

    filled = []
    for rank in range(world):
        pieces = partition.pieces(rank)
        at = 0
        for piece in pieces:  # each piece right after the one before it in the slice: no gap
            assert piece.at == at and piece.length > 0
            at += piece.length
        assert at <= partition.shard_size
        filled.append(at)
        offsets = partition.offsets()
        for piece in pieces:  # the slice's element `at` is the flat buffer's rank * shard_size + at
            assert offsets[piece.index] + piece.start == rank * partition.shard_size + piece.at
    # full slices, then at most one part-filled slice, then slices of padding alone
    assert sum(filled) == partition.total
    assert filled == [min(partition.shard_size, max(0, partition.total - r * partition.shard_size))
                      for r in range(world)]
    assert partition.padded == partition.shard_size * world >= partition.total


@pytest.mark.parametrize(("numels", "world"), SPLITS)
@pytest.mark.parametrize("element_size", [8, 4, 2, 1])
def test_the_slice_size_is_a_whole_number_of_64_byte_lines_and_no_bigger_than_it_needs(numels, world,
                                                                                        element_size):
    partition = FlatPartition(tuple(range(len(numels))), numels, world, element_size)

    align = ALIGN_BYTES // element_size
    assert partition.shard_size >= 1 and partition.shard_size * element_size % ALIGN_BYTES == 0
    assert partition.shard_size * world >= partition.total
    assert (partition.shard_size - align) * world < partition.total or partition.shard_size == align


def test_a_world_bigger_than_the_tensors_gives_rank_0_everything_and_the_rest_padding():
    partition = FlatPartition((0, 1), (3, 2), 8, 4)

    assert partition.shard_size == 16  # one 64-byte line of float32
    assert [(p.index, p.start, p.length, p.at) for p in partition.pieces(0)] == [(0, 0, 3, 0), (1, 0, 2, 3)]
    assert all(partition.pieces(rank) == [] for rank in range(1, 8))


def test_one_huge_tensor_is_split_evenly_over_the_ranks():
    partition = FlatPartition((0,), (50_257 * 768,), 8, 4)  # one embedding table, float32

    share = partition.shard_size
    assert share == 4_824_672 and share % 16 == 0
    for rank in range(8):
        (piece,) = partition.pieces(rank)
        assert (piece.index, piece.start, piece.at) == (0, rank * share, 0)
        assert piece.length == (share if rank < 7 else partition.total - 7 * share)
    assert partition.total - 7 * share > 0.99 * share  # the last rank's slice nearly as full as the others


# about 100M parameters: a GPT-2-small-like stack (an embedding, 12 blocks of 4 matrices with biases and
# norms), then the rest up to 100M in one more tensor; float32 and a bfloat16 group beside it
BLOCK = [768 * 2304, 2304, 768 * 768, 768, 768 * 3072, 3072, 3072 * 768, 768, 768, 768, 768, 768]
GPT = [50_257 * 768, 1024 * 768, *BLOCK * 12, 768, 768]
HUNDRED_MILLION = (*GPT, 100_000_000 - sum(GPT))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_each_rank_holds_at_most_2_percent_more_than_an_even_share_of_100m_elements(world):
    assert sum(HUNDRED_MILLION) == 100_000_000
    fp32 = FlatPartition(tuple(range(len(HUNDRED_MILLION))), HUNDRED_MILLION, world, 4)
    bf16 = FlatPartition((1000, 1001, 1002), (4097, 1, 333), world, 2)

    assert 1.0 <= even_share([fp32]) <= 1.02
    assert 1.0 <= even_share([fp32, bf16]) <= 1.02
    assert even_share([fp32]) == fp32.shard_size * world / 100_000_000


def test_even_share_of_nothing_is_zero_and_the_record_names_the_split():
    assert even_share([FlatPartition((), (), 4, 4)]) == 0.0
    partition = FlatPartition((3, 5), (10, 20), 2, 8)
    assert partition.record() == {"indices": [3, 5], "numels": [10, 20], "world": 2, "shard_size": 16}


# --- the state file ----------------------------------------------------------------------------------------
def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """bfloat16's bits of float32 values (their top 16 bits: the values below are exact in bfloat16)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def tensors() -> dict[str, tuple[str, np.ndarray]]:
    """Optimizer state of each dtype a state file holds, as a sharded checkpoint names it: name -> (its
    safetensors dtype, its values as stored)."""
    rng = np.random.default_rng(0)
    halves = np.array([0.5, -1.25, 3.0, 1024.0, -0.0078125, 2.5], dtype=np.float32).reshape(2, 3)
    return {
        entry_name(0, "exp_avg"): ("F64", rng.normal(size=(3, 5))),
        entry_name(0, "step"): ("F32", np.array(7.0, dtype=np.float32)),  # 0-d: Adam's step
        entry_name(1, "momentum_buffer"): ("F32", rng.normal(size=(129,)).astype(np.float32)),
        entry_name(2, "exp_avg_sq"): ("BF16", bfloat16_bits(halves)),
        entry_name(3, "square_avg"): ("F16", halves.astype(np.float16)),
        entry_name(4, "count"): ("I64", np.arange(-5, 6, dtype=np.int64).reshape(11, 1)),
    }


METADATA = {"param_groups": [{"lr": 0.1, "params": [0, 1, 2, 3, 4]}],
            "per_element": {"0": {"exp_avg": True, "step": False}}, "zero_stage": 2,
            "partition": [{"indices": [0, 1], "numels": [15, 129], "world": 3, "shard_size": 64}]}


def write_out_of_order(path, values: dict[str, tuple[str, np.ndarray]], seed: int = 1) -> None:
    """Each entry cut into runs of 1 to 5 elements, written in a shuffled order, as the ranks' slices reach
    rank 0."""
    entries = layout({name: (dtype, array.shape) for name, (dtype, array) in values.items()})
    runs = []
    for name, (_, array) in values.items():
        flat, start = array.reshape(-1), 0
        rng = random.Random(name)
        while start < flat.size:
            length = rng.randint(1, 5)
            runs.append((name, start, flat[start:start + length].tobytes()))
            start += length
    random.Random(seed).shuffle(runs)
    with open(path, "wb") as file:
        writer = StateFileWriter(file, entries, METADATA)
        for name, start, data in runs:
            writer.write(name, start, data)


def test_a_state_file_written_piecewise_out_of_order_reads_back_whole_and_by_ranges(tmp_path):
    values, path = tensors(), tmp_path / "optimizer-state.safetensors"
    write_out_of_order(path, values)

    state = StateFile(str(path))
    try:
        assert state.metadata == METADATA
        assert sorted(state.names()) == sorted((int(n.split(".")[1]), n.split(".", 2)[2]) for n in values)
        for name, (dtype, array) in values.items():
            entry = state.entries[name]
            assert (entry.dtype, entry.shape, entry.numel) == (dtype, array.shape, array.size)
            assert bytes(state.read(name)) == array.tobytes()
            flat = array.reshape(-1)
            for start in range(flat.size):  # every range a slice could ask for
                for count in range(flat.size - start + 1):
                    assert bytes(state.read(name, start, count)) == flat[start:start + count].tobytes()
        assert bytes(state.read(entry_name(0, "step"))) == struct.pack("<f", 7.0)  # the 0-d entry
    finally:
        state.close()


def test_the_file_is_safetensors_layout_with_a_header_padded_to_8_bytes(tmp_path):
    path = tmp_path / "state.safetensors"
    write_out_of_order(path, tensors())

    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    assert length % 8 == 0 and header["__metadata__"]["format"] == FORMAT
    assert all(isinstance(value, str) for value in header["__metadata__"].values())  # safetensors' rule
    ends = sorted(e["data_offsets"] for name, e in header.items() if name != "__metadata__")
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ends))
    assert len(raw) == 8 + length + ends[-1][1]


def test_the_safetensors_library_reads_a_state_file_as_written(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    values, path = tensors(), tmp_path / "optimizer-state.safetensors"
    write_out_of_order(path, values)

    with safetensors.safe_open(str(path), framework="numpy") as file:
        assert set(file.keys()) == set(values)
        assert {k: json.loads(v) for k, v in file.metadata().items() if k != "format"} == METADATA
        for name, (dtype, array) in values.items():
            if dtype == "BF16":  # numpy has no bfloat16 (torch reads it: the test below)
                continue
            got = file.get_tensor(name)
            assert got.dtype == array.dtype and got.shape == array.shape
            assert got.tobytes() == array.tobytes()
        ranged = file.get_slice(entry_name(1, "momentum_buffer"))[64:100]  # a rank's range, as a reader would
        assert ranged.tobytes() == values[entry_name(1, "momentum_buffer")][1][64:100].tobytes()


def test_torch_reads_the_bfloat16_and_every_other_entry_of_a_state_file(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors")
    values, path = tensors(), tmp_path / "optimizer-state.safetensors"
    write_out_of_order(path, values)

    with safetensors.safe_open(str(path), framework="pt") as file:
        assert file.metadata()["format"] == FORMAT
        assert json.loads(file.metadata()["partition"]) == METADATA["partition"]
        got = {name: file.get_tensor(name) for name in file.keys()}  # noqa: SIM118 (safe_open's API)
    assert set(got) == set(values)
    assert got[entry_name(2, "exp_avg_sq")].dtype == torch.bfloat16
    assert got[entry_name(2, "exp_avg_sq")].tolist() == [[0.5, -1.25, 3.0], [1024.0, -0.0078125, 2.5]]
    assert got[entry_name(0, "step")].shape == () and got[entry_name(0, "step")].item() == 7.0
    assert got[entry_name(3, "square_avg")].dtype == torch.float16
    for name in (entry_name(0, "exp_avg"), entry_name(1, "momentum_buffer"), entry_name(4, "count")):
        assert got[name].numpy().tobytes() == values[name][1].tobytes()


def test_a_write_past_an_entrys_end_and_a_dtype_without_a_size_are_refused(tmp_path):
    entries = layout({"state.0.a": ("F32", (4,)), "state.0.b": ("F64", ())})
    with open(tmp_path / "f", "wb") as file:
        writer = StateFileWriter(file, entries, {})
        with pytest.raises(ValueError, match=r"^state\.0\.a: 8 bytes from element 3 run past its end$"):
            writer.write("state.0.a", 3, b"\0" * 8)
    with pytest.raises(ValueError, match="dtype C64 cannot be written in a state file"):
        layout({"state.0.z": ("C64", (2,))})


def test_a_safetensors_file_of_another_kind_is_refused_in_one_line_naming_it(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "model.safetensors"
    safetensors_numpy.save_file({"weight": np.ones((2, 2))}, str(path), metadata={"format": "pt"})

    with pytest.raises(ValueError) as refused:
        StateFile(str(path))
    assert str(refused.value) == f"{path}: not an optimizer state file of this hvdazure ('pt')"


def test_an_empty_or_truncated_file_is_refused_in_one_line_naming_it(tmp_path):
    empty, short = tmp_path / "empty", tmp_path / "short"
    empty.write_bytes(b"")
    short.write_bytes(b"\x01\x02")
    for path in (empty, short):
        with pytest.raises(ValueError) as refused:
            StateFile(str(path))
        assert str(refused.value) == f"{path}: not an optimizer state file (too short)"


@pytest.mark.parametrize("content", [b"PK\x03\x04" + bytes(range(200)),  # torch.save's zip (optimizer.pt)
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ",
                                     b"\x04\x00\x00\x00\x00\x00\x00\x00[1] "],  # TypeError: not a ValueError
                         ids=["zip", "not-json", "not-an-object"])
def test_a_file_of_another_format_is_refused_in_one_line_naming_it(tmp_path, content):
    path = tmp_path / "optimizer-state.safetensors"
    path.write_bytes(content)

    with pytest.raises(ValueError) as refused:
        StateFile(str(path))
    assert str(refused.value).startswith(f"{path}: not an optimizer state file"), refused.value
