"""flash-attn's interface over the tutorial's kernels: flash_attn_func and flash_attn_varlen_func
with flash-attn 2's arguments, layouts and return values, so code written for flash-attn runs by
changing its import:

    from attention_kernels import flash_attn_func, flash_attn_varlen_func

q [batch, seq_q, heads_q, head_dim] (varlen: [total_q, heads_q, head_dim]), k and v with heads_kv
dividing heads_q; fp16 or bf16; causal aligned bottom-right; window_size (left, right) with -1 for
no limit; softcap; alibi_slopes; deterministic. With any of window_size, softcap, alibi_slopes or a
packed batch the call runs chapter 09's kernels (forward and backward); without, the fastest
kernel of the dtype (ak.attention's defaults).

Where this differs from flash-attn, on purpose (docs/python.md, tested in tests/python):
  * dropout_p must be 0: no kernel here drops weights (a ValueError says so).
  * A query row that sees no key (a window, or a causal row before the first key) gets O = 0 as in
    flash-attn, and LSE = -inf where flash-attn writes +inf.
  * alibi_slopes, float32 [heads_q] or [batch, heads_q] as in flash-attn, reach chapter 09's
    kernels as they are (alibi_slopes(heads_q) gives the ALiBi paper's). The penalty is
    -slope * |i + seq_k - seq_q - j| on every visible key, causal or not, and the LSE is that of
    the penalized scores (tests/python/test_flash_attn.py checks it against that definition).
  * return_attn_probs=True returns (out, softmax_lse, None): there are no dropout masks to return.
  * The (batch, seq, heads, head_dim) tensors, and views of one QKV projection, are read in
    place by the strided kernels (chapter 05's tuned forward, chapter 06's bf16 forward, chapter
    07's tensor-core and Hopper backward, chapter 09's Hopper forward and its backward: the fp16
    and bf16 defaults), whose outputs come back in flash-attn's layout, the varlen call's [total, heads,
    head_dim] rows too; the others (the fp32 kernels, chapter 09's Ampere forward) copy them
    into their packed [batch, heads, seq, head_dim] layout first.
"""
import torch

from . import _library, _ops, _torch

def alibi_slopes(heads, device="cuda"):
    """The ALiBi paper's slopes for `heads` heads (float32 [heads]): what chapter 09's kernels use."""
    return torch.tensor([_library._alibi_slope(heads, h) for h in range(heads)], dtype=torch.float32, device=device)


def _check_common(dropout_p, softmax_scale, window_size, softcap, deterministic):
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0: no kernel of this library drops attention weights, got {dropout_p!r}")
    if softmax_scale is not None and not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a number or None (1/sqrt(head_dim)), got {softmax_scale!r}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), -1 for no limit, got {window_size!r}")
    left, right = window_size
    for name, value in (("window_size[0]", left), ("window_size[1]", right)):
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise ValueError(f"{name} must be an int >= -1 (-1: no limit), got {value!r}")
    if not isinstance(softcap, (int, float)) or softcap < 0:
        raise ValueError(f"softcap must be a number >= 0 (0: off), got {softcap!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")


def _check_alibi(slopes, batch, heads):
    """The caller's slopes (checked), or None."""
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(slopes).__name__}")
    if slopes.dtype != torch.float32 or tuple(slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must be float32 ({heads},) or ({batch}, {heads}), got {slopes.dtype} "
                         f"{tuple(slopes.shape)}")
    return slopes.contiguous()


def _backward_kernel(deterministic, features_on, dtype):
    """The backward kernel's name: None (the default) unless deterministic gradients are asked
    for; then the default when it is deterministic (ch07_wgmma_bf16 on sm_90), else chapter 07's
    deterministic variant for the dtype (ch07_deterministic_*)."""
    if not deterministic:
        return None
    dtype_name = _torch._DTYPE_NAMES.get(dtype)
    if dtype_name is None:
        return None  # the forward's checks name the dtypes allowed
    info = _torch._resolve(_library.BACKWARD, None, dtype_name, "backward kernel", features_on)
    if info.deterministic:
        return info.name
    if not features_on and _torch._exists(_library.BACKWARD, f"ch07_deterministic_{dtype_name}"):
        return f"ch07_deterministic_{dtype_name}"
    raise ValueError(f"deterministic=True: the backward kernel for these arguments, {info.name}, adds dQ with "
                     "atomics, and no deterministic backward takes "
                     + ("chapter 09's features" if features_on else f"{dtype} tensors"))


def _run(q, k, v, causal, scale, window, softcap, alibi, cu_q, cu_k, max_q, max_k, deterministic):
    """O and LSE of [batch, heads, seq, head_dim] q, k, v through the operators (differentiable)."""
    features_on = tuple(window) != (-1, -1) or softcap != 0.0 or alibi is not None or cu_q is not None
    backward_kernel = _backward_kernel(deterministic, features_on, q.dtype)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    scale = None if scale is None else float(scale)
    features = None
    if features_on:
        features = _torch.Features(window=(int(window[0]), int(window[1])), softcap=float(softcap),
                                   alibi=alibi is not None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   max_seqlen_q=int(max_q), max_seqlen_k=int(max_k), alibi_slopes=alibi)
    return _ops.attention_forward(q, k, v, causal, scale, None, backward_kernel, needs_grad, features)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's flash_attn_func: q [batch, seq_q, heads_q, head_dim], k and v [batch, seq_kv,
    heads_kv, head_dim]; returns out like q, or (out, softmax_lse [batch, heads_q, seq_q], None)
    with return_attn_probs."""
    if (dropout_p == 0.0 and softmax_scale is None and softcap == 0.0 and alibi_slopes is None
            and deterministic is False and return_attn_probs is False and (causal is True or causal is False)
            and type(window_size) in (tuple, list) and len(window_size) == 2
            and type(window_size[0]) is int and type(window_size[1]) is int and tuple(window_size) == (-1, -1)):
        # The training call: attention()'s eager path, whose plan checks a new signature of the
        # arguments as the checks below would, and skips every check for one it has seen.
        return _torch.attention(q, k, v, causal=causal, layout="bshd")
    _check_common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _torch._check_tensor(name, t, 4, "[batch, seq, heads, head_dim]")
    alibi = _check_alibi(alibi_slopes, q.shape[0], q.shape[2])
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # views: copied only for a packed-only kernel
    o, lse = _run(qh, kh, vh, bool(causal), softmax_scale, window_size, softcap, alibi, None, None, 0, 0,
                  deterministic)
    out = o.transpose(1, 2)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash-attn's flash_attn_varlen_func: a packed batch, q [total_q, heads_q, head_dim], k and v
    [total_k, heads_kv, head_dim], cu_seqlens_q / cu_seqlens_k int32 [batch + 1]; returns out like
    q, or (out, softmax_lse [heads_q, total_q], None) with return_attn_probs."""
    _check_common(dropout_p, softmax_scale, window_size, softcap, deterministic)
    if block_table is not None:
        raise ValueError("block_table: a paged K/V cache is attention_kernels.decode's (chapter 08), not the varlen "
                         "call's; pass block_table=None")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _torch._check_tensor(name, t, 3, "[total, heads, head_dim]")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _torch._check_tensor(name, t, 1, "[batch + 1]")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r}")
    alibi = _check_alibi(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1])
    qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # views: copied only for a packed-only kernel
    o, lse = _run(qh, kh, vh, bool(causal), softmax_scale, window_size, softcap, alibi, cu_seqlens_q, cu_seqlens_k,
                  max_seqlen_q, max_seqlen_k, deterministic)
    out = o[0].transpose(0, 1)
    return (out, lse[0], None) if return_attn_probs else out


__all__ = ["flash_attn_func", "flash_attn_varlen_func", "alibi_slopes"]
