"""The project is configured in pyproject.toml; this file adds the one C extension there is: the
dispatcher's hit path (autogen/runtime/_hitpath.c), which autogen.runtime.dispatch uses where it is built. It is
optional: without a C compiler or Python's headers pip installs autogen without it, and repeated
dispatched calls are served from Python (slower; tests/runtime/test_bound_calls.py fails loudly then)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("autogen.runtime._hitpath", ["autogen/runtime/_hitpath.c"], optional=True)])
