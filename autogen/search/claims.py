"""Claims: how workers tuning one problem share its variants. A worker claims a variant in autogen's
claim table (TuningDB.claim) before it compiles it, keeps its claims alive with a Heartbeat, and
takes over the claims of a worker that stopped beating (TakeOver, part of the search loop)."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, TYPE_CHECKING

import optuna

from tuning_db import TuningDB

from autogen.catalog.stored import unusable_reason, usable_trials
from autogen.core.problem import Config
from autogen.core.render import render, source_hash
from autogen.search.lease import MAX_LEASE_S
from autogen.search.studies import PENALTY_US

if TYPE_CHECKING:  # the loop imports this module
    from autogen.search.loop import _Pending

log = logging.getLogger("autogen.search.claims")

# Variants claimed together, in one transaction under the problem's lock (TuningDB.claim_many):
# the loop refills its pipeline once this many places are free in it, so that each claim's lock,
# its wait and its commit are paid once per batch rather than once per variant. The pipeline
# holds this many - 1 variants more than it would otherwise (the GPU never waits on a claim).
CLAIM_BATCH = 3
# Asks per place in a batch before the loop claims what it has (rejected or known points).
ASKS_PER_PLACE = 8
# A worker out of budget reads the other workers' claims in flight again after this long at
# first (TakeOver._drain), then less often while they stay the same.
DRAIN_POLL_S = 0.02


@dataclass(frozen=True)
class Lease:
    """How long a worker's claims survive without a heartbeat; it beats six times per lease.
    A killed worker's variant is taken over at most ``lease_s`` + one poll (``heartbeat_s`` / 2)
    after its last beat."""

    lease_s: float = 60.0

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 6


def new_owner(label: str = "") -> str:
    """A worker's identity in claims: host, process, GPU and a random tag (unique per loop)."""
    host = socket.gethostname()[:48]
    return f"{host}:{os.getpid()}:{label or 'gpu'}:{secrets.token_hex(4)}"[:128]


def body_hash(source: str, kernel_name: str) -> str:
    """The variant a claim holds: its code with the kernel's name and the comments masked."""
    # Two configs that render the same code under different names (and comments) are one variant.
    code = re.sub(r"//[^\n]*", "", source.replace(kernel_name, "KERNEL"))
    return source_hash(code)


class Heartbeat:
    """A thread that extends this worker's claims every ``lease.heartbeat_s`` seconds. A beat
    that fails (the database away for a moment) is retried at the next one; the lease is
    several beats long."""

    def __init__(self, db: TuningDB, owner: str, lease: Lease):
        self.db, self.owner, self.lease = db, owner, lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat {owner}", daemon=True)
        self.beats = 0

    def beat(self) -> None:
        self.db.renew_claims(self.owner, self.lease.lease_s)
        self.beats += 1

    def _run(self) -> None:
        while not self._stop.wait(self.lease.heartbeat_s):
            try:
                self.beat()
            except Exception as exc:  # retried at the next beat
                log.warning("heartbeat of %s failed: %s", self.owner, exc)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class TakeOver:
    """The search loop's (autogen.search.loop.SearchLoop) dealings with workers that died: their
    lapsed claims taken over, their unwritten trials added to the shared study, and the wait for
    the other workers' live claims once asking is done. Uses the loop's problem, claims and study."""

    def _take_over_lapsed(self) -> list[_Pending]:
        """Claims of this problem whose worker stopped beating (or that hold a lease longer than
        any worker may take): taken over and compiled here. Another worker's claim whose params
        are not a point of today's space naming its kernel is released: no one could take it over."""
        taken = []
        for claim in self.db.claims(self.device, self.problem.family, self.problem.dtype, self.problem.shape_key,
                                    self.options.cache_mode, running=True):
            if claim.owner == self.owner:
                continue
            unusable = claim.params is None or unusable_reason(self.family, self.problem.dtype,
                                                                self.problem.traits, claim)
            if not unusable and 0 < claim.expires_in_s <= MAX_LEASE_S:
                continue
            if not unusable:
                config = self.family.space.check(claim.params)
                name = self.family.kernel_name(self.problem.dtype, config, self.problem.traits)
                source = render(self.family, self.problem.dtype, config, traits=self.problem.traits)
                variant = body_hash(source, name)
                unusable = variant != claim.variant  # not the code its params render: never completed
            if unusable:
                if self.db.release_claim(self.device, claim):
                    self.progress(f"released {claim.owner}'s claim of {claim.kernel_name}: it is not a point "
                                  "of today's space rendering the variant claimed")
                continue
            got = self.db.claim(self.device, self._record_base(name, config, source), variant, self.owner,
                                self.lease.lease_s, longest_lease_s=MAX_LEASE_S)
            if got.status != "claimed":
                continue  # another worker was quicker
            self.counts.taken_over += 1
            self.progress(f"taking over {name} from {got.previous} (its lease lapsed)")
            self._repair_study(got.previous)
            entry = self._pending([], config, name, source, variant, taken_over_from=got.previous)
            self.in_flight[name] = entry
            taken.append(entry)
        return taken

    def _repair_study(self, dead: str) -> None:
        """The dead worker's measured variants that never reached the shared study (it writes
        them in the background) are added by the worker that took its claim over."""
        done = {c.kernel_name for c in self.db.claims(self.device, self.problem.family, self.problem.dtype,
                                                      self.problem.shape_key, self.options.cache_mode)
                if c.owner == dead and c.state == "done"}
        trials, _skipped = usable_trials(self.family, self.problem, self.db.trials(
            self.device, self.problem.family, self.problem.dtype, self.problem.shape_key, self.options.cache_mode))
        measured = {t.kernel_name: (self.family.space.complete(t.params), t.time_us if t.status == "ok" else PENALTY_US)
                    for t in trials if t.kernel_name in done}
        if measured:
            self.study.add_missing(measured, {"status": "recovered", "worker": dead})

    def _drain(self, started: float) -> list[_Pending]:
        """Wait while other workers hold live claims of this problem; returns the ones that lapse
        meanwhile, taken over (empty once no claim is left running, or the time limit is up).

        The claims are read again after DRAIN_POLL_S, then less and less often (up to a poll of
        the lease, ``heartbeat_s / 2``) while the same claims stay in flight: a claim in flight
        is usually done within an evaluation, and a worker that slept a whole poll of the lease
        (5 s at the default lease) before re-timing made a second GPU slower than none."""
        poll, seen = DRAIN_POLL_S, None
        while True:
            if self.timed_out(started):  # nothing more is measured, lapsed claims included
                live = [] if self.stop.is_set() else self._live_claims_of_others()
                if live:
                    self.progress(f"the time limit is up: not waiting for {len(live)} variant(s) other workers hold")
                return []
            taken = self._take_over_lapsed()
            if taken:
                return taken
            live = self._live_claims_of_others()
            if not live or self.stop.is_set():
                return []
            held = {(c.owner, c.variant) for c in live}
            poll = DRAIN_POLL_S if held != seen else min(poll * 1.5, self.lease.heartbeat_s / 2)
            seen = held
            wait = min(poll, max(0.05, min(c.expires_in_s for c in live) + 0.05))
            if self.options.timeout_s is not None:  # woken for the time limit, too
                wait = min(wait, max(0.05, self.options.timeout_s - (time.monotonic() - started)))
            time.sleep(wait)

    def _live_claims_of_others(self) -> list:
        return [c for c in self.db.claims(self.device, self.problem.family, self.problem.dtype,
                                          self.problem.shape_key, self.options.cache_mode, running=True)
                if c.owner != self.owner]

    def _abandon(self) -> None:
        """Interrupted: give the claims back at once, so that no one waits for their leases."""
        try:
            self.db.release_claims(self.owner)
        except Exception:
            pass  # the leases lapse anyway


class BatchClaims:
    """The search loop's (autogen.search.loop.SearchLoop) asks turned into claimed variants, a
    batch at a time. Uses the loop's sampler, problem, budget and counts."""

    def _next_batch(self, room: int, may_ask: Callable[[], bool]) -> list[_Pending]:
        """Up to ``room`` variants to measure: asked one by one, claimed together (claim_many).
        Two asks of one variant (the same point, or points rendering the same code) are measured
        once and told the same value."""
        wanted: dict[str, tuple[list, Config, str, str]] = {}  # variant -> (trials, config, name, source)
        asks = 0
        while len(wanted) < room and asks < ASKS_PER_PLACE * room and may_ask():
            asks += 1
            with self._timed("ask"):
                trial = self._ask()
            if trial is None:
                break
            with self._timed("prepare"):  # check, render, compare with what is measured
                outcome = self._classify(trial)
                if outcome is None:
                    self.idle_asks += 1
                    continue
                config, name, source = outcome
                variant = body_hash(source, name)
            if variant in wanted:
                wanted[variant][0].append(trial)
                continue
            wanted[variant] = ([trial], config, name, source)
        if not wanted:
            return []
        with self._timed("claim"):
            answers = self.db.claim_many(self.device, [(self._record_base(name, config, source), variant)
                                                       for variant, (_trials, config, name, source) in wanted.items()],
                                         self.owner, self.lease.lease_s, budget=self.options.trials)
        claimed = [self._claimed(answer, variant, *item) for (variant, item), answer in zip(wanted.items(), answers)]
        return [entry for entry in claimed if entry is not None]

    def _claimed(self, claim, variant: str, trials: list, config: Config, name: str, source: str) -> _Pending | None:
        """The variant to measure where ``claim`` won it; otherwise its asked trials told."""
        if claim.status == "claimed":
            self.idle_asks = 0
            return self._pending(trials, config, name, source, variant)
        self.idle_asks += 1
        if claim.status == "done":  # another worker (or an earlier run) measured it
            known = self.db.find_trial(self.device, self.problem.family, self.problem.dtype, self.problem.shape_key,
                                       claim.kernel_name, self.options.cache_mode)
            if known is not None and not unusable_reason(self.family, self.problem.dtype, self.problem.traits, known):
                self.stored[name] = known
                self.counts.reused += 1
                for trial in trials:
                    self.local.tell(trial, known.time_us if known.status == "ok" else PENALTY_US)
                return None
        elif claim.status == "budget":
            self.budget_reached = True
        # Taken (another worker holds it: its shared trial stands for it), or past the budget:
        # not a measurement; FAIL keeps it out of the sampler's model.
        for trial in trials:
            self.local.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None
