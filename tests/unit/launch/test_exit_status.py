"""Rank failure lines: written by the rank wrapper, read back by the supervisor to find the root cause."""

import signal

from hvdazure.launch.exit_status import (
    RankFailure,
    exit_code_of,
    exited_line,
    lost_node,
    parse_exited,
    parse_started,
    started_line,
    with_time_since_start,
)
from hvdazure.launch.supervisor import normalize_line


def test_signalled_processes_get_shell_style_exit_codes():
    assert exit_code_of(0) == (0, "")
    assert exit_code_of(3) == (3, "")
    assert exit_code_of(-signal.SIGKILL) == (137, " (killed by SIGKILL)")
    assert exit_code_of(-signal.SIGTERM) == (143, " (killed by SIGTERM)")


def test_a_failure_line_survives_rank_tagging_and_parses_back():
    failure = RankFailure(False, 1795980000.25, 1, 137, " (killed by SIGKILL)")
    assert RankFailure.parse(f"[1]<stderr>:{failure.line()}\n") == failure
    follow_on = RankFailure(True, 1795980000.5, 0, 1)
    assert "(after a peer rank stopped)" in follow_on.line()
    assert RankFailure.parse(follow_on.line()) == follow_on


def test_root_cause_is_the_earliest_failure_that_was_not_caused_by_a_peer():
    peer_caused_earlier = RankFailure(True, 10.0, 0, 1)
    root = RankFailure(False, 10.1, 1, 3)
    later = RankFailure(False, 11.0, 2, 4)
    assert min([peer_caused_earlier, later, root]) == root
    assert min([RankFailure(True, 5.0, 1, 1), RankFailure(True, 4.0, 0, 1)]).rank == 0


def test_ordinary_output_is_not_a_failure():
    assert RankFailure.parse("[0]<stdout>:epoch 1 failed with exit code 3 hmm") is None


def test_mpirun_tags_are_rewritten_like_horovodrun_tags():
    assert normalize_line("[1,0]<stdout>:hello\n") == ("[0]<stdout>:hello\n", False)
    assert normalize_line("[31203,1]<stderr>:oops\n") == ("[1]<stderr>:oops\n", True)
    assert normalize_line("[1]<stderr>:oops\n") == ("[1]<stderr>:oops\n", True)
    assert normalize_line("untagged launcher line\n") == ("untagged launcher line\n", False)


def test_a_line_mpirun_split_between_two_of_its_reads_comes_back_whole():
    """Open MPI tags each 4 KB it reads: a line straddling two reads carries the tag again inside (seen in
    every burst of tracebacks)."""
    split = '[1,1]<stderr>:  File "/venv/lib/x.py", li[1,1]<stderr>:ne 3, in f\n'
    assert normalize_line(split) == ('[1]<stderr>:  File "/venv/lib/x.py", line 3, in f\n', True)


def test_users_read_failure_times_as_seconds_after_the_start_not_epoch_seconds():
    line = f"[1]<stderr>:{RankFailure(False, 1795980012.34, 1, 2).line()}\n"

    assert with_time_since_start(line, started_at=1795980010.0) == (
        "[1]<stderr>:hvdazure: rank 1 failed with exit code 2 (2.3s after start)\n")
    other = "[0]<stdout>:epoch 1 at 1795980012.5\n"
    assert with_time_since_start(other, 0.0) == other


def test_start_and_exit_lines_survive_rank_tagging_and_parse_back():
    assert parse_started(f"[2]<stderr>:{started_line(2, 'node1')}\n") == (2, "node1")
    assert parse_exited(f"[1,3]<stderr>:{exited_line(3, 143)}\n") == 3
    assert parse_started("[0]<stdout>:rank 0 started on a new epoch\n") is None
    assert parse_exited(RankFailure(False, 1.0, 1, 3).line()) is None


def test_a_node_none_of_whose_ranks_said_how_they_ended_is_the_lost_one():
    hosts = {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}

    # rank 1's exit line was lost in the launcher's teardown: node0 is not lost for that
    assert lost_node(hosts, exited={0, 4}, here="node0") == ("node1", [2, 3])
    assert lost_node(hosts, exited={0, 1, 3, 4}, here="node0") is None  # node1 is not silent
    # never the node `hvdazure run` runs on, which is plainly up
    assert lost_node(hosts, exited={2, 4}, here="node0") is None
    assert lost_node(hosts, exited=set(), here="login") == ("node0", [0, 1])  # the lowest, if several
    assert lost_node({}, exited=set(), here="node0") is None
