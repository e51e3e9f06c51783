"""The export self-test's data (autogen.export.selftest_data): what is written is what the Python
family computes, bounded in size, for every built-in family; and the self-test's own reading
and comparison of it (compiled on the host, no GPU) passes the reference and catches wrong,
unwritten and NaN outputs."""

from __future__ import annotations

import itertools
import struct
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from autogen.core.registry import get_family
from autogen.export import selftest_data
from autogen.export.selftest_data import MAX_DATA_BYTES, build, c_param_list
from nvcc_tools import nvcc_or_skip
from test_export import H100, WERROR, build_library, run, run_export, sgemv_db

BUILT_IN = ("sgemv", "sgemm", "reduce", "softmax", "gelu", "bias_mask_scale_add", "hgemv", "histogram", "copy_if")
ELEMENT_TYPES = {code: name for name, code in selftest_data.ELEMENT_TYPES.items()}


def entries_of(family, shapes=()) -> list:
    """Every entry point of an export with nothing tuned (dtypes x trait values), as build reads them."""
    trait_sets = [tuple(zip((t.name for t in family.traits), values))
                  for values in itertools.product(*(t.choices for t in family.traits))]
    return [SimpleNamespace(symbol=f"e{i}", dtype=dtype, traits=traits, c_params=family.c_params_for(dtype),
                            shapes=shapes)
            for i, (dtype, traits) in enumerate(itertools.product(family.dtypes, trait_sets))]


def read_blob(blob: bytes) -> list[dict]:
    """The records of a data file, read as the self-test reads them."""
    assert blob[:8] == selftest_data.MAGIC
    at, (count,) = 12, struct.unpack_from("<I", blob, 8)

    def take(fmt):
        nonlocal at
        values = struct.unpack_from(fmt, blob, at)
        at += struct.calcsize(fmt)
        return values

    records = []
    for _ in range(count):
        entry, ndims = take("<II")
        dims = take(f"<{ndims}i")
        (name_bytes,) = take("<H")
        name = blob[at:at + name_bytes].decode()
        at += name_bytes
        tolerance, floor, comparison, nargs = take("<ddBI")
        args = []
        for _ in range(nargs):
            (kind,) = take("<B")
            if kind == selftest_data.KIND_SCALAR:
                args.append({"scalar": blob[at:at + 8]})
                at += 8
                continue
            output, type_code, elem_bytes, offset, size = take("<BBIQQ")
            arg = {"output": bool(output), "type": ELEMENT_TYPES[type_code], "offset": offset,
                   "data": blob[at:at + size * elem_bytes]}
            at += size * elem_bytes
            if output:
                (arg["norm"],) = take("<d")
                arg["ref"] = np.frombuffer(blob, np.float64, size, at)
                at += 8 * size
            args.append(arg)
        records.append({"entry": entry, "dims": dims, "name": name, "tolerance": tolerance, "floor": floor,
                        "comparison": comparison, "args": args})
    assert at == len(blob)
    return records


@pytest.mark.parametrize("name", BUILT_IN)
def test_data_is_what_the_python_family_computes(name):
    family = get_family(name)
    entries = entries_of(family)
    data = build(family, entries)
    assert data.size <= MAX_DATA_BYTES and data.crc32 == zlib.crc32(data.blob)
    records = read_blob(data.blob)
    assert records and {r["entry"] for r in records} == set(range(len(entries)))
    first = records[0]  # the smallest tail shape of the first entry point, its first case
    entry = entries[first["entry"]]
    problem = family.problem(entry.dtype, **dict(zip(family.dims, first["dims"])), **dict(entry.traits))
    case = family.validation_cases(problem)[0]
    seed = zlib.crc32(f"{family.name}|{problem.dtype}|{problem.shape_key}|0".encode())
    inputs = family.make_inputs(problem, np, np.random.default_rng(seed), case)
    with np.errstate(all="ignore"):
        expected = family.reference(problem, inputs, np)
    assert first["tolerance"] == family.tolerance_for(problem)
    values = family.c_arguments(problem, inputs)
    for param, arg in zip(c_param_list(entry.c_params, family.name), first["args"]):
        if "scalar" in arg:
            kind = selftest_data.SCALAR_TYPES[param.ctype]
            assert arg["scalar"][:np.dtype(kind).itemsize] == np.asarray(values[param.name]).astype(kind).tobytes()
            continue
        assert arg["data"] == values[param.name].tobytes(), param.name  # outputs: poisoned as made
        if arg["output"]:
            want = np.asarray(expected[param.name] if isinstance(expected, dict) else expected, np.float64).ravel()
            assert np.array_equal(arg["ref"], want, equal_nan=True), param.name
    # Every shape either ships as data or is left to the hook, and the tail shapes are there.
    for entry in entries:
        checks = data.checks[entry.symbol]
        shapes = checks.data_shapes + checks.hook_shapes
        assert sorted(shapes) == sorted(selftest_data.check_shapes(family, entry))
        assert set(shapes) <= set(family.export_tail_shapes())
        assert checks.data_shapes, "no tail shape is small enough to ship"


def test_a_trait_the_kernel_takes_as_an_argument_is_checked_in_each_value():
    # gelu's variants take the form as an argument (approximate): each entry point, whatever form
    # it was tuned for, is checked in both, its own first, each against that form's reference.
    family = get_family("gelu")
    entries = [entry for entry in entries_of(family) if entry.dtype == "float32"]
    records = read_blob(build(family, entries).blob)
    names = [param.name for param in c_param_list(family.c_params, family.name)]
    for index, entry in enumerate(entries):
        own = dict(entry.traits)["approximate"]
        shape = next(r["dims"] for r in records if r["entry"] == index)
        of_shape = [r for r in records if r["entry"] == index and r["dims"] == shape]
        assert of_shape[0]["name"].startswith(f"approximate={own} ")
        assert {r["name"].split()[0] for r in of_shape} == {"approximate=tanh", "approximate=none"}
        for number, record in enumerate(r for r in of_shape if not r["name"].startswith(f"approximate={own} ")):
            form = record["name"].split()[0].split("=")[1]
            (flag,) = struct.unpack_from("<i", record["args"][names.index("approximate")]["scalar"])
            assert flag == int(form == "tanh")
            problem = family.problem("float32", n=shape[0], approximate=form)
            seed = zlib.crc32(f"{family.name}|{problem.dtype}|{problem.shape_key}|{number}".encode())
            inputs = family.make_inputs(problem, np, np.random.default_rng(seed), family.validation_cases(problem)[number])
            want = family.reference(problem, inputs, np)
            assert np.array_equal(record["args"][names.index("y")]["ref"], want.ravel(), equal_nan=True)


def test_tuned_shapes_too_large_are_left_to_the_hook():
    family = get_family("sgemv")
    tuned = SimpleNamespace(dims=(8192, 8192))
    small = SimpleNamespace(dims=(64, 128))
    checks = build(family, entries_of(family, shapes=(tuned, small))).checks["e0"]
    assert (8192, 8192) in checks.hook_shapes and (8193, 8193) in checks.hook_shapes
    assert (64, 128) in checks.data_shapes and (65, 129) in checks.data_shapes
    assert max(np.prod(s) for s in checks.data_shapes) < 8192 * 8192


def test_a_c_parameter_the_family_cannot_give_is_named():
    family = get_family("sgemv")
    entry = entries_of(family)[0]
    entry.c_params = family.c_params + ", int mystery"
    with pytest.raises(Exception, match="mystery"):
        build(family, [entry])


# -- the self-test's reading and comparison, on the host ------------------------------------------

HARNESS = r"""
#include <cstdio>
#include <string>
#include <vector>

#define main autogen_selftest_main
#include "autogen_sgemv_selftest.cu"
#undef main

// Each case of the data file judged with its outputs: the reference rounded to float ("right"),
// scaled by 1 + 1e-3 ("off"), one element NaN ("nan"). One line per case: error, pass, why.
int main(int argc, char** argv)
{
    if (argc != 3) return 2;
    const selftest::DataFile data = selftest::load_data(argv[1], @SIZE@u, @CRC@u);
    if (!data.problem.empty()) {
        std::printf("problem %s\n", data.problem.c_str());
        return 0;
    }
    const std::string mode = argv[2];
    for (const selftest::DataCase& c : data.cases) {
        std::vector<std::vector<unsigned char>> outputs(c.args.size());
        for (std::size_t i = 0; i < c.args.size(); ++i) {
            if (!c.args[i].output) continue;
            std::vector<float> values(c.args[i].ref.begin(), c.args[i].ref.end());
            for (float& v : values) v = mode == "off" ? v * 1.001f : v;
            if (mode == "nan") values[values.size() / 2] = std::numeric_limits<float>::quiet_NaN();
            outputs[i].resize(values.size() * sizeof(float));
            std::memcpy(outputs[i].data(), values.data(), outputs[i].size());
        }
        std::string why;
        const double error = selftest::case_error(c, outputs, autogen_sgemv_test::kParamNames, &why);
        const bool passed = why.empty() && selftest::judged(error, c.tolerance, c.floor, &why);
        std::printf("%.17g %d %s\n", error, passed ? 1 : 0, why.c_str());
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def sgemv_harness(tmp_path_factory):
    nvcc = nvcc_or_skip()
    root = tmp_path_factory.mktemp("selftest_data")
    out = root / "export"
    assert run_export("sgemv", "--out", str(out), "--gpu", H100.name, "--db",
                      sgemv_db(f"sqlite:///{root / 'tuning.db'}"), "--self-test") == 0
    blob = (out / "autogen_sgemv_selftest.data").read_bytes()
    source = root / "harness.cu"
    source.write_text(HARNESS.replace("@SIZE@", str(len(blob))).replace("@CRC@", str(zlib.crc32(blob))))
    library = build_library(out / "autogen_sgemv.cu", "sm_80", root)
    run([nvcc, "-std=c++17", *WERROR, f"-I{out}", str(source), str(library), "-o", str(root / "harness")])
    return root / "harness", out / "autogen_sgemv_selftest.data", read_blob(blob)


def judged_lines(harness, data, mode: str) -> list[tuple[float, bool, str]]:
    lines = run([str(harness), str(data), mode]).stdout.splitlines()
    return [(float(e), p == "1", " ".join(why)) for e, p, *why in (line.split(" ") for line in lines)]


def test_selftest_passes_the_reference_and_catches_wrong_outputs(sgemv_harness):
    harness, data, records = sgemv_harness
    right = judged_lines(harness, data, "right")
    assert len(right) == len(records) > 0
    assert all(passed and why == "" for _, passed, why in right), right[:3]
    off = judged_lines(harness, data, "off")
    assert not any(passed for _, passed, _ in off)  # 1e-3 over the 1e-5 tolerance
    assert all("relative L2 error" in why for _, _, why in off)
    nan = judged_lines(harness, data, "nan")
    assert all(not passed and "y: 1 of" in why and "NaN/inf" in why for _, passed, why in nan), nan[:3]


def test_selftest_refuses_data_that_is_not_its_own(sgemv_harness, tmp_path):
    harness, data, _records = sgemv_harness
    changed = bytearray(data.read_bytes())
    changed[100] ^= 1
    (tmp_path / "changed.data").write_bytes(bytes(changed))
    lines = run([str(harness), str(tmp_path / "changed.data"), "right"]).stdout.splitlines()
    assert lines[0].startswith("problem ") and "CRC-32 differs" in lines[0]
    lines = run([str(harness), str(tmp_path / "missing.data"), "right"]).stdout.splitlines()
    assert lines[0].startswith("problem cannot open")
