"""How `hvdazure run` shows a rank's lines (hvdazure/launch/console.py): rank 0's as a 1-process run prints
them, another rank's after `[rank N] `; its own lines start `hvdazure run: `."""

from __future__ import annotations


def prefix(rank: int) -> str:
    """What `hvdazure run` puts before each line of `rank`."""
    return "" if rank == 0 else f"[rank {rank}] "


def lines_of(output: str, rank: int) -> list[str]:
    """The lines `rank` printed in `output` (one stream of a job), without its prefix. Rank 0's are those
    no other rank's prefix marks and that are not `hvdazure run`'s own."""
    if rank:
        marker = prefix(rank)
        return [line.removeprefix(marker) for line in output.splitlines() if line.startswith(marker)]
    return [line for line in output.splitlines() if not line.startswith(("[rank ", "hvdazure run: "))]
