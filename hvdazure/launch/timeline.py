"""`hvdazure run --timeline FILE`: Horovod's timeline of the job's collectives, which rank 0 writes to the
file HOROVOD_TIMELINE names (a Chrome trace: chrome://tracing or https://ui.perfetto.dev opens it).

The file is checked before any rank starts (a timeline that cannot be written would otherwise be lost
silently, at the end of a long job), and the job's last line says where it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TIMELINE_ENV = "HOROVOD_TIMELINE"  # set for every rank; rank 0 (Horovod's coordinator) writes the file
VIEWERS = "chrome://tracing or https://ui.perfetto.dev"


def absolute_timeline(path: str) -> str:
    """`path` from the current directory (the ranks may start elsewhere), `~` expanded."""
    return os.path.abspath(os.path.expanduser(path))


def prepare_timeline(path: str) -> None:
    """Make `path`'s folder if need be and check that the file can be written there; ValueError, in one line
    naming the path, if not. Nothing is left behind by the check."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--timeline {path}: is a directory; give the file to write the timeline to")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a folder of the path should be
        raise ValueError(f"--timeline {path}: cannot make its folder {target.parent} (a file is in the way)"
                         ) from None
    except OSError as exc:
        raise ValueError(f"--timeline {path}: cannot make its folder {target.parent} "
                         f"({exc.strerror or exc})") from None
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        raise ValueError(f"--timeline {path}: cannot be written ({exc.strerror or exc})") from None


@dataclass(frozen=True)
class TimelineStamp:
    """The file's state before the job (None: absent), to tell a timeline this job wrote from an old one."""

    path: str
    before: tuple[int, int] | None

    @classmethod
    def of(cls, path: str) -> TimelineStamp:
        return cls(path, _stat(path))

    def written(self) -> bool:
        """Whether the file was written since the stamp was taken."""
        now = _stat(self.path)
        return now is not None and now != self.before

    def report_line(self) -> str:
        """The job's last line: where the timeline is and how to open it, or that none was written here."""
        if self.written():
            return f"hvdazure run: Horovod timeline written to {self.path}; open it in {VIEWERS}\n"
        return (f"hvdazure run: no Horovod timeline was written to {self.path} on this machine (rank 0 "
                f"writes it, on its own node, once it has called hvd.init())\n")


def _stat(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
