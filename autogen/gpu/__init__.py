"""Everything that touches the GPU or its toolchain: the device and its identity, NVRTC
compiles, kernel resources, launches, validation and CUDA-graph timing, the roofline ceilings,
the peers, and the isolated worker processes. Imports base and core."""
