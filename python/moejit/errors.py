"""Errors raised by the binding.

Every C call that returns a status other than MJ_OK raises a MoejitError (a subclass per
status), carrying the status name and mj_last_error()'s text, read on the failing thread
right after the call. Arguments the binding can judge itself (a wrong dtype, shape, device,
or an array that is not contiguous) are refused with ValueError / TypeError before any C call.
"""

# The mj_status enum of include/moejit.h, in order (tests/python checks it against C).
STATUS_NAMES = (
    "MJ_OK",
    "MJ_ERR_INVALID_ARG",
    "MJ_ERR_CONFIG",
    "MJ_ERR_UNSUPPORTED",
    "MJ_ERR_PARSE",
    "MJ_ERR_IO",
    "MJ_ERR_NONFINITE",
    "MJ_ERR_NOMEM",
    "MJ_ERR_NO_DEVICE",
    "MJ_ERR_LIBRARY",
    "MJ_ERR_COMPILE",
    "MJ_ERR_CACHE_MISS",
    "MJ_ERR_CUDA",
    "MJ_ERR_INTERNAL",
    "MJ_ERR_KERNEL",
    "MJ_ERR_COMM",
)


class MoejitError(RuntimeError):
    """A moejit C call failed.

    status: the mj_status value; status_name: its enum name ("MJ_ERR_IO"); function: the C
    function that failed; message: mj_last_error(), which says what went wrong and what to do.
    """

    def __init__(self, status, function, message):
        self.status = int(status)
        self.status_name = (
            STATUS_NAMES[self.status] if 0 <= self.status < len(STATUS_NAMES) else "status %d" % self.status
        )
        self.function = function
        self.message = message
        super().__init__("%s: %s: %s" % (function, self.status_name, message or "(no detail)"))


class InvalidArgumentError(MoejitError, ValueError):
    """MJ_ERR_INVALID_ARG: an argument out of range (also a ValueError)."""


class ConfigError(MoejitError):
    """MJ_ERR_CONFIG: a model config that is missing fields or is impossible."""


class UnsupportedError(MoejitError):
    """MJ_ERR_UNSUPPORTED: valid, but not something moejit does."""


class ParseError(MoejitError):
    """MJ_ERR_PARSE: a malformed file (JSON, safetensors)."""


class FileError(MoejitError):
    """MJ_ERR_IO: a file could not be opened, read or written."""


class NonFiniteError(MoejitError):
    """MJ_ERR_NONFINITE: NaN or Inf where a finite number is required."""


class OutOfMemoryError(MoejitError):
    """MJ_ERR_NOMEM: an allocation failed."""


class NoDeviceError(MoejitError):
    """MJ_ERR_NO_DEVICE: no GPU, or no driver."""


class SharedLibraryError(MoejitError):
    """MJ_ERR_LIBRARY: libcuda, libnvrtc or libnccl is missing."""


class CompileError(MoejitError):
    """MJ_ERR_COMPILE: NVRTC or the host compiler rejected generated source."""


class CacheMissError(MoejitError):
    """MJ_ERR_CACHE_MISS: strict mode, and a kernel is not in the cache."""


class CudaError(MoejitError):
    """MJ_ERR_CUDA: a CUDA driver call failed."""


class InternalError(MoejitError):
    """MJ_ERR_INTERNAL: a bug in moejit; please report it with the message."""


class KernelError(MoejitError):
    """MJ_ERR_KERNEL: a kernel failed as it ran (a sim deadlock, __trap())."""


class CommError(MoejitError):
    """MJ_ERR_COMM: a collective failed (NCCL, or an aborted loopback group)."""


_BY_STATUS = {
    1: InvalidArgumentError,
    2: ConfigError,
    3: UnsupportedError,
    4: ParseError,
    5: FileError,
    6: NonFiniteError,
    7: OutOfMemoryError,
    8: NoDeviceError,
    9: SharedLibraryError,
    10: CompileError,
    11: CacheMissError,
    12: CudaError,
    13: InternalError,
    14: KernelError,
    15: CommError,
}


def error_for(status, function, message):
    """The MoejitError subclass instance for a failed call."""
    return _BY_STATUS.get(int(status), MoejitError)(status, function, message)


class LibraryNotFoundError(OSError):
    """libmoejit.so could not be loaded; the message lists where the binding looked."""


class LibraryVersionError(OSError):
    """The libmoejit.so found is not the version this package was written for."""
