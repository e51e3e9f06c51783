"""Command-line values, parsed strictly and checked before any GPU work.

Every function raises UsageError (exit status 2) with a message that names the option and says
what was expected. Numbers are plain ASCII: `16_384`, Arabic-Indic or full-width digits, which
Python's int() and float() would accept, are refused, as are empty items of a list (`--m 4,,8`).
"""

from __future__ import annotations

import itertools
import math
import os
import re
import stat
from pathlib import Path
from urllib.parse import parse_qsl

from autogen.core.problem import Problem
from autogen.core.registry import check_family_renders, get_family
from autogen.distributed.gpu_option import parse_gpus
from autogen.errors import UsageError
from autogen.search.lease import check_lease

DIGITS = re.compile(r"[0-9]+")
SIGNED_DIGITS = re.compile(r"-?[0-9]+")
MAX_SEED = 2**32 - 1  # Optuna's samplers seed NumPy, which takes 32-bit seeds
# A --shapes file is read whole; one shape a line is a few dozen bytes, so this holds tens of
# thousands of shapes while /dev/zero, say, is refused at once rather than read without end.
MAX_SHAPES_BYTES = 1 << 20


def dim_flag(name: str) -> str:
    """The command-line flag of a dimension or trait: bias_size -> --bias-size."""
    return "--" + name.replace("_", "-")


def strict_int(text: str, option: str, signed: bool = False) -> int:
    if not (SIGNED_DIGITS if signed else DIGITS).fullmatch(text):
        raise UsageError(f"{option} expects a whole number written with the digits 0-9, got {text!r}")
    return int(text)


def signed_int(text: str, option: str) -> int:
    """A whole number with an optional minus sign (the caller checks the range and says it)."""
    return strict_int(text, option, signed=True)


def strict_float(text: str, option: str) -> float:
    """A number written in ASCII (the caller checks the range: nan and inf reach it)."""
    try:
        if text.isascii() and "_" not in text:
            return float(text)
    except ValueError:
        pass
    raise UsageError(f"{option} expects a number written with the digits 0-9, got {text!r}")


def trait_text(text: str, trait, option: str) -> str:
    """A trait's value as given (Trait.value checks it later): one of its choices, or ASCII text
    for its parser (`--selectivity 0.5`), never full-width or other non-ASCII digits."""
    if text in trait.choices or text.isascii():
        return text
    raise UsageError(f"{option} expects one of {', '.join(trait.choices)} or ASCII text, got {text!r}")


def int_list(text: str, option: str) -> list[int]:
    """'4096,16384' -> [4096, 16384]; every item a plain number, none empty."""
    items = text.split(",")
    if any(not item.strip() for item in items):
        raise UsageError(f"{option} has an empty item in {text!r}; write numbers separated by single commas")
    return [strict_int(item.strip(), option) for item in items]


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


def _sqlite_target(text: str) -> tuple[str, dict[str, str]] | None:
    """(database, its URL's query in lower case) of a SQLite --db (a sqlite:/// URL or a bare file
    path); None for another kind of database."""
    if "://" not in text:
        return os.path.expanduser(text), {}
    scheme, _, rest = text.partition("://")
    if scheme.split("+")[0].lower() != "sqlite":
        return None
    database, _, query = rest[1:].partition("?")
    return database, {key.lower(): value.lower() for key, value in parse_qsl(query)}


def check_storing_db(text: str | None, command: str) -> None:
    """A --db that `command` stores into: not an in-memory database (all it stored would be gone
    when the command ends) nor one its URL opens read-only (`?mode=ro`, `?immutable=1`), which
    SQLite's driver ignores unless the URL also says `uri=true`, and writes to anyway."""
    target = _sqlite_target(text) if text is not None else None
    if target is None:
        return
    database, query = target
    if database == ":memory:" or database.startswith("file::memory:") or query.get("mode") == "memory":
        raise UsageError(f"--db {text!r} is an in-memory database: what {command} stores would be lost when it "
                         "ends; give a database file")
    if query.get("mode") == "ro" or query.get("immutable", "0") not in ("0", "false", "no", "off"):
        raise UsageError(f"--db {text!r} asks for a read-only database, but {command} stores its results; "
                         "give one it may write")


def missing_sqlite_file(text: str | None) -> Path | None:
    """The SQLite file a --db names, where it does not exist; None otherwise and for other
    databases (in memory, a URI filename, another dialect)."""
    target = _sqlite_target(text) if text else None
    if target is None or target[0] in ("", ":memory:") or target[0].startswith("file:"):
        return None
    path = Path(target[0])
    return None if path.exists() else path


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
    raw = _read_shapes_bytes(path)
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


def _read_shapes_bytes(path: Path) -> bytes:
    """The --shapes file's bytes: a regular file of at most MAX_SHAPES_BYTES. A device
    (/dev/zero) would be read without end and a FIFO would wait for a writer: both refused. It
    is opened without waiting (O_NONBLOCK) and checked once open, so it cannot change in between."""
    limit = f"{MAX_SHAPES_BYTES // 2**20} MiB"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise UsageError(f"cannot read --shapes file {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"--shapes {path} is not a regular file; give a text file of shapes")
        with os.fdopen(os.dup(fd), "rb") as file:
            raw = file.read(MAX_SHAPES_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read --shapes file {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_SHAPES_BYTES:
        raise UsageError(f"--shapes file {path} is larger than {limit}, the limit of a shapes file")
    return raw


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


def family_of(args):
    """The family a command names; a user's is checked to render first (check_family_renders)."""
    family = args.family_object or get_family(args.family)
    check_family_renders(family)
    return family
