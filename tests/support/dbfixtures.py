"""Records for tests that need a populated tuning database (no GPU involved)."""

from __future__ import annotations

from tuning_db import TuningDB
from tuning_db.records import DeviceIdentity, TrialRecord

from autogen.core.registry import get_family
from autogen.core.render import render, source_hash

H100 = DeviceIdentity("NVIDIA H100 80GB HBM3", "9.0", 132, 52428800, 13000, 13000, "13.0")
H100_PCIE = DeviceIdentity("NVIDIA H100 PCIe", "9.0", 114, 52428800, 13000, 13000, "13.0")
A100 = DeviceIdentity("NVIDIA A100-SXM4-80GB", "8.0", 108, 41943040, 12040, 12040, "12.4")


def store_winner(db: TuningDB, device: DeviceIdentity, m: int, n: int, time_us: float = 5.0,
                 params: dict | None = None, peer_time_us: float | None = 7.5):
    family = get_family("sgemv")
    config = family.space.check(params or family.default_params)
    trial = TrialRecord(family="sgemv", dtype="float32", shape_key=f"m={m},n={n}",
                        kernel_name=family.kernel_name("float32", config), params=config.as_dict(),
                        status="ok", time_us=time_us, samples_us=(time_us, time_us * 1.01),
                        spread_us=time_us * 0.01, error=1e-7,
                        source_hash=source_hash(render(family, "float32", config)),
                        compile_options=f"-std=c++17 --gpu-architecture={device.arch}")
    stored = db.record_trial(device, trial)
    return db.set_winner(device, stored, peer_name="cuBLAS sgemv", peer_time_us=peer_time_us,
                         margin=0.02, autogen_version="0.1.0")
