"""The tutorial's attention kernels on torch tensors.

    import attention_kernels as ak
    o = ak.attention(q, k, v, causal=True, kernel="ch06_pingpong")   # differentiable
    o, lse = ak.forward(q, k, v, kernel="ch05_tuned_bf16")           # no autograd
    o, lse = ak.decode(q, k_cache, v_cache, block_table, context_lens)
    ak.list_kernels("backward")
    from attention_kernels import flash_attn_func, flash_attn_varlen_func   # flash-attn's interface

attention() and decode() run as PyTorch operators (torch.ops.attention_kernels.forward,
.backward, .decode; _ops.py), so torch.compile(fullgraph=True) traces through them and CUDA graphs
capture them; forward() and backward() are the eager calls underneath, with out= tensors.

The kernels live in libfa_kernels.so (common/c_api.h), found next to this package, through
FA_KERNELS_LIBRARY, or in the source tree's build/lib. list_kernels() and the library itself need
no torch; the functions on tensors do.
"""
from ._library import (  # noqa: F401
    InvalidArgumentError,
    KernelError,
    KernelInfo,
    NoGpuError,
    UnknownKernelError,
    UnsupportedError,
    load,
)

__all__ = [
    "attention",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "alibi_slopes",
    "Features",
    "forward",
    "backward",
    "decode",
    "list_kernels",
    "KernelInfo",
    "KernelError",
    "InvalidArgumentError",
    "UnknownKernelError",
    "UnsupportedError",
    "NoGpuError",
    "load",
]


def list_kernels(kind=None):
    """Every registered kernel (kind None, "forward", "backward" or "decode") as KernelInfo."""
    from . import _library

    kinds = {"forward": _library.FORWARD, "backward": _library.BACKWARD, "decode": _library.DECODE}
    if kind is not None and kind not in kinds:
        raise ValueError(f"kind must be one of None, 'forward', 'backward', 'decode'; got {kind!r}")
    library = load()
    return [info for k in ([kinds[kind]] if kind else kinds.values()) for info in library.kernels(k)]


def __getattr__(name):
    # The tensor functions import torch on first use, so the package imports without it.
    if name in ("attention", "forward", "backward", "decode", "check_backward", "Features"):
        from . import _torch

        return getattr(_torch, name)
    if name in ("flash_attn_func", "flash_attn_varlen_func", "alibi_slopes"):
        from . import _flash_attn

        return getattr(_flash_attn, name)
    raise AttributeError(f"module 'attention_kernels' has no attribute {name!r}")
