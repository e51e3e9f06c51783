"""The order in which a process takes its problems.

Processes that share a database (several machines, or several `autogen tune` on one) tune the same
list of problems. Taken in the same order, they would all start on the first problem and share
its trials, and each would pay every problem's fixed costs (its GPU worker, warm start and
re-timing) for a share of its trials. Each process starts instead at its own place in the list
and goes round: a problem that another process completed meanwhile is answered from the
database (autogen.search.tuner), one it is still searching is joined (the claims keep the budget
exact and no variant measured twice), and a resumed run still tunes every problem.
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


def in_start_order(items: Sequence[T], offset: int | None = None) -> list[T]:
    """``items`` rotated to start at ``offset`` (default: this process's start_offset)."""
    offset = start_offset(len(items)) if offset is None else offset % max(1, len(items))
    return list(items[offset:]) + list(items[:offset])
