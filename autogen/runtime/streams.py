"""The stream a dispatched call launches on: CuPy's current one, PyTorch's for tensor operands, or
the one given (a CuPy or torch stream, anything with __cuda_stream__, a raw handle); and whether
a stream is capturing a CUDA graph, where building a kernel must not happen."""

from __future__ import annotations

import sys

from autogen.errors import ArgumentError


def capturing(cupy, stream=None) -> bool:
    """Whether `stream` (a CuPy stream; None: the current one) is capturing a CUDA graph."""
    try:
        pointer = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
        is_capturing = cupy.cuda.runtime.streamIsCapturing
    except Exception:  # a stand-in for CuPy (tests), or CuPy without a driver or GPU: no stream captures
        return False
    try:
        return is_capturing(pointer) != 0
    except Exception:  # an invalidated capture raises: that stream is capturing too
        return True


_external_streams: dict[int, object] = {}


def resolve_stream(cupy, stream, args: tuple):
    """None means the current stream: CuPy's, or PyTorch's when the operands are torch tensors.
    Also accepts a CuPy stream, a torch.cuda.Stream, or a raw cudaStream_t as an int."""
    if stream is None:
        first = args[0]
        if type(first) is cupy.ndarray:  # the common case, decided without touching torch
            return None
        if isinstance(first, (list, tuple)) and first:  # a list of operands (concat): its first
            first = first[0]
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(first, torch.Tensor):
            return None
        stream = torch.cuda.current_stream(first.device)
    if isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
        return stream
    if isinstance(stream, int):
        stream = _StreamHandle(stream)
    if not hasattr(stream, "__cuda_stream__"):
        raise ArgumentError(f"stream must be a CuPy stream, a torch.cuda.Stream (or anything with "
                            f"__cuda_stream__) or an int handle, got {type(stream).__name__}")
    key = stream.__cuda_stream__()[1]
    if key not in _external_streams:
        _external_streams[key] = cupy.cuda.Stream.from_external(stream)
    return _external_streams[key]


class _StreamHandle:
    """A raw cudaStream_t, presented through the CUDA stream protocol."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self):
        return (0, self.pointer)
