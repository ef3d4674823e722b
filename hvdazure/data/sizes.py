"""Sizes as users write them: "64MB", "20 GB", "1.5GiB", "2K", or a number of bytes.

KB, MB, GB and TB (or K, M, G, T) are powers of 1000, as disks and Azure quote sizes; KiB, MiB, GiB and
TiB powers of 1024. One parser for every size hvdazure.data takes (shard sizes, the cache's limit).
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?)?B?\s*", re.IGNORECASE)


def parse_size(value: str | int, what: str | None = None) -> int:
    """Bytes in `value` (more than 0); a ValueError naming `what` and the value otherwise."""
    prefix = f"{what}: " if what else ""
    hint = "give bytes, or a number with KB, MB, GB (or KiB, MiB, GiB)"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{prefix}bad size {value!r}: {hint}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value)
        if match is None:
            raise ValueError(f"{prefix}bad size {value!r}: {hint}")
        size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])
    if size <= 0:
        raise ValueError(f"{prefix}bad size {value!r}: must be more than 0 bytes")
    return size
