"""Gather the winners that bench scripts stored on a GPU into the shipped catalog of that GPU.

Usage: python3 scripts/catalog_from.py --gpu "NVIDIA H200" [--keep] DB [DB ...]
Writes autogen/catalog/data/pretuned_<gpu>.json (the folder the dispatcher reads the shipped
catalog from: autogen.catalog.pretuned.CATALOG_DIR): replacing it, or with --keep adding to it
(the file's entries for problems the databases do not hold stay).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def catalog_path(gpu: str) -> Path:
    """The shipped catalog file of `gpu` (its name as the winners were stored under)."""
    from autogen.catalog.pretuned import CATALOG_DIR

    slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    return CATALOG_DIR / f"pretuned_{slug}.json"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", required=True, help="the GPU name the winners were stored under")
    parser.add_argument("--keep", action="store_true", help="keep the catalog's entries no database replaces")
    parser.add_argument("databases", nargs="+", help="database URLs or SQLite files")
    args = parser.parse_args()
    from tuning_db import TuningDB

    from autogen.catalog.pretuned import dump_catalog

    path = catalog_path(args.gpu)
    count = dump_catalog([TuningDB(db, readonly=True) for db in args.databases], args.gpu, path, keep=args.keep)
    print(f"wrote {count} winners to {path}")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
