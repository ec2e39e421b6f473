#!/usr/bin/env python3
"""PyTorch's context parallelism on the problem chapter 10's benchmark runs: the anchor.

One process per GPU (torch.multiprocessing), NCCL between them. Causal attention over one sequence
of N x --tokens-per-rank tokens, bf16, [batch, heads, seq, head_dim], split across the N ranks by
torch.distributed.tensor.experimental.context_parallel (which shards the sequence with its own
load balancing for the causal mask and runs SDPA's kernel as ring attention), and, on one GPU,
SDPA on --tokens-per-rank tokens. Prints, for each run, the forward and forward+backward times (the
median over --iters steps of the slowest rank) and TFLOP/s counted as chapter 10 counts them (the
causal half of the score matrix; the backward 2.5 times the forward).

  python3 tools/bench_context_parallel.py [--ranks 2] [--tokens-per-rank 65536] [--csv FILE]
"""
import argparse
import csv
import os
import statistics
import sys

from cp_model import causal_flops  # chapter 10's count: the causal half of the score matrix


def timed(torch, fn, iters, warmup, group):
    """Median over iters of the slowest rank's time of fn() in ms (every rank starts together)."""
    times = []
    for i in range(warmup + iters):
        if group is not None:
            torch.distributed.barrier()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ms = torch.tensor([begin.elapsed_time(end)], device="cuda")
        if group is not None:
            torch.distributed.all_reduce(ms, op=torch.distributed.ReduceOp.MAX)
        if i >= warmup:
            times.append(ms.item())
    return statistics.median(times)


def one_gpu(args):
    import torch
    import torch.nn.functional as F
    torch.cuda.set_device(0)
    b, h, t, d = args.batch, args.heads, args.tokens_per_rank, args.dim
    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def train():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return timed(torch, fwd, args.iters, args.warmup, None), timed(torch, train, args.iters, args.warmup, None)


def rank_main(rank, args, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK=str(rank),
                      WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    mesh = init_device_mesh("cuda", (args.ranks,))
    b, h, d = args.batch, args.heads, args.dim
    seq = args.tokens_per_rank * args.ranks
    torch.manual_seed(0)  # every rank makes the same global tensors; the context keeps its shard
    q, k, v, grad = (torch.randn(b, h, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for rotate in args.rotate:
        set_rotate_method(rotate)
        with context_parallel(mesh, buffers=[q, k, v, grad], buffer_seq_dims=[2, 2, 2, 2]):
            ql, kl, vl = (t.detach().requires_grad_() for t in (q, k, v))

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def train():
                F.scaled_dot_product_attention(ql, kl, vl, is_causal=True).backward(grad)

            f_ms = timed(torch, fwd, args.iters, args.warmup, True)
            t_ms = timed(torch, train, args.iters, args.warmup, True)
        if rank == 0:
            results[rotate] = (f_ms, t_ms)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens-per-rank", type=int, default=65536)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rotate", nargs="+", default=["allgather", "alltoall"],
                        help="context_parallel's ways of moving K/V: allgather (all at once) or alltoall (a ring)")
    parser.add_argument("--port", type=int, default=29533)
    parser.add_argument("--csv", help="write the rows here")
    args = parser.parse_args()
    for name in ("ranks", "tokens_per_rank", "batch", "heads", "dim", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < args.ranks:
        print(f"skipped: PyTorch's context parallelism on {args.ranks} ranks needs {args.ranks} GPUs; "
              f"this machine has {torch.cuda.device_count()}")
        return 77
    f1, t1 = one_gpu(args)
    torch.cuda.empty_cache()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(rank_main, args=(args, results), nprocs=args.ranks, join=True)
    b, h, d, t = args.batch, args.heads, args.dim, args.tokens_per_rank
    rows = [("1 GPU, SDPA", t, f1, t1)]
    rows += [(f"{args.ranks} GPUs, context_parallel ({rotate})", t * args.ranks, *results[rotate])
             for rotate in args.rotate if rotate in results]
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name(0)}: causal, bf16, batch {b}, heads {h}, "
          f"head_dim {d}, {t} tokens per rank; median of {args.iters} steps, each the slowest rank's time")
    header = ("run", "tokens", "fwd_ms", "fwd_tflops", "fwd_bwd_ms", "fwd_bwd_tflops")
    print(f"{header[0]:<42} {header[1]:>8} {header[2]:>9} {header[3]:>11} {header[4]:>11} {header[5]:>15}")
    out = []
    for name, seq, f_ms, t_ms in rows:
        flops = causal_flops(b, h, seq, d)
        row = (name, seq, f"{f_ms:.2f}", f"{flops / f_ms / 1e9:.1f}", f"{t_ms:.2f}", f"{3.5 * flops / t_ms / 1e9:.1f}")
        out.append(row)
        print(f"{row[0]:<42} {row[1]:>8} {row[2]:>9} {row[3]:>11} {row[4]:>11} {row[5]:>15}")
    if args.csv:
        import datetime
        with open(args.csv, "w", newline="") as f:
            f.write(f"# {args.ranks} x {torch.cuda.get_device_name(0)} (one machine), PyTorch {torch.__version__}, "
                    f"{datetime.date.today().isoformat()}: tools/bench_context_parallel.py --ranks {args.ranks} "
                    f"--tokens-per-rank {t} --batch {b} --heads {h} --dim {d} --iters {args.iters}\n")
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
