"""Plain value objects that cross the storage boundary.

The rest of autogen never sees ORM rows: the repository turns rows into these frozen records, so a
session closing cannot invalidate what a caller holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceIdentity:
    """Everything about a GPU and its software stack that changes a binary or its speed."""

    name: str
    compute_capability: str  # "9.0"
    sm_count: int
    l2_bytes: int
    driver_version: int  # as cudaDriverGetVersion reports it, e.g. 13000
    runtime_version: int  # cudaRuntimeGetVersion
    nvrtc_version: str  # "13.0"

    @property
    def arch(self) -> str:
        return "sm_" + self.compute_capability.replace(".", "")


@dataclass(frozen=True)
class TrialRecord:
    """One measured (or failed, or rejected) variant of one problem on one device."""

    family: str
    dtype: str
    shape_key: str  # canonical "m=16384,n=16"
    kernel_name: str  # procedural name, unique per config within a family
    params: dict = field(hash=False)  # parameter name -> value, as the family's space defines
    status: str  # "ok" | "failed" | "rejected"
    reason: str = ""  # why failed/rejected; empty when ok
    time_us: float | None = None  # median GPU time per launch
    samples_us: tuple[float, ...] = ()  # every timed replay, per launch
    spread_us: float | None = None  # (max - min) of the samples
    error: float | None = None  # relative L2 error against float64
    source_hash: str = ""  # sha256 of the rendered source
    compile_options: str = ""  # the exact options given to NVRTC
    cache_mode: str = "cold"  # "cold" | "hot"
    created_at: str = ""  # ISO-8601 UTC, set by the repository


@dataclass(frozen=True)
class WinnerRecord:
    """The served kernel for (device, family, dtype, shape) and how it compares with the peer."""

    device: DeviceIdentity
    trial: TrialRecord
    peer_name: str = ""  # e.g. "cuBLAS sgemv"; empty when no peer was available
    peer_time_us: float | None = None
    margin: float | None = None  # relative gap to the runner-up at selection time
    autogen_version: str = ""
    updated_at: str = ""


@dataclass(frozen=True)
class ValidationRecord:
    """A kernel checked once on a shape it was not tuned for (the dispatcher's nearest-shape step)."""

    family: str
    dtype: str
    shape_key: str
    kernel_name: str
    source_hash: str
    passed: bool
    error: float | None = None
    reason: str = ""
    created_at: str = ""


@dataclass(frozen=True)
class InvalidRow:
    """A stored row that cannot become a record (tampered, or written by something else).

    Readers skip it and report it; the stored values are kept as found (they may be of any type),
    so messages show them with repr.
    """

    table: str  # "autogen_winners", "autogen_trials", ...
    row_id: object
    reason: str  # one line: what is wrong with it
    gpu: object = None
    family: object = None
    dtype: object = None
    shape_key: object = None
    cache_mode: object = None

    def describe(self) -> str:
        """One line naming the row: table and id, then the problem as stored."""
        parts = [f"{name} {value!r}" for name, value in (
            ("GPU", self.gpu), ("family", self.family), ("dtype", self.dtype),
            ("shape", self.shape_key), ("cache", self.cache_mode)) if value is not None]
        return f"{self.table} row {self.row_id!r} ({', '.join(parts)}): {self.reason}"

    def __str__(self) -> str:
        return self.describe()


def one_per_problem(winners: "list[WinnerRecord] | tuple[WinnerRecord, ...]") -> list[WinnerRecord]:
    """One winner per (GPU, family, dtype, shape): the cold-cache one where both are stored (cold
    is how weights are read in inference), else the hot one. Keeps the order of ``winners``."""
    chosen: dict[tuple, WinnerRecord] = {}
    for winner in winners:
        key = (winner.device.name, winner.device.compute_capability, winner.trial.family,
               winner.trial.dtype, winner.trial.shape_key)
        if key not in chosen or (chosen[key].trial.cache_mode != "cold" and winner.trial.cache_mode == "cold"):
            chosen[key] = winner
    keep = {id(w) for w in chosen.values()}
    return [w for w in winners if id(w) in keep]


def most_tuned_gpu(winners: "list[WinnerRecord] | tuple[WinnerRecord, ...]") -> tuple[list[WinnerRecord], list[tuple[str, int]]]:
    """Where the winners of several GPUs answer one request (`--arch sm_90` with an H100 and an
    H200 stored), the stated rule: the GPU holding the most of them, ties to the name that sorts
    first. Returns that GPU's winners (in order) and the GPUs passed over as (name, count)."""
    counts: dict[tuple[str, str], int] = {}
    for winner in winners:
        key = (winner.device.name, winner.device.compute_capability)
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts, key=lambda key: (-counts[key], key))
    chosen = ranked[0] if ranked else None
    kept = [w for w in winners if (w.device.name, w.device.compute_capability) == chosen]
    return kept, [(name, counts[(name, cc)]) for name, cc in ranked[1:]]


@dataclass(frozen=True)
class ClaimRecord:
    """A variant claimed by a worker sharing the database (see TuningDB.claim)."""

    family: str
    dtype: str
    shape_key: str
    cache_mode: str
    variant: str  # hash of the variant's code with its name masked
    kernel_name: str
    params: dict | None = field(hash=False)  # None: stored as something else than a JSON object
    owner: str = ""
    state: str = "running"  # "running" | "done"
    expires_in_s: float = 0.0  # seconds left on the lease when read (negative: lapsed)
    attempts: int = 1  # 1 + take-overs


@dataclass(frozen=True)
class Claim:
    """The answer to TuningDB.claim: ``status`` is
    "claimed" (yours to measure; ``taken_over`` when a lapsed lease was taken from ``previous``),
    "done" (measured already, as ``kernel_name``), "taken" (another worker holds a live lease),
    or "budget" (the problem's trial budget is used up by stored trials and live claims)."""

    status: str
    kernel_name: str = ""
    taken_over: bool = False
    previous: str = ""  # the owner whose lapsed lease was taken over
