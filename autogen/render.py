"""Rendering: a pure function from (family, dtype, config) to CUDA source text."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import jinja2

from .problem import Config


def templates_dir() -> Path:
    """The folder holding the *.cu.j2 templates.

    In an installed wheel they sit in autogen/templates (pyproject maps the top-level templates/
    there); in a source checkout they sit beside the autogen package.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autogen templates not found next to {here}")


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, never an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_template(template_name: str, variables: dict) -> str:
    return _environment().get_template(template_name).render(**variables)


def render(family, dtype: str, config: Config, host_launcher: bool = False) -> str:
    """CUDA source of one variant; `config` must come from family.space.check. With
    host_launcher, the source also defines `<kernel_name>_launch(<family.c_params>, stream)`
    for nvcc builds (exports); NVRTC gets device code only."""
    variables = family.template_vars(dtype, config, host_launcher)
    if family.template_source is not None:  # test-only families carry their template inline
        return _environment().from_string(family.template_source).render(**variables)
    return render_template(family.template, variables)


def source_hash(source: str, options: tuple[str, ...] = ()) -> str:
    digest = hashlib.sha256(source.encode())
    for option in options:
        digest.update(b"\0" + option.encode())
    return digest.hexdigest()
