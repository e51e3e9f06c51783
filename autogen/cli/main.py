"""The `autogen` command. Results go to stdout (--json for machines); progress and errors to stderr.

Exit codes: 0 success, 1 failure (no GPU, database trouble, nothing tuned), 2 usage error,
130 interrupted, 141 stdout's reader went away (`autogen list --json | head`), as for a process
that SIGPIPE ends.

Every usage error is one line on stderr, argparse's own (a bad choice, an unknown flag) included,
and an option that takes a value is refused when given twice rather than its last value kept.

The family is the first word after `tune`, `bench` and `show`; the parser is then built for that
family alone, so `autogen tune sgemv --help` lists sgemv's dimensions, traits and dtypes only, and
a user's family (`autogen tune mykernels.axpy ...`) gets its own flags the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autogen._version import __version__
from autogen.cli.commands import cmd_bench, cmd_db, cmd_export, cmd_list, cmd_show
from autogen.cli.kernel_commands import add_commands as add_kernel_commands, cmd_check, cmd_tune_kernel
from autogen.cli.options import (check_db_url, dim_flag, int_list, MAX_SHAPES_BYTES, signed_int, strict_float,
                                 strict_int, trait_text)
from autogen.cli.tune_model import cmd_tune_model
from autogen.cli.tuning import cmd_tune
from autogen.core.registry import all_families, get_family
from autogen.errors import AutogenError, UsageError
from autogen.gpu import stack_record
from autogen.paths import installed_file
from autogen.report import terminal_text
from autogen.search.lease import MAX_LEASE_S
from autogen.torch.models import PRESETS

FAMILY_COMMANDS = ("tune", "bench", "show")
COMMANDS = ("tune", "bench", "list", "show", "export", "db", "tune-model", "tune-kernel", "check")
STDOUT_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a process that SIGPIPE ended


class CommandLineError(UsageError):
    """What argparse itself found wrong, said in one line by main() with where to find help."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


_GIVEN = "_autogen_options_given"  # the namespace's record for _StoreOnce, removed after parsing


class _StoreOnce(argparse._StoreAction):
    """An option's value, refused when the option is given twice (`--m 1024 --m 2048`,
    `--db a --db b`): argparse would silently keep the last."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given more than once; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (CommandLineError instead of a usage block and SystemExit)
    and _StoreOnce for every option that takes a value; its subcommands' parsers are the same."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        namespace.__dict__.pop(_GIVEN, None)
        return namespace, extras

    def error(self, message: str):
        raise CommandLineError(self.prog, message)


def _by(parse, option: str):
    """argparse's type for `option`: `parse(text, option)`, which raises UsageError naming it."""
    return lambda text: parse(text, option)


def _literal(text: str) -> str:
    """Text a family supplies, as argparse shows it literally: argparse %-formats every
    argument's help, so a '%' in it (a family's, a user family's) would break --help."""
    return text.replace("%", "%%")


def _literal_description(text: str) -> str:
    # argparse %-formats a description only where it holds '%(prog)'
    return _literal(text) if "%(prog)" in text else text


def _family_names() -> str:
    return ", ".join(all_families())


def _add_family_args(parser: argparse.ArgumentParser, family, many: bool = False) -> None:
    parser.add_argument("family", help=_literal(f"kernel family: {_family_names()}, or a user family "
                                                "<package>.<name>; `autogen COMMAND FAMILY --help` lists its options"))
    if family is None:
        return
    group = parser.add_argument_group(f"{family.name}", _literal_description(family.description or "") or None)
    for dim in family.dims:
        flag = dim_flag(dim)
        group.add_argument(flag, dest=dim, metavar="N" + (",N..." if many else ""),
                           type=(lambda text, f=flag: int_list(text, f)) if many else (lambda text, f=flag: strict_int(text, f)),
                           help=_literal(f"size of {dim}" + (" (several: comma-separated; tunes every combination)"
                                                             if many else "")))
    for trait in family.traits:
        flag = dim_flag(trait.name)
        group.add_argument(flag, dest=trait.name, metavar=trait.name.upper(),
                           type=lambda text, f=flag, t=trait: trait_text(text, t, f),
                           help=_literal(f"{trait.help} (one of {', '.join(trait.choices)}; default {trait.choices[0]})"))
        if trait.switch:
            group.add_argument(dim_flag(trait.switch), dest=trait.name, action="store_const", const=trait.choices[1],
                               help=_literal(f"the same as {flag} {trait.choices[1]}"))
    group.add_argument("--dtype", choices=family.dtypes, help=_literal(f"element type (default {family.dtypes[0]})"))
    if many:
        group.add_argument("--shapes", type=Path, metavar="FILE",
                           help=_literal(f"tune every shape in FILE (a regular file, at most "
                                         f"{MAX_SHAPES_BYTES // 2**20} MiB): one per line, e.g. "
                                         + "'" + " ".join(f"{d}=64" for d in family.dims) + "'"))


def _add_db_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL",
                        help="database URL or SQLite file (default: $AUTOGEN_DB, else ~/.cache/autogen/tuning.db)")


def _add_tune_options(parser: argparse.ArgumentParser) -> None:
    """The options of a search (tune, tune-model)."""
    parser.add_argument("--trials", type=_by(signed_int, "--trials"), default=60, help="variants to measure (default 60)")
    parser.add_argument("--timeout", type=_by(strict_float, "--timeout"), help="stop searching after this many seconds")
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random", "exhaustive"])
    parser.add_argument("--seed", type=_by(signed_int, "--seed"), default=0, help="sampler seed, 0 to 2^32-1 (default 0)")
    parser.add_argument("--cache", default="cold", choices=["cold", "hot"],
                        help="cold: rotate input sets larger than 4x L2 (default); hot: one set")
    parser.add_argument("--workers", type=_by(signed_int, "--workers"),
                        help="compile processes per GPU (default: half the cores, shared among the GPUs; at most 8 a GPU)")
    parser.add_argument("--no-warm-start", action="store_true", help="do not seed from nearby tuned shapes")
    parser.add_argument("--eval-timeout", type=_by(strict_float, "--eval-timeout"), default=60.0,
                        help="seconds before a variant counts as hung")
    parser.add_argument("--refresh", action="store_true",
                        help="re-time a stale winner's best few trials in this environment (driver, runtime, NVRTC, "
                             "autogen or template changed) instead of searching")
    parser.add_argument("--gpus", metavar="all|N,N...",
                        help="tune on these GPUs of this machine, one isolated evaluator each: problems "
                             "are spread over them, and a problem's trials too when problems run out "
                             "(default: the current GPU)")
    parser.add_argument("--lease", type=_by(strict_float, "--lease"), default=60.0, metavar="S",
                        help="a worker that stops (killed, machine lost) has its variants taken over by "
                             "the others sharing the database this long after its last heartbeat (default 60, "
                             f"at most {MAX_LEASE_S:g}; a claim holding more is taken over)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_db_arg(parser)


def _model_presets() -> list[str]:
    return list(PRESETS)


def build_parser(family=None) -> argparse.ArgumentParser:
    parser = _Parser(prog="autogen", description="Code-generating CUDA kernel autotuner.")
    parser.add_argument("--version", action="version", version=f"autogen {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tune = subcommands.add_parser("tune", help="search a family's variants for a shape and store the winner")
    _add_family_args(tune, family, many=True)
    _add_tune_options(tune)

    tune_model = subcommands.add_parser(
        "tune-model", help="tune every decode-time problem of a model (a Hugging Face config.json or a preset)")
    tune_model.add_argument("config", metavar="CONFIG",
                            help="a config.json (or its folder), or a preset: " + ", ".join(_model_presets()))
    tune_model.add_argument("--batch", type=_by(int_list, "--batch"), default=[1, 2, 4, 8], metavar="N,N...",
                            help="decode batch sizes (tokens per step; default 1,2,4,8)")
    tune_model.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                            help="weight dtype (default: the config's torch_dtype, else bfloat16)")
    tune_model.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML page of the results")
    _add_tune_options(tune_model)

    bench = subcommands.add_parser("bench", help="re-measure the stored winner against the peer")
    _add_family_args(bench, family)
    bench.add_argument("--cache", default="cold", choices=["cold", "hot"])
    bench.add_argument("--json", action="store_true")
    _add_db_arg(bench)

    listing = subcommands.add_parser("list", help="what is tuned, per GPU, family and shape (the shipped catalog too)")
    listing.add_argument("--family", help="only this family")
    listing.add_argument("--json", action="store_true")
    _add_db_arg(listing)

    show = subcommands.add_parser("show", help="one stored entry: parameters, source, provenance")
    _add_family_args(show, family)
    show.add_argument("--gpu", help="GPU name (default: this machine's GPU; else, where several are stored, the one "
                                    "with the most tuned shapes of the family)")
    show.add_argument("--arch", help="only winners of this architecture, e.g. sm_90")
    show.add_argument("--json", action="store_true")
    show.add_argument("--resources", action="store_true",
                      help="also compile the kernel with nvcc for the GPU it was tuned on and report ptxas's "
                           "registers, spills, stack frame, static shared memory and barriers (no GPU needed)")
    _add_db_arg(show)

    export = subcommands.add_parser("export", help="write the tuned kernels as standalone CUDA C++ with build files")
    export.add_argument("family", help=f"kernel family: {_family_names()}")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="folder to write into (created if missing; fixed file names, never outside it)")
    export.add_argument("--force", action="store_true",
                        help="write into a folder holding files autogen did not write, replacing those of "
                             "the export's file names (without it such a folder is refused)")
    export.add_argument("--gpu", help="export the winners of this GPU name (default: this machine's GPU; else, "
                                      "where several of one architecture are stored, the one with the most tuned "
                                      "shapes of the family)")
    export.add_argument("--arch", help="export the winners of this architecture, e.g. sm_90; also the nvcc arch")
    export.add_argument("--self-test", action="store_true",
                        help="also write a C++ self-test program (make selftest) that validates and times the export")
    export.add_argument("--json", action="store_true", help="print what was exported as JSON")
    _add_db_arg(export)

    add_kernel_commands(subcommands, _add_db_arg)  # tune-kernel, check

    db = subcommands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="apply schema migrations")
    _add_db_arg(upgrade)
    return parser


def _named_family(argv: list[str]):
    """The family a family command names, or None (no such command, or no family given yet)."""
    if len(argv) >= 2 and argv[0] in FAMILY_COMMANDS and not argv[1].startswith("-"):
        return get_family(argv[1])
    return None


# Commands that ask the GPU's driver for the device (tune and bench, cold or answered from the
# database): its initialisation (cuInit, a large share of a warm command) is started first, on a
# thread, and where no stack record holds, the child process that makes one.
GPU_COMMANDS = ("tune", "bench", "tune-model", "tune-kernel")


def _start_gpu_preparation() -> None:
    """cuInit on a daemon thread, while the main thread imports the tuner and the database layers
    (ctypes releases the GIL while the driver initialises). Where autogen.gpu.stack_record holds,
    the main process needs no CuPy to name the GPU (its GPU worker imports its own); where it does
    not, a child process asks CuPy (autogen.gpu.stack_record.record_in_background), so that CuPy's
    import and its search of the disk for NVRTC (several times slower on a machine just started:
    docs/history/sessions.md, eighth and ninth sessions) run beside this process's imports
    instead of taking turns with them for the GIL. Where there is no driver or no CuPy nothing
    happens here: the command says so."""
    import ctypes
    import threading

    try:
        driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    except OSError:
        return  # no driver: the command says so
    threading.Thread(target=driver.cuInit, args=(0,), name="autogen-gpu-preparation", daemon=True).start()
    if installed_file("cupy") is not None and stack_record.recall() is None:
        stack_record.record_in_background()


HANDLERS = {"tune": cmd_tune, "tune-model": cmd_tune_model, "bench": cmd_bench, "list": cmd_list, "show": cmd_show,
            "export": cmd_export, "db": cmd_db, "tune-kernel": cmd_tune_kernel, "check": cmd_check}


def run(args) -> int:
    """Run the parsed command."""
    if hasattr(args, "db"):
        args.db = check_db_url(args.db)
    return HANDLERS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in GPU_COMMANDS and "--help" not in argv and "-h" not in argv:
        _start_gpu_preparation()
    family = None
    try:
        family = _named_family(argv)
        args = build_parser(family).parse_args(argv)
        args.family_object = family
        return run(args)
    except CommandLineError as exc:
        print(f"{exc.prog}: error: {_one_line(exc)} (see {_help_command(argv, family)})", file=sys.stderr)
        return exc.exit_code
    except AutogenError as exc:
        print(f"autogen: error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autogen: interrupted; completed trials are stored, run the same command to continue",
              file=sys.stderr)
        return 130
    except Exception as exc:
        from tuning_db import DatabaseError
        if isinstance(exc, DatabaseError):
            print(f"autogen: database error: {_one_line(exc)}", file=sys.stderr)
            return 1
        raise


def _help_command(argv: list[str], family) -> str:
    """The --help that documents what `argv` was trying to do."""
    words = ["autogen"]
    if argv and argv[0] in COMMANDS:
        words.append(argv[0])
        if family is not None:
            words.append(family.name)
        elif argv[0] == "db" and argv[1:2] == ["upgrade"]:
            words.append("upgrade")
    return " ".join(words + ["--help"])


def entry() -> None:
    """The `autogen` command (and `python -m autogen`): main(), then leave at once. By then every
    result is committed and every output written; the interpreter's own teardown after a tune
    (modules, CuPy, SQLAlchemy's pools) is time the user waits for nothing.

    A reader of stdout that went away (`autogen list --json | head`) ends the command quietly:
    what is left unwritten is dropped (os._exit flushes nothing), no traceback is printed."""
    try:
        try:
            code = main()
        except SystemExit as exc:  # --help and --version, written by argparse
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        sys.stdout.flush()
    except BrokenPipeError:
        code = STDOUT_CLOSED
    try:
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a reader that went away, or a closed stream
        pass
    _release_kept_processes()
    os._exit(code)


def _release_kept_processes() -> None:
    """Stop the GPU worker and the compile pool a tune keeps for its next problem, the pool's
    processes joined. os._exit runs none of multiprocessing's exit hooks, so the pool's semaphores
    were left registered, and multiprocessing's resource tracker, which outlives this process,
    printed a warning about leaked semaphores on the user's terminal after the command had ended.
    Nothing to do for a command that started no GPU work (the module is not even imported)."""
    backend = sys.modules.get("autogen.gpu.backend")
    if backend is not None:
        backend.release_kept()


def _one_line(exc: BaseException) -> str:
    return terminal_text(" ".join(str(exc).split()) or type(exc).__name__)


if __name__ == "__main__":
    sys.exit(main())
