"""The coordinator of a sweep: hands trials to groups as they become free, answers pruning questions, records
outcomes. It lives in a thread of world rank 0 (beside that rank's own trials) and talks to group leaders
only with point-to-point messages on a communicator of its own (sweep/messages.py): it joins no collective,
so it cannot deadlock with the Horovod collectives of rank 0's group, and adds nothing to a training step.

The Optuna study is the record: a trial told is finished for good; a trial left RUNNING when a sweep stopped
is handed out again first when it restarts, to resume from its checkpoints.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.space import SearchSpace

# How a trial ended, as results.json and the table say it; Optuna's state follows from it.
COMPLETE, PRUNED, FAILED, DIVERGED, RUNNING = "complete", "pruned", "failed", "diverged", "running"


def trial_dir(output: Path, number: int) -> Path:
    return output / "trials" / f"trial-{number:04d}"


class Coordinator:
    """Answers the requests of group leaders (`handle`); pure Optuna, no MPI, so it is unit-testable."""

    def __init__(self, options: SweepOptions, space: SearchSpace, study: Any, total: int,
                 say: Callable[[str], None]) -> None:
        import optuna

        self.options, self.space, self.study, self.total, self.say = options, space, study, total, say
        self.running: dict[int, Any] = {}  # trial number -> optuna.Trial
        self.aborted: str | None = None  # why no more trials are handed out (a sweep-wide error)
        self.interrupted = False
        stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        self.to_resume = [t.number for t in stale]  # left running by a sweep that stopped: resume first
        self.distributions = space.optuna_distributions()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        op = message["op"]
        if op == "next":
            return self._next(message)
        if op == "report":
            return self._report(message)
        if op == "finish":
            return self._finish(message)
        raise ValueError(f"unknown sweep request {op!r}")

    def _next(self, message: dict[str, Any]) -> dict[str, Any]:
        import optuna

        if self.aborted or self.interrupted:
            return {"trial": None}
        if self.to_resume:
            number = self.to_resume.pop(0)
            frozen = self.study.trials[number]
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            resumed = True
        elif len(self.study.trials) < self.total:
            trial, resumed = self.study.ask(self.distributions), False
        else:
            return {"trial": None}
        self.running[trial.number] = trial
        params = dict(trial.params)
        seed = params.get("seed", self.options.seed + trial.number)
        ranks = message["ranks"]
        trial.set_user_attr("ranks", ranks)
        trial.set_user_attr("seed", seed)
        trial.set_user_attr("start", time.time())
        self.say(f"trial {trial.number} {'resumes' if resumed else 'starts'} on rank"
                 f"{'s' if len(ranks) > 1 else ''} {_span(ranks)}: {_params_text(params)}")
        return {"trial": trial.number, "params": params, "seed": seed, "resumed": resumed,
                "dir": str(trial_dir(self.options.output_dir, trial.number))}

    def _report(self, message: dict[str, Any]) -> dict[str, Any]:
        trial = self.running[message["trial"]]
        step, value = int(message["step"]), float(message["value"])
        frozen = self.study.trials[trial.number]
        if step not in frozen.intermediate_values and math.isfinite(value):
            trial.report(value, step)
        if message.get("last"):  # the trial trained to its end: it completes
            return {"prune": False}
        return {"prune": bool(trial.should_prune())}

    def _finish(self, message: dict[str, Any]) -> dict[str, Any]:
        import optuna

        number, state = message["trial"], message["state"]
        trial = self.running.pop(number)
        if message.get("interrupted"):
            self.interrupted = True  # stays RUNNING in the study: a restart resumes it from its checkpoint
            self.say(f"trial {number} stopped ({message.get('error') or 'interrupted'}); it resumes when the "
                     "sweep is started again with the same --output")
            return {"ok": True}
        start = self.study.trials[number].user_attrs.get("start", time.time())
        for key in ("best", "final", "epochs", "error", "error_kind"):
            if message.get(key) is not None:
                trial.set_user_attr(key, message[key])
        trial.set_user_attr("state", state)
        trial.set_user_attr("end", time.time())
        trial.set_user_attr("duration_s", round(time.time() - start, 3))
        states = {COMPLETE: optuna.trial.TrialState.COMPLETE, PRUNED: optuna.trial.TrialState.PRUNED}
        try:
            self.study.tell(trial, message["best"] if state == COMPLETE else None,
                            state=states.get(state, optuna.trial.TrialState.FAIL))
        except RuntimeError as exc:
            # GridSampler calls study.stop() once its grid is used up, which raises outside optimize(); the
            # trial is stored by then (Optuna stores it in a `finally`)
            if "Study.stop" not in str(exc):
                raise
        if message.get("error_kind") == "sweep":  # every trial would fail the same way: stop the sweep
            self.aborted = message["error"]
        self.say(self._finish_line(number, state, message))
        return {"ok": True}

    def _finish_line(self, number: int, state: str, message: dict[str, Any]) -> str:
        duration = self.study.trials[number].user_attrs.get("duration_s", 0.0)
        metric = self.options.metric
        if state == COMPLETE:
            best = self.study.best_trial
            return (f"trial {number} complete in {duration:.1f} s: {metric} {message['best']:.6g} "
                    f"(best so far: trial {best.number}, {best.value:.6g})")
        if state == PRUNED:
            return f"trial {number} pruned after {message.get('epochs', '?')} epoch(s), {duration:.1f} s"
        return f"trial {number} {state} after {duration:.1f} s: {message.get('error')}"


def serve(coordinator: Coordinator, comm: Any, leaders: int) -> None:
    """Answer requests on `comm` until every group leader said it is done. A request the coordinator fails
    to answer (a broken journal, say) aborts the sweep: each later request is told there is no trial."""
    from mpi4py import MPI

    from hvdazure.sweep.messages import TAG_REPLY, TAG_REQUEST, wait_until

    status, done = MPI.Status(), 0
    while done < leaders:
        wait_until(lambda: comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST, status=status), 0.01)
        source = status.Get_source()
        message = comm.recv(source=source, tag=TAG_REQUEST)
        if message["op"] == "bye":
            done += 1
            continue
        try:
            reply = coordinator.handle(message)
        except Exception as exc:  # reported, and the sweep ends instead of hanging
            failure = f"the sweep's coordinator failed: {type(exc).__name__}: {exc}"
            coordinator.aborted = coordinator.aborted or failure
            coordinator.say(coordinator.aborted)
            reply = {"trial": None, "prune": False, "ok": False}
        comm.send(reply, dest=source, tag=TAG_REPLY)


def start_thread(coordinator: Coordinator, comm: Any, leaders: int) -> threading.Thread:
    thread = threading.Thread(target=serve, args=(coordinator, comm, leaders),
                              name="hvdazure-sweep-coordinator", daemon=True)
    thread.start()
    return thread


def printer(stream: TextIO) -> Callable[[str], None]:
    def say(line: str) -> None:
        stream.write(f"sweep: {line}\n")
        stream.flush()

    return say


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
