"""ctypes binding of libfa_kernels.so (common/c_api.h). Plain Python: no torch needed here.

Functions take device pointers as integers; the torch layer (_torch.py) passes tensors'
data_ptr() and the current stream. Every failing call raises KernelError with the library's
one-line message.
"""
import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

API_VERSION = 3

FORWARD, BACKWARD, DECODE = 0, 1, 2
KIND_NAMES = {FORWARD: "forward", BACKWARD: "backward", DECODE: "decode"}
DTYPE_NAMES = {0: "fp32", 1: "fp16", 2: "bf16"}

# fa_status values, as in c_api.h.
STATUS_NAMES = {
    1: "unknown kernel",
    2: "invalid argument",
    3: "unsupported",
    4: "no GPU",
    5: "CUDA error",
    6: "internal error",
}


class KernelError(RuntimeError):
    """A call into libfa_kernels.so failed; .status is the fa_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class UnknownKernelError(KernelError, ValueError):
    """No registered kernel of that kind has that name."""


class InvalidArgumentError(KernelError, ValueError):
    """A shape field out of range, a null pointer: the message names the value and what is allowed."""


class UnsupportedError(KernelError, ValueError):
    """A valid shape that this kernel does not take (head_dim, the GPU's architecture)."""


class NoGpuError(KernelError):
    """No usable CUDA device."""


_ERROR_CLASSES = {1: UnknownKernelError, 2: InvalidArgumentError, 3: UnsupportedError, 4: NoGpuError}


class _Shape(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int) for name in ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim", "causal")] + [
        ("scale", ctypes.c_double)
    ]


class _DecodeShape(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int)
        for name in (
            "num_seqs",
            "heads_q",
            "heads_kv",
            "head_dim",
            "query_len",
            "block_size",
            "num_blocks",
            "max_blocks_per_seq",
            "max_context",
        )
    ]


class _Features(ctypes.Structure):
    """c_api.h's fa_features: chapter 09's features and their device pointers (as integers)."""

    _fields_ = [
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("softcap", ctypes.c_double),
        ("alibi", ctypes.c_int),
        ("bias", ctypes.c_void_p),
        ("sequences", ctypes.c_int),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("max_seqlen_q", ctypes.c_int),
        ("max_seqlen_k", ctypes.c_int),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_slopes_per_sequence", ctypes.c_int),
    ]


class _KernelInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("variant", ctypes.c_char_p),
        ("summary", ctypes.c_char_p),
        ("chapter", ctypes.c_int),
        ("number", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("deterministic", ctypes.c_int),
        ("head_dims", ctypes.c_char_p),
        ("unavailable", ctypes.c_char_p),
        ("tolerance_rel_fro", ctypes.c_double),
        ("tolerance_max_abs", ctypes.c_double),
        ("tolerance_lse_abs", ctypes.c_double),
        ("coarse_arithmetic", ctypes.c_int),
        ("strided", ctypes.c_int),
    ]


class _Strides(ctypes.Structure):
    """c_api.h's fa_strides: element strides of a tensor's batch, head and row (head_dim contiguous)."""

    _fields_ = [("batch", ctypes.c_int64), ("head", ctypes.c_int64), ("row", ctypes.c_int64)]


@dataclass(frozen=True)
class KernelInfo:
    """One registered kernel, as list_kernels() returns it."""

    kind: str  # "forward", "backward" or "decode"
    name: str
    chapter: int
    variant: str
    dtype: str  # "fp32", "fp16" or "bf16"
    summary: str
    head_dims: tuple  # the head_dim values from 1 to 256 it accepts
    unavailable: str  # "" when this machine runs it, else why not
    deterministic: bool
    tolerance: tuple  # forward/decode: (rel_fro, max_abs, lse_abs) of the C++ tests; backward: None
    coarse_arithmetic: bool  # FP8 inside (chapter 06): held to its own tolerance, not the dtype's
    strided: bool = False  # takes tensors that are not packed [batch, heads, seq, head_dim] (no copy)

    @property
    def available(self):
        return not self.unavailable


def _alibi_slope(heads, h):
    """attention_features.h's AttentionFeatures::alibi_slope: the ALiBi paper's slope of head h."""
    n = 1
    while 2 * n <= heads:
        n *= 2
    return 2.0 ** (-8.0 * (h + 1) / n) if h < n else 2.0 ** (-4.0 * (2 * (h - n) + 1) / n)


def _ref(features):
    """An fa_features by reference, or NULL (no features: the C interface's plain call)."""
    return None if features is None else ctypes.byref(features)


def _parse_head_dims(text):
    dims = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        dims.extend(range(int(low), int(high or low) + 1))
    return tuple(dims)


def candidate_paths():
    """Where load() looks for libfa_kernels.so, in order."""
    here = Path(__file__).resolve().parent
    paths = []
    if os.environ.get("FA_KERNELS_LIBRARY"):
        paths.append(Path(os.environ["FA_KERNELS_LIBRARY"]))
    paths.append(here / "libfa_kernels.so")  # the build folder's copy, or a pip install of it
    build_dir = os.environ.get("FA_BUILD_DIR")
    if build_dir:
        paths.append(Path(build_dir) / "lib" / "libfa_kernels.so")
    paths.append(here.parent.parent / "build" / "lib" / "libfa_kernels.so")  # python/ in the source tree
    return paths


class Library:
    """libfa_kernels.so, loaded once (load())."""

    def __init__(self, path):
        self.path = Path(path)
        lib = ctypes.CDLL(str(self.path))
        self._lib = lib
        lib.fa_api_version.restype = ctypes.c_int
        lib.fa_last_error.restype = ctypes.c_char_p
        lib.fa_kernel_count.restype = ctypes.c_int
        lib.fa_kernel_count.argtypes = [ctypes.c_int]
        lib.fa_kernel_at.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_KernelInfo)]
        lib.fa_kernel_find.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_KernelInfo)]
        size_p = ctypes.POINTER(ctypes.c_size_t)
        lib.fa_forward_check.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), size_p]
        lib.fa_backward_check.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), size_p]
        lib.fa_decode_check.argtypes = [ctypes.c_char_p, ctypes.POINTER(_DecodeShape), size_p]
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        lib.fa_forward.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape)] + [ptr] * 6 + [size, ptr]
        lib.fa_backward.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape)] + [ptr] * 10 + [size, ptr]
        lib.fa_decode.argtypes = [ctypes.c_char_p, ctypes.POINTER(_DecodeShape)] + [ptr] * 8 + [size, ptr]
        features_p = ctypes.POINTER(_Features)
        lib.fa_features_none.restype = _Features
        lib.fa_forward_check_features.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p, size_p]
        lib.fa_backward_check_features.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p, size_p]
        lib.fa_forward_features.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p] + [ptr] * 6 + [
            size, ptr]
        lib.fa_backward_features.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p] + [ptr] * 10 + [
            size, ptr]
        strides_p = ctypes.POINTER(_Strides)
        lib.fa_forward_strided.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p, strides_p] + [
            ptr] * 6 + [size, ptr]
        lib.fa_backward_strided.argtypes = [ctypes.c_char_p, ctypes.POINTER(_Shape), features_p, strides_p] + [
            ptr] * 10 + [size, ptr]
        for fn in ("fa_kernel_at", "fa_kernel_find", "fa_forward_check", "fa_backward_check", "fa_decode_check",
                   "fa_forward", "fa_backward", "fa_decode", "fa_forward_check_features",
                   "fa_backward_check_features", "fa_forward_features", "fa_backward_features", "fa_forward_strided",
                   "fa_backward_strided"):
            getattr(lib, fn).restype = ctypes.c_int
        version = lib.fa_api_version()
        if version != API_VERSION:
            raise ImportError(f"{self.path} has C API version {version}; this package speaks version {API_VERSION}: "
                              "rebuild the library (make build) or use the package next to it")

    def _raise_for(self, status):
        if status == 0:
            return
        message = self._lib.fa_last_error().decode("utf-8", "replace")
        raise _ERROR_CLASSES.get(status, KernelError)(status, message)

    def kernels(self, kind):
        out = []
        for index in range(self._lib.fa_kernel_count(kind)):
            info = _KernelInfo()
            self._raise_for(self._lib.fa_kernel_at(kind, index, ctypes.byref(info)))
            out.append(self._info(kind, info))
        return out

    def find(self, kind, name):
        info = _KernelInfo()
        self._raise_for(self._lib.fa_kernel_find(kind, name.encode(), ctypes.byref(info)))
        return self._info(kind, info)

    @staticmethod
    def _info(kind, info):
        tolerance = (info.tolerance_rel_fro, info.tolerance_max_abs, info.tolerance_lse_abs)
        return KernelInfo(
            kind=KIND_NAMES[kind],
            name=info.name.decode(),
            chapter=info.chapter,
            variant=info.variant.decode(),
            dtype=DTYPE_NAMES[info.dtype],
            summary=info.summary.decode(),
            head_dims=_parse_head_dims(info.head_dims.decode()),
            unavailable=info.unavailable.decode(),
            deterministic=bool(info.deterministic),
            tolerance=tolerance if any(tolerance) else None,
            coarse_arithmetic=bool(info.coarse_arithmetic),
            strided=bool(info.strided),
        )

    @staticmethod
    def shape(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal=False, scale=0.0):
        return _Shape(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, int(bool(causal)), float(scale))

    @staticmethod
    def decode_shape(**fields):
        return _DecodeShape(**fields)

    def features(self, window=(-1, -1), softcap=0.0, alibi=False, bias=0, sequences=0, cu_seqlens_q=0,
                 cu_seqlens_k=0, max_seqlen_q=0, max_seqlen_k=0, alibi_slopes=0, alibi_slopes_per_sequence=False):
        """An fa_features: every feature off unless given (pointers as integers, 0 for none)."""
        f = self._lib.fa_features_none()
        f.window_left, f.window_right = int(window[0]), int(window[1])
        f.softcap = float(softcap)
        f.alibi = int(bool(alibi))
        f.bias = bias or None
        f.sequences = int(sequences)
        f.cu_seqlens_q, f.cu_seqlens_k = cu_seqlens_q or None, cu_seqlens_k or None
        f.max_seqlen_q, f.max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        f.alibi_slopes = alibi_slopes or None
        f.alibi_slopes_per_sequence = int(bool(alibi_slopes_per_sequence))
        return f

    def check(self, kind, name, shape, features=None):
        """Workspace bytes the kernel needs for this shape (and features, an fa_features or None,
        forward and backward only); raises if it does not take it."""
        needed = ctypes.c_size_t(0)
        if kind == DECODE:
            self._raise_for(self._lib.fa_decode_check(name.encode(), ctypes.byref(shape), ctypes.byref(needed)))
        else:
            fn = self._lib.fa_forward_check_features if kind == FORWARD else self._lib.fa_backward_check_features
            self._raise_for(fn(name.encode(), ctypes.byref(shape), _ref(features), ctypes.byref(needed)))
        return needed.value

    def forward(self, name, shape, q, k, v, o, lse, workspace, workspace_bytes, stream, features=None):
        self._raise_for(self._lib.fa_forward_features(name.encode(), ctypes.byref(shape), _ref(features), q, k, v, o,
                                                      lse, workspace, workspace_bytes, stream))

    def backward(self, name, shape, q, k, v, o, d_o, lse, dq, dk, dv, workspace, workspace_bytes, stream,
                 features=None):
        self._raise_for(self._lib.fa_backward_features(name.encode(), ctypes.byref(shape), _ref(features), q, k, v, o,
                                                       d_o, lse, dq, dk, dv, workspace, workspace_bytes, stream))

    def decode(self, name, shape, q, k_cache, v_cache, block_tables, context_lens, o, lse, workspace, workspace_bytes,
               stream):
        self._raise_for(self._lib.fa_decode(name.encode(), ctypes.byref(shape), q, k_cache, v_cache, block_tables,
                                            context_lens, o, lse, workspace, workspace_bytes, stream))


_loaded = None


def load():
    """The library, loaded on first use from the first of candidate_paths() that exists."""
    global _loaded
    if _loaded is None:
        tried = candidate_paths()
        for path in tried:
            if path.is_file():
                _loaded = Library(path)
                break
        else:
            raise ImportError("libfa_kernels.so not found; looked in " + ", ".join(str(p) for p in tried) +
                              ". Build it with `make build`, or set FA_KERNELS_LIBRARY to its path")
    return _loaded
