"""What `hvdazure run` shows of the launcher's output (launch/console.py, launch/supervisor.py): rank 0's
lines as one process prints them, another rank's marked `[rank N] `, each on the stream it was printed on;
rank 0's redraws drawn in place on a terminal, and only their last state elsewhere."""

import io

from hvdazure.launch.console import Console
from hvdazure.launch.supervisor import _Job, normalize_line

CLEAR = "\r\x1b[K"


class Launcher:
    """Stands for the launcher process: its merged output, as chunks the supervisor reads."""

    def __init__(self, *chunks: bytes) -> None:
        self.stdout = io.BufferedReader(io.BytesIO(b"".join(chunks)))  # type: ignore[arg-type]


def _shown(*chunks: bytes, terminal: bool = False) -> tuple[str, str]:
    """(stdout, stderr) of `hvdazure run` for the launcher's output `chunks`."""
    out, err = io.StringIO(), io.StringIO()
    job = _Job()
    job.console = Console(terminal=terminal)
    job.proc = Launcher(*chunks)  # type: ignore[assignment]
    job.pump_output(out, err)
    return out.getvalue(), err.getvalue()


def test_rank_0s_lines_are_untagged_another_ranks_marked_and_each_stream_kept():
    out, err = _shown(b"[0]<stdout>:final: accuracy 0.97\n", b"[1]<stdout>:rank 1 says hi\n",
                      b"[1,0]<stderr>:hvdazure: epoch 1 done\n", b"[1,1]<stderr>:a warning\n")

    assert out == "final: accuracy 0.97\n[rank 1] rank 1 says hi\n"
    assert err == "hvdazure: epoch 1 done\n[rank 1] a warning\n"


def test_a_failure_line_and_a_traceback_of_another_rank_are_marked_with_its_rank():
    _, err = _shown(b"[1]<stderr>:Traceback (most recent call last):\n",
                    b'[1]<stderr>:  File "/work/train.py", line 3, in <module>\n',
                    b"[1]<stderr>:ValueError: bad\n",
                    b"[1]<stderr>:hvdazure: rank 1 failed with exit code 1 at 1795980012.500000\n")

    lines = err.splitlines()
    assert lines[:3] == ["[rank 1] Traceback (most recent call last):",
                         '[rank 1]   File "/work/train.py", line 3, in <module>', "[rank 1] ValueError: bad"]
    assert lines[3].startswith("[rank 1] hvdazure: rank 1 failed with exit code 1 (")


def test_elsewhere_than_on_a_terminal_a_redrawn_line_shows_once_in_its_last_state_without_control_codes():
    # a user's own tqdm bar on rank 0: each redraw starts with \r; the line ends with a newline
    _, err = _shown(b"[0]<stderr>:\r", b"[0]<stderr>: 10%|#   |\r", b"[0]<stderr>: 50%|##  |\r",
                    b"[0]<stderr>:100%|####|\n", b"[0]<stderr>:after\n")

    assert err == "100%|####|\nafter\n"
    assert "\r" not in err and "\x1b" not in err


def test_a_redraw_ended_by_an_empty_line_is_kept_as_it_last_was():
    _, err = _shown(b"[1]<stderr>:step 1\r", b"[1]<stderr>:step 2\r", b"[1]<stderr>:\n")

    assert err == "[rank 1] step 2\n"


def test_on_a_terminal_rank_0s_redraws_are_drawn_in_place_and_other_lines_go_above_them():
    _, err = _shown(b"[0]<stderr>:epoch 1/2  10%\r", b"[0]<stderr>:epoch 1/2  50%\r",
                    b"[1]<stderr>:a warning\n", b"[0]<stderr>:\r", b"[0]<stderr>:hvdazure: epoch 1 done\n",
                    terminal=True)

    assert err == (f"{CLEAR}epoch 1/2  10%{CLEAR}epoch 1/2  50%"  # drawn, then redrawn in place
                   f"{CLEAR}[rank 1] a warning\n{CLEAR}epoch 1/2  50%"  # cleared, the line, drawn again
                   f"{CLEAR}hvdazure: epoch 1 done\n")  # an empty redraw clears it: the epoch's line


def test_mpiruns_one_tag_for_a_chunk_of_redraws_counts_for_each_of_them():
    """mpirun tags what it reads at once, not each segment: two redraws read together carry one tag."""
    _, err = _shown(b"[1,0]<stderr>:step 1\rstep 2\r", b"[1,0]<stderr>:\n")

    assert err == "step 2\n"


def test_a_line_split_across_mpiruns_reads_is_shown_whole():
    out, _ = _shown(b"[1,1]<stdout>:hel", b"[1,1]<stdout>:lo\n")

    assert out == "[rank 1] hello\n"
    assert normalize_line("[1,1]<stdout>:hel[1,1]<stdout>:lo\n") == ("[1]<stdout>:hello\n", False)
