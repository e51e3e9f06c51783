"""Tuning over several GPUs of one host: one helper process per extra GPU, all sharing one
study in the tuning database. Imports base, core, gpu, search, tuning_db."""
