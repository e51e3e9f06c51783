"""The lease a tuning worker holds on a variant it measures (--lease), shared by the search loop
and the command line's checks."""

from __future__ import annotations

from autogen.errors import UsageError

# The longest lease a worker may take (--lease): a worker killed holding a claim delays the
# others by at most this. A claim read with more time left than this was not written by a
# worker keeping to it, and is taken over like a lapsed one (autogen.search.claims).
MAX_LEASE_S = 3600.0


def check_lease(lease_s: float) -> None:
    """--lease: at least 2 s (a worker beats six times a lease), at most MAX_LEASE_S."""
    if not 2 <= lease_s <= MAX_LEASE_S:  # NaN fails too
        raise UsageError(f"--lease must be between 2 and {MAX_LEASE_S:g} seconds, got {lease_s:g}")
