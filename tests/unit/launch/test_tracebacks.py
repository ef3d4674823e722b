"""launch/tracebacks.py: a traceback is shown whole, and an error on several ranks once, not once per rank."""

import sysconfig
from pathlib import Path

import pytest

import hvdazure
from hvdazure.launch.tracebacks import HOLD_S, Tracebacks, is_library_file

SITE = sysconfig.get_paths()["purelib"]
HVDAZURE = str(Path(hvdazure.__file__).parent)


def traceback(error: str, *, user_frame: str = 'File "/home/me/train.py", line 12, in training_step',
              user_code: str = "return self.model(x)") -> list[str]:
    """What Python prints for an exception raised in a library called from the user's training_step."""
    return ["Traceback (most recent call last):",
            '  File "/home/me/train.py", line 30, in <module>',
            "    trainer.fit()",
            f'  File "{HVDAZURE}/core/trainer.py", line 137, in fit',
            "    self._train_epoch()",
            f"  {user_frame}",
            f"    {user_code}",
            "           ^^^^^^^^^^^^^",
            f'  File "{SITE}/torch/nn/modules/module.py", line 1775, in _call_impl',
            "    return forward_call(*args, **kwargs)",
            *error.splitlines()]


def tag(rank: int) -> str:
    return f"[{rank}]<stderr>:"


def feed(tracebacks: Tracebacks, rank: int, lines: list[str], now: float = 0.0) -> list[str]:
    return [shown for text in lines for shown in tracebacks.stderr_line(rank, tag(rank), text + "\n", now)]


def tagged(rank: int, lines: list[str]) -> list[str]:
    return [f"{tag(rank)}{text}\n" for text in lines]


def test_the_same_error_on_two_ranks_interleaved_line_by_line_is_shown_once_and_whole():
    tracebacks, shown = Tracebacks(), []
    lines = traceback("ValueError: invalid literal for int() with base 10: 'x'")
    for text in lines:  # as the launcher interleaves them
        shown += feed(tracebacks, 1, [text]) + feed(tracebacks, 0, [text])
    assert shown == []  # held until complete
    shown += tracebacks.rank_ended(1) + tracebacks.rank_ended(0)

    assert shown == tagged(1, lines)
    assert tracebacks.same_error_as(1) == [0] and tracebacks.same_error_as(0) == [1]
    assert tracebacks.shown_by(0) == 1
    assert tracebacks.not_in_full == 1


def test_other_output_streams_at_once_while_a_traceback_is_held():
    tracebacks = Tracebacks()
    feed(tracebacks, 1, traceback("ValueError: bad")[:4])

    assert feed(tracebacks, 0, ["hvdazure: epoch 1 step 10/40 loss 0.5"]) == tagged(
        0, ["hvdazure: epoch 1 step 10/40 loss 0.5"])
    assert feed(tracebacks, 2, ["a warning"]) == tagged(2, ["a warning"])


def test_a_different_error_on_another_rank_is_shown_abridged_to_the_users_frame_and_the_error():
    tracebacks = Tracebacks()
    feed(tracebacks, 1, traceback("ValueError: rank 1 dislikes its shard"))
    first = tracebacks.rank_ended(1)
    feed(tracebacks, 0, traceback("KeyError: 'label'", user_frame='File "/home/me/train.py", line 20, in '
                                  "validation_step", user_code='y = batch["label"]'))
    second = tracebacks.rank_ended(0)

    assert first == tagged(1, traceback("ValueError: rank 1 dislikes its shard"))
    assert second == tagged(0, ["Traceback (most recent call last; 3 of 4 frames not shown):",
                                '  File "/home/me/train.py", line 20, in validation_step',
                                '    y = batch["label"]',
                                "           ^^^^^^^^^^^^^",
                                "KeyError: 'label'"])
    assert tracebacks.same_error_as(1) == []
    assert tracebacks.not_in_full == 1


def test_a_follow_on_error_is_abridged_even_when_it_comes_first():
    """Horovod's "has been shut down" on a peer says nothing of the cause; the cause's rank says it."""
    tracebacks = Tracebacks()
    feed(tracebacks, 0, traceback("horovod.common.exceptions.HorovodInternalError: Horovod has been shut "
                                  "down. This was caused by an exception on one of the ranks"))
    shown = tracebacks.rank_ended(0)

    assert shown[0] == f"{tag(0)}Traceback (most recent call last; 3 of 4 frames not shown):\n"
    assert len(shown) == 5 and "HorovodInternalError" in shown[-1]


def test_without_a_frame_of_the_users_the_last_frame_is_kept():
    lines = ["Traceback (most recent call last):",
             f'  File "{SITE}/a.py", line 1, in f',
             "    g()",
             f'  File "{SITE}/b.py", line 2, in g',
             "    raise OSError(5)",
             "OSError: 5"]
    tracebacks = Tracebacks()
    feed(tracebacks, 1, traceback("ValueError: first"))
    tracebacks.rank_ended(1)
    feed(tracebacks, 0, lines)

    assert tracebacks.rank_ended(0) == tagged(
        0, ["Traceback (most recent call last; 1 of 2 frames not shown):", *lines[3:]])


def test_a_multi_line_error_is_compared_whole_and_log_lines_after_it_do_not_count():
    """TensorFlow's errors all start `TypeError: in user code:`; its C++ logs a line as a rank exits."""
    tf_error = "TypeError: in user code:\n\n    File \"/home/me/train.py\", line 9, in training_step  *\n" \
               "    TypeError: training_step must return a loss, got {}"
    tracebacks = Tracebacks()
    feed(tracebacks, 0, traceback(tf_error.format("NoneType")))
    feed(tracebacks, 1, [*traceback(tf_error.format("NoneType")),
                         "I0000 00:00:1796226954.846019    7565 gloo_context.cc:90] shutting down"])
    feed(tracebacks, 2, traceback(tf_error.format("str")))
    for rank in (0, 1, 2):
        tracebacks.rank_ended(rank)

    assert tracebacks.same_error_as(0) == [1]


def test_a_chained_exception_compares_and_abridges_by_its_last_error():
    chain = [*traceback("KeyError: 'w'"), "", "The above exception was the direct cause of the following "
             "exception:", "", *traceback("RuntimeError: cannot load the checkpoint")]
    tracebacks = Tracebacks()
    feed(tracebacks, 0, traceback("ValueError: something else"))
    tracebacks.rank_ended(0)
    feed(tracebacks, 1, chain)
    shown = tracebacks.rank_ended(1)

    assert tracebacks.errors[1] == "RuntimeError: cannot load the checkpoint"
    assert shown[0] == f"{tag(1)}Traceback (most recent call last; 7 of 8 frames not shown):\n"
    assert shown[-1] == f"{tag(1)}RuntimeError: cannot load the checkpoint\n"


def test_a_traceback_of_a_rank_that_goes_on_is_shown_once_its_lines_stop():
    tracebacks = Tracebacks()
    lines = traceback("ConnectionError: the tracking server is down")
    feed(tracebacks, 0, lines, now=100.0)

    assert tracebacks.stale(now=100.0 + HOLD_S / 2) == []
    assert tracebacks.stale(now=100.0 + HOLD_S) == tagged(0, lines)
    assert feed(tracebacks, 0, ["hvdazure: epoch 2 step 10/40"], now=101.0 + HOLD_S) == tagged(
        0, ["hvdazure: epoch 2 step 10/40"])


def test_a_line_after_a_complete_traceback_is_not_taken_into_it():
    """A progress line that follows an error logged HOLD_S earlier is not part of that error."""
    tracebacks = Tracebacks()
    lines = traceback("ConnectionError: the tracking server is down")
    feed(tracebacks, 0, lines, now=100.0)

    assert feed(tracebacks, 0, ["hvdazure: epoch 2 step 10/40"], now=100.0 + HOLD_S) == [
        *tagged(0, lines), *tagged(0, ["hvdazure: epoch 2 step 10/40"])]


def test_the_same_rank_repeating_a_traceback_shows_it_each_time():
    tracebacks = Tracebacks()
    lines = traceback("ConnectionError: the tracking server is down")
    shown = []
    for _ in range(2):
        feed(tracebacks, 0, lines)
        shown += tracebacks.rank_ended(0)

    assert shown == tagged(0, lines) * 2 and tracebacks.not_in_full == 0


def test_verbose_shows_every_traceback_in_full_and_still_knows_the_same_errors():
    tracebacks = Tracebacks(verbose=True)
    lines = traceback("ValueError: bad")
    for rank in (0, 1):
        feed(tracebacks, rank, lines)
    shown = tracebacks.rank_ended(0) + tracebacks.rank_ended(1)

    assert shown == tagged(0, lines) + tagged(1, lines)
    assert tracebacks.same_error_as(0) == [1] and tracebacks.not_in_full == 0


def test_when_the_output_ends_every_held_traceback_is_shown():
    tracebacks = Tracebacks()
    feed(tracebacks, 1, traceback("ValueError: bad")[:5])  # killed mid-traceback

    assert tracebacks.release_all() == tagged(1, traceback("ValueError: bad")[:5])


@pytest.mark.parametrize(("path", "library"), [
    ("/home/me/train.py", False), ("/tmp/x/train.py", False), (f"{SITE}/torch/nn/modules/module.py", True),
    (f"{HVDAZURE}/core/trainer.py", True), (sysconfig.get_paths()["stdlib"] + "/runpy.py", True),
    ("/usr/lib/python3/dist-packages/numpy/core.py", True), ("<frozen runpy>", True),
    ("/tmp/__autograph_generated_filet4u59uwt.py", True),
])
def test_the_users_frames_are_those_outside_python_installed_packages_and_hvdazure(path, library):
    assert is_library_file(path) is library


def test_a_traceback_that_never_ends_is_shown_rather_than_held_without_bound():
    tracebacks = Tracebacks()
    lines = ["Traceback (most recent call last):", *[f"  line {i}" for i in range(6000)]]

    assert len(feed(tracebacks, 0, lines, now=0.0)) >= 5000
