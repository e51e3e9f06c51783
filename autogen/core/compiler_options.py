"""A family's own compiler options (Family.compiler_options): the options autogen accepts, each in
one spelling for NVRTC (what tuning and the dispatcher compile with, and what the compile cache key
and the stored source hash hold) and its nvcc spelling (`autogen check`, `show --resources`, the
export's Makefile and CMakeLists). Pure: no compiler is run here.

Accepted (with one dash or two, as NVRTC and Kernel Tuner's users write them): -DNAME[=VALUE],
-use_fast_math, -lineinfo (--generate-line-info), -maxrregcount=N, -ftz=, -prec-div=, -prec-sqrt=,
-fmad= (true or false), -extra-device-vectorization, -restrict, -std=c++NN. Refused, in one line
naming the option: the target (-arch, --gpu-architecture, -code: autogen compiles for each GPU it
runs on), include paths (a header outside the source is in neither the cache key nor the export),
relocatable or debug code, and anything else.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from autogen.errors import UsageError

DEFAULT_STD = "c++17"  # autogen.gpu.compile.BASE_OPTIONS' language standard


class _Rule(NamedTuple):
    pattern: re.Pattern  # the option's name and value, leading dashes removed
    nvrtc: str  # format of the NVRTC spelling, from the match's groups
    nvcc: str  # format of the nvcc spelling


_BOOL = r"(true|false)"
_RULES = (
    _Rule(re.compile(r"D([A-Za-z_][A-Za-z0-9_]*)(?:=([^\s\"'\\$#`]*))?"), "-D{0}{1}", "-D{0}{1}"),
    _Rule(re.compile(r"define-macro=([A-Za-z_][A-Za-z0-9_]*)(?:=([^\s\"'\\$#`]*))?"), "-D{0}{1}", "-D{0}{1}"),
    _Rule(re.compile(r"use_fast_math"), "--use_fast_math", "-use_fast_math"),
    _Rule(re.compile(r"lineinfo|generate-line-info"), "--generate-line-info", "-lineinfo"),
    _Rule(re.compile(r"maxrregcount=([1-9][0-9]{0,2})"), "--maxrregcount={0}", "-maxrregcount={0}"),
    _Rule(re.compile(r"(ftz|prec-div|prec-sqrt|fmad)=" + _BOOL), "--{0}={1}", "-{0}={1}"),
    _Rule(re.compile(r"extra-device-vectorization"), "--extra-device-vectorization", "-extra-device-vectorization"),
    _Rule(re.compile(r"restrict"), "--restrict", "-restrict"),
    _Rule(re.compile(r"std=(c\+\+(?:11|14|17|20))"), "--std={0}", "-std={0}"),
)
# Options that cannot work, and why (matched on the name without dashes, before any '=').
_REFUSED = (
    (re.compile(r"arch|gpu-architecture|code|gencode|generate-code"),
     "autogen compiles for the architecture of each GPU it runs on (export: make ARCH=...)"),
    (re.compile(r"I.*|include-path|include|pre-include"),
     "a header outside the kernel source is in neither the compile cache key nor the export; include its "
     "text in the source"),
    (re.compile(r"rdc|relocatable-device-code|dc|dw|device-c|device-w|dlto|dlink-time-opt"),
     "autogen loads each variant as one self-contained cubin"),
    (re.compile(r"G|device-debug|dopt"), "debug code would be what is timed"),
)


def _spelled(option: str) -> tuple[str, str]:
    """(NVRTC spelling, nvcc spelling) of one option; UsageError naming it where refused."""
    if not isinstance(option, str):
        raise UsageError(f"compiler option {option!r} is not a string")
    bare = option[2:] if option.startswith("--") else option[1:] if option.startswith("-") else None
    for rule in _RULES if bare else ():
        match = rule.pattern.fullmatch(bare)
        if match:
            groups = [g or "" for g in match.groups()]
            if rule.nvrtc.startswith("-D"):  # a macro's value keeps its '='
                groups = [groups[0], f"={groups[1]}" if match.group(2) is not None else ""]
            return rule.nvrtc.format(*groups), rule.nvcc.format(*groups)
    name = (bare or "").split("=")[0]
    why = next((reason for pattern, reason in _REFUSED if name and pattern.fullmatch(name)), None)
    raise UsageError(f"compiler option {option!r} is not taken: " + (why or (
        "autogen takes -DNAME[=VALUE], -use_fast_math, -lineinfo, -maxrregcount=N, -ftz=, -prec-div=, "
        "-prec-sqrt=, -fmad= (true|false), -extra-device-vectorization, -restrict, -std=c++11|14|17|20")))


def checked(options) -> tuple[str, ...]:
    """The options in NVRTC's spelling, duplicates dropped, order kept; UsageError (one line,
    naming the option) for one autogen refuses, and for two -std or -maxrregcount that differ."""
    if isinstance(options, str):
        raise UsageError(f"compiler options must be a list of options, not the string {options!r}")
    found: list[str] = []
    for option in options or ():
        spelled = _spelled(option)[0]
        key = spelled.split("=")[0] if not spelled.startswith("-D") else None
        clash = next((f for f in found if key and f.split("=")[0] == key and f != spelled), None)
        if clash:
            raise UsageError(f"compiler options {clash!r} and {option!r} contradict each other")
        if spelled not in found:
            found.append(spelled)
    return tuple(found)


def nvcc_flags(options: tuple[str, ...]) -> tuple[str, ...]:
    """The nvcc spelling of checked options, without the language standard (see language_std)."""
    return tuple(_spelled(o)[1] for o in options if not o.startswith("--std="))


def language_std(options: tuple[str, ...]) -> str:
    """The C++ standard the options ask for ("c++17" where they name none)."""
    return next((o.partition("=")[2] for o in options if o.startswith("--std=")), DEFAULT_STD)
