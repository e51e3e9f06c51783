"""Tuning over several GPUs of one host: one agent process per GPU past the first, all sharing
one study in the tuning database. Imports base, core, gpu, search, tuning_db."""
