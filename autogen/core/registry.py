"""The registry that finds families: built-in ones (every module of autogen.families, imported on
first use), a user's (registered with @autogen.register, found again by module path), and an
installed package's (the entry-point group `autogen.families`). Core modules never name a
family: they ask here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import importlib
import re
import sys
from importlib import metadata


from autogen.core import compiler_options
from autogen.core.dtypes import DTYPES
from autogen.core.signature import check_signature
from autogen.core.space import Space
from autogen.errors import AutogenError, describe_family, FamilyError, InvalidConfigError, UsageError

if TYPE_CHECKING:  # the registry holds families; it needs their class for annotations only
    from autogen.core.family import Family

ENTRY_POINT_GROUP = "autogen.families"
BUILTIN_PACKAGE = "autogen.families"

_REGISTRY: dict[str, Family] = {}
_LISTENERS: list[Callable[[Family], None]] = []
_builtins_loaded = False
_entry_points_loaded = False


def on_register(listener: Callable[[Family], None]) -> None:
    """Call `listener` with every family registered from now on (a part above the core, such as
    autogen.torch.ops, learns of a user's family without the core naming it)."""
    _LISTENERS.append(listener)


def register(family):
    """Class decorator (or call on an instance): make a family known to the CLI, the tuner, the
    dispatcher and export. A family defined outside autogen gets a namespaced name, its top-level
    package (or module) and its own name: `mykernels.axpy`."""
    instance = family() if isinstance(family, type) else family
    module = type(instance).__module__
    if not isinstance(getattr(instance, "name", None), str):
        raise FamilyError(f"family {module}.{type(instance).__qualname__} does not define its name (a string)")
    if "." not in instance.name and not module.startswith(BUILTIN_PACKAGE + "."):
        instance.name = f"{module.split('.')[0]}.{instance.name}"
    _check_definition(instance)
    known = _REGISTRY.get(instance.name)
    if known is not None and (known.module, type(known).__qualname__) != (module, type(instance).__qualname__):
        raise FamilyError(f"family {instance.name!r} is registered twice ({known.module}.{type(known).__qualname__} "
                          f"and {module}.{type(instance).__qualname__}); rename one")
    if instance.api:
        clash = next((f for f in _REGISTRY.values() if f.api == instance.api and f.name != instance.name), None)
        if clash is not None:
            raise FamilyError(f"{describe_family(instance)}: the call name autogen.{instance.api} is taken by "
                              f"{clash.name}")
    _REGISTRY[instance.name] = instance
    for listener in _LISTENERS:  # e.g. autogen.torch.ops: the new family's torch op
        listener(instance)
    return family


# Names a dimension or trait cannot take: options of the family commands (a dimension becomes the
# flag --<name>), the parser's own destinations, and the keywords of Family.problem and
# autogen.lookup, which take the dimensions as keyword arguments beside them.
# tests/core/test_family_hardening.py checks that this covers every option of the parser.
RESERVED_DIM_NAMES = frozenset({
    "help", "trials", "timeout", "sampler", "seed", "cache", "workers", "no_warm_start", "eval_timeout", "refresh",
    "gpus", "lease", "json", "db", "dtype", "shapes", "gpu", "arch", "resources", "version",
    "command", "family", "family_object", "db_command", "strict", "pdl", "stream",
})
# Variables every template gets (Family.template_vars, render): a parameter of that name would
# replace them.
TEMPLATE_VARIABLES = frozenset({"kernel_name", "dtype", "elem_t", "dtype_bytes", "host_launcher", "c_params", "pdl"})
KERNEL_NAME_PART = re.compile(r"[A-Za-z0-9_]+")


def _check_definition(family: Family) -> None:
    """A family definition that would break later (at --help, render, storage or export) fails
    at registration, with one line naming the family and its module. Cheap: no template is
    read here (see check_family_renders)."""
    where = describe_family(family)
    for attribute in ("name", "template", "dims", "dtypes", "space", "default_params", "outputs", "c_params"):
        if not hasattr(family, attribute):
            raise FamilyError(f"{where} does not define {attribute}")
    if not all(part.isidentifier() for part in family.name.split(".")):
        raise FamilyError(f"{where}: the name must be identifiers joined by dots")
    if not isinstance(family.space, Space):
        raise FamilyError(f"{where}: space must be an autogen.Space, not {type(family.space).__name__}")
    for attribute in ("dims", "dtypes", "outputs"):
        if isinstance(getattr(family, attribute), str):
            raise FamilyError(f"{where}: {attribute} must be a tuple of names, not the string "
                              f"{getattr(family, attribute)!r} (one name is written (\"n\",))")
    unknown = [d for d in family.dtypes if d not in DTYPES]
    if unknown:
        raise FamilyError(f"{where}: unknown dtype(s) {', '.join(unknown)}; known: {', '.join(DTYPES)}")
    if family.roofline not in ("memory", "compute"):
        raise FamilyError(f"{where}: roofline must be 'memory' or 'compute'")
    try:  # NVRTC's spelling of each, once: what the cache key and the stored source hash hold
        family.compiler_options = compiler_options.checked(family.compiler_options)
    except UsageError as exc:
        raise FamilyError(f"{where}: {exc}") from None
    problem_names = tuple(family.dims) + tuple(t.name for t in family.traits)
    _check_names(where, "dimension or trait", problem_names, RESERVED_DIM_NAMES)
    for trait in family.traits:
        if not trait.choices:
            raise FamilyError(f"{where}: trait {trait.name!r} has no choices")
    coded = {t.name for t in family.traits if t.code}
    _check_names(where, "parameter", family.space.names, TEMPLATE_VARIABLES | coded)
    for param in family.space.params:
        if not param.choices:
            raise FamilyError(f"{where}: parameter {param.name!r} has no choices")
        odd = [c for c in param.choices if isinstance(c, bool) or not isinstance(c, (int, str))
               or not KERNEL_NAME_PART.fullmatch(f"{param.abbrev}{c}")]
        if odd:
            raise FamilyError(f"{where}: parameter {param.name!r} has choice(s) {odd!r} that do not make a kernel "
                              f"name with its abbreviation {param.abbrev!r} (integers, or letters, digits and _)")
    try:
        family.space.check(family.default_params)  # the default must be a valid point
    except InvalidConfigError as exc:
        raise FamilyError(f"{where}: default_params: {exc}") from None
    _check_arguments_stated_once(family, where)
    _check_templates_exist(family, where)
    if family.op_signature is not None:
        check_signature(family, where)


def _check_arguments_stated_once(family: Family, where: str) -> None:
    """The kernels' arguments are stated in one place: plan, or launch and kernel_args for the
    default plan's one kernel; a kernel_args beside a plan of the family's own would never run."""
    hooks = ("plan", "launch", "kernel_args")
    contract = type(family).__mro__[-2]  # Family: every family derives from it, before object
    own = {hook for hook in hooks if getattr(type(family), hook) is not getattr(contract, hook)}
    if "plan" in own and "kernel_args" in own:
        raise FamilyError(f"{where} defines both plan and kernel_args, which only the default plan calls: "
                          "state the arguments in plan's steps alone")
    missing = [hook for hook in ("launch", "kernel_args") if hook not in own]
    if "plan" not in own and missing:
        raise FamilyError(f"{where} does not define {' or '.join(missing)} (its one kernel's), "
                          "nor a plan of its launches")


def _check_names(where: str, kind: str, names: tuple, reserved: frozenset) -> None:
    seen = set()
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise FamilyError(f"{where}: {kind} name {name!r} is not an identifier")
        if name in reserved:
            raise FamilyError(f"{where}: {kind} name {name!r} is reserved (an option or variable of autogen's "
                              "own); rename it")
        if name in seen:
            raise FamilyError(f"{where}: {kind} name {name!r} is listed twice")
        seen.add(name)


def _check_templates_exist(family: Family, where: str) -> None:
    # Built-in families' templates ship beside them and their contract test renders every
    # point: not looked for here, which would cost every CLI start a few file lookups.
    module = sys.modules.get(family.module)
    if family.module.startswith(BUILTIN_PACKAGE + ".") or getattr(module, "__file__", None) is None:
        return  # (no file: defined interactively; its templates are looked up in autogen's folder alone)
    if getattr(family, "render_source", None) is not None:
        return  # rendered from its own source text (autogen.core.kernel_family), not a template file
    folders = family.template_dirs()
    for template in (family.template, family.selftest_template):
        if template is not None and not any((folder / template).is_file() for folder in folders):
            raise FamilyError(f"{where}: template {template!r} not found in {', '.join(map(str, folders))}")


_rendered_once: set[tuple[str, str]] = set()  # (family name, module) whose default point rendered


def check_family_renders(family) -> None:
    """Before a user family's first search, show, bench, export or dispatch in this process: its
    default point renders in every dtype, for NVRTC and with the host launcher, under
    StrictUndefined; a missing template, a syntax error, an undefined variable or a failing
    template_vars is then one FamilyError line naming the family and its module, not a
    traceback in the middle of a search. Built-in families are skipped: their contract test
    renders every point, and rendering here would load Jinja2 and the template on paths that
    otherwise render nothing (a tune answered from the database). Not at registration: that
    runs when the CLI starts, for every plug-in."""
    key = (family.name, family.module)
    if key in _rendered_once or family.module.startswith(BUILTIN_PACKAGE + "."):
        return
    from autogen.core.render import render
    config = family.space.check(family.default_params)
    traits = tuple((trait.name, trait.choices[0]) for trait in family.traits)
    for dtype in family.dtypes:
        for host_launcher in (False, True):
            try:
                render(family, dtype, config, host_launcher, traits)
            except AutogenError:
                raise
            except Exception as exc:
                raise FamilyError(f"{describe_family(family)}: its default point does not render "
                                  f"({type(exc).__name__}: {exc})") from None
    _rendered_once.add(key)


def recreate(recipe: tuple) -> None:
    """Register a family in a child process (the tuner's GPU worker) the way its parent made it:
    `recipe` is Family.worker_recipe()'s (module, function, keyword arguments), from the parent
    process that defined the family, never from stored data."""
    module, function, kwargs = recipe
    getattr(importlib.import_module(module), function)(**kwargs)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        import pkgutil
        package = importlib.import_module(BUILTIN_PACKAGE)
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")


def _load_entry_points() -> None:
    """Import every module an installed package declares under `autogen.families`."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()
        except Exception as exc:  # one broken plug-in must not take the CLI down
            print(f"autogen: warning: cannot load family plug-in {entry.name!r} ({entry.value}): "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def all_families(include_plugins: bool = True) -> dict[str, Family]:
    """Every registered family by name: built-ins, plug-ins, and whatever user modules have
    registered so far."""
    _load_builtins()
    if include_plugins:
        _load_entry_points()
    return dict(sorted(_REGISTRY.items()))


def registered_family(name: str) -> Family | None:
    """The family called `name` among those this environment registers (built-ins, plug-ins of
    the entry-point group, modules already imported), else None. For a name read from data (a
    database row, a catalog entry): it never imports a module the name points to, so a shared
    database cannot make its readers run code from their sys.path."""
    _load_builtins()
    if name not in _REGISTRY:
        _load_entry_points()
    return _REGISTRY.get(name)


def get_family(name: str) -> Family:
    """The family called `name`, as the user typed it (command line, autogen.lookup): a dotted
    name not yet registered is imported (`mykernels.axpy` imports the module mykernels.axpy,
    else mykernels) or found among the plug-ins. A name read from data goes through
    registered_family instead."""
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if "." in name and all(part.isidentifier() for part in name.split(".")):
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            module = ".".join(parts[:end])
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is not None and not module.startswith(exc.name):
                    raise UsageError(f"cannot import the module of family {name!r}: {exc}") from None
                continue
            except UsageError:
                raise  # a family of that module is refused: the message names it
            except Exception as exc:  # the user's module is broken: one line naming it, not a traceback
                raise FamilyError(f"cannot import the module {module} of family {name!r}: "
                                  f"{type(exc).__name__}: {exc}") from None
            if name in _REGISTRY:
                return _REGISTRY[name]
    _load_entry_points()
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise UsageError(f"unknown family {name!r}; known: {', '.join(sorted(_REGISTRY))} (a user family is "
                     "named <package>.<name> and found by importing the package)")


def family_for_api(api: str) -> Family | None:
    """The family whose Python call is autogen.<api>."""
    for family in all_families(include_plugins=False).values():
        if family.api == api:
            return family
    return None
