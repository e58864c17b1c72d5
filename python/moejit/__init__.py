"""moejit: generated CUDA kernels for the MoE layer of NVFP4 models, from Python.

A ctypes binding over libmoejit.so (no compiled extension). Two entry points:

  route(logits, bias, topk=8, k0=4, ...)  OEA / noaux_tc routing, the piece an engine adopts
                                          alone (SGLang's select_experts: see
                                          examples/sglang_select_experts.py)
  Moe(checkpoint, layer, tp=..., ...)     a whole MoE layer on this rank: prepare() the batch
                                          sizes, then forward(hidden) every step
  Experts.adopt(w13_weight=..., ...)      a serving engine's own NVFP4 expert tensors, run on
                                          its top-k (moejit.integrations: SGLang, vLLM)

Inputs are numpy arrays (host memory: the CPU interpreter, or the CPU reference) or torch
tensors (CUDA tensors run on that GPU on torch's current stream; CPU tensors on the
interpreter); outputs are of the same kind. Failed C calls raise MoejitError (a subclass per
mj_status) with mj_last_error()'s text. The library is found through $MOEJIT_LIBRARY, beside
this package, in a checkout's build/, or on the loader's path (see _lib.py).
"""
from ._arrays import bf16_from_f32, bf16_to_f32
from ._lib import __version__, library_path, library_version, load as load_library
from .checkpoint import Checkpoint, Layer, MoeConfig, make_checkpoint
from .comm import Comm, NcclComm, loopback_comms, nccl_comms_all, nccl_unique_id
from .context import Context, get_context
from .errors import (CacheMissError, CommError, CompileError, ConfigError, CudaError, FileError, InternalError,
                     InvalidArgumentError, KernelError, LibraryNotFoundError, LibraryVersionError, MoejitError,
                     NoDeviceError, NonFiniteError, OutOfMemoryError, ParseError, SharedLibraryError,
                     UnsupportedError)
from .experts import Experts
from .moe import Moe
from .route import K0Policy, RouteResult, route

__all__ = [
    "__version__", "route", "RouteResult", "K0Policy", "Moe", "Experts", "Checkpoint", "Layer", "MoeConfig",
    "make_checkpoint", "Comm", "NcclComm", "loopback_comms", "nccl_comms_all", "nccl_unique_id", "Context",
    "get_context", "bf16_from_f32", "bf16_to_f32", "library_path", "library_version", "load_library",
    "MoejitError", "InvalidArgumentError", "ConfigError", "UnsupportedError", "ParseError", "FileError",
    "NonFiniteError", "OutOfMemoryError", "NoDeviceError", "SharedLibraryError", "CompileError", "CacheMissError",
    "CudaError", "InternalError", "KernelError", "CommError", "LibraryNotFoundError", "LibraryVersionError",
]
