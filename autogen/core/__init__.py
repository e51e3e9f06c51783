"""The vocabulary every other part speaks: the Family contract and its registry, operand
helpers for a family's Python call, dtypes, problems, search spaces, rendering, comparison with
the float64 reference. Imports only the base modules (errors, paths, notes, report)."""
