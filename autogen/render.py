"""Rendering: a pure function from (family, dtype, config) to CUDA source text."""

from __future__ import annotations

import functools
import hashlib

import jinja2

from .paths import templates_dir
from .problem import Config

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
    from .paths import kernel_cache_dir

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
    """Render a template by name, looked up beside `family`'s module first when given."""
    folders = family.template_dirs() if family is not None else [templates_dir()]
    try:
        template = _environment(tuple(str(f) for f in folders)).get_template(template_name)
    except jinja2.TemplateNotFound:
        where = ", ".join(str(f) for f in folders)
        raise FileNotFoundError(f"template {template_name!r} not found in {where}") from None
    return template.render(**variables)


def render(family, dtype: str, config: Config, host_launcher: bool = False,
           traits: tuple[tuple[str, str], ...] = (), pdl: bool = False) -> str:
    """CUDA source of one variant; `config` must come from family.space.check, `traits` are the
    problem's (those that change the code become template variables). With host_launcher, the
    source also defines `<kernel_name>_launch(<c_params>, stream)` for nvcc builds (exports);
    NVRTC gets device code only. With `pdl` (families whose `pdl_capable` is set), the kernel
    is named `<kernel_name>_pdl` and waits for the previous kernel with griddepcontrol (see
    autogen.launch); without it the template variable `pdl` is "off" and the source is unchanged."""
    variables = family.template_vars(dtype, config, host_launcher, traits)
    variables.setdefault("pdl", "off")
    if pdl:
        if not getattr(family, "pdl_capable", False):
            raise ValueError(f"{family.name} has no programmatic-dependent-launch variant")
        variables["pdl"] = "on"
        variables["kernel_name"] = variables["kernel_name"] + PDL_SUFFIX
    return render_template(family.template, variables, family)


def source_hash(source: str, options: tuple[str, ...] = ()) -> str:
    digest = hashlib.sha256(source.encode())
    for option in options:
        digest.update(b"\0" + option.encode())
    return digest.hexdigest()
