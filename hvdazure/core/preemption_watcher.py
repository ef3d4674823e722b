"""The trainer's answer to an advance notice of preemption: poll what the environment reports
(core/environments: `PreemptionNotices`, e.g. Azure Scheduled Events) and, on a notice that is due, make
every rank save a checkpoint at the next step and exit 143.

One watcher per node, on local rank 0, in a daemon thread: the notice is per VM. It calls the run's
`request_checkpoint_and_exit` (core/run_protocol.py), which travels in the per-step stop vote (no collective
of its own).
It never stops training by itself failing: an unreachable source or a malformed answer is logged once and
tried again at the next poll.
"""

from __future__ import annotations

import logging
import threading

from hvdazure.core.callbacks import BuiltinCallback
from hvdazure.core.environments import PreemptionNotices
from hvdazure.core.rank_logging import logger
from hvdazure.core.run_protocol import Run


class PreemptionWatcher(BuiltinCallback):
    """On local rank 0 of each node: polls `notices` and, on one that is due, asks every rank to checkpoint at
    the next step and exit 143 (Run.request_checkpoint_and_exit)."""

    def __init__(self, notices: PreemptionNotices) -> None:
        self.notices = notices
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def on_train_start(self, run: Run) -> None:
        if run.local_rank != 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, args=(run,), name="hvdazure-preemption-watch",
                                        daemon=True)
        self._thread.start()

    def on_train_end(self, run: Run) -> None:
        self._stop.set()  # not joined: a request may be in flight; the daemon thread ends after it

    def _watch(self, run: Run) -> None:
        notices = self.notices
        answered = reported = False
        while not self._stop.is_set():
            try:
                notice = notices.due_notice(notices.timeout if answered else notices.first_timeout)
                if not answered:
                    logger.info(f"watching {notices.watching()}")
                answered = True
                if notice is not None:
                    _tell(run, f"{notice.reason} ({notice.detail}): every rank saves a checkpoint at the "
                               "next step, then exits")
                    run.request_checkpoint_and_exit(notice.reason)
                    return
            except Exception as exc:  # never let the watcher end training: say so once, try again
                if not reported:
                    _tell(run, f"{notices.where} unavailable ({exc}); trying again every "
                               f"{notices.poll_seconds:g} s")
                reported = True
            self._stop.wait(notices.poll_seconds)


def _tell(run: Run, message: str) -> None:
    # Ranks other than 0 log errors only; a node's watcher must still be heard in that node's log.
    logger.log(logging.WARNING if run.rank == 0 else logging.ERROR, message)
