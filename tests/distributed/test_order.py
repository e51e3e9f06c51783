"""The order in which a process takes its problems (autogen.distributed.order)."""

from __future__ import annotations

from autogen.distributed.order import in_start_order, start_offset, walks_backwards


def test_processes_started_together_start_apart():
    # Consecutive process ids on one host (a shell loop, srun's tasks): two of 8 problems start
    # 5 apart, and 8 processes start on 8 different problems.
    first, second = (start_offset(8, "gpu01", pid) for pid in (4100, 4101))
    assert (second - first) % 8 in (3, 5)
    assert len({start_offset(8, "gpu01", pid) for pid in range(4100, 4108)}) == 8


def test_every_problem_is_taken_once_from_the_start():
    problems = list("abcdefgh")
    assert in_start_order(problems, 3, backwards=False) == list("defghabc")
    assert in_start_order(problems, 3, backwards=True) == list("dcbahgfe")
    assert sorted(in_start_order(problems)) == problems  # this process's own offset and direction
    assert in_start_order(["only"]) == ["only"] and start_offset(1) == 0 and in_start_order([]) == []


def _shared_problems(orders: list[list[str]]) -> int:
    """Processes that take the next problem of their order each step, every problem taking one
    step: one started in an earlier step is done (answered from the database at once), one that
    several take in the same step is shared (neither has claimed a variant of it yet). How many
    problems were shared."""
    queues = [list(order) for order in orders]
    started, shared = set(), 0
    while True:
        picks = []
        for queue in queues:
            while queue and queue[0] in started:
                queue.pop(0)
            if queue:
                picks.append(queue.pop(0))
        if not picks:
            return shared
        shared += len(picks) - len(set(picks))
        started |= set(picks)


def test_two_processes_started_together_walk_towards_each_other():
    # Walking the same way, two processes that meet start every later problem together; walking
    # towards each other, after they meet each comes to problems the other has done.
    problems = list("abcdefgh")
    pids = (4100, 4101)
    assert walks_backwards(pids[0]) != walks_backwards(pids[1])
    offsets = [start_offset(8, "gpu01", pid) for pid in pids]
    towards = [in_start_order(problems, o, walks_backwards(pid)) for o, pid in zip(offsets, pids)]
    same_way = [in_start_order(problems, o, False) for o in offsets]
    assert _shared_problems(towards) == 0 and _shared_problems(same_way) >= 2
