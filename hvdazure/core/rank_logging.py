"""Rank-aware logging: rank 0 speaks, the other ranks stay quiet unless something is wrong.

Python warnings are shown once (by rank 0), not once per rank. HVDAZURE_LOG_ALL_RANKS=1 turns this off,
for debugging one rank's behaviour.
"""

from __future__ import annotations

import logging
import os
import warnings

logger = logging.getLogger("hvdazure")


def configure_logging(rank: int) -> None:
    """INFO on rank 0, ERROR elsewhere; called once the rank is known."""
    everyone = os.environ.get("HVDAZURE_LOG_ALL_RANKS") == "1"
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hvdazure: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 or everyone else logging.ERROR)
    if rank != 0 and not everyone:
        warnings.simplefilter("ignore")
