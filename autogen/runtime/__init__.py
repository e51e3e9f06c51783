"""Serving tuned kernels at run time: the dispatcher's fallback chain (exact shape, nearest,
architecture, default) and the bound-call hit path (_hitpath.c where built). Imports base,
core, gpu, catalog, tuning_db."""
