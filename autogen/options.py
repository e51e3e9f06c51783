"""Command-line values, parsed strictly and checked before any GPU work.

Every function raises UsageError (exit status 2) with a message that names the option and says
what was expected. Integers are plain ASCII digits: `16_384` and full-width digits, which
Python's int() would accept, are refused, as are empty items of a list (`--m 4,,8`).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

from .errors import UsageError
from .problem import Problem

DIGITS = re.compile(r"[0-9]+")
MAX_SEED = 2**32 - 1  # Optuna's samplers seed NumPy, which takes 32-bit seeds


def dim_flag(name: str) -> str:
    """The command-line flag of a dimension or trait: bias_size -> --bias-size."""
    return "--" + name.replace("_", "-")


def strict_int(text: str, option: str) -> int:
    if not DIGITS.fullmatch(text):
        raise UsageError(f"{option} expects a whole number written with the digits 0-9, got {text!r}")
    return int(text)


def int_list(text: str, option: str) -> list[int]:
    """'4096,16384' -> [4096, 16384]; every item a plain number, none empty."""
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise UsageError(f"{option} has an empty item in {text!r}; write numbers separated by single commas")
    return [strict_int(item.strip(), option) for item in items]


# The longest lease a worker may take (--lease): a worker killed holding a claim delays the
# others by at most this. A claim read with more time left than this was not written by a
# worker keeping to it, and is taken over like a lapsed one (autogen.search).
MAX_LEASE_S = 3600.0


def check_lease(lease_s: float) -> None:
    """--lease: at least 2 s (a worker beats six times a lease), at most MAX_LEASE_S."""
    if not 2 <= lease_s <= MAX_LEASE_S:  # NaN fails too
        raise UsageError(f"--lease must be between 2 and {MAX_LEASE_S:g} seconds, got {lease_s:g}")


def check_tune_options(args) -> None:
    """The options of `autogen tune`, checked on any machine before the GPU is looked for."""
    if args.trials is not None and args.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {args.trials}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {args.workers}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and {MAX_SEED}, got {args.seed}")
    for option, value in (("--timeout", args.timeout), ("--eval-timeout", args.eval_timeout)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{option} must be a positive number of seconds, got {value}")
    lease = getattr(args, "lease", None)
    if lease is not None:
        check_lease(lease)
    if getattr(args, "gpus", None) is not None:
        from .distributed import parse_gpus
        parse_gpus(args.gpus)


def check_db_url(text: str | None, option: str = "--db") -> str | None:
    """A database URL or SQLite file path that cannot be misread. `sqlite:` with no path or with
    one slash would otherwise become a file named `sqlite:...` in the working folder."""
    if text is None:
        return None
    if not text.strip():
        raise UsageError(f"{option} is empty; give a SQLAlchemy URL or a SQLite file path")
    if text.startswith("sqlite:"):
        path = text[len("sqlite:"):]
        if not path.startswith("///") or not path[3:].strip():
            raise UsageError(f"{option} {text!r} is not a SQLite URL: write sqlite:///relative/path.db or "
                             "sqlite:////absolute/path.db (or give the file path alone)")
    elif "://" not in text and ":" in text.split("/")[0]:
        raise UsageError(f"{option} {text!r} looks like a URL without '://'; write dialect://... or a file path")
    return text


def check_export_out(out: Path | str) -> Path:
    text = str(out)
    if not text.strip():
        raise UsageError("--out is empty; give the folder to write the export into")
    path = Path(text)
    if path.resolve() == Path(path.resolve().anchor):
        raise UsageError(f"--out {text!r} is the root of the file system; give a folder of its own")
    return path


def read_shapes_file(path: Path, family) -> list[dict[str, int | str]]:
    """Lines like 'm=4096 n=16' (commas or spaces between items, '#' starts a comment)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --shapes file {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--shapes file {path} is not UTF-8 text (byte {exc.start})") from None
    traits = {t.name: t for t in family.traits}
    shapes = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        shape: dict[str, int | str] = {}
        for item in line.replace(",", " ").split():
            name, equals, value = item.partition("=")
            if not equals or not name:
                raise UsageError(f"{path}:{number}: expected 'name=size ...', got {line!r}")
            if name in shape:
                raise UsageError(f"{path}:{number}: {name} is given twice on one line")
            if name in traits:
                shape[name] = value
            else:
                try:
                    shape[name] = strict_int(value, f"{path}:{number}: {name}")
                except UsageError as exc:
                    raise UsageError(f"{exc}; expected 'name=size ...'") from None
        shapes.append(shape)
    return shapes


def problems_from_args(args, family) -> list[Problem]:
    """Every Problem the arguments name, each once, in order: --shapes lines, then the product of
    the comma lists of the dimension flags (traits take one value each)."""
    shapes: list[dict] = []
    if getattr(args, "shapes", None):
        shapes += read_shapes_file(args.shapes, family)
    given = {d: getattr(args, d) for d in family.dims if getattr(args, d, None) is not None}
    traits = {t.name: getattr(args, t.name) for t in family.traits if getattr(args, t.name, None) is not None}
    if given:
        missing = [d for d in family.dims if d not in given and d not in family.dim_defaults]
        if missing:
            raise UsageError(f"{family.name} needs {', '.join(dim_flag(d) for d in missing)}")
        lists = [v if isinstance(v, list) else [v] for v in given.values()]
        shapes += [dict(zip(given, combo)) for combo in itertools.product(*lists)]
    if not shapes:
        raise UsageError(f"{family.name} needs {', '.join(dim_flag(d) for d in family.dims)}")
    problems = [family.problem(args.dtype, **{**traits, **shape}) for shape in shapes]
    return list(dict.fromkeys(problems))  # a shape given twice is tuned once
