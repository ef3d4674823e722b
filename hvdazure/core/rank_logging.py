"""Rank-aware logging: rank 0 speaks, the other ranks stay quiet unless something is wrong.

Python warnings are shown once (by rank 0), not once per rank. HVDAZURE_LOG_ALL_RANKS=1 turns this off,
for debugging one rank's behaviour. A line logged while a progress bar is drawn on the same terminal (one
process; core/progress_display.py) is written above the bar, not into it; under `hvdazure run` the
launcher does that for every rank's lines (launch/console.py).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import TextIO

logger = logging.getLogger("hvdazure")


class _UnderProgressBars(logging.StreamHandler[TextIO]):
    """A stream handler that clears tqdm's bars on its stream while it writes, and draws them again."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm = sys.modules.get("tqdm")  # no bar can be drawn where tqdm was never imported
        if tqdm is None:
            super().emit(record)
            return
        with tqdm.tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def configure_logging(rank: int) -> None:
    """INFO on rank 0, ERROR elsewhere; called once the rank is known."""
    everyone = os.environ.get("HVDAZURE_LOG_ALL_RANKS") == "1"
    if not logger.handlers:
        handler = _UnderProgressBars()
        handler.setFormatter(logging.Formatter("hvdazure: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if rank == 0 or everyone else logging.ERROR)
    if rank != 0 and not everyone:
        warnings.simplefilter("ignore")
