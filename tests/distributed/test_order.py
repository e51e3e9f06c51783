"""The order in which a process takes its problems (autogen.distributed.order)."""

from __future__ import annotations

from autogen.distributed.order import in_start_order, start_offset


def test_processes_started_together_start_apart():
    # Consecutive process ids on one host (a shell loop, srun's tasks): two of 8 problems start
    # 5 apart, and 8 processes start on 8 different problems.
    first, second = (start_offset(8, "gpu01", pid) for pid in (4100, 4101))
    assert (second - first) % 8 in (3, 5)
    assert len({start_offset(8, "gpu01", pid) for pid in range(4100, 4108)}) == 8


def test_every_problem_is_taken_once_from_the_start():
    problems = list("abcdefgh")
    assert in_start_order(problems, 3) == list("defghabc")
    assert sorted(in_start_order(problems)) == problems  # this process's own offset
    assert in_start_order(["only"]) == ["only"] and start_offset(1) == 0 and in_start_order([]) == []
