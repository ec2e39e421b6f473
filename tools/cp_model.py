#!/usr/bin/env python3
"""Chapter 10's model of N GPUs: step time and efficiency of ring attention and Ulysses from two
measured numbers, checked against the measured ranks.

Inputs (docs/results/h200/context_parallel.csv, from `ch10_context_parallel --bench --csv`): one
GPU's throughput on causal attention (forward and backward TFLOP/s, the "1 rank" row) and the
bandwidth of one hop between two GPUs (the "hop GB/s" of the N-rank rows). Beyond one machine the
link is an assumption, said as one: --inter-gbps (default 50 GB/s a GPU, one 400 Gb/s NIC each).

Ring attention, zigzag split, N ranks of T tokens (S = N T): every step computes the same share,
tau = F(S) / N^2 / R seconds, where F(S) is causal attention's FLOPs over the sequence and R one
GPU's FLOP/s; step t's block arrives during step t - 1, so a pass takes tau + (N - 1) max(tau, x),
x the time of one hop of K and V (the backward's hops also carry dK and dV in float, 3 times the
bytes, and a last hop of dK and dV, 2 x, brings the sums home). Ulysses: all-to-alls move Q, K, V
in and O out (each rank keeps 1/N of them; the backward also moves O and dO in and dQ, dK, dV out:
twice the bytes), and each rank runs the whole sequence for H/N heads: F(S) / N / R plus the
all-to-alls, which nothing overlaps; on GPUs it needs N to divide both head counts.

  python3 tools/cp_model.py [--results docs/results/h200] [--out-csv F] [--plot F.png]
"""
import argparse
import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_measured(path):
    with open(path, newline="") as f:
        line = f.readline()
        rows = list(csv.DictReader(f))
    if not line.startswith("# "):
        raise SystemExit(f"cp_model: {path} must start with a '# ' line saying where it was measured")
    return line[2:].strip(), rows


def causal_flops(batch, heads, seq, dim):
    return 4.0 * batch * heads * seq * (seq + 1) / 2.0 * dim


class Model:
    def __init__(self, fwd_tflops, bwd_tflops, link_gbps, inter_gbps, batch, heads, heads_kv, dim, per_machine=8):
        self.rf, self.rb = fwd_tflops * 1e12, bwd_tflops * 1e12
        self.link, self.inter = link_gbps * 1e9, inter_gbps * 1e9
        self.b, self.h, self.hkv, self.d, self.per_machine = batch, heads, heads_kv, dim, per_machine

    def bandwidth(self, n):
        return self.link if n <= self.per_machine else self.inter

    def ring(self, n, t, backward=False):
        """(time in s, efficiency) of one pass over S = n t tokens."""
        s = n * t
        flops = causal_flops(self.b, self.h, s, self.d) * (2.5 if backward else 1.0)
        rate = self.rb if backward else self.rf
        c = flops / n / n / rate
        kv_bytes = 2.0 * self.b * self.hkv * t * self.d * 2.0
        x = (kv_bytes * 3.0 if backward else kv_bytes) / self.bandwidth(n) if n > 1 else 0.0
        time = c + (n - 1) * max(c, x)
        if backward and n > 1:  # the N-th hop carries the dK/dV sums home after the last step
            time += 2.0 * kv_bytes / self.bandwidth(n)
        return time, flops / n / rate / time

    def ulysses(self, n, t, backward=False):
        if self.h % n or self.hkv % n:  # on GPUs each rank owns whole K/V heads (ulysses_gpu.h)
            return None, None
        s = n * t
        flops = causal_flops(self.b, self.h, s, self.d) * (2.5 if backward else 1.0)
        rate = self.rb if backward else self.rf
        compute = flops / n / rate
        # In: Q, K, V (and for the backward O and dO); out: O (dQ, dK, dV). The LSE is small.
        moved = (n - 1) / n * self.b * t * self.d * 2.0 * (2 * self.h + 2 * self.hkv) * (2.0 if backward else 1.0)
        comm = moved / self.bandwidth(n) if n > 1 else 0.0
        return compute + comm, compute / (compute + comm)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(ROOT, "docs", "results", "h200"))
    parser.add_argument("--inter-gbps", type=float, default=50.0,
                        help="bandwidth a GPU gets to a GPU of another machine, GB/s (an assumption)")
    parser.add_argument("--out-csv", help="the predictions (default: context_parallel_model.csv in --results)")
    parser.add_argument("--plot", help="the plot (default: context_parallel_model.png in --results)")
    args = parser.parse_args()
    if args.inter_gbps <= 0:
        parser.error(f"--inter-gbps must be > 0, got {args.inter_gbps}")
    line, rows = read_measured(os.path.join(args.results, "context_parallel.csv"))
    one = next(r for r in rows if r["ranks"] == "1")
    ring_rows = [r for r in rows if r["ranks"] != "1" and r["transfer"] == "1" and r["split"] == "zigzag"]
    if not ring_rows:
        raise SystemExit("cp_model: context_parallel.csv has no zigzag row on more than one rank")
    measured = ring_rows[0]
    ranks, tokens = int(measured["ranks"]), int(measured["tokens"]) // int(measured["ranks"])
    words = line.split("--")
    shape = {w.split()[0]: int(w.split()[1]) for w in words[1:] if len(w.split()) > 1 and w.split()[1].isdigit()}
    model = Model(float(one["fwd_tflops"]), float(one["bwd_tflops"]), float(measured["hop_gbps"]), args.inter_gbps,
                  shape.get("batch", 1), shape.get("heads", 16), shape.get("heads-kv", 16), shape.get("dim", 128))
    out_csv = args.out_csv or os.path.join(args.results, "context_parallel_model.csv")
    points = []
    for t in (4096, 16384, 65536):
        for n in (1, 2, 4, 8, 16, 32, 64):
            rf, ef = model.ring(n, t)
            rb, eb = model.ring(n, t, backward=True)
            uf, euf = model.ulysses(n, t)
            ub, eub = model.ulysses(n, t, backward=True)
            points.append({"tokens_per_rank": t, "ranks": n, "ring_fwd_ms": f"{rf * 1e3:.2f}",
                           "ring_fwd_eff": f"{ef:.3f}", "ring_bwd_ms": f"{rb * 1e3:.2f}", "ring_bwd_eff": f"{eb:.3f}",
                           "ulysses_fwd_ms": "" if uf is None else f"{uf * 1e3:.2f}",
                           "ulysses_fwd_eff": "" if euf is None else f"{euf:.3f}",
                           "ulysses_bwd_ms": "" if ub is None else f"{ub * 1e3:.2f}",
                           "ulysses_bwd_eff": "" if eub is None else f"{eub:.3f}"})
    pred_f, _ = model.ring(ranks, tokens)
    pred_b, _ = model.ring(ranks, tokens, backward=True)
    with open(out_csv, "w", newline="") as f:
        f.write(f"# tools/cp_model.py --inter-gbps {args.inter_gbps:g} (one hop {model.link / 1e9:.0f} GB/s as measured; "
                f"{args.inter_gbps:g} GB/s across machines, assumed), from the run of {line}\n")
        f.write(f"# check: {ranks} ranks x {tokens} tokens, zigzag: forward predicted {pred_f * 1e3:.2f} ms, measured "
                f"{float(measured['fwd_ms']):.2f} ms; backward predicted {pred_b * 1e3:.2f} ms, measured "
                f"{float(measured['bwd_ms']):.2f} ms\n")
        writer = csv.DictWriter(f, fieldnames=list(points[0]))
        writer.writeheader()
        writer.writerows(points)
    print(f"cp_model: wrote {out_csv}; {ranks} ranks x {tokens} tokens: forward {pred_f * 1e3:.2f} ms predicted, "
          f"{float(measured['fwd_ms']):.2f} measured; backward {pred_b * 1e3:.2f} predicted, "
          f"{float(measured['bwd_ms']):.2f} measured")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("cp_model: matplotlib is not installed; no plot")
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, backward in zip(axes, (False, True)):
        for t, style in ((4096, ":"), (16384, "--"), (65536, "-")):
            ns = [p["ranks"] for p in points if p["tokens_per_rank"] == t]
            key = "bwd" if backward else "fwd"
            ax.plot(ns, [float(p[f"ring_{key}_eff"]) for p in points if p["tokens_per_rank"] == t], "C0" + style,
                    label=f"ring, {t // 1024}k tokens/GPU")
            uly = [(p["ranks"], float(p[f"ulysses_{key}_eff"])) for p in points
                   if p["tokens_per_rank"] == t and p[f"ulysses_{key}_eff"]]
            ax.plot([u[0] for u in uly], [u[1] for u in uly], "C1" + style, label=f"Ulysses, {t // 1024}k tokens/GPU")
        ax.axvline(model.per_machine, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (beyond 8: another machine's link)")
        ax.set_title("backward" if backward else "forward")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("efficiency (compute ÷ step time)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    plot = args.plot or os.path.join(args.results, "context_parallel_model.png")
    fig.savefig(plot, dpi=110)
    print(f"cp_model: wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
