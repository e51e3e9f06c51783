"""`autogen show ... --resources`: ptxas's report of a stored kernel, from nvcc, without a GPU."""

from __future__ import annotations

import json

import pytest

from autogen.cli.main import main
from autogen.errors import CompileError
from autogen.gpu.resources import kernel_resources, parse_ptxas_report
from nvcc_tools import nvcc_or_skip

# ptxas -v as nvcc 13 prints it for sm_90: a kernel that spills and one without barriers or
# shared memory (ptxas then leaves those phrases out).
REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
    24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 33036 bytes smem
ptxas info    : Compile time = 51.371 ms
ptxas info    : Compiling entry function 'small' for 'sm_90'
ptxas info    : Function properties for small
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers
"""


def test_the_report_is_split_per_kernel_and_absent_phrases_are_zero():
    big, small = parse_ptxas_report(REPORT)
    assert (big.kernel, big.registers, big.barriers, big.shared_bytes) == ("big", 255, 1, 33036)
    assert (big.stack_frame_bytes, big.spill_store_bytes, big.spill_load_bytes) == (24, 16, 12)
    assert "spills 16 B stored, 12 B loaded" in big.summary()
    assert (small.kernel, small.registers, small.barriers, small.shared_bytes) == ("small", 26, 0, 0)
    assert "no spills" in small.summary()


def test_a_kernel_without_a_register_count_is_an_error_not_a_zero():
    with pytest.raises(CompileError, match="no register count for big"):
        parse_ptxas_report(REPORT.split("ptxas info    : Used 255")[0])


def test_show_reports_the_resources_of_every_kernel_of_a_stored_winner(db_url, capsys):
    # copy_if's ordered form is two kernels (the scan and its initialisation); the winner comes
    # from the shipped catalog, the database stays empty.
    nvcc_or_skip()
    args = ["show", "copy_if", "--n", "268435456", "--selectivity", "p50", "--order", "ordered",
            "--gpu", "NVIDIA H200", "--db", db_url]
    assert main(args + ["--resources", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    report = shown["resources"]
    assert report["arch"] == "sm_90" and report["nvcc"][0].isdigit()
    assert [k["kernel"] for k in report["kernels"]] == [shown["kernel"], shown["kernel"] + "_init"]
    scan = report["kernels"][0]
    assert 0 < scan["registers"] <= 255 and scan["shared_bytes"] > 0 and scan["spill_store_bytes"] == 0
    # with the launch this shape gets: block size from the kernel name (bs256), one block per tile
    assert scan["block"] == [256, 1, 1] and scan["grid"][0] > 1000 and scan["dynamic_shared_bytes"] == 0
    assert scan["summary"].endswith(f"launched with {scan['grid'][0]} blocks of 256 threads, "
                                    "0 B dynamic shared memory")
    assert main(args + ["--resources"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"resources {shown['kernel']} ") and line.endswith(f"  {scan['summary']}")
               for line in lines)
    assert main(args + ["--json"]) == 0
    assert "resources" not in json.loads(capsys.readouterr().out)  # only when asked: nvcc is slow


def test_nvcc_errors_come_back_as_a_compile_error():
    nvcc_or_skip()
    with pytest.raises(CompileError, match="nvcc sm_90 failed"):
        kernel_resources('extern "C" __global__ void k() { undefined_name(); }', "sm_90")


def test_without_nvcc_show_resources_says_so_in_one_line(db_url, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert main(["show", "hgemv", "--m", "4096", "--n", "4096", "--gpu", "NVIDIA H100 80GB HBM3",
                 "--db", db_url, "--resources"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    # (a note may say that the --db file does not exist: the catalog is read)
    assert [line for line in captured.err.strip().splitlines() if not line.startswith("autogen: note:")] == [
        "autogen: error: nvcc not found (PATH, $CUDA_HOME, $CUDA_PATH): the resource report needs the "
        "CUDA toolkit's compiler"]
