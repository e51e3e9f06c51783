"""Built-in kernel families: one module each, autogen/families/<name>.py, with its templates in
templates/<name>/ (kernel.cu.j2, selftest.cu.j2).

Each module registers its family with @autogen.register; the registry (autogen.core.registry)
imports every module of this package on first use, so adding a family edits no other file.
"""
