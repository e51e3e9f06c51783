"""Built-in kernel families: one module each, beside templates/<family>.cu.j2.

Each module registers its family with @autogen.family.register; autogen.family imports every
module of this package on first use, so adding a family edits no other file.
"""
