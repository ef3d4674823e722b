"""What every rank of a sweep runs (`python -m hvdazure.sweep`): split the MPI world into groups of
--ranks-per-trial ranks, and in each group run trial after trial of the user's unmodified script.

A trial is the script run in this process (runpy) inside a RunContext (core/run_context.py): the trainers it
builds start Horovod on the group's communicator, take the trial's parameters over the script's config, and
report their per-epoch metric to the coordinator through a callback (pruning). After each trial, success or
not, Horovod is shut down on every rank of the group: a rank whose trial raised thereby releases its peers
from the collectives they wait in ("Horovod has been shut down"), and the group starts the next trial afresh.
"""

from __future__ import annotations

import contextlib
import math
import os
import runpy
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hvdazure.core.callbacks import BuiltinCallback
from hvdazure.core.config import ConfigError
from hvdazure.core.errors import exception_line
from hvdazure.core.nonfinite import NonFiniteError
from hvdazure.core.run_context import RunContext, active
from hvdazure.core.run_protocol import Run
from hvdazure.sweep import messages
from hvdazure.sweep.coordinator import COMPLETE, DIVERGED, FAILED, PRUNED
from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.space import overrides

LAUNCHED_ENV = "HVDAZURE_SWEEP_LAUNCHED"  # set by `hvdazure sweep`, which prints the results table itself


class TrialInterrupted(BaseException):
    """A stop signal arrived while a trial ran outside a trainer's fit() (which handles its own)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


class _StopSignals:
    """SIGTERM/SIGINT/SIGHUP to a sweep rank: between trials, the group takes no further trial; inside a
    trial, outside fit(), the trial stops (TrialInterrupted); inside fit() the trainer's own handling
    applies (a checkpoint, then exit 128 + signal), and the trial resumes when the sweep is restarted."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.in_trial = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = self.signum or signum
        if self.in_trial:
            self.in_trial = False
            raise TrialInterrupted(signum)


class SweepMetricError(ConfigError):
    """The metric to optimise is not among the trial's metrics: every trial would fail the same way."""


class TrialReporter(BuiltinCallback):
    """On every rank of a trial: follows the optimised metric epoch by epoch, stops a diverged trial, and on
    the group leader asks the coordinator whether to prune (the leader's stop request reaches the other ranks
    at the epoch's end, through the trainer's own stop vote: no collective is added). hvdazure's own: it is
    given the run, not the user's trainer."""

    def __init__(self, metric: str, mode: str,
                 should_prune: Callable[[int, float, bool], bool] | None) -> None:
        self.metric, self.mode, self.should_prune = metric, mode, should_prune
        self.history: list[dict[str, Any]] = []
        self.pruned = self.diverged = self.ended = False

    def on_epoch_end(self, run: Run) -> None:
        self.history = list(run.state.history)
        record = self.history[-1]
        value = self._value(record)
        bad = [k for k, v in record.items() if k.startswith("train_loss") and not _finite(v)]
        if value is not None and not _finite(value):
            bad.insert(0, self.metric)
        if bad:
            self.diverged = True
            run.state.request_stop(f"the trial diverged ({bad[0]} is {record.get(bad[0])})")
        elif value is not None and self.should_prune and self.should_prune(record["epoch"], value,
                                                                           run.finished):
            self.pruned = True
            run.state.request_stop("pruned by the sweep")

    def on_train_end(self, run: Run) -> None:
        self.history = list(run.state.history)
        self.ended = True
        if not self.values():
            keys = sorted({k for r in self.history for k in r} - {"epoch", "step", "samples_seen", "lr"})
            raise SweepMetricError(f"--metric {self.metric!r} is not in the trial's history; its metrics are "
                                   f"{', '.join(keys) or 'none (no epoch finished)'}")

    def _value(self, record: dict[str, Any]) -> float | None:
        if self.metric in record:
            return float(record[self.metric])
        evaluated = any(k.startswith("eval_") for k in record)
        if self.metric.startswith("eval_") and not evaluated:
            return None  # no evaluation this epoch (eval_every)
        keys = sorted(set(record) - {"epoch", "step", "samples_seen", "lr"})
        raise SweepMetricError(f"--metric {self.metric!r} is not in the trial's history; its metrics are "
                               f"{', '.join(keys)}")

    def values(self) -> list[float]:
        return [float(r[self.metric]) for r in self.history if self.metric in r]

    def best(self) -> float | None:
        finite = [v for v in self.values() if _finite(v)]
        if not finite:
            return None
        return min(finite) if self.mode == "min" else max(finite)


def main(options: SweepOptions) -> int:
    """Run this rank's part of the sweep; the exit status of the process."""
    _share_cores_among_ranks()
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    control, done = world.Dup(), world.Dup()  # the coordinator's messages; the final barrier
    problem, parent = None, None
    try:
        space = options.check(world.Get_size())
        if world.Get_rank() == 0:
            options.check_same_as_saved()
            options.save(space)
            if options.mlflow:
                from hvdazure.sweep.tracking import parent_run

                parent = parent_run(options)
    except ConfigError as exc:
        problem = str(exc)
    # rank 0 alone reads and writes the output folder (on several nodes, the others may not see it)
    rank0_problem, parent = control.bcast((problem, parent), root=0)
    problem = rank0_problem or problem
    if problem:
        sys.stderr.write(f"hvdazure sweep: error: {problem}\n")
        return 2
    group_index = world.Get_rank() // options.ranks_per_trial
    group = world.Split(group_index, world.Get_rank())
    leaders = world.Get_size() // options.ranks_per_trial
    console = os.fdopen(os.dup(1), "w", buffering=1)  # trials' own output goes to their log files
    coordinator = thread = None
    if world.Get_rank() == 0:
        coordinator, thread = _start_coordinator(options, space, control, leaders, console)
    ranks = list(range(group_index * options.ranks_per_trial, (group_index + 1) * options.ranks_per_trial))
    exit_code = _run_group(options, control, group, ranks, _StopSignals(), parent)
    messages.barrier(done)
    if thread is not None and coordinator is not None:
        thread.join()
        from hvdazure.sweep.results import write_results

        results = write_results(options, coordinator.study, space)
        if parent is not None:
            from hvdazure.sweep.tracking import log_best

            log_best(options, parent, results.best, len(results.rows), finished=exit_code == 0)
        if not os.environ.get(LAUNCHED_ENV):
            console.write(results.table() + "\n")
        if coordinator.aborted:
            sys.stderr.write(f"hvdazure sweep: error: {coordinator.aborted}\n")
            exit_code = exit_code or 1
        elif results.best is None and not exit_code:  # a script that cannot train must not look fine
            states = Counter(row["state"] for row in results.rows)
            counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            sys.stderr.write(f"hvdazure sweep: error: no trial completed ({counts}); see the trials' logs "
                             f"in {options.output_dir / 'trials'}\n")
            exit_code = 1
    console.flush()
    return exit_code


def _start_coordinator(options: SweepOptions, space: Any, control: Any, leaders: int, console: Any) -> tuple:
    from hvdazure.sweep.coordinator import Coordinator, printer, start_thread
    from hvdazure.sweep.study import make_study, total_trials

    study = make_study(options, space)
    coordinator = Coordinator(options, space, study, total_trials(options, space), printer(console))
    return coordinator, start_thread(coordinator, control, leaders)


def _run_group(options: SweepOptions, control: Any, group: Any, ranks: list[int], stop: _StopSignals,
               mlflow_parent: str | None) -> int:
    """Trial after trial on this group until the coordinator has none left; the process's exit status."""
    leader, size = group.Get_rank() == 0, group.Get_size()
    exit_code = 0
    while True:
        if leader:  # the members wait for the leader's word even after a signal: it always comes
            assignment: dict[str, Any] = {"trial": None} if stop.signum else messages.request(
                control, {"op": "next", "ranks": ranks})
            for member in range(1, size):
                group.send(assignment, dest=member, tag=messages.TAG_ASSIGN)
        else:
            assignment = messages.receive(group, 0, messages.TAG_ASSIGN)
        if assignment.get("trial") is None:
            if stop.signum:
                exit_code = exit_code or 128 + stop.signum
            break
        outcome = _run_trial(options, assignment, group, control if leader else None, stop, mlflow_parent)
        if leader:
            outcomes = [outcome] + [messages.receive(group, m, messages.TAG_OUTCOME) for m in range(1, size)]
            messages.request(control, _summary(assignment["trial"], outcomes))
        else:
            group.send(outcome, dest=0, tag=messages.TAG_OUTCOME)
        if outcome.get("interrupted"):
            exit_code = outcome["exit_code"]
            break
    if leader:
        control.send({"op": "bye"}, dest=0, tag=messages.TAG_REQUEST)
    return exit_code


def _run_trial(options: SweepOptions, assignment: dict[str, Any], group: Any, control: Any | None,
               stop: _StopSignals, mlflow_parent: str | None) -> dict:
    """Run the script once as this rank of the trial; how it ended, as a message for the leader."""
    number, directory = assignment["trial"], Path(assignment["dir"])
    directory.mkdir(parents=True, exist_ok=True)
    changes = {**overrides(assignment["params"]), "output_dir": str(directory),
               "checkpoint_dir": str(directory / "checkpoints"), "resume": "auto", "seed": assignment["seed"],
               "progress_bar": False}
    if mlflow_parent is not None:
        from hvdazure.sweep.tracking import tracking_uri

        changes.update(mlflow=True, mlflow_tracking_uri=tracking_uri(options))

    def should_prune(epoch: int, value: float, last: bool) -> bool:
        """Report the epoch's value; after the last epoch there is nothing left to prune."""
        assert control is not None
        reply = messages.request(control, {"op": "report", "trial": number, "step": epoch, "value": value,
                                           "last": last})
        return bool(reply.get("prune")) and not last

    reporter = TrialReporter(options.metric, options.mode, should_prune if control is not None else None)
    context = RunContext(communicator=group, config_overrides=changes, callbacks=[reporter],
                         run_name=directory.name, mlflow_parent_run_id=mlflow_parent)
    log = directory / ("trial.log" if group.Get_rank() == 0 else f"trial.rank{group.Get_rank()}.log")
    outcome: dict[str, Any] = {"error": None, "error_kind": None, "interrupted": False, "exit_code": 0}
    nonfinite: str | None = None  # the trainer stopped every rank on a non-finite loss: the trial diverged
    start = time.time()
    with _output_to(log), active(context), _script_argv(options):
        try:
            stop.in_trial = not stop.signum
            if stop.signum:
                raise TrialInterrupted(stop.signum)
            runpy.run_path(options.script, run_name="__main__")
        except TrialInterrupted as exc:
            outcome.update(interrupted=True, exit_code=128 + exc.signum, error=str(exc))
        except NonFiniteError as exc:
            sys.stderr.write(f"hvdazure: error: {exc}\n")  # into the trial's log, as the script would end
            nonfinite = str(exc)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if code >= 128:  # a stop signal: the trainer saved a checkpoint; the trial resumes on restart
                outcome.update(interrupted=True, exit_code=code, error=f"exit {code} (stop signal)")
            elif code:
                outcome.update(error=f"the script exited with status {code} (see {log})", error_kind="exit")
        except BaseException as exc:
            traceback.print_exc()
            outcome.update(error=exception_line(exc),
                           error_kind="sweep" if isinstance(exc, SweepMetricError)
                           else "horovod" if _is_peer_shutdown(exc) else "error")
            if isinstance(exc, KeyboardInterrupt):
                outcome.update(interrupted=True, exit_code=130)
        finally:
            stop.in_trial = False
            context.shut_down()
            _end_mlflow_run("KILLED" if outcome["interrupted"] else "FAILED" if outcome["error"] else
                            "FINISHED")
    outcome.update(start=start, end=time.time(), ended=reporter.ended, pruned=reporter.pruned,
                   diverged=reporter.diverged, best=reporter.best(), values=reporter.values(),
                   epochs=len(reporter.history))
    if nonfinite is not None:
        outcome.update(diverged=True, divergence=f"diverged: {nonfinite}")
    elif outcome["error"] is None and not reporter.ended:
        outcome.update(error="the script ended without training (no Trainer.fit() ran to its end)",
                       error_kind="error")
    return outcome


def _end_mlflow_run(status: str) -> None:
    """A trial that failed left its MLflow run active in this process (the next trial could not start one)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None and mlflow.active_run() is not None:
        mlflow.end_run(status)


def _summary(number: int, outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial's outcome from its ranks' outcomes: the leader's view, with the first real error (a rank
    released by a peer's failure only says "Horovod has been shut down")."""
    lead = outcomes[0]
    errors = [o for o in outcomes if o["error"]]
    real = [o for o in errors if o["error_kind"] != "horovod"] or errors
    interrupted = any(o["interrupted"] for o in outcomes)
    values = lead["values"]
    message: dict[str, Any] = {"op": "finish", "trial": number, "interrupted": interrupted,
                               "best": lead["best"], "final": values[-1] if values else None,
                               "epochs": lead["epochs"]}
    if interrupted:
        message.update(state=FAILED, error=next((o["error"] for o in outcomes if o["interrupted"]), None))
    elif real:
        message.update(state=FAILED, error=real[0]["error"], error_kind=real[0]["error_kind"])
    elif lead["diverged"] or lead["best"] is None:
        message.update(state=DIVERGED, error=lead.get("divergence") or f"diverged: the loss or the metric "
                                             f"became non-finite after {lead['epochs']} epoch(s)")
    elif lead["pruned"]:
        message.update(state=PRUNED)
    else:
        message.update(state=COMPLETE)
    return message


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (Python's and the libraries' own, at the file descriptors) to
    `path` while a trial runs: concurrent trials would interleave on one console."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


@contextlib.contextmanager
def _script_argv(options: SweepOptions) -> Iterator[None]:
    """The script sees the arguments it would under `hvdazure run`, and its own directory on sys.path."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [options.script, *options.script_args]
    sys.path.insert(0, str(Path(options.script).resolve().parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _share_cores_among_ranks() -> None:
    """Each trial's Horovod sees only its group, so its local size says nothing of the other trials'
    processes on this node: share the node's cores among all of them, before a framework is imported."""
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    share = str(max(1, len(os.sched_getaffinity(0)) // local))
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(name, share)
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(min(2, int(share))))


def _is_peer_shutdown(exc: BaseException) -> bool:
    return "Horovod has been shut down" in str(exc)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
