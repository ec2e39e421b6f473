#!/usr/bin/env python3
"""PyTorch's FlexAttention (compiled) and SDPA on chapter 09's points, CSV out.

The points are fa_bench --features' (tools/fa_bench.cu, feature_points): 16k tokens, hidden 2048,
seq 4k/8k/16k, causal, with one feature each -- a sliding window of 1024 or 4096 keys, softcap 50,
ALiBi, a packed batch of equal-length sequences (a document mask over one 16k-token row), and at
seq 4k a float bias [batch, heads, seq, seq] without the causal mask. FlexAttention gets the
features as a score_mod and a block_mask (built once per point, not timed), compiled with
torch.compile; SDPA runs where it takes the feature: the plain causal mask (FLASH and cuDNN), the
bias and ALiBi as a materialized additive mask (cuDNN and EFFICIENT, bf16 mask). Every result is
checked against float64 attention on one head before it is timed. FLOPs count only the (query,
key) pairs the mask leaves, as fa_bench does: half the square for causal, exact for windows.

--pass backward times o.backward(dO) alone, after an untimed forward (fa_bench --features
--backward's counterpart), FLOPs 2.5 x the forward's; the gradients of one head are checked
against float64 autograd first (relative error of each of dQ, dK, dV below 0.05).
"""
import argparse
import csv
import math
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.nn.functional import scaled_dot_product_attention

from bench_torch import backward_ms_of, time_ms

SEQS = [4096, 8192, 16384]
FEATURES = ["causal", "window 1024", "window 4096", "softcap 50", "alibi", "packed", "bias"]


def alibi_slopes(heads):
    """ALiBi's slopes (AttentionShape::alibi_slope): 2^(-8(h+1)/n) for the largest power of two
    n <= heads, then every other slope of the sequence for 2n."""
    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * m + 1) / n) for m in range(heads - n)]
    return slopes


def visible_pairs(feature, seq):
    """(query, key) pairs one head of one sequence computes, by fa_bench's convention."""
    if feature == "bias":
        return seq * seq
    if feature.startswith("window"):
        w = int(feature.split()[1])
        return w * (w + 1) / 2 + (seq - w) * w if seq > w else seq * (seq + 1) / 2
    return seq * seq / 2  # the causal convention of the FlashAttention papers


def point_inputs(feature, seq, dim, g):
    batch, heads = 16384 // seq, 2048 // dim
    shape = (1, heads, 16384, dim) if feature == "packed" else (batch, heads, seq, dim)
    q, k, v = (torch.randn(shape, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16) for _ in range(3))
    return batch, heads, q, k, v


def flex_call(feature, seq, q, slopes, bias, flex):
    """FlexAttention's function for the point: (block_mask, score_mod) bound into a closure."""
    n = q.shape[2]

    def causal(b, h, qi, ki):
        return qi >= ki

    mask_mod, score_mod = causal, None
    if feature.startswith("window"):
        w = int(feature.split()[1])

        def mask_mod(b, h, qi, ki):
            return (qi >= ki) & (qi - ki < w)
    elif feature == "packed":
        doc = torch.arange(n, device="cuda") // seq

        def mask_mod(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)
    elif feature == "softcap 50":
        def score_mod(score, b, h, qi, ki):
            return 50.0 * torch.tanh(score / 50.0)
    elif feature == "alibi":
        def score_mod(score, b, h, qi, ki):
            return score - slopes[h] * (qi - ki).abs()
    elif feature == "bias":
        mask_mod = None

        def score_mod(score, b, h, qi, ki):
            return score + bias[b, h, qi, ki]
    block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda") if mask_mod else None
    return lambda q, k, v: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)


def reference(feature, qh, kh, vh, slopes, bias):
    """Float64 attention of one head (of batch 0; for a packed batch its first sequence)."""
    seq = qh.shape[0]
    s = qh @ kh.T / math.sqrt(qh.shape[-1])
    i = torch.arange(seq, device="cuda")[:, None]
    j = torch.arange(seq, device="cuda")[None, :]
    if feature == "softcap 50":
        s = 50.0 * torch.tanh(s / 50.0)
    if feature == "alibi":
        s = s - slopes[0].double() * (i - j).abs()
    if feature == "bias":
        s = s + bias[0, 0].double()
    else:
        visible = j <= i
        if feature.startswith("window"):
            visible &= i - j < int(feature.split()[1])
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, dim=-1) @ vh


def reference_head(feature, seq, q, k, v, slopes, bias):
    """Float64 attention of batch 0, head 0 (for a packed batch: its first sequence)."""
    return reference(feature, *(t[0, 0, :seq].double() for t in (q, k, v)), slopes, bias)


def gradient_error(feature, seq, fn, q, k, v, slopes, bias):
    """The largest relative (Frobenius) error of dQ, dK, dV of batch 0, head 0 against float64
    autograd, for the loss sum(o * dO) with a random dO."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    d_out = torch.randn_like(q)
    fn(q, k, v).backward(d_out)
    heads = [t[0, 0, :seq].double().detach().requires_grad_() for t in (q, k, v)]
    reference(feature, *heads, slopes, bias).backward(d_out[0, 0, :seq].double())
    errors = [((t.grad[0, 0, :seq].double() - h.grad).norm() / h.grad.norm()).item() for t, h in zip((q, k, v), heads)]
    return max(errors)


def additive_mask(feature, seq, slopes, bias):
    """SDPA's form of ALiBi and the bias: a materialized bf16 mask, causal folded in as -inf."""
    if feature == "bias":
        return bias.to(torch.bfloat16)
    i = torch.arange(seq, device="cuda")[:, None]
    j = torch.arange(seq, device="cuda")[None, :]
    mask = -slopes[:, None, None] * (i - j).abs().float()
    return mask.masked_fill(j > i, float("-inf")).to(torch.bfloat16)[None]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--dims", default="128", help="head_dim values (fa_bench --features --dims)")
    parser.add_argument("--seqs", default=",".join(map(str, SEQS)))
    parser.add_argument("--features", default=",".join(FEATURES), help=f"a subset of: {', '.join(FEATURES)}")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-ms", type=float, default=1500)
    parser.add_argument("--pass", dest="which", choices=["forward", "backward"], default="forward",
                        help="time the forward, or the backward alone (o.backward(dO) after an untimed forward)")
    args = parser.parse_args()
    backward = args.which == "backward"
    features = args.features.split(",")
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        sys.exit(f"bench_flex: unknown --features entry {unknown[0]!r}; allowed: {', '.join(FEATURES)}")
    # Each point has its own score_mod / mask_mod functions and shapes: a compiled function per
    # point, so that no point runs into dynamo's limit on recompilations and falls back to eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    print(f"PyTorch {torch.__version__} FlexAttention and SDPA on {torch.cuda.get_device_name()}", flush=True)
    with open(args.csv, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["feature", "backend", "batch", "heads", "seq", "head_dim", "status", "time_ms", "tflops",
                      "grad_rel_err_vs_fp64" if backward else "max_abs_err_vs_fp64"])
        for dim in (int(d) for d in args.dims.split(",")):
            for seq in (int(s) for s in args.seqs.split(",")):
                for feature in features:
                    if feature == "bias" and seq != 4096:
                        continue
                    g = torch.Generator(device="cuda").manual_seed(1234)
                    batch, heads, q, k, v = point_inputs(feature, seq, dim, g)
                    slopes = torch.tensor(alibi_slopes(heads), device="cuda", dtype=torch.float32)
                    bias = (torch.randn((batch, heads, seq, seq), device="cuda", generator=g)
                            if feature == "bias" else None)
                    flops = 4.0 * batch * heads * visible_pairs(feature, seq) * dim * (2.5 if backward else 1.0)
                    ref = reference_head(feature, seq, q, k, v, slopes, bias)
                    flex = torch.compile(flex_attention, dynamic=False)
                    runs = [("flex", flex_call(feature, seq, q, slopes, bias, flex))]
                    if feature == "causal":
                        for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                                              ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                            runs.append((name, lambda q, k, v, b=backend: _sdpa(q, k, v, b, None, True)))
                    if feature in ("alibi", "bias"):
                        mask = additive_mask(feature, seq, slopes, bias)
                        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                              ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
                            runs.append((name, lambda q, k, v, b=backend, m=mask: _sdpa(q, k, v, b, m, False)))
                    for name, fn in runs:
                        label = f"{feature:12s} {name:15s} b{batch} h{heads} s{seq} d{dim}"
                        try:
                            o = fn(q, k, v)
                            torch.cuda.synchronize()
                            err = (o[0, 0, :seq].double() - ref).abs().max().item()
                            if not err < 0.05:
                                raise RuntimeError(f"wrong answer: max error {err:.3g} against float64")
                            if backward:
                                err = gradient_error(feature, seq, fn, q, k, v, slopes, bias)
                                if not err < 0.05:
                                    raise RuntimeError(f"wrong gradients: relative error {err:.3g} against float64")
                                ms = backward_ms_of(fn, q, k, v, args.warmup, args.iters, args.budget_ms)
                            else:
                                ms = time_ms(lambda: fn(q, k, v), args.warmup, args.iters, args.budget_ms)
                            tflops = flops / (ms * 1e-3) / 1e12
                            out.writerow([feature, name, batch, heads, seq, dim, "ok", f"{ms:.6g}", f"{tflops:.6g}",
                                          f"{err:.3g}"])
                            print(f"{label}: {ms:9.3f} ms {tflops:8.2f} TFLOP/s  err {err:.2e}", flush=True)
                        except Exception as e:  # a backend that refuses the point, or runs out of memory
                            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                            out.writerow([feature, name, batch, heads, seq, dim, "skipped: " + reason, "", "", ""])
                            print(f"{label}: skipped ({reason})", flush=True)
                        f.flush()
                    del q, k, v, bias
                    torch.cuda.empty_cache()
    return 0


def _sdpa(q, k, v, backend, mask, causal):
    with sdpa_kernel([backend]):
        return scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


if __name__ == "__main__":
    sys.exit(main())
