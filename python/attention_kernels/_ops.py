"""The kernels as PyTorch operators, registered with torch.library:

    torch.ops.attention_kernels.forward(q, k, v, causal, scale, kernel, backward_kernel, check_backward)
        -> (o, lse)
    torch.ops.attention_kernels.backward(q, k, v, o, lse, d_o, causal, scale, kernel) -> (dq, dk, dv)
    torch.ops.attention_kernels.decode(q, k_cache, v_cache, block_table, context_lens, kernel,
                                       max_context, check) -> (o, lse)
    torch.ops.attention_kernels.features_forward / features_backward: forward and backward with
        chapter 09's features (window, softcap, ALiBi, bias, a packed batch) as arguments

Each has a fake implementation (shapes and dtypes, no kernel), so torch.compile traces through
it without a graph break, and the forward has its backward registered, so autograd,
torch.compile and CUDA graphs take attention like any ATen operator. The real implementations
are _torch.py's checks and launches: a call that breaks a rule raises the same exception, at
run time (under torch.compile, when the compiled graph runs). The LSE output has no gradient
(it does not require grad).
"""
from typing import Optional, Tuple

import torch

from . import _torch

Tensor = torch.Tensor


def _fake_attention_checks(q, k, v):
    """What the fake implementation can check without a kernel: ranks and matching sizes."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions [batch, heads, seq, head_dim], got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")


@torch.library.custom_op("attention_kernels::forward", mutates_args=(), device_types="cuda")
def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float], kernel: Optional[str],
            backward_kernel: Optional[str], check_backward: bool) -> Tuple[Tensor, Tensor]:
    """O and LSE; with check_backward, also checks now that the backward kernel takes the shape
    (so that a model fails at its forward, not in the middle of loss.backward())."""
    o, lse = _torch.forward(q, k, v, causal=causal, scale=scale, kernel=kernel)
    if check_backward:
        _torch.check_backward(q, k, v, causal=causal, scale=scale, kernel=backward_kernel)
    return o, lse


@forward.register_fake
def _(q, k, v, causal, scale, kernel, backward_kernel, check_backward):
    _fake_attention_checks(q, k, v)
    (o,) = _torch.outputs_like(_torch.lib.FORWARD, kernel, (q, k, v))
    return o, q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attention_kernels::backward", mutates_args=(), device_types="cuda")
def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, d_o: Tensor, causal: bool,
             scale: Optional[float], kernel: Optional[str]) -> Tuple[Tensor, Tensor, Tensor]:
    return _torch.backward(q, k, v, o, lse, d_o, causal=causal, scale=scale, kernel=kernel)


@backward.register_fake
def _(q, k, v, o, lse, d_o, causal, scale, kernel):
    _fake_attention_checks(q, k, v)
    dq, dk, dv = _torch.outputs_like(_torch.lib.BACKWARD, kernel, (q, k, v, o, d_o))
    return dq, dk, dv


def _setup_forward(ctx, inputs, output):
    q, k, v, causal, scale, _kernel, backward_kernel, _check = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.backward_kernel = causal, scale, backward_kernel
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward_of_forward(ctx, d_o, d_lse):
    q, k, v, o, lse = ctx.saved_tensors
    if d_o is None:
        return None, None, None, None, None, None, None, None
    dq, dk, dv = backward(q, k, v, o, lse, d_o, ctx.causal, ctx.scale, ctx.backward_kernel)
    return dq, dk, dv, None, None, None, None, None


forward.register_autograd(_backward_of_forward, setup_context=_setup_forward)


# Chapter 09's features: the same pair of operators with the features as arguments (an
# operator's schema takes tensors, numbers and strings, so the Features fields travel one by one).
def _features(window_left, window_right, softcap, alibi, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
              max_seqlen_k, alibi_slopes):
    return _torch.Features(window=(window_left, window_right), softcap=softcap, alibi=alibi, bias=bias,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k, alibi_slopes=alibi_slopes)


@torch.library.custom_op("attention_kernels::features_forward", mutates_args=(), device_types="cuda")
def features_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: Optional[float], window_left: int,
                     window_right: int, softcap: float, alibi: bool, bias: Optional[Tensor],
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                     max_seqlen_k: int, alibi_slopes: Optional[Tensor], kernel: Optional[str],
                     backward_kernel: Optional[str], check_backward: bool) -> Tuple[Tensor, Tensor]:
    f = _features(window_left, window_right, softcap, alibi, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, alibi_slopes)
    o, lse = _torch.forward(q, k, v, causal=causal, scale=scale, kernel=kernel, features=f)
    if check_backward:
        _torch.check_backward(q, k, v, causal=causal, scale=scale, kernel=backward_kernel, features=f)
    return o, lse


@features_forward.register_fake
def _(q, k, v, causal, scale, window_left, window_right, softcap, alibi, bias, cu_seqlens_q, cu_seqlens_k,
      max_seqlen_q, max_seqlen_k, alibi_slopes, kernel, backward_kernel, check_backward):
    _fake_attention_checks(q, k, v)
    (o,) = _torch.outputs_like(_torch.lib.FORWARD, kernel, (q, k, v), features=True)
    return o, q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("attention_kernels::features_backward", mutates_args=(), device_types="cuda")
def features_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, d_o: Tensor, causal: bool,
                      scale: Optional[float], window_left: int, window_right: int, softcap: float, alibi: bool,
                      bias: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                      max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor],
                      kernel: Optional[str]) -> Tuple[Tensor, Tensor, Tensor]:
    f = _features(window_left, window_right, softcap, alibi, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                  max_seqlen_k, alibi_slopes)
    return _torch.backward(q, k, v, o, lse, d_o, causal=causal, scale=scale, kernel=kernel, features=f)


@features_backward.register_fake
def _(q, k, v, o, lse, d_o, causal, scale, window_left, window_right, softcap, alibi, bias, cu_seqlens_q,
      cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, kernel):
    _fake_attention_checks(q, k, v)
    dq, dk, dv = _torch.outputs_like(_torch.lib.BACKWARD, kernel, (q, k, v, o, d_o), features=True)
    return dq, dk, dv


_FEATURE_ARGS = slice(5, 15)  # window_left .. alibi_slopes in features_forward's arguments


def _setup_features_forward(ctx, inputs, output):
    q, k, v, causal, scale = inputs[:5]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.backward_kernel = causal, scale, inputs[16]
    ctx.features = inputs[_FEATURE_ARGS]
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward_of_features_forward(ctx, d_o, d_lse):
    q, k, v, o, lse = ctx.saved_tensors
    none = (None,) * 15  # no gradient for causal .. check_backward (the bias and slopes get none either)
    if d_o is None:
        return (None, None, None) + none
    dq, dk, dv = features_backward(q, k, v, o, lse, d_o, ctx.causal, ctx.scale, *ctx.features,
                                   ctx.backward_kernel)
    return (dq, dk, dv) + none


features_forward.register_autograd(_backward_of_features_forward, setup_context=_setup_features_forward)


class _Eager(torch.autograd.Function):
    """The forward operators' eager twin: the same launches and the same backward, taken through
    torch.autograd.Function rather than the dispatcher. An eager call through a Python custom
    operator costs tens of microseconds of CPU time more (docs/python.md, the overhead table),
    which at a training shape is longer than the kernel; torch.compile, export and opcheck see
    the operators (attention_forward picks)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, kernel, backward_kernel, check_backward, features):
        o, lse = _torch.forward(q, k, v, causal=causal, scale=scale, kernel=kernel, features=features)
        if check_backward:
            _torch.check_backward(q, k, v, causal=causal, scale=scale, kernel=backward_kernel, features=features)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.backward_kernel, ctx.features = causal, scale, backward_kernel, features
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, d_o, d_lse):
        if d_o is None:
            return (None,) * 9
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _torch.backward(q, k, v, o, lse, d_o, causal=ctx.causal, scale=ctx.scale,
                                     kernel=ctx.backward_kernel, features=ctx.features)
        return (dq, dk, dv) + (None,) * 6


def attention_forward(q, k, v, causal, scale, kernel, backward_kernel, needs_grad, features=None):
    """O and LSE, differentiable: under torch.compile (or export) the forward operators, so the
    graph holds them; in eager mode their twin _Eager when a gradient is needed, else the launch
    alone. features: a _torch.Features with a feature on, or None."""
    if torch.compiler.is_compiling():
        if features is None:
            return forward(q, k, v, causal, scale, kernel, backward_kernel, needs_grad)
        f = features
        return features_forward(q, k, v, causal, scale, int(f.window[0]), int(f.window[1]), float(f.softcap),
                                bool(f.alibi), f.bias, f.cu_seqlens_q, f.cu_seqlens_k, int(f.max_seqlen_q),
                                int(f.max_seqlen_k), f.alibi_slopes, kernel, backward_kernel, needs_grad)
    if features is None:
        out = _torch.eager_attention(q, k, v, causal, scale, kernel, backward_kernel, needs_grad)
        if out is not None:
            return out
    if needs_grad:
        return _Eager.apply(q, k, v, causal, scale, kernel, backward_kernel, True, features)
    return _torch.forward(q, k, v, causal=causal, scale=scale, kernel=kernel, features=features)


@torch.library.custom_op("attention_kernels::decode", mutates_args=(), device_types="cuda")
def decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, context_lens: Tensor,
           kernel: Optional[str], max_context: Optional[int], check: bool) -> Tuple[Tensor, Tensor]:
    return _torch.decode_impl(q, k_cache, v_cache, block_table, context_lens, kernel=kernel,
                              max_context=max_context, check=check)


@decode.register_fake
def _(q, k_cache, v_cache, block_table, context_lens, kernel, max_context, check):
    if q.dim() != 4:
        raise ValueError(f"q must have 4 dimensions [num_seqs, heads_q, query_len, head_dim], got shape "
                         f"{tuple(q.shape)}")
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)
