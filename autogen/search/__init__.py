"""Tuning one problem: where the search starts, the Optuna loop (all of Optuna's private
interfaces are fenced in search/optuna_internals.py), choosing, re-timing and storing the winner.
Imports base, core, gpu, catalog, tuning_db."""
