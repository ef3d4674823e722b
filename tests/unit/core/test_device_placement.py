"""Which device a rank trains on (core/devices.py): the placement policy over a table of node layouts, and
over every layout of up to 16 ranks and 16 GPUs. Pure logic: no framework, no GPU."""

import pytest

from hvdazure.core.devices import DevicePlacementError, Placement, place_rank
from hvdazure.core.errors import UserError

CPU = None


@pytest.mark.parametrize(("local_rank", "local_size", "visible", "visible_devices", "index"), [
    (0, 1, 0, None, CPU),  # no GPU
    (1, 2, 0, "", CPU),  # CUDA_VISIBLE_DEVICES="" hides them all
    (3, 4, 4, None, 3),  # one GPU per rank: the local rank picks it
    (3, 4, 4, "4,5,6,7", 3),  # counted within CUDA_VISIBLE_DEVICES
    (1, 2, 8, None, 1),  # more GPUs than ranks: the rest idle
    (5, 8, 1, "5", 0),  # a launcher that gives each rank its own GPU: the only one it sees
    (1, 2, 1, None, 0),  # one GPU, two ranks: shared
])
def test_each_layout_places_the_rank_by_the_policy(local_rank, local_size, visible, visible_devices, index):
    assert place_rank(local_rank, local_size, visible, visible_devices).index == index


@pytest.mark.parametrize(("local_size", "visible", "visible_devices"), [
    (4, 2, None), (8, 4, "0,1,2,3"), (3, 2, "0,1")])
def test_more_ranks_than_gpus_but_more_than_one_gpu_is_an_error_naming_both_and_the_fix(local_size, visible,
                                                                                      visible_devices):
    with pytest.raises(DevicePlacementError) as raised:
        place_rank(0, local_size, visible, visible_devices)
    message = str(raised.value)
    assert message.startswith(f"{local_size} ranks per node but {visible} GPUs visible "
                              f"(CUDA_VISIBLE_DEVICES={visible_devices or 'unset'})")
    assert f"run {visible} ranks per node" in message
    assert "-np" in message and "process_count_per_instance" in message and "\n" not in message
    assert isinstance(raised.value, UserError)  # one line, exit status 2, on every rank


def test_every_layout_up_to_16_ranks_and_16_gpus_gives_each_rank_of_a_node_its_own_gpu_or_refuses():
    """The policy's properties over every combination (what a property-based test would draw): ranks of a
    node never share a GPU while there are several, no index is out of range, and the decision is the same
    kind (GPU, CPU or refused) for every rank of the node, so every rank says the same."""
    for local_size in range(1, 17):
        for visible in range(17):
            outcomes = []
            for local_rank in range(local_size):
                try:
                    outcomes.append(place_rank(local_rank, local_size, visible, None).index)
                except DevicePlacementError:
                    outcomes.append("refused")
            kinds = {"refused" if o == "refused" else CPU if o is CPU else "gpu" for o in outcomes}
            assert len(kinds) == 1, (local_size, visible, outcomes)
            if kinds == {"gpu"}:
                assert all(0 <= o < visible for o in outcomes)
                if visible > 1:
                    assert len(set(outcomes)) == local_size
            assert (kinds == {"refused"}) == (1 < visible < local_size)


def test_a_local_rank_outside_the_node_is_a_programming_error():
    with pytest.raises(ValueError, match="local rank 2 is not one of 2"):
        place_rank(2, 2, 2, None)


@pytest.mark.parametrize(("placement", "size", "nodes", "line"), [
    (Placement(None, 2, 0, None), 2, 1, "2 ranks on 1 node, CPU"),
    (Placement(0, 1, 1, None), 1, 1, "1 rank on 1 node, 1 GPU each (cuda:0)"),
    (Placement(0, 4, 4, None), 4, 1, "4 ranks on 1 node, 1 GPU each (cuda:0..3)"),
    (Placement(0, 8, 8, None), 16, 2, "16 ranks on 2 nodes (8 per node), 1 GPU each (cuda:0..7)"),
    (Placement(0, 2, 4, "0,1,2,3"), 2, 1,
     "2 ranks on 1 node, 1 GPU each (cuda:0..1 of CUDA_VISIBLE_DEVICES=0,1,2,3; 2 of 4 visible GPUs idle)"),
    (Placement(0, 4, 1, "0"), 4, 1,
     "4 ranks on 1 node, 1 GPU each (each rank sees one: CUDA_VISIBLE_DEVICES=0 on rank 0)"),
    (Placement(0, 2, 1, None), 2, 1, "2 ranks on 1 node, sharing the node's 1 GPU (cuda:0; NCCL needs a GPU "
                                     "per rank, Horovod's CPU operations do not)"),
])
def test_rank_0s_layout_line_says_ranks_nodes_and_gpus(placement, size, nodes, line):
    assert placement.layout(size, nodes) == line
