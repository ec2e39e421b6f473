#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on fa_bench's sweep, one backend at a time, CSV out.

--pass backward times o.backward(dO) alone (after an untimed forward), FLOPs 2.5 x the forward's.
--pass decode times one decode step (chapter 08's points: heads 32/8, head_dim 128, one query
token per sequence) on K/V stored contiguously, and reports the K/V bytes read per second.

Backends and dtypes: FLASH_ATTENTION (bf16, fp16), CUDNN_ATTENTION (bf16, fp16), and for the fp32
chapters EFFICIENT_ATTENTION (fp32, the fused memory-efficient kernel) and MATH (fp32, unfused:
scores in memory, like chapters 01-03; math_bf16 too when --backends names it). Timing as in
fa_bench: CUDA events, warm-up, median.
FLOPs by the same convention (4*B*H*N*N*d, halved for causal). The forward's device_mib is its
peak device memory as fa_bench counts its own: Q, K and V in the backend's dtype, plus the most
that one call allocated on top (torch.cuda.max_memory_allocated over the call, less what was
allocated before it): the output, the log-sum-exp and, for MATH, the N x N scores. The decode
step's device_mib is counted the same way: Q, K and V, plus what one call allocated on top.
"""
import argparse
import csv
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention


def sweep(name, dims):
    seqs = [512, 2048] if name == "quick" else [512, 1024, 2048, 4096, 8192, 16384]
    if name == "memory":  # fa_bench's memory sweep: the standard one from seq 128
        seqs = [128, 256] + seqs
    for dim in dims:
        for causal in (False, True):
            for seq in seqs:
                yield dict(batch=16384 // seq, heads=2048 // dim, seq=seq, dim=dim, causal=causal)


BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION, torch.bfloat16),
    ("flash", SDPBackend.FLASH_ATTENTION, torch.float16),
    ("cudnn", SDPBackend.CUDNN_ATTENTION, torch.bfloat16),
    ("cudnn", SDPBackend.CUDNN_ATTENTION, torch.float16),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
    ("math", SDPBackend.MATH, torch.float32),
]
# Only when --backends names it (the memory table): MATH in bf16.
ON_REQUEST = [("math", SDPBackend.MATH, torch.bfloat16)]
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def time_ms(fn, warmup, iters, budget_ms):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    while len(times) < iters:
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
        if len(times) == 1:
            iters = max(3, min(iters, int(budget_ms / max(times[0], 1e-3))))
    return statistics.median(times)


def backward_ms(q, k, v, causal, warmup, iters, budget_ms):
    """Median time of o.backward(dO) alone: each repeat runs an untimed forward first."""
    return backward_ms_of(lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=causal), q, k, v, warmup,
                          iters, budget_ms)


def backward_ms_of(attention, q, k, v, warmup, iters, budget_ms):
    """Median time of o.backward(dO) alone for o = attention(q, k, v), each repeat after an
    untimed forward."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    d_out = torch.randn_like(q)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(warmup + iters):
        q.grad = k.grad = v.grad = None
        o = attention(q, k, v)
        start.record()
        o.backward(d_out)
        stop.record()
        stop.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(stop))
            if len(times) == 1:
                iters = max(3, min(iters, int(budget_ms / max(times[0], 1e-3))))
            if len(times) >= iters:
                break
    return statistics.median(times)


DECODE_POINTS = [(64, 16384), (8, 8192), (1, 32768), (32, 4096), (128, 2048), (1, 8192)]


def decode(args, backends, out):
    """One decode step per point. GQA the way a contiguous cache serves it best: the 4 query heads of
    a K/V head become 4 query rows of that head ([B, 8, 4, d] against [B, 8, ctx, d]), so K/V are
    read once; the dense form ([B, 32, 1, d] with enable_gqa) is timed beside it."""
    n = 0
    for dim in [int(d) for d in args.dims.split(",")]:
        for batch, ctx in DECODE_POINTS:
            for name, backend, dtype in backends:
                if dtype == torch.float32:
                    continue
                g = torch.Generator(device="cuda").manual_seed(1234)
                k = torch.randn((batch, 8, ctx, dim), device="cuda", generator=g, dtype=dtype)
                v = torch.randn((batch, 8, ctx, dim), device="cuda", generator=g, dtype=dtype)
                kv_bytes = 2 * k.numel() * k.element_size()
                forms = {
                    "grouped": (torch.randn((batch, 8, 4, dim), device="cuda", generator=g, dtype=dtype), {}),
                    "enable_gqa": (torch.randn((batch, 32, 1, dim), device="cuda", generator=g, dtype=dtype),
                                   {"enable_gqa": True}),
                }
                for form, (q, extra) in forms.items():
                    n += 1
                    label = f"[{n:3d}] {name:6s} {DTYPE_NAMES[dtype]} decode b{batch} ctx{ctx} d{dim} {form}"
                    try:
                        with sdpa_kernel([backend]):
                            fn = lambda: scaled_dot_product_attention(q, k, v, **extra)
                            # Peak device memory as the forward pass counts it: Q, K and V, plus
                            # the most one call allocated on top of what was there before it.
                            torch.cuda.synchronize()
                            before = torch.cuda.memory_allocated()
                            torch.cuda.reset_peak_memory_stats()
                            fn()
                            torch.cuda.synchronize()
                            mib = (sum(t.numel() * t.element_size() for t in (q, k, v)) +
                                   torch.cuda.max_memory_allocated() - before) / 2**20
                            ms = time_ms(fn, args.warmup, args.iters, args.budget_ms)
                        gbps = kv_bytes / (ms * 1e-3) / 1e9
                        out.writerow([name, DTYPE_NAMES[dtype], batch, ctx, dim, form, "ok", f"{ms:.6g}", f"{gbps:.6g}",
                                      f"{mib:.1f}"])
                        print(f"{label}: {ms:9.4f} ms {gbps:8.0f} GB/s {mib:9.1f} MiB", flush=True)
                    except (RuntimeError, TypeError, torch.OutOfMemoryError) as e:
                        reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
                        out.writerow([name, DTYPE_NAMES[dtype], batch, ctx, dim, form, "skipped: " + reason,
                                      "", "", ""])
                        print(f"{label}: skipped ({reason})", flush=True)
                del k, v, forms
                torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="standard", choices=["standard", "quick", "memory"])
    parser.add_argument("--csv", required=True)
    parser.add_argument("--dims", default="64,128", help="head_dim values of the sweep")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-ms", type=float, default=1500)
    parser.add_argument("--pass", dest="which", choices=["forward", "backward", "decode"], default="forward",
                        help="time the forward, or the backward alone (o.backward(dO) after an untimed forward; "
                             "FLOPs = 2.5 x the forward's)")
    parser.add_argument("--backends", default="",
                        help="comma-separated backend_dtype pairs to run, e.g. flash_bf16,cudnn_bf16 (default: all)")
    args = parser.parse_args()
    backends = BACKENDS
    if args.backends:
        wanted = args.backends.split(",")
        backends = [b for b in BACKENDS + ON_REQUEST if f"{b[0]}_{DTYPE_NAMES[b[2]]}" in wanted]
        known = [f"{b[0]}_{DTYPE_NAMES[b[2]]}" for b in BACKENDS + ON_REQUEST]
        unknown = [w for w in wanted if w not in known]
        if unknown:
            sys.exit(f"bench_torch: unknown --backends entry {unknown[0]!r}; allowed: {', '.join(known)}")

    print(f"PyTorch {torch.__version__} SDPA on {torch.cuda.get_device_name()}", flush=True)
    if args.which == "decode":
        with open(args.csv, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["backend", "dtype", "batch", "context", "head_dim", "form", "status", "time_ms", "kv_gbps",
                          "device_mib"])
            decode(args, backends, out)
        return 0
    points = list(sweep(args.sweep, [int(d) for d in args.dims.split(",")]))
    with open(args.csv, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["backend", "dtype", "batch", "heads", "seq", "head_dim", "causal", "status", "time_ms", "tflops",
                      "max_abs_err_vs_fp32_math", "device_mib"])
        n = 0
        for p in points:
            shape = (p["batch"], p["heads"], p["seq"], p["dim"])
            g = torch.Generator(device="cuda").manual_seed(1234)
            q32, k32, v32 = (torch.randn(shape, device="cuda", generator=g) for _ in range(3))
            flops = 4.0 * p["batch"] * p["heads"] * p["seq"] * p["seq"] * p["dim"] / (2 if p["causal"] else 1)
            if args.which == "backward":
                flops *= 2.5
            for name, backend, dtype in backends:
                n += 1
                q, k, v = (t.to(dtype) for t in (q32, k32, v32))
                label = f"[{n:3d}/{len(points) * len(backends)}] {name:9s} {DTYPE_NAMES[dtype]} " \
                        f"b{p['batch']} h{p['heads']} s{p['seq']} d{p['dim']}{' causal' if p['causal'] else ''}"
                try:
                    if args.which == "backward":
                        with sdpa_kernel([backend]):
                            ms = backward_ms(q, k, v, p["causal"], args.warmup, args.iters, args.budget_ms)
                        tflops = flops / (ms * 1e-3) / 1e12
                        out.writerow([name, DTYPE_NAMES[dtype], p["batch"], p["heads"], p["seq"], p["dim"],
                                      int(p["causal"]), "ok", f"{ms:.6g}", f"{tflops:.6g}", "", ""])
                        print(f"{label} backward: {ms:9.3f} ms {tflops:8.2f} TFLOP/s", flush=True)
                        f.flush()
                        continue
                    with sdpa_kernel([backend]):
                        fn = lambda: scaled_dot_product_attention(q, k, v, is_causal=p["causal"])
                        o = None
                        torch.cuda.synchronize()
                        before = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        o = fn()
                        torch.cuda.synchronize()
                        mib = (sum(t.numel() * t.element_size() for t in (q, k, v)) +
                               torch.cuda.max_memory_allocated() - before) / 2**20
                        ms = time_ms(fn, args.warmup, args.iters, args.budget_ms)
                    # A sampled sanity check (first head) against fp32 math in float64 on the GPU.
                    ref = scaled_dot_product_attention(q[:1, :1].double(), k[:1, :1].double(), v[:1, :1].double(),
                                                       is_causal=p["causal"])
                    err = (o[:1, :1].double() - ref).abs().max().item()
                    tflops = flops / (ms * 1e-3) / 1e12
                    out.writerow([name, DTYPE_NAMES[dtype], p["batch"], p["heads"], p["seq"], p["dim"], int(p["causal"]),
                                  "ok", f"{ms:.6g}", f"{tflops:.6g}", f"{err:.3g}", f"{mib:.1f}"])
                    print(f"{label}: {ms:9.3f} ms {tflops:8.2f} TFLOP/s {mib:9.1f} MiB  max err {err:.2e}", flush=True)
                except (RuntimeError, torch.OutOfMemoryError) as e:
                    reason = str(e).splitlines()[0][:120]
                    out.writerow([name, DTYPE_NAMES[dtype], p["batch"], p["heads"], p["seq"], p["dim"], int(p["causal"]),
                                  "skipped: " + reason, "", "", "", ""])
                    print(f"{label}: skipped ({reason})", flush=True)
                    torch.cuda.empty_cache()
                f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
