"""The `autogen` command. Results go to stdout (--json for machines); progress and errors to stderr.

Exit codes: 0 success, 1 failure (no GPU, database trouble, nothing tuned), 2 usage error,
130 interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from . import __version__
from .errors import AutogenError, UsageError
from .family import all_families, get_family

FAMILIES = all_families()
# Every dimension flag any family uses; each family says which it needs.
DIM_FLAGS = sorted({d for family in FAMILIES.values() for d in family.dims})


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _add_problem_args(parser: argparse.ArgumentParser, many: bool = False) -> None:
    parser.add_argument("family", help=f"kernel family: {', '.join(sorted(FAMILIES))}")
    for dim in DIM_FLAGS:
        parser.add_argument(f"--{dim}", type=_int_list if many else int, metavar="N" + (",N..." if many else ""),
                            help=f"size of dimension {dim}" + (" (several: comma-separated)" if many else ""))
    parser.add_argument("--dtype", help="element type (default: the family's first)")
    if many:
        parser.add_argument("--shapes", type=Path, metavar="FILE",
                            help="tune every shape in FILE: one per line, e.g. 'm=4096 n=16'")


def _add_db_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="URL",
                        help="database URL or SQLite file (default: $AUTOGEN_DB, else ~/.cache/autogen/tuning.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autogen", description="Code-generating CUDA kernel autotuner.")
    parser.add_argument("--version", action="version", version=f"autogen {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tune = commands.add_parser("tune", help="search a family's variants for a shape and store the winner")
    _add_problem_args(tune, many=True)
    tune.add_argument("--trials", type=int, default=60, help="variants to measure (default 60)")
    tune.add_argument("--timeout", type=float, help="stop searching after this many seconds")
    tune.add_argument("--sampler", default="tpe", choices=["tpe", "random", "exhaustive"])
    tune.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    tune.add_argument("--cache", default="cold", choices=["cold", "hot"],
                      help="cold: rotate input sets larger than 4x L2 (default); hot: one set")
    tune.add_argument("--workers", type=int, help="compile processes (default: one per core)")
    tune.add_argument("--no-warm-start", action="store_true", help="do not seed from nearby tuned shapes")
    tune.add_argument("--eval-timeout", type=float, default=60.0, help="seconds before a variant counts as hung")
    tune.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_db_arg(tune)

    bench = commands.add_parser("bench", help="re-measure the stored winner against the peer")
    _add_problem_args(bench)
    bench.add_argument("--cache", default="cold", choices=["cold", "hot"])
    bench.add_argument("--json", action="store_true")
    _add_db_arg(bench)

    listing = commands.add_parser("list", help="what is tuned, per GPU, family and shape")
    listing.add_argument("--family", help="only this family")
    listing.add_argument("--json", action="store_true")
    _add_db_arg(listing)

    show = commands.add_parser("show", help="one stored entry: parameters, source, provenance")
    _add_problem_args(show)
    show.add_argument("--gpu", help="GPU name (default: this machine's GPU, else the only one stored)")
    show.add_argument("--json", action="store_true")
    _add_db_arg(show)

    export = commands.add_parser("export", help="write the tuned kernels as standalone CUDA C++ with build files")
    export.add_argument("family", help=f"kernel family: {', '.join(sorted(FAMILIES))}")
    export.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="folder to write into (created if missing; fixed file names, never outside it)")
    export.add_argument("--gpu", help="export the winners of this GPU name (default: this machine's GPU, "
                                      "else the only one stored)")
    export.add_argument("--arch", help="export the winners of this architecture, e.g. sm_90; also the nvcc arch")
    export.add_argument("--self-test", action="store_true",
                        help="also write a C++ self-test program (make selftest) that validates and times the export")
    export.add_argument("--json", action="store_true", help="print what was exported as JSON")
    _add_db_arg(export)

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_commands.add_parser("upgrade", help="apply schema migrations")
    _add_db_arg(upgrade)
    return parser


def problems_from_args(args) -> list:
    """Every Problem the arguments name: the product of comma lists, plus --shapes lines."""
    family = get_family(args.family)
    shapes: list[dict[str, int]] = []
    if getattr(args, "shapes", None):
        shapes += _read_shapes_file(args.shapes, family)
    given = {d: getattr(args, d) for d in family.dims if getattr(args, d, None) is not None}
    stray = [d for d in DIM_FLAGS if d not in family.dims and getattr(args, d, None) is not None]
    if stray:
        raise UsageError(f"{family.name} takes {', '.join('--' + d for d in family.dims)}, not "
                         f"{', '.join('--' + d for d in stray)}")
    if given:
        missing = [d for d in family.dims if d not in given]
        if missing:
            raise UsageError(f"{family.name} needs {', '.join('--' + d for d in missing)}")
        lists = [v if isinstance(v, list) else [v] for v in given.values()]
        shapes += [dict(zip(given, combo)) for combo in itertools.product(*lists)]
    if not shapes:
        raise UsageError(f"{family.name} needs {', '.join('--' + d for d in family.dims)}")
    return [family.problem(args.dtype, **shape) for shape in shapes]


def _read_shapes_file(path: Path, family) -> list[dict[str, int]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read --shapes file {path}: {exc.strerror}") from None
    shapes = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            shapes.append({k: int(v) for k, v in (item.split("=", 1) for item in line.replace(",", " ").split())})
        except ValueError:
            raise UsageError(f"{path}:{number}: expected 'name=size ...', got {line!r}") from None
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from . import commands  # imported late: `autogen --help` needs no database or GPU libraries

    try:
        return commands.run(args)
    except AutogenError as exc:
        print(f"autogen: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("autogen: interrupted; completed trials are stored, run the same command to continue",
              file=sys.stderr)
        return 130
    except Exception as exc:
        from tuning_db import DatabaseError
        if isinstance(exc, DatabaseError):
            print(f"autogen: database error: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
