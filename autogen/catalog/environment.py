"""Whether a stored winner was measured in the environment that runs now.

Every stored winner carries what it was measured with: the driver, CUDA runtime and NVRTC
versions (per trial), the autogen version (per winner) and the hash of the kernel's rendered
source (per trial). A winner is *stale* when any of them differs from the running one:
  * the source hash: the template (or its rendering) changed, so the stored timing is of another
    kernel. The kernel cache is keyed by source, so the old binary is never loaded; the new source
    is validated before it is served;
  * the driver, runtime or NVRTC version: the same source may compile or run differently;
  * the autogen version: the way kernels are built, checked and timed may have changed.
A stale winner is still served, after a validation in the running environment (the dispatcher
keeps that verdict for the process); `autogen list` marks it and `autogen tune ... --refresh`
re-times its best few trials here, which makes it fresh.
"""

from __future__ import annotations

from tuning_db.records import DeviceIdentity, WinnerRecord
from autogen._version import __version__
from autogen.catalog.source_memo import rendered_source_hash
from autogen.errors import AutogenError


def stale_reasons(winner: WinnerRecord, source_hash: str | None, device: DeviceIdentity | None,
                  version: str | None = None) -> tuple[str, ...]:
    """Why `winner` is stale here, one short phrase each; () when it is fresh.

    `source_hash` is the hash of its params rendered by this autogen (None: not checked);
    `device` the running GPU's identity (None: no GPU here, the software stack is not compared);
    `version` this autogen's version (default: autogen.__version__)."""
    if version is None:
        version = __version__
    reasons = []
    stored = winner.trial.source_hash
    if source_hash is not None and stored != source_hash:
        reasons.append("template changed" if stored else "no source hash stored")
    if device is not None:
        before = winner.device
        for label, old, new in (("driver", before.driver_version, device.driver_version),
                                ("runtime", before.runtime_version, device.runtime_version),
                                ("nvrtc", before.nvrtc_version, device.nvrtc_version)):
            if old != new:
                reasons.append(f"{label} {_version_text(old)} -> {_version_text(new)}")
    if winner.autogen_version != version:
        reasons.append(f"autogen {winner.autogen_version or '?'} -> {version}")
    return tuple(reasons)


def _version_text(value) -> str:
    # cudaDriverGetVersion's 13000 reads as 13.0; NVRTC's "13.0" stays as it is.
    if isinstance(value, int) and value >= 1000:
        return f"{value // 1000}.{value % 1000 // 10}"
    return str(value)


def winner_source_hash(family, winner: WinnerRecord) -> str | None:
    """The hash of the winner's params rendered by this autogen; None where they do not render
    (params outside the family's space: the dispatcher skips such a row anyway)."""
    try:
        config = family.space.check(winner.trial.params)
        traits = tuple((t.name, dict(_dims(winner.trial.shape_key)).get(t.name, t.choices[0]))
                       for t in family.traits)
        return rendered_source_hash(family, winner.trial.dtype, config, traits)
    except (AutogenError, ValueError, KeyError):
        return None


def _dims(shape_key: str):
    return [tuple(part.split("=", 1)) for part in shape_key.split(",") if "=" in part]
