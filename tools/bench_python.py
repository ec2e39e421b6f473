#!/usr/bin/env python3
"""What a call from PyTorch costs: wall time per call of the package's attention against SDPA's
FLASH_ATTENTION backend, forward and forward + backward, at a training shape where the CPU's work
per call shows (32 x 8 x 256 x 64, causal) and at a long one where the kernel dominates
(4 x 16 x 4096 x 128, causal), bf16, in both layouts:

  bhsd  [batch, heads, seq, head_dim] contiguous tensors: ak.attention against
        scaled_dot_product_attention on the same tensors;
  bshd  [batch, seq, heads, head_dim] tensors: ak.flash_attn_func against SDPA on their
        transposed views (what a model's projections give).

Wall time: N calls back to back, then one synchronize, divided by N (so a call bound by the CPU
shows its CPU time and a call bound by the GPU its GPU time); the median of --rounds rounds, the
variants of a shape taking turns within each round. `ours` is the package's call as a user makes
it: with libfa_torch.so built, the C++ operator (python/csrc/eager_attention.cpp). Two more rows
at the training shape break it down: ours_python is the same call made from Python (the forward
alone: _torch.forward; forward + backward: the autograd.Function _ops._Eager, the path taken
without libfa_torch.so), ours_launch the C library's launch alone through ctypes with
everything prepared.

    PYTHONPATH=build/python python3 tools/bench_python.py --csv python_overhead.csv
"""
import argparse
import csv
import statistics
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

import attention_kernels as ak
from attention_kernels import _library, _ops, _torch

SHAPES = [(32, 8, 256, 64), (4, 16, 4096, 128)]


def gpu_us(fn, calls=50):
    """The median GPU time of one call (CUDA events around it, the queue drained before each)."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000)
    return statistics.median(times)


def per_call_us(fn, calls):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def variants(batch, heads, seq, dim):
    torch.manual_seed(0)
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v = (make(batch, heads, seq, dim) for _ in range(3))
    qs, ks, vs = (make(batch, seq, heads, dim) for _ in range(3))
    g, gs = make(batch, heads, seq, dim), make(batch, seq, heads, dim)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qsg, ksg, vsg = (t.clone().requires_grad_() for t in (qs, ks, vs))

    def sdpa_fwd():
        sdpa(q, k, v, is_causal=True)

    def sdpa_fwd_bshd():
        sdpa(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), is_causal=True)

    def sdpa_train():
        sdpa(qg, kg, vg, is_causal=True).backward(g)

    def sdpa_train_bshd():
        sdpa(qsg.transpose(1, 2), ksg.transpose(1, 2), vsg.transpose(1, 2), is_causal=True).transpose(1, 2).backward(gs)

    # The launch alone: every argument prepared once, as the package prepares them per call.
    library = _library.load()
    info = _torch._resolve(_library.FORWARD, None, "bf16", "kernel")
    shape = _torch._attention_shape(q, k, v, True, None)
    nbytes = _torch._check(_library.FORWARD, info.name, _torch._key(shape))
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    work = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), work.data_ptr() if nbytes else None)
    stream = _torch._stream(q.device)

    def launch():
        library.forward(info.name, shape, *ptrs, nbytes, stream)

    def python_train():  # the path attention() takes without libfa_torch.so
        _ops._Eager.apply(qg, kg, vg, True, None, None, None, True, None)[0].backward(g)

    return [
        ("forward", "bhsd", "sdpa_flash", sdpa_fwd),
        ("forward", "bhsd", "ours", lambda: ak.attention(q, k, v, causal=True)),
        ("forward", "bhsd", "ours_python", lambda: _torch.forward(q, k, v, causal=True)),
        ("forward", "bhsd", "ours_launch", launch),
        ("forward", "bshd", "sdpa_flash", sdpa_fwd_bshd),
        ("forward", "bshd", "ours", lambda: ak.flash_attn_func(qs, ks, vs, causal=True)),
        ("forward+backward", "bhsd", "sdpa_flash", sdpa_train),
        ("forward+backward", "bhsd", "ours", lambda: ak.attention(qg, kg, vg, causal=True).backward(g)),
        ("forward+backward", "bhsd", "ours_python", python_train),
        ("forward+backward", "bshd", "sdpa_flash", sdpa_train_bshd),
        ("forward+backward", "bshd", "ours", lambda: ak.flash_attn_func(qsg, ksg, vsg, causal=True).backward(gs)),
    ], info.name


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--csv", help="write the rows here")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--ms", type=float, default=150.0, help="about how long each variant runs per round")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_python: no CUDA device")
    rows = []
    # SDPA's backend is chosen once, outside the timed loops (the context manager costs CPU time
    # per entry); the package's calls do not read it.
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for shape in SHAPES:
            rows += measure(shape, args)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            f.write(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, {time.strftime('%Y-%m-%d')}: "
                    f"tools/bench_python.py --rounds {args.rounds} --ms {args.ms:g}\n")
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)


def measure(shape, args):
    """The rows of one shape: every variant's wall time per call, the variants taking turns."""
    batch, heads, seq, dim = shape
    runs, kernel = variants(batch, heads, seq, dim)
    rows, calls = [], {}
    for _, _, _, fn in runs:  # warm up: the first calls load the library and run the checks
        for _ in range(5):
            fn()
    for key in range(len(runs)):
        once = per_call_us(runs[key][3], 10)
        calls[key] = max(10, int(args.ms * 1000 / once))
    times = {key: [] for key in range(len(runs))}
    for _ in range(args.rounds):
        for key, (_, _, _, fn) in enumerate(runs):
            times[key].append(per_call_us(fn, calls[key]))
    sdpa_us = {(r[0], r[1]): statistics.median(times[i]) for i, r in enumerate(runs) if r[2] == "sdpa_flash"}
    for key, (pas, layout, name, _) in enumerate(runs):
        us = statistics.median(times[key])
        gpu = gpu_us(runs[key][3])
        row = dict(batch=batch, heads=heads, seq=seq, head_dim=dim, causal=1, pass_=pas, layout=layout,
                   variant=name, kernel="" if name.startswith("sdpa") else kernel, us_per_call=f"{us:.1f}",
                   over_sdpa=f"{us / sdpa_us[(pas, layout)]:.2f}", gpu_us_alone=f"{gpu:.1f}")
        rows.append(row)
        print(f"{batch}x{heads}x{seq}x{dim} {pas:17s} {layout} {name:12s} {us:9.1f} us  {row['over_sdpa']}x SDPA"
              f"   one call alone on the GPU {gpu:8.1f} us")
    return rows


if __name__ == "__main__":
    main()
