"""A stand-in for subprocess.Popen (or the launcher's run_job) in the tests of what `hvdazure run` must refuse
before any rank starts: a start fails the test, naming what was started."""

from __future__ import annotations

from typing import NoReturn


def must_not_start(*args: object, **kwargs: object) -> NoReturn:
    raise AssertionError(f"started a process: {args[0] if args else kwargs}")
