"""`autogen export` without a GPU: what is written, that it builds with plain nvcc/g++/make/cmake
for sm_80 and sm_90 with warnings as errors, that the C dispatch follows the Python rule, and that
nothing unchecked from the database reaches the files."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autogen.core.problem import shape_distance
from autogen.cli import commands as commands_module
from autogen.cli import options as options_module
from autogen.export import writer as export_module
from autogen.cli.main import main
from autogen.export.writer import nearest_index
from autogen.core import registry as family_registry
from autogen.core.registry import all_families, get_family
from autogen.core.family import Family
from autogen.core.space import Param, Space
from conftest import gpu_unavailable_reason
from nvcc_tools import ARCHS, nvcc_or_skip
from tuning_db import DeviceIdentity, TrialRecord, TuningDB

H100 = DeviceIdentity("NVIDIA H100 80GB HBM3", "9.0", 132, 52428800, 13000, 13000, "13.0")
A100 = DeviceIdentity("NVIDIA A100-SXM4-40GB", "8.0", 108, 41943040, 12040, 12040, "12.4")
WERROR = ["-Werror", "all-warnings", "-Xcompiler", "-Wall,-Wextra,-Werror"]

SMALL_ROWS = {"threads_per_row": 4, "vector_width": 4, "warps_per_block": 4, "rows_per_group": 1, "unroll": 1,
              "x_path": "ldg", "reduce": "shfl"}
MEDIUM_ROWS = {"threads_per_row": 8, "vector_width": 2, "warps_per_block": 2, "rows_per_group": 2, "unroll": 2,
               "x_path": "smem", "reduce": "shfl"}
LONG_ROWS = {"threads_per_row": 128, "vector_width": 4, "warps_per_block": 4, "rows_per_group": 1, "unroll": 2,
             "x_path": "ldg", "reduce": "smem"}
# shape -> (params, time_us, peer_time_us). 512x16 and 1000x37 share a variant. 1024x16 lies
# exactly between 512x16 and 2048x16: the Python dispatcher breaks that tie by the smaller shape
# key, "m=2048,n=16" (numeric order would pick 512x16).
SGEMV_WINNERS = {
    (512, 16): (SMALL_ROWS, 2.5, 3.25),
    (1000, 37): (SMALL_ROWS, 2.75, 3.5),
    (2048, 16): (MEDIUM_ROWS, 3.0, 4.5),
    (4096, 4096): (LONG_ROWS, 24.0, 28.0),
}
TIE, TIED_WINNER, TIED_LOSER = (1024, 16), (2048, 16), (512, 16)


# -- building databases and exports ---------------------------------------------------------------


def store_winner(db: TuningDB, device: DeviceIdentity, family: str, dims: dict, params: dict, time_us: float,
                 peer_time_us: float | None = None, dtype: str = "float32", shape_key: str | None = None,
                 kernel_name: str | None = None) -> None:
    """An ok trial made the winner, with whatever params and keys the test wants stored; named
    as its params name it where they are a point of the family's space."""
    key = shape_key or ",".join(f"{k}={v}" for k, v in dims.items())
    kernel_name = kernel_name or _procedural_name(family, dtype, key, params) or f"k{len(key)}_{time_us}"
    trial = TrialRecord(family=family, dtype=dtype, shape_key=key, kernel_name=kernel_name,
                        params=params, status="ok", time_us=time_us, samples_us=(time_us,), spread_us=0.01,
                        error=1e-7, source_hash="0" * 64, compile_options="--gpu-architecture=" + device.arch)
    db.record_trial(device, trial)
    db.set_winner(device, trial, peer_name="cuBLAS sgemv" if peer_time_us else "", peer_time_us=peer_time_us,
                  margin=0.05, autogen_version="0.1.0")


def _procedural_name(family: str, dtype: str, key: str, params: dict) -> str | None:
    from autogen.errors import AutogenError
    from autogen.core.problem import problem_of_record

    fam, problem = get_family(family), problem_of_record(family, dtype, key)
    try:
        return fam.kernel_name(dtype, fam.space.check(params), problem.traits if problem else ())
    except (AutogenError, KeyError):
        return None


def sgemv_db(url: str, devices=(H100,)) -> str:
    with TuningDB(url) as db:
        for device in devices:
            for (m, n), (params, time_us, peer) in SGEMV_WINNERS.items():
                store_winner(db, device, "sgemv", {"m": m, "n": n}, params, time_us, peer)
    return url


def run_export(*args: str) -> int:
    return main(["export", *args])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """One sgemv export with the self-test, shared by the build tests."""
    root = tmp_path_factory.mktemp("export")
    url = sgemv_db(f"sqlite:///{root / 'tuning.db'}")
    out = root / "autogen_sgemv"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    return out


# -- compiling --------------------------------------------------------------------------------------


def run(command: list[str], cwd: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return done


def cuda_dirs() -> tuple[str, str]:
    """The CUDA include and library folders, as nvcc itself reports them (for g++)."""
    report = subprocess.run([nvcc_or_skip(), "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"],
                            capture_output=True, text=True).stderr
    include = re.search(r'INCLUDES="-I([^"]+)"', report)
    libraries = re.findall(r'"-L([^"]+)"', report)
    assert include and libraries, f"cannot find the CUDA folders in nvcc --dryrun:\n{report}"
    return include[1], [lib for lib in libraries if not lib.rstrip("/").endswith("stubs")][0]


def export_winners(root: Path, winners: list[tuple[str, str, dict, dict]]) -> dict[str, Path]:
    """family -> its export folder (with the self-test) under root, from one database holding the
    made-up winners (family, dtype, dims, params); a family and dtype's i-th winner timed 2 + i us."""
    url = f"sqlite:///{root / 'tuning.db'}"
    counts: dict = {}
    with TuningDB(url) as db:
        for family, dtype, dims, params in winners:
            i = counts[family, dtype] = counts.get((family, dtype), -1) + 1
            store_winner(db, H100, family, dims, params, 2.0 + i, 3.0 + i, dtype=dtype)
    outs = {}
    for family in dict.fromkeys(family for family, *_ in winners):
        outs[family] = root / f"autogen_{family}"
        assert run_export(family, "--out", str(outs[family]), "--gpu", H100.name, "--db", url, "--self-test") == 0
    return outs


def build_libraries(exports: dict[str, Path], arch: str, workdir: Path) -> dict[str, Path]:
    """family -> the static library of its exported kernels (build_library)."""
    return {family: build_library(out / f"autogen_{family}.cu", arch, workdir) for family, out in exports.items()}


def build_library(source: Path, arch: str, workdir: Path) -> Path:
    """nvcc -c with warnings as errors, then a static library, as the exported Makefile does."""
    obj = workdir / f"{source.stem}_{arch}.o"
    run([nvcc_or_skip(), f"-arch={arch}", "-std=c++17", "-O3", *WERROR, "-Xcompiler", "-fPIC", "-c", str(source),
         "-o", str(obj)])
    library = workdir / f"lib{source.stem}_{arch}.a"
    run(["ar", "rcs", str(library), str(obj)])
    return library


CALLER = r"""
#include "autogen_sgemv.h"
#include <cstdio>

int main()
{
    float *A = nullptr, *x = nullptr, *y = nullptr;
    const int m = 4096, n = 16;
    if (cudaMalloc(&A, sizeof(float) * m * n) != cudaSuccess || cudaMalloc(&x, sizeof(float) * n) != cudaSuccess
        || cudaMalloc(&y, sizeof(float) * m) != cudaSuccess)
        return 2;
    const cudaError_t error = autogen_sgemv(A, x, y, m, n, 1.0f, 0.0f, 0);
    std::printf("%s ran %s\n", cudaGetErrorString(error), autogen_sgemv_variant(m, n));
    return error == cudaSuccess ? 0 : 1;
}
"""

# Prints the variant the entry point picks for each "m n" pair on stdin: host code only, so it
# runs without a GPU.
DISPATCH_PROBE = r"""
#include "{header}"
#include <cstdio>

int main()
{{
    long long dims[{count}];
    while (true) {{
        for (int d = 0; d < {count}; ++d)
            if (std::scanf("%lld", &dims[d]) != 1) return 0;
        const char* name = {symbol}_variant({args});
        std::printf("%s\n", name ? name : "(null)");
    }}
}}
"""


def dispatch_probe(out: Path, header: str, symbol: str, dims: int, library: Path, workdir: Path) -> Path:
    probe = workdir / f"probe_{symbol}.cpp"
    args = ", ".join(f"(int)dims[{d}]" for d in range(dims))
    probe.write_text(DISPATCH_PROBE.format(header=header, count=dims, symbol=symbol, args=args))
    binary = workdir / f"probe_{symbol}"
    run([nvcc_or_skip(), "-std=c++17", *WERROR, f"-I{out}", str(probe), str(library), "-o", str(binary)])
    return binary


def probe_variants(binary: Path, shapes: list[tuple[int, ...]]) -> list[str]:
    text = "\n".join(" ".join(map(str, shape)) for shape in shapes) + "\n"
    return run([str(binary)], input=text).stdout.split()


# -- what is written --------------------------------------------------------------------------------


def test_export_writes_fixed_files_and_each_variant_once(exported):
    names = sorted(p.name for p in exported.iterdir())
    assert names == [export_module.MANIFEST, "CMakeLists.txt", "Makefile", "autogen_sgemv.cu", "autogen_sgemv.h",
                     "autogen_sgemv_selftest.cu", "autogen_sgemv_selftest.data"]
    source = (exported / "autogen_sgemv.cu").read_text()
    family = get_family("sgemv")
    kernels = {family.kernel_name("float32", family.space.check(p)) for p, _, _ in SGEMV_WINNERS.values()}
    assert len(kernels) == 3 < len(SGEMV_WINNERS)  # the test stores a shared variant
    assert len(re.findall(r'extern "C" __global__', source)) == len(kernels)
    for name in kernels:
        assert len(re.findall(rf"^{name}\(", source, re.M)) == 1, name
        assert len(re.findall(rf'extern "C" cudaError_t {name}_launch\(', source)) == 1, name
    assert 'extern "C" cudaError_t autogen_sgemv(const float* A, const float* x, float* y, int m, int n, ' \
           "float alpha, float beta, cudaStream_t stream)" in source


def test_dispatch_table_lists_the_tuned_shapes_in_order(exported):
    source = (exported / "autogen_sgemv.cu").read_text()
    table = re.search(r"static const int autogen_sgemv_shapes\[(\d+)\]\[2\] = \{(.*?)\n\};", source, re.S)
    assert table and int(table[1]) == len(SGEMV_WINNERS)
    rows = [tuple(map(int, row)) for row in re.findall(r"\{(\d+), (\d+)\}", table[2])]
    # In shape-key order, the order in which the Python dispatcher breaks ties (not numeric order).
    assert rows == sorted(SGEMV_WINNERS, key=lambda s: f"m={s[0]},n={s[1]}") != sorted(SGEMV_WINNERS)



def test_header_declares_and_records_provenance(exported):
    header = (exported / "autogen_sgemv.h").read_text()
    for fragment in ("GPU:                 NVIDIA H100 80GB HBM3", "compute capability:  9.0 (built for sm_90)",
                     "driver:              13.0 (13000)", "CUDA runtime:        13.0 (13000)",
                     "NVRTC:               13.0", "tuned with autogen:  0.1.0", "exported by autogen: 0.1.0 on 20",
                     'extern "C" {', "#include <cuda_runtime.h>",
                     "cudaError_t autogen_sgemv(const float* A, const float* x, float* y, int m, int n, "
                     "float alpha, float beta, cudaStream_t stream);",
                     "const char* autogen_sgemv_variant(int m, int n);"):
        assert fragment in header, fragment
    for (m, n), (_params, time_us, peer) in SGEMV_WINNERS.items():
        line = f"{time_us:.3f} us (cold L2), cuBLAS sgemv {peer:.3f} us, speedup {peer / time_us:.2f}x"
        assert f"m={m},n={n}:" in header and line in header, line
    assert len(re.findall(r"^#include", header, re.M)) == 1


def test_build_files_name_the_arch(exported):
    makefile = (exported / "Makefile").read_text()
    cmake = (exported / "CMakeLists.txt").read_text()
    assert "ARCH ?= sm_90" in makefile and "selftest:" in makefile
    assert 'AUTOGEN_SGEMV_ARCHITECTURES "90"' in cmake and "add_library(autogen_sgemv STATIC" in cmake
    assert "LANGUAGES CXX CUDA" in cmake and "add_executable(autogen_sgemv_selftest" in cmake


# -- it builds --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_source_compiles_and_a_cpp_caller_links(exported, arch, tmp_path):
    library = build_library(exported / "autogen_sgemv.cu", arch, tmp_path)
    include, libdir = cuda_dirs()
    caller = tmp_path / "main.cpp"
    caller.write_text(CALLER)
    # g++ alone, with nothing but the exported header and the CUDA runtime's.
    run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{exported}", f"-I{include}", "-c", str(caller),
         "-o", str(tmp_path / "main.o")])
    run(["g++", str(tmp_path / "main.o"), str(library), f"-L{libdir}", "-lcudart_static", "-ldl", "-lpthread", "-lrt",
         "-o", str(tmp_path / "main_gxx")])
    run([nvcc_or_skip(), f"-arch={arch}", str(tmp_path / "main.o"), str(library), "-o", str(tmp_path / "main_nvcc")])
    assert (tmp_path / "main_gxx").is_file() and (tmp_path / "main_nvcc").is_file()


def test_makefile_builds_library_and_selftest(exported, tmp_path):
    nvcc_or_skip()
    work = tmp_path / "copy"
    shutil.copytree(exported, work)
    flags = "NVCCFLAGS=-O3 -std=c++17 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror"
    run(["make", "-C", str(work), "ARCH=sm_80", flags, "selftest"])
    binary = work / "autogen_sgemv_selftest"
    assert (work / "libautogen_sgemv.a").is_file() and binary.is_file()
    if gpu_unavailable_reason() is not None:
        # No GPU here: the program must say so and fail, never pass unchecked.
        done = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "no CUDA GPU available" in done.stdout


def test_cmake_builds_library_and_selftest(exported, tmp_path):
    nvcc_or_skip()
    if shutil.which("cmake") is None:
        pytest.skip("cmake not on PATH")
    build = tmp_path / "build"
    run(["cmake", "-S", str(exported), "-B", str(build), "-DCMAKE_CUDA_FLAGS=-Werror all-warnings"])
    run(["cmake", "--build", str(build)])
    assert (build / "libautogen_sgemv.a").is_file() and (build / "autogen_sgemv_selftest").is_file()


def test_c_dispatch_follows_the_python_rule(exported, tmp_path):
    from autogen.runtime.dispatch import _by_distance

    library = build_library(exported / "autogen_sgemv.cu", "sm_90", tmp_path)
    binary = dispatch_probe(exported, "autogen_sgemv.h", "autogen_sgemv", 2, library, tmp_path)
    family = get_family("sgemv")
    with TuningDB(exported.parent / "tuning.db") as db:
        winners = db.winners(family="sgemv")
    rng = random.Random(7)
    queries = [*SGEMV_WINNERS, TIE, (1, 1), (2**31 - 1, 2**31 - 1), (2048, 4096), (1000, 16)]
    queries += [(int(2 ** rng.uniform(0, 24)), int(2 ** rng.uniform(0, 16))) for _ in range(300)]
    tuned = [family.problem(m=m, n=n) for m, n in SGEMV_WINNERS]
    names = [family.kernel_name("float32", family.space.check(params)) for params, _, _ in SGEMV_WINNERS.values()]
    expected = []
    for m, n in queries:
        query = family.problem(m=m, n=n)
        served = _by_distance(family, query, winners)[0]  # what autogen.runtime.dispatch serves from Python
        expected.append(family.kernel_name("float32", family.space.check(served.trial.params)))
        assert expected[-1] == names[nearest_index(family, tuned, query)]
    assert probe_variants(binary, queries) == expected
    # The tie is exact, and the C breaks it as Python does: toward the smaller shape key.
    tie = family.problem(m=TIE[0], n=TIE[1])
    assert shape_distance(tie, family.problem(m=TIED_WINNER[0], n=TIED_WINNER[1])) == \
        shape_distance(tie, family.problem(m=TIED_LOSER[0], n=TIED_LOSER[1]))
    assert probe_variants(binary, [TIE]) == [names[list(SGEMV_WINNERS).index(TIED_WINNER)]]
    assert names[list(SGEMV_WINNERS).index(TIED_WINNER)] != names[list(SGEMV_WINNERS).index(TIED_LOSER)]
    assert probe_variants(binary, [(0, 5), (5, -1)]) == ["(null)", "(null)"]


# -- refusals ---------------------------------------------------------------------------------------


def test_a_fresh_machine_exports_the_shipped_catalog(tmp_path, monkeypatch, capsys):
    from autogen.catalog import pretuned
    pretuned.pretuned_db.cache_clear()
    monkeypatch.setattr(export_module, "local_device", lambda: None)
    out = tmp_path / "out"
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert run_export("sgemv", "--out", str(out), "--gpu", "NVIDIA H100 80GB HBM3", "--db", empty, "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    shipped = {w.trial.shape_key for w in pretuned.pretuned_db().winners(family="sgemv")}
    assert {s["shape"] for s in summary["entry_points"][0]["shapes"]} == shipped
    assert (out / "autogen_sgemv.cu").is_file()


def test_nothing_tuned_exits_1_and_writes_nothing(tmp_path, capsys, no_catalog):
    out = tmp_path / "out"
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", empty) == 1
    assert "nothing tuned for sgemv on GPU 'NVIDIA H100 80GB HBM3'" in capsys.readouterr().err
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuned.db'}")
    assert run_export("sgemv", "--out", str(out), "--arch", "sm_80", "--db", url) == 1
    assert "nothing tuned for sgemv on compute capability 8.0" in capsys.readouterr().err
    assert not out.exists()


OUTSIDE_THE_SPACE = [
    ({**SMALL_ROWS, "threads_per_row": 3}, "threads_per_row=3 is not one of"),
    ({**SMALL_ROWS, "x_path": 'ldg"); system("rm -rf /"); //'}, "x_path='ldg\"); system("),
    ({**SMALL_ROWS, "unroll": "2"}, "unroll='2' is not one of"),
    ({**SMALL_ROWS, "extra": 1}, "unknown parameter(s) extra"),
    ({**SMALL_ROWS, "threads_per_row": 64, "warps_per_block": 1}, "needs warps_per_block >= 2"),
]


@pytest.mark.parametrize("params, fragment", OUTSIDE_THE_SPACE)
def test_a_winner_outside_the_space_is_skipped_naming_it(tmp_path, capsys, params, fragment):
    """Issue 34.1: a winner an older or newer autogen's space held (or tampered params) is left
    out with a warning naming it; the other shapes are exported, and the payload never is."""
    import sqlite3

    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    with sqlite3.connect(tmp_path / "tuning.db") as connection:
        connection.execute("UPDATE autogen_trials SET params = ? WHERE shape_key = 'm=512,n=16'", (json.dumps(params),))
    out = tmp_path / "out"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--json") == 0
    captured = capsys.readouterr()
    shapes = {s["shape"] for s in json.loads(captured.out)["entry_points"][0]["shapes"]}
    assert shapes == {f"m={m},n={n}" for m, n in SGEMV_WINNERS} - {"m=512,n=16"}
    assert captured.err.count("\n") == 1 and "shape 'm=512,n=16'" in captured.err and fragment in captured.err
    assert "system" not in (out / "autogen_sgemv.cu").read_text()


@pytest.mark.parametrize("field, stored, fragment", [
    ("shape_key", "m=16,n=16;int evil", "bad shape"),
    ("shape_key", "n=16,m=16", "bad shape"),
    ("shape_key", "m=016,n=16", "not canonical"),
    ("shape_key", "m=0,n=16", "bad shape"),
    ("time_us", -1.0, "time_us=-1.0 is not a positive time"),
    ("dtype", "float64", "sgemv has no dtype 'float64'"),
])
def test_tampered_record_is_refused_naming_it(tmp_path, capsys, field, stored, fragment):
    import json
    import sqlite3

    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    values = {"params": SMALL_ROWS, "shape_key": "m=16,n=16", "time_us": 2.0, "dtype": "float32"}
    with TuningDB(url) as db:
        store_winner(db, H100, "sgemv", {}, values["params"], values["time_us"], dtype=values["dtype"],
                     shape_key=values["shape_key"])
    # Tampered after it was stored, as set_winner refuses to store some of these values.
    values[field] = stored
    column_value = json.dumps(stored) if field == "params" else stored
    with sqlite3.connect(tmp_path / "tuning.db") as connection:
        tables = ("autogen_trials", "autogen_winners") if field in ("shape_key", "dtype") else ("autogen_trials",)
        for table in tables:
            connection.execute(f"UPDATE {table} SET {field} = ? WHERE shape_key = 'm=16,n=16'", (column_value,))
    out = tmp_path / "out"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for name in ("GPU 'NVIDIA H100 80GB HBM3'", "family 'sgemv'", f"dtype {values['dtype']!r}",
                 f"shape {values['shape_key']!r}", fragment):
        assert name in err, (name, err)
    assert not out.exists()


def test_stored_names_and_free_text_never_reach_the_code(tmp_path):
    """Kernel names come from the checked params; GPU, peer and version text only as sanitized
    comments or an escaped string literal."""
    evil = DeviceIdentity('Evil GPU \\\n#include "/etc/passwd"\n*/ int x;', "9.0", 1, 1, 13000, 13000,
                          '13.0\n#error nvrtc')
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    with TuningDB(url) as db:
        store_winner(db, evil, "sgemv", {"m": 64, "n": 64}, SMALL_ROWS, 2.0, 3.0)
        # A stored name its params do not derive is an inconsistent row: left out, counted.
        store_winner(db, evil, "sgemv", {"m": 128, "n": 64}, SMALL_ROWS, 2.0, 3.0,
                     kernel_name='sgemv"); abort(); //')
    out = tmp_path / "out"
    result = export_module.export(export_module.ExportRequest("sgemv", out, db_url=url, self_test=True),
                                  detect=lambda: None)
    assert result.model.gpu.name == evil.name and len(result.skipped) == 1 and "abort" in result.skipped[0]
    assert [s["shape"] for s in result.summary()["entry_points"][0]["shapes"]] == ["m=64,n=64"]
    literal = r'"Evil GPU \134\012#include \042/etc/passwd\042\012*/ int x;"'
    for path in out.iterdir():
        if path.suffix == ".data":  # numbers made by the Python family (test_selftest_data.py)
            continue
        text = path.read_text()
        assert "abort" not in text, path.name
        assert "\\\n" not in text, path.name  # no line continuation out of a comment
        for line in text.splitlines():
            if "passwd" in line or "#error" in line:  # only ever inside a one-line comment, or escaped
                assert line.lstrip().startswith(("//", "#")) or literal in line, (path.name, line)
                assert not re.match(r"\s*#\s*(include|error)", line), (path.name, line)
    assert literal in (out / "autogen_sgemv_selftest.cu").read_text()
    nvcc = nvcc_or_skip()
    run([nvcc, "-arch=sm_90", "-std=c++17", *WERROR, "-c", str(out / "autogen_sgemv_selftest.cu"),
         "-o", str(tmp_path / "selftest.o")])
    run([nvcc, "-arch=sm_90", "-std=c++17", *WERROR, "-c", str(out / "autogen_sgemv.cu"), "-o", str(tmp_path / "k.o")])


def test_out_must_be_a_folder(tmp_path, capsys):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    assert run_export("sgemv", "--out", str(target), "--gpu", H100.name, "--db", url) == 2
    assert "is a file" in capsys.readouterr().err
    assert target.read_text() == "keep me"


def test_symlink_out_of_the_folder_is_refused(tmp_path, capsys):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "precious.h"
    outside.write_text("precious")
    (out / "autogen_sgemv.h").symlink_to(outside)
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url) == 2
    assert "outside --out" in capsys.readouterr().err
    assert outside.read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["autogen_sgemv.h"]  # nothing else written either
    # A link that stays inside the folder is replaced by the file (with --force: the folder is
    # not autogen's), never written through.
    (out / "autogen_sgemv.h").unlink()
    (out / "notes.txt").write_text("mine")
    (out / "Makefile").symlink_to(out / "notes.txt")
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--force") == 0
    assert (out / "notes.txt").read_text() == "mine" and not (out / "Makefile").is_symlink()


def test_a_folder_holding_files_autogen_did_not_write_is_refused(tmp_path, capsys):
    # Issue 34.5: `export --out .` in a project root replaced its Makefile and CMakeLists.txt.
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    project = tmp_path / "project"
    project.mkdir()
    (project / "Makefile").write_text("all:\n\techo mine\n")
    (project / "CMakeLists.txt").write_text("project(mine)\n")
    assert run_export("sgemv", "--out", str(project), "--gpu", H100.name, "--db", url) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not write" in err and "Makefile" in err and "--force" in err
    assert sorted(p.name for p in project.iterdir()) == ["CMakeLists.txt", "Makefile"]
    assert (project / "Makefile").read_text() == "all:\n\techo mine\n"
    assert run_export("sgemv", "--out", str(project), "--gpu", H100.name, "--db", url, "--force") == 0
    assert "autogen_sgemv" in (project / "Makefile").read_text()


def test_an_earlier_export_is_replaced_but_not_a_file_changed_since(tmp_path, capsys):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    out = tmp_path / "out"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    (out / "libautogen_sgemv.a").write_bytes(b"!<arch>\n")  # a build beside it is left alone
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url) == 0
    assert (out / "libautogen_sgemv.a").read_bytes() == b"!<arch>\n"
    with (out / "Makefile").open("a") as makefile:
        makefile.write("# my change\n")
    capsys.readouterr()
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url) == 2
    assert "changed since autogen wrote them (Makefile)" in capsys.readouterr().err
    assert (out / "Makefile").read_text().endswith("# my change\n")
    # The self-test file of the first export is still autogen's: a later --self-test replaces it.
    (out / "Makefile").unlink()
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0


def test_out_with_dot_dot_makes_no_folder_on_the_way(tmp_path, monkeypatch):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    monkeypatch.chdir(tmp_path)
    assert run_export("sgemv", "--out", "a/../b", "--gpu", H100.name, "--db", url) == 0
    assert not (tmp_path / "a").exists() and (tmp_path / "b" / "autogen_sgemv.cu").is_file()


# -- choosing the GPU -------------------------------------------------------------------------------


def test_gpu_and_arch_select_the_winners(tmp_path, monkeypatch, capsys):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}", devices=(H100, A100))
    monkeypatch.setattr(export_module, "local_device", lambda: None)
    assert run_export("sgemv", "--out", str(tmp_path / "none"), "--db", url) == 2
    err = capsys.readouterr().err
    assert "pick one with --gpu" in err and H100.name in err and A100.name in err and "--arch sm_80" in err
    assert run_export("sgemv", "--out", str(tmp_path / "a100"), "--gpu", A100.name, "--db", url) == 0
    assert "ARCH ?= sm_80" in (tmp_path / "a100" / "Makefile").read_text()
    assert A100.name in (tmp_path / "a100" / "autogen_sgemv.h").read_text()
    assert run_export("sgemv", "--out", str(tmp_path / "sm90"), "--arch", "sm_90", "--db", url) == 0
    assert "ARCH ?= sm_90" in (tmp_path / "sm90" / "Makefile").read_text()
    assert run_export("sgemv", "--out", str(tmp_path / "bad"), "--arch", "hopper", "--db", url) == 2
    assert "--arch must look like sm_80" in capsys.readouterr().err
    # This machine's GPU, when CuPy sees one, is the default.
    monkeypatch.setattr(export_module, "local_device", lambda: A100)
    assert run_export("sgemv", "--out", str(tmp_path / "here"), "--db", url, "--json") == 0
    assert '"arch": "sm_80"' in capsys.readouterr().out


def test_the_only_gpu_is_the_default_without_a_local_one(tmp_path, monkeypatch, capsys):
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}")
    monkeypatch.setattr(export_module, "local_device", lambda: None)
    assert run_export("sgemv", "--out", str(tmp_path / "out"), "--db", url) == 0
    table = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3 (sm_90)" in table and "m=2048,n=16" in table


# -- other families: dims other than (m, n), several dtypes, no self-test hook --------------------


class ScaleTest(Family):
    """A one-dimensional test-only family: y = alpha * x, with block size as its one parameter."""

    name = "scale_test"
    template = "not-rendered"  # test_other_families renders it itself
    dims = ("count",)
    dtypes = ("float32", "float16")
    space = Space(params=(Param("block", (64, 128, 256), "b"),))
    default_params = {"block": 128}
    outputs = ("y",)
    c_params = "const float* x, float* y, int count, float alpha"


def render_scale(family, dtype, config, host_launcher=False, traits=()):
    assert host_launcher, "exports render host launchers"
    name = family.kernel_name(dtype, config)
    block = config["block"]
    return (f'extern "C" __global__ void {name}(const float* x, float* y, int count, float alpha)\n'
            f"{{\n    const int i = blockIdx.x * {block} + threadIdx.x;\n    if (i < count) y[i] = alpha * x[i];\n}}\n"
            f'extern "C" cudaError_t {name}_launch({family.c_params}, cudaStream_t stream)\n'
            f"{{\n    {name}<<<(count + {block - 1}) / {block}, {block}, 0, stream>>>(x, y, count, alpha);\n"
            f"    return cudaGetLastError();\n}}\n")


def test_other_families_export_with_their_own_dims_and_dtypes(tmp_path, monkeypatch, capsys):
    family = ScaleTest()
    monkeypatch.setitem(family_registry._REGISTRY, family.name, family)
    monkeypatch.setattr(export_module, "render", render_scale)
    monkeypatch.setattr(export_module, "check_family_renders", lambda family: None)  # no template: render_scale
    monkeypatch.setattr(options_module, "check_family_renders", lambda family: None)
    monkeypatch.setattr(commands_module, "check_family_renders", lambda family: None)
    url = f"sqlite:///{tmp_path / 'tuning.db'}"
    counts = {1000: 64, 4000: 128, 2**20: 256}
    with TuningDB(url) as db:
        for count, block in counts.items():
            store_winner(db, H100, family.name, {"count": count}, {"block": block}, 1.0 + block / 100)
    out = tmp_path / "out"
    assert run_export(family.name, "--out", str(out), "--gpu", H100.name, "--db", url, "--self-test") == 0
    assert "no self-test hook" in capsys.readouterr().err
    source = (out / "autogen_scale_test.cu").read_text()
    assert "static int autogen_scale_test_nearest(int count)" in source
    # float16 has no winner: its entry point serves the family default.
    assert 'return scale_test_f16_b128_launch(x, y, count, alpha, stream);' in source
    selftest = (out / "autogen_scale_test_selftest.cu").read_text()
    assert "autogen_scale_test: skipped, autogen has no self-test hook for scale_test" in selftest
    assert "autogen_scale_test_f16: skipped" in selftest
    nvcc = nvcc_or_skip()
    library = build_library(out / "autogen_scale_test.cu", "sm_80", tmp_path)
    run([nvcc, "-arch=sm_80", "-std=c++17", *WERROR, str(out / "autogen_scale_test_selftest.cu"), str(library),
         "-o", str(tmp_path / "selftest")])
    if gpu_unavailable_reason() is not None:
        assert subprocess.run([str(tmp_path / "selftest")], capture_output=True, timeout=60).returncode == 1
    probe = dispatch_probe(out, "autogen_scale_test.h", "autogen_scale_test", 1, library, tmp_path)
    tuned = [family.problem(count=c) for c in sorted(counts)]
    names = [family.kernel_name("float32", family.space.check({"block": counts[c]})) for c in sorted(counts)]
    queries = [(1,), (999,), (2000,), (2**12,), (2**31 - 1,), *[(random.Random(c).randint(1, 2**24),) for c in range(50)]]
    expected = [names[nearest_index(family, tuned, family.problem(count=q))] for (q,) in queries]
    assert probe_variants(probe, queries) == expected
    probe16 = dispatch_probe(out, "autogen_scale_test.h", "autogen_scale_test_f16", 1, library, tmp_path)
    assert probe_variants(probe16, [(1,), (10**6,)]) == ["scale_test_f16_b128"] * 2


# The sgemv self-test hook's error measure, compiled with nvcc and run on the host (no GPU): it
# must judge an output as sgemv.py does (relative to |alpha| |A| |x| + |beta| |y|).
ERROR_HARNESS = r"""
#include <cstdio>
#include <string>
#include <vector>
#define main autogen_selftest_main
#include "autogen_sgemv_selftest.cu"
#undef main

static bool read_all(std::vector<float>& values)
{
    for (float& v : values)
        if (std::scanf("%f", &v) != 1) return false;
    return true;
}

int main()
{
    int m = 0, n = 0;
    float alpha = 0.0f, beta = 0.0f;
    if (std::scanf("%d %d %f %f", &m, &n, &alpha, &beta) != 4) return 2;
    std::vector<float> a((std::size_t)m * n), x((std::size_t)n), y_in((std::size_t)m), out((std::size_t)m);
    if (!read_all(a) || !read_all(x) || !read_all(y_in) || !read_all(out)) return 2;
    std::string why;
    const double error = autogen_sgemv_test::Workload::output_error(a, x, y_in, out, m, n, alpha, beta, &why);
    std::printf("%.17g\n%s\n", error, why.c_str());
    return 0;
}
"""


@pytest.fixture(scope="module")
def error_harness(exported, tmp_path_factory) -> Path:
    nvcc = nvcc_or_skip()
    work = tmp_path_factory.mktemp("sgemv_harness")
    library = build_library(exported / "autogen_sgemv.cu", "sm_80", work)
    source = work / "harness.cu"
    source.write_text(ERROR_HARNESS)
    run([nvcc, "-std=c++17", *WERROR, f"-I{exported}", str(source), str(library), "-o", str(work / "harness")])
    return work / "harness"


def harness_error(binary: Path, A, x, y_in, out, alpha: float, beta: float) -> tuple[float, str]:
    words = [f"{A.shape[0]} {A.shape[1]} {alpha!r} {beta!r}"]
    words += [" ".join("nan" if np.isnan(v) else repr(float(v)) for v in values.ravel()) for values in (A, x, y_in, out)]
    lines = run([str(binary)], input="\n".join(words) + "\n").stdout.splitlines()
    return float(lines[0]), (lines[1] if len(lines) > 1 else "")


@pytest.mark.parametrize("m,n,alpha,beta", [(1, 4099, 1.5, 0.0), (37, 1000, -0.75, 1.25)])
def test_selftest_error_matches_sgemv_py(error_harness, m, n, alpha, beta):
    from autogen.core.compare import relative_error

    family = get_family("sgemv")
    rng = np.random.default_rng(7)
    A = (rng.random((m, n)) - 0.5).astype(np.float32)
    x = (rng.random(n) - 0.5).astype(np.float32)
    if m == 1:  # cancel the one dot product to nearly zero: |y| alone would fail a correct kernel
        x[-1] = np.float32(-(A[0, :-1].astype(np.float64) @ x[:-1].astype(np.float64)) / A[0, -1])
    y_in = (rng.random(m) - 0.5).astype(np.float32) if beta else np.full(m, np.nan, np.float32)
    inputs = {"A": A, "x": x, "y": y_in.copy(), "alpha": alpha, "beta": beta}
    problem = family.problem(m=m, n=n)
    expected = family.reference(problem, inputs, np)
    magnitude = family.reference_magnitude(problem, inputs, np)
    # A correct fp32 kernel: products summed in fp32, in order.
    products = (A * x).astype(np.float32)
    out = (np.float32(alpha) * np.cumsum(products, axis=1, dtype=np.float32)[:, -1]
           + (np.float32(beta) * y_in if beta else np.float32(0))).astype(np.float32)
    for output, passes in ((out, True), ((out + 1e-3 * magnitude).astype(np.float32), False)):
        error, why = harness_error(error_harness, A, x, y_in, output, alpha, beta)
        python_error, _ = relative_error(np, output, expected, magnitude)
        assert why == "" and error == pytest.approx(python_error, rel=1e-6, abs=1e-12)
        assert (error <= family.tolerance) is passes, error
    poisoned = out.copy()
    poisoned[-1] = np.nan
    error, why = harness_error(error_harness, A, x, y_in, poisoned, alpha, beta)
    assert error == math.inf and "NaN/inf" in why


def test_arch_with_two_gpus_of_it_takes_the_one_with_most_shapes(tmp_path, monkeypatch, capsys):
    """`--arch sm_90` with an H100 and an H200 stored (as the shipped catalog holds): the GPU with
    the most tuned shapes of the family is exported, ties to the first name, the other is named."""
    h200 = DeviceIdentity("NVIDIA H200", "9.0", 132, 62914560, 13000, 13000, "13.0")
    url = sgemv_db(f"sqlite:///{tmp_path / 'tuning.db'}", devices=(H100,))
    with TuningDB(url) as db:  # the H200 holds one shape fewer than the H100
        for (m, n), (params, time_us, peer) in list(SGEMV_WINNERS.items())[1:]:
            store_winner(db, h200, "sgemv", {"m": m, "n": n}, params, time_us, peer)
    monkeypatch.setattr(export_module, "local_device", lambda: None)
    assert run_export("sgemv", "--out", str(tmp_path / "sm90"), "--arch", "sm_90", "--db", url, "--json") == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["gpu"] == H100.name
    assert summary["also_tuned_on"] == [{"gpu": h200.name, "shapes": len(SGEMV_WINNERS) - 1}]
    assert "the GPU with the most tuned shapes" in captured.err and h200.name in captured.err
    with TuningDB(url) as db:  # level: the name that sorts first
        params, time_us, peer = next(iter(SGEMV_WINNERS.values()))
        (m, n) = next(iter(SGEMV_WINNERS))
        store_winner(db, h200, "sgemv", {"m": m, "n": n}, params, time_us, peer)
    assert run_export("sgemv", "--out", str(tmp_path / "tie"), "--arch", "sm_90", "--db", url, "--json") == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == H100.name
