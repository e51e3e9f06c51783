"""Rendering: a pure function from (family, dtype, config) to CUDA source text."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jinja2

from autogen.core.problem import Config
from autogen.errors import FamilyError, describe_family
from autogen.paths import kernel_cache_dir, templates_dir

PDL_SUFFIX = "_pdl"  # the kernel name of a variant rendered with pdl=True


class _TemplateBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja's compiled templates kept beside the kernel cache: compiling a family's template
    takes longer than the rest of an `autogen tune` answered from the database. Jinja keys each
    entry by the template's name and source checksum, so an edited template is compiled afresh.
    A cache that cannot be written is only slower."""

    def dump_bytecode(self, bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    folder = kernel_cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return _TemplateBytecodeCache(str(folder))


@functools.lru_cache(maxsize=None)
def _environment(search_path: tuple[str, ...]) -> jinja2.Environment:
    # One FileSystemLoader over the path: a user family's folder first, then autogen's templates,
    # so a user template can {% import "common.cuh.j2" as common %} the shared macros.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(list(search_path)),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, never an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        bytecode_cache=_bytecode_cache(),
    )


def render_template(template_name: str, variables: dict, family=None) -> str:
    """Render a template by name, looked up beside `family`'s module first when given. A template
    of a family that is missing, does not parse or uses an undefined variable is a FamilyError
    naming the family, its module and the template's line."""
    folders = family.template_dirs() if family is not None else [templates_dir()]
    try:
        template = _environment(tuple(str(f) for f in folders)).get_template(template_name)
        return template.render(**variables)
    except jinja2.TemplateNotFound as exc:
        where = ", ".join(str(f) for f in folders)
        message = f"template {exc.name or template_name!r} not found in {where}"
        if family is None:
            raise FileNotFoundError(message) from None
        raise _family_error(family, message) from None
    except Exception as exc:  # a syntax error, an undefined variable, a filter given a wrong type...
        if family is None:
            raise
        raise _family_error(family, f"template {_where_in_template(exc, template_name)}: {type(exc).__name__}: "
                                    f"{getattr(exc, 'message', None) or exc}") from None


def _where_in_template(exc: Exception, template_name: str) -> str:
    """"name, line N" of the template line that raised `exc`: a syntax error says where; a
    rendering error is found in the traceback, whose template frames Jinja maps to their lines."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"{exc.name or template_name}, line {exc.lineno}"
    found = template_name
    frame = exc.__traceback__
    while frame is not None:
        filename = frame.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            found = f"{Path(filename).name}, line {frame.tb_lineno}"
        frame = frame.tb_next
    return found


def _family_error(family, message: str):
    return FamilyError(f"{describe_family(family)}: {message}")


def render(family, dtype: str, config: Config, host_launcher: bool = False,
           traits: tuple[tuple[str, str], ...] = (), pdl: bool = False) -> str:
    """CUDA source of one variant; `config` must come from family.space.check, `traits` are the
    problem's (those that change the code become template variables). With host_launcher, the
    source also defines `<kernel_name>_launch(<c_params>, stream)` for nvcc builds (exports);
    NVRTC gets device code only. With `pdl` (families whose `pdl_capable` is set), the kernel
    is named `<kernel_name>_pdl` and waits for the previous kernel with griddepcontrol (see
    autogen.gpu.launch); without it the template variable `pdl` is "off" and the source is unchanged."""
    variables = family.template_vars(dtype, config, host_launcher, traits)
    variables.setdefault("pdl", "off")
    if pdl:
        if not getattr(family, "pdl_capable", False):
            raise ValueError(f"{family.name} has no programmatic-dependent-launch variant")
        variables["pdl"] = "on"
        variables["kernel_name"] = variables["kernel_name"] + PDL_SUFFIX
    own = getattr(family, "render_source", None)  # a family made from source text, not a template file
    return own(variables) if own is not None else render_template(family.template, variables, family)


def render_string(text: str, variables: dict, family) -> str:
    """Jinja2 text (not a file: a kernel source given as a string) under StrictUndefined; an
    error is a FamilyError naming the family."""
    try:
        return _environment(tuple(str(f) for f in family.template_dirs())).from_string(text).render(**variables)
    except Exception as exc:
        raise _family_error(family, f"its source as a Jinja2 template: {type(exc).__name__}: "
                                    f"{getattr(exc, 'message', None) or exc}") from None


def source_hash(source: str, options: tuple[str, ...] = ()) -> str:
    digest = hashlib.sha256(source.encode())
    for option in options:
        digest.update(b"\0" + option.encode())
    return digest.hexdigest()
