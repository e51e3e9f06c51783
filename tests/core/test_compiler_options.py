"""A family's own compiler options (Family.compiler_options, autogen.core.compiler_options): the
spellings taken and their NVRTC and nvcc forms, the one-line refusals, the check at registration,
and the built-in families' options and compile cache key left as they were."""

from __future__ import annotations

import copy

import pytest

from autogen.core.compiler_options import checked, language_std, nvcc_flags
from autogen.core.registry import all_families, get_family, register
from autogen.errors import FamilyError, UsageError
from autogen.gpu.compile import cache_key, compile_options
from autogen.gpu.resources import nvcc_options


@pytest.mark.parametrize("given, nvrtc, nvcc", [
    ("-use_fast_math", "--use_fast_math", "-use_fast_math"),
    ("--use_fast_math", "--use_fast_math", "-use_fast_math"),
    ("-lineinfo", "--generate-line-info", "-lineinfo"),
    ("--generate-line-info", "--generate-line-info", "-lineinfo"),
    ("-maxrregcount=32", "--maxrregcount=32", "-maxrregcount=32"),
    ("--maxrregcount=64", "--maxrregcount=64", "-maxrregcount=64"),
    ("-ftz=true", "--ftz=true", "-ftz=true"),
    ("--prec-div=false", "--prec-div=false", "-prec-div=false"),
    ("-prec-sqrt=false", "--prec-sqrt=false", "-prec-sqrt=false"),
    ("-fmad=false", "--fmad=false", "-fmad=false"),
    ("-extra-device-vectorization", "--extra-device-vectorization", "-extra-device-vectorization"),
    ("-restrict", "--restrict", "-restrict"),
    ("-DWIDTH=64", "-DWIDTH=64", "-DWIDTH=64"),
    ("-DFAST", "-DFAST", "-DFAST"),
    ("--define-macro=TILE=4", "-DTILE=4", "-DTILE=4"),
])
def test_each_option_has_one_nvrtc_and_one_nvcc_spelling(given, nvrtc, nvcc):
    assert checked([given]) == (nvrtc,)
    assert nvcc_flags(checked([given])) == (nvcc,)


def test_the_language_standard_replaces_autogens_and_duplicates_collapse():
    options = checked(["--std=c++20", "-use_fast_math", "--use_fast_math"])
    assert options == ("--std=c++20", "--use_fast_math")
    assert language_std(options) == "c++20" and language_std(()) == "c++17"
    assert compile_options("sm_90", options) == ("--gpu-architecture=sm_90", "--std=c++20", "--use_fast_math")
    assert nvcc_options(options) == ("-std=c++20", "-use_fast_math")


@pytest.mark.parametrize("option, why", [
    ("-arch=sm_80", "architecture of each GPU"),
    ("--gpu-architecture=compute_90", "architecture of each GPU"),
    ("-gencode=arch=compute_90,code=sm_90", "architecture of each GPU"),
    ("-I/usr/local/include", "neither the compile cache key nor the export"),
    ("--include-path=inc", "neither the compile cache key nor the export"),
    ("-rdc=true", "self-contained cubin"),
    ("-G", "debug code"),
    ("-O3", "autogen takes -DNAME"),
    ("-maxrregcount=0", "autogen takes -DNAME"),
    ("-DA=$(shell rm x)", "autogen takes -DNAME"),  # a value the export's Makefile would run
    ("use_fast_math", "autogen takes -DNAME"),
])
def test_what_cannot_work_is_refused_in_one_line_naming_it(option, why):
    with pytest.raises(UsageError) as caught:
        checked([option])
    text = str(caught.value)
    assert text.startswith(f"compiler option {option!r} is not taken: ") and why in text and "\n" not in text


def test_contradicting_options_and_a_bare_string_are_refused():
    with pytest.raises(UsageError, match="'--maxrregcount=32' and '-maxrregcount=64' contradict"):
        checked(["-maxrregcount=32", "-maxrregcount=64"])
    with pytest.raises(UsageError, match="a list of options, not the string"):
        checked("-use_fast_math")


def test_registration_checks_a_familys_options_in_one_line():
    broken = copy.copy(get_family("gelu"))
    broken.compiler_options = ("-arch=sm_80",)
    with pytest.raises(FamilyError) as caught:
        register(broken)
    assert "gelu" in str(caught.value) and "'-arch=sm_80' is not taken" in str(caught.value)
    assert "\n" not in str(caught.value) and get_family("gelu").compiler_options == ()


def test_built_in_families_keep_their_options_and_cache_keys():
    built_in = [f for f in all_families(include_plugins=False).values() if f.module.startswith("autogen.families.")]
    assert len(built_in) > 5 and all(family.compiler_options == () for family in built_in)
    assert compile_options("sm_90") == ("-std=c++17", "--gpu-architecture=sm_90")
    # The key main computed for this source before families could state options.
    assert cache_key('extern "C" __global__ void k() {}', compile_options("sm_90"), "13.0") == \
        "86cea3fe25ef55023a587cb5d5cd602012bcf249a071b76a78aabe457d37d6ba"
    assert cache_key("k", compile_options("sm_90", ("--maxrregcount=32",)), "13.0") != \
        cache_key("k", compile_options("sm_90"), "13.0")
