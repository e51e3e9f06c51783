"""`autogen export`: a family's tuned kernels as standalone CUDA C++ for builds without Python.

The flow: pick the GPU the winners come from (choose_target), read its winners and re-check every
stored value (check_winner: parameters through family.space.check, shapes through
parse_shape_key and family.problem), build an ExportModel (one entry point per dtype, each distinct
variant once), render the files from templates/export/*.j2 and write them into --out.

Nothing read from the database reaches the generated code unchecked: parameters are re-validated,
kernel names are re-derived from them, shapes become integers, timings finite floats, and free
text (GPU name, versions, peer name) only appears in comments after sanitizing, or as a C string
literal with every unusual byte escaped. File names are fixed here, never taken from the database.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tuning_db import TuningDB
from tuning_db.engine import display_url
from tuning_db.records import DeviceIdentity, WinnerRecord, most_tuned_gpu, one_per_problem

from autogen._version import __version__
from autogen.errors import GpuUnavailableError, InvalidConfigError, NotTunedError, UsageError
from autogen.core.family import Family
from autogen.core.registry import check_family_renders, get_family
from autogen.core.compiler_options import language_std, nvcc_flags
from autogen.core.dtypes import DTYPES
from autogen.core.problem import Config, Problem, nearest, parse_shape_key
from autogen.catalog.pretuned import pretuned_db
from autogen.core.render import render, render_template
from autogen.export.files import MANIFEST, write_files  # noqa: F401 (MANIFEST: the export's face)
from autogen.export import selftest_data
from autogen.export.selftest_data import c_param_list
from autogen.export.text import c_string, comment_text, cuda_version
from autogen.catalog.stored import skipped_winners_note, winner_unusable_reason
from autogen.gpu.device import device_identity

ARCH_PATTERN = re.compile(r"sm_([1-9][0-9]?)([0-9])([af]?)")  # sm_80, sm_90a, sm_100, sm_120f
CC_PATTERN = re.compile(r"([1-9][0-9]?)\.([0-9])")  # "9.0"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# -- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TunedShape:
    """One stored winner after every value in it was checked."""

    problem: Problem
    config: Config
    kernel_name: str  # re-derived from config, never the stored name
    time_us: float
    peer_name: str  # sanitized for comments
    peer_time_us: float | None
    cache_mode: str  # "cold" | "hot": how the stored time was measured
    provenance: str  # one sanitized line: when, with which autogen, driver, runtime and NVRTC

    @property
    def dims(self) -> tuple[int, ...]:
        """The sizes, in the family's dimension order (traits are the entry point's)."""
        return tuple(size for _name, size in self.problem.sizes)

    @property
    def speedup(self) -> float | None:
        return self.peer_time_us / self.time_us if self.peer_time_us else None


@dataclass(frozen=True)
class Variant:
    """One distinct kernel of the export, with its host launcher `<kernel_name>_launch`."""

    dtype: str
    config: Config
    kernel_name: str
    source: str  # rendered with host_launcher=True


@dataclass(frozen=True)
class EntryPoint:
    """The C function of one family and dtype that dispatches on shape."""

    symbol: str  # autogen_sgemv, autogen_softmax_f16, autogen_gelu_f16_tanh
    dtype: str
    c_params: str  # the family's parameter list for this dtype
    arg_names: tuple[str, ...]  # the names in c_params, to forward them to a launcher
    shapes: tuple[TunedShape, ...]  # the dispatch table, sorted by shape key; ties go to the earlier
    default: Variant | None  # served for every shape when nothing is tuned for this dtype
    traits: tuple[tuple[str, str], ...] = ()  # the trait values every shape of this entry has

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """The variants this entry point can launch, each once, in table order."""
        if self.default is not None:
            return (self.default.kernel_name,)
        return tuple(dict.fromkeys(s.kernel_name for s in self.shapes))


@dataclass(frozen=True)
class ExportModel:
    family: Family
    gpu: DeviceIdentity  # the GPU the winners were measured on (its first winner's record)
    arch: str  # nvcc -arch
    entries: tuple[EntryPoint, ...]
    variants: tuple[Variant, ...]
    exported_at: str
    software: dict[str, str] = field(default_factory=dict)  # sanitized version lists
    self_test: bool = False

    @property
    def base(self) -> str:
        return f"autogen_{self.family.symbol}"

    @property
    def cmake_arch(self) -> str:
        return self.arch.removeprefix("sm_")

    @property
    def selftest_hook(self) -> str | None:
        """The family's self-test template (Family.selftest_template), or None when it has none."""
        return self.family.selftest_template

    def file_names(self) -> dict[str, str]:
        names = {"source": f"{self.base}.cu", "header": f"{self.base}.h", "cmake": "CMakeLists.txt",
                 "makefile": "Makefile"}
        if self.self_test:
            names["selftest"] = f"{self.base}_selftest.cu"
            names["selftest_data"] = f"{self.base}_selftest.data"  # autogen.export.selftest_data
        return names


@dataclass(frozen=True)
class ExportRequest:
    family: str
    out: Path
    gpu: str | None = None
    arch: str | None = None
    db_url: str | None = None
    self_test: bool = False
    force: bool = False  # replace files in --out that autogen did not write (write_files)


@dataclass(frozen=True)
class ExportResult:
    model: ExportModel
    out: Path
    files: tuple[Path, ...]
    passed_over: tuple[tuple[str, int], ...] = ()  # other GPUs of the arch: (name, tuned shapes)
    skipped: tuple[str, ...] = ()  # stored winners left out, and why (autogen.catalog.stored)

    def summary(self) -> dict:
        """What was exported, for --json and the text report."""
        model = self.model
        return {
            "family": model.family.name, "gpu": model.gpu.name,
            "compute_capability": model.gpu.compute_capability, "arch": model.arch,
            "out": str(self.out), "files": [str(f) for f in self.files],
            "self_test": model.self_test,
            "self_test_hook": model.selftest_hook is not None,
            "entry_points": [{
                "symbol": e.symbol, "dtype": e.dtype,
                "default": e.default.kernel_name if e.default else None,
                "shapes": [{"shape": s.problem.shape_key, "kernel": s.kernel_name,
                            "time_us": s.time_us, "peer_time_us": s.peer_time_us,
                            "speedup": round(s.speedup, 3) if s.speedup else None} for s in e.shapes],
            } for e in model.entries],
            "variants": [v.kernel_name for v in model.variants],
            "also_tuned_on": [{"gpu": name, "shapes": count} for name, count in self.passed_over],
        }


# -- choosing the GPU and its winners -------------------------------------------------------------


def local_device() -> DeviceIdentity | None:
    """This machine's GPU when CuPy sees one, else None."""
    try:
        return device_identity()
    except GpuUnavailableError:
        return None


def arch_to_cc(arch: str) -> str:
    """sm_90 -> "9.0", sm_120 -> "12.0"; UsageError for anything else."""
    match = ARCH_PATTERN.fullmatch(arch)
    if not match:
        raise UsageError(f"--arch must look like sm_80, sm_90 or sm_90a, not {arch!r}")
    return f"{match[1]}.{match[2]}"


def cc_to_arch(cc: str, gpu_name: str) -> str:
    """"9.0" -> sm_90; a stored compute capability of any other form is refused."""
    match = CC_PATTERN.fullmatch(cc) if isinstance(cc, str) else None
    if not match:
        raise InvalidConfigError(f"GPU {gpu_name!r} in the database has an invalid compute capability {cc!r}")
    return f"sm_{match[1]}{match[2]}"


def choose_target(db: TuningDB, family: Family, gpu: str | None, arch: str | None,
                  detect: Callable[[], DeviceIdentity | None] | None = None,
                  on_skipped: Callable[[str], None] | None = None
                  ) -> tuple[list[WinnerRecord], list[tuple[str, int]]]:
    """The winners to export: those of one GPU, chosen by --gpu, --arch, this machine's GPU
    (`detect`, default local_device), or the database's only GPU. Where several GPUs of one
    architecture match (`--arch sm_90`, an H100 and an H200), the one with the most tuned shapes
    (tuning_db.most_tuned_gpu); the GPUs passed over come back with it. Winners today's family
    cannot render under their stored name (autogen.catalog.stored) are left out: ``on_skipped`` gets each
    one's description and why."""
    cc = arch_to_cc(arch) if arch else None
    if gpu is None and arch is None:
        here = (detect or local_device)()
        if here is not None:
            gpu, cc = here.name, here.compute_capability
    winners, invalid = db.winners_checked(family=family.name, gpu_name=gpu, compute_capability=cc)
    if invalid:  # never export around a row that cannot be read: it may be the one that matters
        more = f" (and {len(invalid) - 1} more invalid row(s))" if len(invalid) > 1 else ""
        raise InvalidConfigError(f"cannot export from {display_url(db.url)}: invalid stored {invalid[0].describe()}"
                                 f"{more}; re-tune that shape or delete the row, or pick another GPU with --gpu "
                                 "or --arch")
    usable, skipped = [], 0
    for w in winners:
        reason = winner_unusable_reason(family, w)
        if reason is None:
            usable.append(w)
            continue
        skipped += 1
        if on_skipped is not None:
            on_skipped(f"{describe(w)}, cache {w.trial.cache_mode!r}: {reason}")
    winners = one_per_problem(usable)  # the cold-cache winner where a shape has both
    if not winners:
        target = " ".join(part for part in (gpu and f"GPU {gpu!r}", cc and f"compute capability {cc}") if part)
        raise NotTunedError(f"nothing tuned for {family.name} on {target} in {display_url(db.url)}"
                            + (f" ({skipped_winners_note(skipped)})" if skipped else "") + "; run "
                            f"`autogen tune {family.name} ...` on that GPU first, or pick another "
                            f"with --gpu or --arch (`autogen list` shows what is stored)")
    devices = sorted({(w.device.name, w.device.compute_capability) for w in winners})
    if len({c for _, c in devices}) > 1:  # the architecture decides the build: never guessed
        listed = "; ".join(f"{name!r} (cc {c}, --arch {cc_to_arch(c, name)})" for name, c in devices)
        raise UsageError(f"{family.name} is tuned on several GPUs matching the request ({listed}); "
                         "pick one with --gpu NAME or --arch sm_XY")
    return most_tuned_gpu(winners)


# -- checking what the database says --------------------------------------------------------------


def describe(winner: WinnerRecord) -> str:
    """The record, named for error messages (repr: stored text may hold anything)."""
    t = winner.trial
    return (f"winner for GPU {winner.device.name!r} (cc {winner.device.compute_capability!r}), "
            f"family {t.family!r}, dtype {t.dtype!r}, shape {t.shape_key!r}")


def check_winner(family: Family, winner: WinnerRecord) -> TunedShape:
    """A TunedShape holding only checked values; InvalidConfigError naming the record otherwise."""
    where = describe(winner)
    problem = _checked_problem(family, winner, where)
    params = winner.trial.params
    if not isinstance(params, dict):
        raise InvalidConfigError(f"{where}: params must be a mapping, not {type(params).__name__}")
    try:
        config = family.space.check(params)
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"{where}: {exc}") from None
    if winner.trial.cache_mode not in ("cold", "hot"):
        raise InvalidConfigError(f"{where}: cache_mode={winner.trial.cache_mode!r} is not cold or hot")
    return TunedShape(
        problem=problem, config=config,
        kernel_name=_identifier(family.kernel_name(problem.dtype, config, problem.traits), where),
        time_us=_positive(winner.trial.time_us, "time_us", where),
        peer_name=comment_text(winner.peer_name) if winner.peer_time_us is not None else "",
        peer_time_us=(None if winner.peer_time_us is None
                      else _positive(winner.peer_time_us, "peer_time_us", where)),
        cache_mode=winner.trial.cache_mode,
        provenance=comment_text(
            f"tuned {winner.updated_at} with autogen {winner.autogen_version or '?'}, driver "
            f"{cuda_version(winner.device.driver_version)}, runtime {cuda_version(winner.device.runtime_version)}, "
            f"NVRTC {winner.device.nvrtc_version}"),
    )


def _checked_problem(family: Family, winner: WinnerRecord, where: str) -> Problem:
    key, dtype = winner.trial.shape_key, winner.trial.dtype
    if dtype not in family.dtypes:
        raise InvalidConfigError(f"{where}: {family.name} has no dtype {dtype!r} (it has {', '.join(family.dtypes)})")
    try:
        dims = parse_shape_key(key) if isinstance(key, str) else None
        names = family.dims + tuple(t.name for t in family.traits)
        if dims is None or tuple(name for name, _ in dims) != names:
            raise ValueError(f"{family.name} shapes name {', '.join(names)} in that order")
        problem = family.problem(dtype, **dict(dims))
    except (ValueError, UsageError) as exc:
        raise InvalidConfigError(f"{where}: bad shape: {exc}") from None
    if problem.shape_key != key:  # "m=016" would alias m=16 in the dispatch table
        raise InvalidConfigError(f"{where}: shape key is not canonical (expected {problem.shape_key!r})")
    return problem


def _positive(value, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidConfigError(f"{where}: {name}={value!r} is not a positive time")
    return float(value)


def _identifier(name: str, where: str) -> str:
    # Names are built from checked choices; this guards against a family whose abbreviations or
    # choices would not make a C identifier.
    if not IDENTIFIER.fullmatch(name):
        raise InvalidConfigError(f"{where}: derived kernel name {name!r} is not a C identifier")
    return name


# -- building the model ---------------------------------------------------------------------------


def entry_symbol(family: Family, dtype: str, traits: tuple[tuple[str, str], ...] = ()) -> str:
    """autogen_<family> for the first dtype, autogen_<family>_<tag> for the others (or for every
    dtype, with Family.export_names_dtype), then the trait values: autogen_gelu_f16_tanh."""
    parts = [f"autogen_{family.symbol}"]
    if dtype != family.dtypes[0] or family.export_names_dtype:
        parts.append(DTYPES[dtype].tag)
    parts += [value for _name, value in traits]
    return "_".join(parts)


def c_arg_names(c_params: str, family: Family) -> tuple[str, ...]:
    """The parameter names of a C parameter list; each dim must be one of them, as `int <dim>`."""
    params = c_param_list(c_params, family.name)
    declared_ints = {p.name for p in params if p.ctype == "int"}
    missing = [d for d in family.dims if d not in declared_ints]
    if missing:
        raise UsageError(f"{family.name}: c_params must declare every dimension as `int <dim>`; "
                         f"missing {', '.join(missing)}")
    return tuple(p.name for p in params)


def nearest_index(family: Family, shapes: Sequence[Problem], query: Problem) -> int:
    """The rule of autogen.runtime.dispatch that the generated C follows: the nearest tuned shape by
    problem.nearest (log2 distance, a tie going to the smaller shape key). The C table is sorted
    by shape key, so there a tie goes to the earlier row."""
    return nearest(query, range(len(shapes)), lambda i: shapes[i])[0]


def _variant(family: Family, dtype: str, config: Config, traits: tuple = ()) -> Variant:
    name = family.kernel_name(dtype, config, traits)
    return Variant(dtype, config, name, render(family, dtype, config, host_launcher=True, traits=traits))


def build_model(family: Family, winners: Sequence[WinnerRecord], arch: str | None,
                self_test: bool = False) -> ExportModel:
    """Check every winner, then lay out entry points and distinct variants."""
    gpu = winners[0].device
    arch = arch or cc_to_arch(gpu.compute_capability, gpu.name)
    tuned = [check_winner(family, w) for w in winners]  # every record checked before any render
    entries, variants = [], {}
    trait_sets = [tuple(zip((t.name for t in family.traits), values))
                  for values in itertools.product(*(t.choices for t in family.traits))]
    for dtype, traits in itertools.product(family.dtypes, trait_sets):
        if family.traits_reason(dtype, traits):
            continue  # no such problem: no entry point
        # Sorted by shape key: the Python dispatcher breaks distance ties by the smaller key.
        shapes = tuple(sorted((s for s in tuned if s.problem.dtype == dtype and s.problem.traits == traits),
                              key=lambda s: s.problem.shape_key))
        default = None
        if shapes:
            for shape in shapes:
                if shape.kernel_name not in variants:
                    variants[shape.kernel_name] = _variant(family, dtype, shape.config, traits)
        else:
            default_config = family.default_config()
            name = family.kernel_name(dtype, default_config, traits)
            if name not in variants:
                variants[name] = _variant(family, dtype, default_config, traits)
            default = variants[name]
        c_params = family.c_params_for(dtype)
        entries.append(EntryPoint(entry_symbol(family, dtype, traits), dtype, c_params,
                                  c_arg_names(c_params, family), shapes, default, traits))
    software = {
        "driver": ", ".join(sorted({cuda_version(w.device.driver_version) for w in winners})),
        "runtime": ", ".join(sorted({cuda_version(w.device.runtime_version) for w in winners})),
        "nvrtc": ", ".join(sorted({comment_text(w.device.nvrtc_version) for w in winners})),
        "autogen": ", ".join(sorted({comment_text(w.autogen_version or "?") for w in winners})),
    }
    return ExportModel(family, gpu, arch, tuple(entries), tuple(variants.values()),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"), software, self_test)


# -- rendering and writing ------------------------------------------------------------------------


def render_files(model: ExportModel) -> dict[str, str | bytes]:
    """File name -> text (bytes for the self-test's data), for every file of the export."""
    names = model.file_names()
    data = selftest_data.build(model.family, model.entries) if model.self_test else None
    variables = {
        "data": data, "c_param_list": lambda entry: c_param_list(entry.c_params, model.family.name),
        "model": model, "family": model.family, "names": names, "autogen_version": __version__,
        "gpu_name": comment_text(model.gpu.name), "gpu_name_literal": c_string(model.gpu.name),
        "dims": model.family.dims, "selftest_hook": model.selftest_hook, "comment": comment_text,
        "c_headers": [h for h in model.family.c_headers if h != "cuda_runtime.h"],
        # The family's own compiler options, in nvcc's spelling: the kernels build as they were tuned.
        "cxx_std": language_std(model.family.compiler_options),
        "kernel_flags": " ".join(nvcc_flags(model.family.compiler_options)),
    }
    templates = {"source": "export/kernels.cu.j2", "header": "export/header.h.j2",
                 "cmake": "export/CMakeLists.txt.j2", "makefile": "export/Makefile.j2",
                 "selftest": "export/selftest.cu.j2"}
    files = {names[role]: render_template(templates[role], variables, model.family)
             for role in names if role != "selftest_data"}
    if data is not None:
        files[names["selftest_data"]] = data.blob
    return files


def export(request: ExportRequest, detect: Callable[[], DeviceIdentity | None] | None = None) -> ExportResult:
    """The whole command: select, check, render, write."""
    family = get_family(request.family)
    check_family_renders(family)
    arch = request.arch
    if arch is not None:
        arch_to_cc(arch)  # a malformed --arch is a usage error before the database is opened
    out = Path(request.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    skipped = []
    with TuningDB(request.db_url, readonly=True) as db:  # export only reads: nothing is created
        try:
            winners, passed_over = choose_target(db, family, request.gpu, arch, detect, skipped.append)
        except NotTunedError:
            # Nothing of the user's own: export what autogen ships (a fresh machine, no GPU).
            shipped = pretuned_db()
            if shipped is None or not shipped.winners(family=family.name):
                raise
            winners, passed_over = choose_target(shipped, family, request.gpu, arch, detect, skipped.append)
    model = build_model(family, winners, arch, request.self_test)
    files = render_files(model)
    return ExportResult(model, out, write_files(files, out, request.force), tuple(passed_over), tuple(skipped))
