"""The order in which a process takes its problems.

Processes that share a database (several machines, or several `autogen tune` on one) tune the same
list of problems. Taken in the same order, they would all start on the first problem and share
its trials, and each would pay every problem's fixed costs (its GPU worker, warm start and
re-timing) for a share of its trials. Each process starts instead at its own place in the list
and goes round: a problem that another process completed meanwhile is answered from the
database (autogen.search.tuner), one it is still searching is left for later
(autogen.distributed.multi_gpu), and a resumed run still tunes every problem.

Half the processes go round the other way. Two that walk the same way and reach one problem at
the same moment (before either has claimed a variant of it, so neither sees the other) share it,
finish it together and start the next one together again: on two GPUs they shared every problem
after their first meeting (docs/distributed.md). Walking towards each other, after they meet
each finds the problems the other has done.
"""

from __future__ import annotations

import os
import socket
import zlib
from typing import Sequence, TypeVar

T = TypeVar("T")

GOLDEN_SHARE = 0.6180339887  # consecutive multiples mod 1 keep splitting the largest gap


def start_offset(count: int, host: str | None = None, pid: int | None = None) -> int:
    """Where this process starts among ``count`` problems: a hash of the host name plus the
    process id times the golden ratio's share of ``count``. Processes started together on one
    host (consecutive ids) start far apart, the next one in the largest gap left (two of 8
    problems: 5 apart), so each tunes a run of problems before meeting the others' (those done
    are answered from the database, one being searched is shared); hosts are spread by the hash."""
    if count <= 1:
        return 0
    host = socket.gethostname() if host is None else host
    pid = os.getpid() if pid is None else pid
    stride = max(1, round(count * GOLDEN_SHARE))
    return (zlib.crc32(host.encode()) + pid * stride) % count


def walks_backwards(pid: int | None = None) -> bool:
    """Whether this process goes round its list backwards: processes started together on one host
    have consecutive ids, so every other one does."""
    return (os.getpid() if pid is None else pid) % 2 == 1


def in_start_order(items: Sequence[T], offset: int | None = None, backwards: bool | None = None) -> list[T]:
    """``items`` from ``offset`` round (default: this process's start_offset), forwards or
    ``backwards`` (default: walks_backwards())."""
    offset = start_offset(len(items)) if offset is None else offset % max(1, len(items))
    backwards = walks_backwards() if backwards is None else backwards
    rotated = list(items[offset:]) + list(items[:offset])
    return rotated[:1] + rotated[:0:-1] if backwards else rotated
