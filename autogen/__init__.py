"""autogen: a code-generating CUDA kernel autotuner."""

__version__ = "0.1.0"
