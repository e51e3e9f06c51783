"""The project is configured in pyproject.toml; this file adds the one C extension there is: the
dispatcher's hit path (autogen/_hitpath.c), which autogen.dispatch uses where it is built."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("autogen._hitpath", ["autogen/_hitpath.c"])])
