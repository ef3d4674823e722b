"""Sizes as users write them: "20GB", "500MB", "1.5GiB", or a number of bytes.

KB, MB, GB and TB are powers of 1000 (as disks and Azure quote sizes); KiB, MiB, GiB and TiB powers of 1024.
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(value: str | int, what: str = "size") -> int:
    """Bytes in `value` ("20GB", "500 MB", "64MiB", 1048576); ValueError naming `what` and the value."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of bytes or a size such as '20GB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must not be negative, got {value}")
        return value
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{what} must be a number of bytes or a size such as '20GB', '500MB' or '64MiB', "
                         f"got {value!r}")
    return int(float(match.group(1)) * _UNITS[unit])
