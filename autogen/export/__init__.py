"""`autogen export`: tuned kernels written out as a standalone CUDA project (source, header,
CMake/Make files and a self-test). Imports base, core, gpu, catalog, tuning_db."""
