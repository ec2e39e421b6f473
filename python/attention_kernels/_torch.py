"""The kernels on torch tensors: checks, allocation, the current stream, and autograd.

Layout: the kernels take [batch, heads, seq, head_dim] tensors, the shape
torch.nn.functional.scaled_dot_product_attention takes. The strided kernels (KernelInfo.strided:
chapter 05's tuned forward, chapter 06's bf16 kernels, chapter 07's tensor-core and Hopper
backward, chapter 09's Hopper forward and its backward) read and
write any such view whose head_dim is contiguous, in place: flash-attn's [batch, seq, heads,
head_dim] tensors (layout="bshd", or .transpose(1, 2)) and the Q, K, V slices of one projection
cost no copy, and their outputs come back laid out like their inputs. Every other kernel reads packed tensors: a
tensor that is not packed is copied for it (.contiguous()), and its outputs are packed.
"""
import contextlib
import ctypes
import functools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from . import _library as lib

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}
_ALLOWED_DTYPES = "torch.float32, torch.float16, torch.bfloat16"
_LAYOUTS = ("bhsd", "bshd")
_NO_GUARD = contextlib.nullcontext()


@dataclass(frozen=True)
class Features:
    """Chapter 09's features of one call (c_api.h's fa_features), each off by default.

    window: (left, right) keys a query sees on each side of its diagonal, -1 for no limit;
    softcap: scores x become softcap * tanh(x / softcap) (0: off); alibi: ALiBi, with the ALiBi
    paper's slopes (attention_features.h) or alibi_slopes, float32 [heads_q] or [batch (sequences
    when packed), heads_q] (flash-attn's); bias: float32 [batch, heads_q, seq_q, seq_kv] added to the
    scaled scores (no gradient); cu_seqlens_q / cu_seqlens_k: int32 [sequences + 1] of a packed
    batch whose q is [1, heads_q, total_q, head_dim], with max_seqlen_q / max_seqlen_k.
    """

    window: tuple = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    bias: Optional[torch.Tensor] = None
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_k: Optional[torch.Tensor] = None
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0
    alibi_slopes: Optional[torch.Tensor] = None

    @property
    def sequences(self):
        return 0 if self.cu_seqlens_q is None else self.cu_seqlens_q.shape[0] - 1

    def any(self):
        return (tuple(self.window) != (-1, -1) or self.softcap != 0.0 or self.alibi or self.bias is not None
                or self.cu_seqlens_q is not None)

    def key(self):
        """What the kernel's support check reads: every field but the tensors' contents."""
        return (int(self.window[0]), int(self.window[1]), float(self.softcap), bool(self.alibi),
                self.bias is not None, self.sequences, int(self.max_seqlen_q), int(self.max_seqlen_k),
                None if self.alibi_slopes is None else self.alibi_slopes.dim())

    def struct(self):
        """The fa_features of this call, with the tensors' device pointers."""
        return lib.load().features(
            window=self.window, softcap=self.softcap, alibi=self.alibi,
            bias=0 if self.bias is None else self.bias.data_ptr(), sequences=self.sequences,
            cu_seqlens_q=0 if self.cu_seqlens_q is None else self.cu_seqlens_q.data_ptr(),
            cu_seqlens_k=0 if self.cu_seqlens_k is None else self.cu_seqlens_k.data_ptr(),
            max_seqlen_q=self.max_seqlen_q, max_seqlen_k=self.max_seqlen_k,
            alibi_slopes=0 if self.alibi_slopes is None else self.alibi_slopes.data_ptr(),
            alibi_slopes_per_sequence=self.alibi_slopes is not None and self.alibi_slopes.dim() == 2)


def _check_features(features, q, k):
    """The tensors of `features` against q [batch, heads_q, seq_q, d] and k; None when none is on."""
    if features is None or not features.any():
        return None
    for name, value in zip(("window_left", "window_right"), features.window):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int (-1 for no limit), got {value!r}")
    if not isinstance(features.softcap, (int, float)) or not math.isfinite(features.softcap) or features.softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0 for none), got {features.softcap!r}")
    batch, heads_q, seq_q, _ = q.shape
    seq_kv = k.shape[2]
    if features.bias is not None:
        b = features.bias
        _check_tensor("bias", b, 4, "[batch, heads_q, seq_q, seq_kv]")
        if b.dtype != torch.float32 or tuple(b.shape) != (batch, heads_q, seq_q, seq_kv):
            raise ValueError(f"bias must be torch.float32 {(batch, heads_q, seq_q, seq_kv)}, got {b.dtype} "
                             f"{tuple(b.shape)}")
        _check_contiguous("bias", b, "pass .contiguous() (a copy)")
        _same_device(("q", "bias"), (q, b))
    if features.alibi_slopes is not None:
        a = features.alibi_slopes
        rows = batch if features.cu_seqlens_q is None else features.cu_seqlens_q.shape[0] - 1
        if not features.alibi:
            raise ValueError("alibi_slopes are given but alibi is False")
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(a).__name__}")
        if a.dtype != torch.float32 or tuple(a.shape) not in ((heads_q,), (rows, heads_q)):
            raise ValueError(f"alibi_slopes must be torch.float32 ({heads_q},) or ({rows}, {heads_q}), got {a.dtype} "
                             f"{tuple(a.shape)}")
        _check_contiguous("alibi_slopes", a, "pass .contiguous() (a copy)")
        _same_device(("q", "alibi_slopes"), (q, a))
    if (features.cu_seqlens_q is None) != (features.cu_seqlens_k is None):
        raise ValueError("a packed batch needs both cu_seqlens_q and cu_seqlens_k")
    if features.cu_seqlens_q is not None:
        if batch != 1:
            raise ValueError(f"a packed batch lies along the seq axis of one batch: q's batch must be 1, got {batch}")
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            t = getattr(features, name)
            _check_tensor(name, t, 1, "[sequences + 1]")
            if t.dtype != torch.int32:
                raise TypeError(f"{name} has dtype {t.dtype}; allowed: torch.int32")
            _check_contiguous(name, t, "pass .contiguous() (a copy)")
            _same_device(("q", name), (q, t))
        if features.cu_seqlens_k.shape != features.cu_seqlens_q.shape:
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one length (sequences + 1), got "
                             f"{features.cu_seqlens_q.shape[0]} and {features.cu_seqlens_k.shape[0]}")
        for name in ("max_seqlen_q", "max_seqlen_k"):
            value = getattr(features, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
    return features


# The kernel used when none is named: the first of each list this machine can run.
_DEFAULT_FORWARD = {
    "bf16": ("ch06_pingpong_bf16", "ch05_tuned_bf16"),
    "fp16": ("ch05_tuned_fp16",),
    "fp32": ("ch04_registers",),
}
_DEFAULT_BACKWARD = {
    "bf16": ("ch07_wgmma_bf16", "ch07_mma_bf16"),
    "fp16": ("ch07_mma_fp16",),
    "fp32": ("ch07_fp32",),
}


# The kernels that take chapter 09's features, when none is named and a feature is on.
_FEATURES_FORWARD = {"bf16": ("ch09_hopper_bf16", "ch09_ampere_bf16"), "fp16": ("ch09_ampere_fp16",)}
_FEATURES_BACKWARD = {"bf16": ("ch09_ampere_backward_bf16",), "fp16": ("ch09_ampere_backward_fp16",)}




@functools.lru_cache(maxsize=None)
def _features_default(kind, dtype_name):
    """The first of chapter 09's kernels for the dtype that this machine runs (else the first)."""
    table = _FEATURES_FORWARD if kind == lib.FORWARD else _FEATURES_BACKWARD
    if dtype_name not in table:
        raise TypeError(f"chapter 09's features take torch.float16 or torch.bfloat16 tensors, got "
                        f"{_TORCH_DTYPES[dtype_name]}")
    library = lib.load()
    infos = [library.find(kind, n) for n in table[dtype_name]]
    return next((i for i in infos if i.available), infos[0])


def _resolve(kind, name, dtype_name, what, features=False):
    """The KernelInfo to run: `name` exactly, or name + "_" + dtype ("ch06_pingpong" on bf16),
    or the default for the dtype when name is None (chapter 09's kernels when `features`)."""
    if name is None and features:
        return _features_default(kind, dtype_name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{what} must be a kernel name (str) or None, got {type(name).__name__}")
    return _resolve_name(kind, name, dtype_name, what)


@functools.lru_cache(maxsize=None)
def _resolve_name(kind, name, dtype_name, what):
    library = lib.load()
    if name is None:
        defaults = (_DEFAULT_FORWARD if kind == lib.FORWARD else _DEFAULT_BACKWARD)[dtype_name]
        infos = [library.find(kind, n) for n in defaults]
        for info in infos:
            if info.available:
                return info
        return infos[0]  # its launch will say why it cannot run here
    try:
        info = library.find(kind, name)
    except lib.UnknownKernelError:
        try:
            info = library.find(kind, f"{name}_{dtype_name}")
        except lib.UnknownKernelError:
            others = [k for k in library.kernels(kind) if k.name.startswith(name + "_")]
            if others:
                dtypes = ", ".join(sorted({str(_TORCH_DTYPES[k.dtype]) for k in others}))
                raise TypeError(f"{what} '{name}' comes in {dtypes} only, got {_TORCH_DTYPES[dtype_name]} tensors")
            library.find(kind, name)  # raises with the list of registered names
            raise
    if info.dtype != dtype_name:
        twin = f"{name.rsplit('_', 1)[0]}_{dtype_name}"
        raise TypeError(f"{what} '{info.name}' takes {_TORCH_DTYPES[info.dtype]} tensors, got "
                        f"{_TORCH_DTYPES[dtype_name]}" + (f" (try '{twin}')" if _exists(kind, twin) else ""))
    return info


@functools.lru_cache(maxsize=4096)
def _check(kind, name, shape_key, features_key=None):
    """Workspace bytes for a shape (a tuple of fa_shape's fields) and features (Features.key(),
    or None); raises if the kernel does not take them. Cached: a model calls the same kernel on
    the same shape at every step. The C library sees a non-null pointer wherever a feature's
    tensor is given (its contents are not part of the check)."""
    library = lib.load()
    shape = (lib._DecodeShape if kind == lib.DECODE else lib._Shape)(*shape_key)
    features = None
    if features_key is not None:
        wl, wr, softcap, alibi, has_bias, sequences, max_q, max_k, slope_dims = features_key
        present = 1 << 8
        features = library.features(window=(wl, wr), softcap=softcap, alibi=alibi, bias=present if has_bias else 0,
                                    sequences=sequences, cu_seqlens_q=present if sequences else 0,
                                    cu_seqlens_k=present if sequences else 0, max_seqlen_q=max_q,
                                    max_seqlen_k=max_k, alibi_slopes=present if slope_dims else 0,
                                    alibi_slopes_per_sequence=slope_dims == 2)
    return library.check(kind, name, shape, features)


def _key(shape):
    return tuple(getattr(shape, f) for f, _ in shape._fields_)


def _exists(kind, name):
    try:
        lib.load().find(kind, name)
        return True
    except lib.UnknownKernelError:
        return False


def _check_tensor(name, t, ndim, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on device '{t.device}'; the kernels run on a CUDA device: move it with {name}.cuda()")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions {what}, got shape {tuple(t.shape)}")


def _check_float(name, t):
    if t.dtype not in _DTYPE_NAMES:
        raise TypeError(f"{name} has dtype {t.dtype}; allowed: {_ALLOWED_DTYPES}")


def _check_contiguous(name, t, hint):
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}); the kernels "
                         f"read dense tensors: {hint}")


def _same_device(names, tensors):
    device = tensors[0].device
    for name, t in zip(names[1:], tensors[1:]):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but {names[0]} is on {device}; all tensors must be on one device")


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def _workspace(nbytes, device):
    if nbytes == 0:
        return None, 0
    buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer, buffer.data_ptr()


def _attention_shape(q, k, v, causal, scale):
    """The fa_shape of [batch, heads, seq, head_dim] q, k, v after every check of their shapes."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4, "[batch, heads, seq, head_dim]")
        _check_float(name, t)
    _same_device(("q", "k", "v"), (q, k, v))
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads_q, seq_q, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k must be [batch={batch}, heads_kv, seq_kv, head_dim={head_dim}] like q "
                         f"{tuple(q.shape)}, got {tuple(k.shape)}")
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    if heads_q % heads_kv != 0:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's heads ({heads_kv}) (GQA/MQA)")
    if scale is None:
        scale = 0.0
    elif not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0 or None (1/sqrt(head_dim)), got {scale!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    return lib.load().shape(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, causal, scale)


def _output(name, given, shape, dtype, device, strided=False):
    """A new output tensor, or the caller's `given` after checking it matches (contiguous,
    unless the kernel is strided)."""
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _check_tensor(name, given, len(shape), str(list(shape)))
    if tuple(given.shape) != tuple(shape) or given.dtype != dtype or given.device != device:
        raise ValueError(f"{name} must be a {dtype} tensor of shape {tuple(shape)} on {device}, got "
                         f"{given.dtype} {tuple(given.shape)} on {given.device}")
    if not strided:
        _check_contiguous(name, given, "pass a new tensor")
    return given


# A model calls the same kernel with tensors of the same shapes at every step, so what the checks
# find for one signature of the arguments (every tensor's shape, strides, dtype and device, and
# the other arguments) is kept: the kernel, its fa_shape and its workspace bytes. A call with a
# known signature skips the checks, which passed for it before; one that raises is not kept.
_PLANS = {}
_PLANS_MAX = 4096


def _sig(t):
    # storage_offset % 8: whether the data is 16-byte aligned, which a strided kernel's copies need
    return None if t is None else (t.shape, t.stride(), t.storage_offset() % 8, t.dtype, t.device)


# Strided kernels (KernelInfo.strided: chapter 06's bf16 kernels, chapter 07's Hopper backward,
# chapter 09's Hopper forward) read and write [batch, heads, seq, head_dim] views with any strides
# whose head_dim is contiguous, such as flash-attn's [batch, seq, heads, head_dim] tensors seen through
# .transpose(1, 2), or slices of one QKV projection: nothing is copied. Every other kernel reads
# packed tensors, and a tensor that is not packed is copied for it (.contiguous()).

def _strides(t):
    """fa_strides of a [batch, heads, rows, head_dim] tensor a strided kernel can take as it is,
    or None (it is copied): head_dim contiguous, 16-byte aligned, other strides multiples of 8
    elements (the tensor maps' rule). A dimension of size 1 is never stepped over, so its stride
    is replaced by a valid one."""
    if t.stride(3) != 1 or t.storage_offset() % 8:  # (the caching allocator's blocks are aligned)
        return None
    fixed = []
    for dim in (0, 1, 2):
        stride = t.stride(dim) if t.shape[dim] > 1 else 8
        if stride <= 0 or stride % 8:
            return None
        fixed.append(stride)
    return lib._Strides(*fixed)


def _seq_major(t):
    """True when t's rows are farther apart than its heads (a view of [batch, seq, heads, head_dim])."""
    return t.shape[1] > 1 and t.shape[2] > 1 and t.stride(2) > t.stride(1)


def _new_like(t):
    """An empty output shaped like [batch, heads, seq, head_dim] t: for a strided kernel, laid out
    [batch, seq, heads, head_dim] underneath when t is, so that the caller's .transpose(1, 2)
    back is free."""
    if _seq_major(t):
        b, h, s, d = t.shape
        return torch.empty((b, s, h, d), dtype=t.dtype, device=t.device).transpose(1, 2)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def _in_place(info, tensors):
    """Whether the kernel takes these tensors as they are: a strided kernel, and strides it can use."""
    return info.strided and all(_strides(t) is not None for t in tensors)


def _layout(info, inputs, outputs):
    """How a call passes its tensors: None when every one is packed, or when the kernel takes
    packed tensors only (the inputs are then copied, the outputs new and packed); else the
    fa_strides array for the kernel's strided entry point, inputs then outputs. outputs: the
    caller's tensors, or tensors allocated as they will be (_new_like)."""
    tensors = inputs + outputs
    if all(t.is_contiguous() for t in tensors) or not _in_place(info, tensors):
        return None
    return (lib._Strides * len(tensors))(*(_strides(t) for t in tensors))


def outputs_like(kind, kernel, inputs, features=False):
    """The outputs a forward (O) or backward (dQ, dK, dV) call on `inputs` returns, empty: laid
    out as forward() and backward() lay them out, so that the operators' fake implementations
    give torch.compile the strides the real ones will have (`features`: a call with chapter 09's
    features, whose default kernels are chapter 09's)."""
    like = inputs[:1] if kind == lib.FORWARD else inputs[:3]
    new = [_new_like(t) for t in like]
    try:
        info = _resolve(kind, kernel, _DTYPE_NAMES[inputs[0].dtype], "kernel", features)
    except Exception:  # the real call raises the right error
        info = None
    if info is None or not _in_place(info, list(inputs) + new):
        new = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in like]
    return new


def _signature(kind, tensors, causal, scale, kernel, features):
    """The key of a call's plan, or None when an argument is not what the checks take (the slow
    path then raises the right error)."""
    try:
        key = (kind, causal, scale, kernel, *(_sig(t) for t in tensors))
        if features is not None:
            key += (features.key(), _sig(features.bias), _sig(features.cu_seqlens_q), _sig(features.cu_seqlens_k),
                    _sig(features.alibi_slopes))
        hash(key)
        return key
    except (AttributeError, TypeError, ValueError):
        return None


def _plan(key, make):
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = make()
        if key is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


def _device_index(device):
    """The CUDA device to launch on, made current by the caller only when it is not already."""
    return device.index if device.index is not None else torch.cuda.current_device()


def _raw_stream(index):
    return torch._C._cuda_getCurrentRawStream(index)


def forward(q, k, v, *, causal=False, scale=None, kernel=None, out=None, lse=None, features=None):
    """O and LSE of [batch, heads, seq, head_dim] tensors, no autograd; out/lse: tensors to
    write into (O like q; LSE float32 [batch, heads_q, seq_q], natural log); features: a
    Features (chapter 09's kernels only). Tensors that are not packed are read in place by a
    strided kernel and copied for any other (module docstring)."""
    if features is not None and not features.any():
        features = None
    key = _signature(lib.FORWARD, (q, k, v, out, lse), causal, scale, kernel, features)

    def make():
        shape = _attention_shape(q, k, v, causal, scale)
        checked = _check_features(features, q, k)
        info = _resolve(lib.FORWARD, kernel, _DTYPE_NAMES[q.dtype], "kernel", checked is not None)
        nbytes = _check(lib.FORWARD, info.name, _key(shape), None if checked is None else checked.key())
        _output("out", out, q.shape, q.dtype, q.device, info.strided)
        _output("lse", lse, q.shape[:3], torch.float32, q.device)
        strides = _layout(info, [q, k, v], [_new_like(q) if out is None else out])
        if strides is None and out is not None and not out.is_contiguous():
            raise ValueError(f"out has strides {out.stride()} that {info.name} cannot write; pass a new tensor")
        copy = strides is None and not all(t.is_contiguous() for t in (q, k, v))
        return info.name.encode(), shape, nbytes, strides, copy

    # The plan's key holds every tensor's strides, so whether this call copies is part of the plan.
    name, shape, nbytes, strides, copy = _plan(key, make)
    if copy:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if out is None:
        out = torch.empty_like(q) if strides is None else _new_like(q)
    if lse is None:
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    index = _device_index(q.device)
    with torch.cuda.device(index) if index != torch.cuda.current_device() else _NO_GUARD:
        work = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        library = lib.load()
        features_p = None if features is None else ctypes.byref(features.struct())
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                    None if work is None else work.data_ptr(), nbytes, _raw_stream(index))
        if strides is None:
            library._raise_for(library._lib.fa_forward_features(name, ctypes.byref(shape), features_p, *pointers))
        else:
            library._raise_for(library._lib.fa_forward_strided(name, ctypes.byref(shape), features_p, strides,
                                                               *pointers))
        del work  # returned to the caching allocator in stream order
    return out, lse


def backward(q, k, v, o, lse, d_o, *, causal=False, scale=None, kernel=None, dq=None, dk=None, dv=None,
             features=None):
    """dQ, dK, dV from a forward's O and LSE and the output gradient dO, no autograd; features:
    the forward's Features. Strides as in forward(); new gradients are laid out like the inputs
    they belong to."""
    if features is not None and not features.any():
        features = None
    key = _signature(lib.BACKWARD, (q, k, v, o, lse, d_o, dq, dk, dv), causal, scale, kernel, features)

    def make():
        shape = _attention_shape(q, k, v, causal, scale)
        _check_tensor("o", o, 4, "[batch, heads, seq, head_dim]")
        _check_tensor("d_o", d_o, 4, "[batch, heads, seq, head_dim]")
        _check_tensor("lse", lse, 3, "[batch, heads_q, seq_q]")
        for name, t in (("o", o), ("d_o", d_o)):
            if t.shape != q.shape or t.dtype != q.dtype:
                raise ValueError(f"{name} must be {q.dtype} {tuple(q.shape)} like q, got {t.dtype} {tuple(t.shape)}")
        if lse.shape != q.shape[:3] or lse.dtype != torch.float32:
            raise ValueError(f"lse must be torch.float32 {tuple(q.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}")
        _same_device(("q", "o", "d_o", "lse"), (q, o, d_o, lse))
        _check_contiguous("lse", lse, "pass .contiguous() (a copy)")
        checked = _check_features(features, q, k)
        info = _resolve(lib.BACKWARD, kernel, _DTYPE_NAMES[q.dtype], "backward kernel", checked is not None)
        nbytes = _check(lib.BACKWARD, info.name, _key(shape), None if checked is None else checked.key())
        _output("dq", dq, q.shape, q.dtype, q.device, info.strided)
        _output("dk", dk, k.shape, k.dtype, k.device, info.strided)
        _output("dv", dv, v.shape, v.dtype, v.device, info.strided)
        grads = [_new_like(t) if g is None else g for t, g in ((q, dq), (k, dk), (v, dv))]
        strides = _layout(info, [q, k, v, o, d_o], grads)
        given = [g for g in (dq, dk, dv) if g is not None]
        if strides is None and not all(g.is_contiguous() for g in given):
            raise ValueError(f"dq, dk or dv has strides that {info.name} cannot write; pass new tensors")
        copy = strides is None and not all(t.is_contiguous() for t in (q, k, v, o, d_o))
        return info.name.encode(), shape, nbytes, strides, copy

    name, shape, nbytes, strides, copy = _plan(key, make)  # whether it copies: as in forward()
    if copy:
        q, k, v, o, d_o = (t.contiguous() for t in (q, k, v, o, d_o))
    new = torch.empty_like if strides is None else _new_like
    dq = new(q) if dq is None else dq
    dk = new(k) if dk is None else dk
    dv = new(v) if dv is None else dv
    index = _device_index(q.device)
    with torch.cuda.device(index) if index != torch.cuda.current_device() else _NO_GUARD:
        work = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        library = lib.load()
        features_p = None if features is None else ctypes.byref(features.struct())
        pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(), lse.data_ptr(),
                    dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None if work is None else work.data_ptr(), nbytes,
                    _raw_stream(index))
        if strides is None:
            library._raise_for(library._lib.fa_backward_features(name, ctypes.byref(shape), features_p, *pointers))
        else:
            library._raise_for(library._lib.fa_backward_strided(name, ctypes.byref(shape), features_p, strides,
                                                                *pointers))
        del work
    return dq, dk, dv


# attention()'s eager path in C++ (libfa_torch.so, python/csrc/eager_attention.cpp), built next to
# libfa_kernels.so when CMake found torch: the same launches as forward() and backward(), with
# autograd in C++, so that neither the call nor its backward runs Python per call.
EAGER_PYTHON_VARIABLE = "FA_EAGER_PYTHON"  # set to 1: attention() takes the Python path instead


@functools.lru_cache(maxsize=None)
def eager_ops():
    """torch.ops.attention_kernels with eager_plan and eager_attention when libfa_torch.so is
    loaded; else a string saying why not (attention() then calls the library from Python)."""
    if os.environ.get(EAGER_PYTHON_VARIABLE, "") not in ("", "0"):
        return f"{EAGER_PYTHON_VARIABLE} is set"
    path = lib.load().path.with_name("libfa_torch.so")
    if not path.is_file():
        return f"{path} is not there (CMake did not find torch when the library was built)"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:  # built against another torch
        warnings.warn(f"attention_kernels: {path} does not load ({e}); attention() calls the library from Python")
        return f"{path} does not load: {e}"
    global _EAGER_FAKE
    if not _EAGER_FAKE:  # once per process (eager_ops' cache may be cleared, the registration stays)
        torch.library.register_fake("attention_kernels::eager_attention", _eager_attention_fake)
        torch.library.register_fake("attention_kernels::eager_attention_backward", _eager_backward_fake)
        _EAGER_FAKE = True
    return torch.ops.attention_kernels


_EAGER_FAKE = False

_EAGER_KERNELS = {}  # plan id -> its forward and backward KernelInfo (None: no backward), for the fakes


def _eager_attention_fake(q, k, v, plan):
    """Shapes and strides of eager_attention's outputs, as eager_attention.cpp lays them out."""
    fwd = _EAGER_KERNELS.get(plan, (None, None))[0]
    o = _new_like(q) if fwd is not None and _in_place(fwd, (q, k, v)) else q.new_empty(q.shape)
    return o, q.new_empty(q.shape[:3], dtype=torch.float32)


def _eager_backward_fake(q, k, v, o, lse, d_o, plan):
    """Shapes and strides of eager_attention_backward's gradients, as eager_attention.cpp lays them out."""
    bwd = _EAGER_KERNELS.get(plan, (None, None))[1]
    in_place = bwd is not None and _in_place(bwd, (q, k, v, o, d_o))
    return tuple(_new_like(t) if in_place else t.new_empty(t.shape) for t in (q, k, v))


def eager_attention(q, k, v, causal, scale, kernel, backward_kernel, needs_grad):
    """(O, LSE) of attention() through libfa_torch.so's operator, its backward in C++; None when
    that library is not loaded, or for tensors whose alignment the launch would refuse. The plan
    (the kernels, shape and workspaces after every check of forward() and check_backward()) is
    made once per signature of the arguments, and is a row of the operator's table for good."""
    ops = eager_ops()
    if isinstance(ops, str):
        return None
    try:  # _signature's key, spelled out: this runs on every call
        key = ("eager", q.shape, q.stride(), q.storage_offset() % 8, q.dtype, q.get_device(), k.shape, k.stride(),
               k.storage_offset() % 8, k.dtype, k.get_device(), v.shape, v.stride(), v.storage_offset() % 8, v.dtype,
               v.get_device(), causal, scale, kernel, backward_kernel, needs_grad)
        hash(key)
    except (AttributeError, TypeError):
        key = None  # not tensors, or an argument that cannot be a key: make() raises the right error

    def make():
        shape = _attention_shape(q, k, v, causal, scale)
        if any(t.storage_offset() % 8 for t in (q, k, v)):
            return None  # possibly misaligned: forward() says so in its own words
        dtype_name = _DTYPE_NAMES[q.dtype]
        fwd = _resolve(lib.FORWARD, kernel, dtype_name, "kernel")
        fwd_bytes = _check(lib.FORWARD, fwd.name, _key(shape))
        bwd, bwd_bytes = None, 0
        if needs_grad:  # checked now, so a model fails at its forward rather than in loss.backward()
            bwd = _resolve(lib.BACKWARD, backward_kernel, dtype_name, "backward_kernel")
            bwd_bytes = _check(lib.BACKWARD, bwd.name, _key(shape))
        plan = ops.eager_plan(fwd.name, "" if bwd is None else bwd.name, list(_key(shape)[:7]), shape.scale,
                              fwd.strided, bwd is not None and bwd.strided, fwd_bytes, bwd_bytes)
        _EAGER_KERNELS[plan] = (fwd, bwd)
        return plan

    plan = _plan(key, make)
    return None if plan is None else ops.eager_attention.default(q, k, v, plan)


def check_backward(q, k, v, *, causal=False, scale=None, kernel=None, features=None):
    """Raises now if the backward kernel does not take this shape (or does not exist for the dtype)."""
    if features is not None and not features.any():
        features = None

    def make():
        shape = _attention_shape(q, k, v, causal, scale)
        checked = _check_features(features, q, k)
        name = _resolve(lib.BACKWARD, kernel, _DTYPE_NAMES[q.dtype], "backward_kernel", checked is not None).name
        _check(lib.BACKWARD, name, _key(shape), None if checked is None else checked.key())
        return True

    _plan(_signature("check_backward", (q, k, v), causal, scale, kernel, features), make)


def attention(q, k, v, *, causal=False, scale=None, kernel=None, backward_kernel=None, layout="bhsd"):
    """softmax(scale q k^T + causal mask) v with a registered kernel; differentiable.

    q [batch, heads_q, seq_q, head_dim], k and v [batch, heads_kv, seq_kv, head_dim] (GQA when
    heads_kv divides heads_q), one dtype, contiguous, on one CUDA device: the same arguments as
    scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True), except
    that causal is aligned bottom-right when seq_q != seq_kv (the last query sees every key).
    kernel: a forward kernel's name ("ch06_pingpong_bf16", or "ch06_pingpong": the dtype is
    added), or None for the first of the dtype's default list that this machine runs
    (_DEFAULT_FORWARD). backward_kernel: the same for the backward (chapter 07, _DEFAULT_BACKWARD),
    used when any input requires grad. layout: "bhsd" or "bshd" (module
    docstring: what is copied).
    """
    if (layout == "bhsd" or layout == "bshd") and not torch.compiler.is_compiling():
        # The eager path: a known signature of the arguments skips every check (they passed for it
        # before); a new one is checked by eager_attention's plan, which raises what the checks
        # below would.
        try:
            needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
            if layout == "bhsd":
                views = (q, k, v)
            elif q.dim() == k.dim() == v.dim() == 4:
                views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            else:
                needs_grad = None  # the checks below say what is wrong
        except (AttributeError, TypeError):
            needs_grad = None  # not tensors: the checks below say so
        if needs_grad is not None:
            out = eager_attention(*views, causal, scale, kernel, backward_kernel, needs_grad)
            if out is not None:
                return out[0] if layout == "bhsd" else out[0].transpose(1, 2)
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bhsd' ([batch, heads, seq, head_dim]) or 'bshd' ([batch, seq, heads, "
                         f"head_dim]), got {layout!r}")
    if layout == "bshd":
        for name, t in (("q", q), ("k", k), ("v", v)):
            _check_tensor(name, t, 4, "[batch, seq, heads, head_dim]")
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # views: forward() copies only for a packed-only kernel
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, 4, "[batch, heads, seq, head_dim]")
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a kernel name (str) or None, got {type(kernel).__name__}")
    if backward_kernel is not None and not isinstance(backward_kernel, str):
        raise TypeError(f"backward_kernel must be a kernel name (str) or None, got {type(backward_kernel).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError(f"scale must be a finite number > 0 or None (1/sqrt(head_dim)), got {scale!r}")
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    o, _ = _ops.attention_forward(q, k, v, causal, None if scale is None else float(scale), kernel, backward_kernel,
                                  needs_grad)
    return o.transpose(1, 2) if layout == "bshd" else o


def decode(q, k_cache, v_cache, block_table, context_lens, *, kernel=None, max_context=None, check=True, out=None,
           lse=None):
    """The paged decode (decode_impl's arguments and result), through the attention_kernels::decode
    operator so that torch.compile and CUDA graphs take it; with out= or lse= it writes into those
    tensors directly (eager only). Under a CUDA graph pass check=False and max_context: the checks
    read context_lens on the host."""
    if out is not None or lse is not None:
        return decode_impl(q, k_cache, v_cache, block_table, context_lens, kernel=kernel, max_context=max_context,
                           check=check, out=out, lse=lse)
    for name, t, ndim, what in (("q", q, 4, "[num_seqs, heads_q, query_len, head_dim]"),
                                ("k_cache", k_cache, 4, "[num_blocks, heads_kv, block_size, head_dim]"),
                                ("v_cache", v_cache, 4, "[num_blocks, heads_kv, block_size, head_dim]"),
                                ("block_table", block_table, 2, "[num_seqs, max_blocks_per_seq]"),
                                ("context_lens", context_lens, 1, "[num_seqs]")):
        _check_tensor(name, t, ndim, what)
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(f"kernel must be a kernel name (str) or None, got {type(kernel).__name__}")
    return _ops.decode(q, k_cache, v_cache, block_table, context_lens, kernel,
                       None if max_context is None else int(max_context), bool(check))


def decode_impl(q, k_cache, v_cache, block_table, context_lens, *, kernel=None, max_context=None, check=True, out=None,
                lse=None):
    """Attention of each sequence's newest query_len tokens over a paged K/V cache (chapter 08).

    q [num_seqs, heads_q, query_len, head_dim]; k_cache and v_cache [num_blocks, heads_kv,
    block_size, head_dim]; block_table int32 [num_seqs, max_blocks_per_seq]; context_lens int32
    [num_seqs]: sequence s has context_lens[s] tokens, token t in row t % block_size of block
    block_table[s, t // block_size]; its queries are its last query_len tokens (causal among
    themselves). Scale 1/sqrt(head_dim). Returns O like q and LSE float32 [num_seqs, heads_q,
    query_len]. max_context: the largest context length (read from context_lens when None, which
    waits for the GPU). check: also verify context lengths and the block-table entries in use
    (one more wait); a wrong entry otherwise reads outside the cache.
    """
    _check_tensor("q", q, 4, "[num_seqs, heads_q, query_len, head_dim]")
    _check_tensor("k_cache", k_cache, 4, "[num_blocks, heads_kv, block_size, head_dim]")
    _check_tensor("v_cache", v_cache, 4, "[num_blocks, heads_kv, block_size, head_dim]")
    _check_tensor("block_table", block_table, 2, "[num_seqs, max_blocks_per_seq]")
    _check_tensor("context_lens", context_lens, 1, "[num_seqs]")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_float(name, t)
    for name, t in (("block_table", block_table), ("context_lens", context_lens)):
        if t.dtype != torch.int32:
            raise TypeError(f"{name} has dtype {t.dtype}; allowed: torch.int32")
    names = ("q", "k_cache", "v_cache", "block_table", "context_lens")
    tensors = (q, k_cache, v_cache, block_table, context_lens)
    _same_device(names, tensors)
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must have one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    num_seqs, heads_q, query_len, head_dim = q.shape
    num_blocks, heads_kv, block_size, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"k_cache's head_dim ({cache_dim}) must equal q's ({head_dim})")
    if block_table.shape[0] != num_seqs or context_lens.shape[0] != num_seqs:
        raise ValueError(f"block_table and context_lens must have num_seqs={num_seqs} rows like q, got "
                         f"{tuple(block_table.shape)} and {tuple(context_lens.shape)}")
    for name, t in zip(names, tensors):
        _check_contiguous(name, t, "pass .contiguous() (a copy)")
    max_blocks = block_table.shape[1]
    if max_context is None:
        max_context = int(context_lens.max().item()) if num_seqs > 0 else 0
    if check:
        lens = context_lens.to(torch.int64)
        if bool((lens < 0).any()) or bool((lens > max_context).any()):
            raise ValueError(f"context_lens must be between 0 and max_context ({max_context}), got "
                             f"{context_lens.min().item()}..{context_lens.max().item()}")
        used = torch.arange(max_blocks, device=q.device)[None, :] * block_size < lens[:, None]
        bad = used & ((block_table < 0) | (block_table >= num_blocks))
        if bool(bad.any()):
            s, b = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{s}, {b}] is {int(block_table[s, b])}; entries in use must be between 0 "
                             f"and num_blocks - 1 ({num_blocks - 1})")
    library = lib.load()
    shape = library.decode_shape(num_seqs=num_seqs, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                                 query_len=query_len, block_size=block_size, num_blocks=num_blocks,
                                 max_blocks_per_seq=max_blocks, max_context=int(max_context))
    dtype_name = _DTYPE_NAMES[q.dtype]
    if kernel is None:
        kernel = "ch08_split_kv"
    info = _resolve(lib.DECODE, kernel, dtype_name, "kernel")
    nbytes = _check(lib.DECODE, info.name, _key(shape))
    out = _output("out", out, q.shape, q.dtype, q.device)
    lse = _output("lse", lse, q.shape[:3], torch.float32, q.device)
    with torch.cuda.device(q.device):
        work, work_ptr = _workspace(nbytes, q.device)
        library.decode(info.name, shape, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
                       context_lens.data_ptr(), out.data_ptr(), lse.data_ptr(), work_ptr, nbytes, _stream(q.device))
        del work
    return out, lse


from . import _ops  # noqa: E402  (the operators call the functions above)
