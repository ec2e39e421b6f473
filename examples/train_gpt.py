"""Train a small GPT twice from the same seed: once with PyTorch's attention, once with the
tutorial's kernels (forward and backward), and compare the loss curves and the speed.

    PYTHONPATH=build/python python3 examples/train_gpt.py --out build/train_gpt

The data is this repository's own text (its Markdown docs and its C++, CUDA and Python sources),
read character by character: nothing is downloaded. Three runs share the model's initial
weights and the order of the batches, and train interleaved (--chunk steps each in turn), so
that their tokens/s are measured under the same conditions:

  sdpa-flash   scaled_dot_product_attention on its FLASH_ATTENTION backend
  sdpa-cudnn   the same on its CUDNN_ATTENTION backend: how far two correct bf16 attentions
               drift apart over training ("bf16 noise")
  ours         attention_kernels.attention with --kernel and --backward-kernel

With --features gemma2 the attention is Gemma-2's: a sliding window (--window keys to the left,
causal) and a logit softcap (--softcap) in every layer, and the three runs are

  flex         FlexAttention (torch.compile'd) with the softcap as its score_mod and the window
               as its block mask
  eager        the same attention written out in PyTorch (the scores materialized in fp32): how far
               two correct implementations drift apart
  ours         attention_kernels.flash_attn_func(causal=True, window_size=(window, 0), softcap=...),
               chapter 09's forward and backward kernels

Weights are fp32 and the matrix products run under bf16 autocast, so attention sees bf16 Q, K, V.
Writes train_losses.csv (every step's loss), train_runs.csv (final losses, tokens/s, the gap
between curves) and, when matplotlib imports, train_loss_curves.png into --out (with --features
gemma2: train_gemma2_losses.csv, train_gemma2_runs.csv, train_gemma2_loss_curves.png).
"""
import argparse
import csv
import datetime
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attention_kernels as ak

ROOT = Path(__file__).resolve().parent.parent


def load_text():
    """The repository's own text: its Markdown, then its C++, CUDA and Python sources."""
    patterns = ["*.md", "chapters/**/*.md", "docs/**/*.md", "chapters/**/*.cu", "chapters/**/*.cuh", "chapters/**/*.h",
                "chapters/**/*.cpp", "common/*.h", "common/*.cpp", "common/*.cuh", "tests/**/*.cpp", "tests/**/*.cu",
                "tools/*.py"]
    paths = sorted({p for pattern in patterns for p in ROOT.glob(pattern)})
    return "\n\n".join(p.read_text(encoding="utf-8") for p in paths), len(paths)


def split_chunks(data, chunk=2048, every=10):
    """Every tenth 2048-character chunk for validation, the rest for training."""
    pieces = list(torch.split(data, chunk))
    val = torch.cat(pieces[every - 1::every])
    train = torch.cat([p for i, p in enumerate(pieces) if i % every != every - 1])
    return train, val


class Block(nn.Module):
    def __init__(self, width, heads, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, c // self.heads).unbind(2)  # [b, s, h, d]
        x = x + self.proj(self.attend(q, k, v).reshape(b, s, c))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, width, heads, layers, attend):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def sdpa_attention(backend):
    def attend(q, k, v):  # [b, s, h, d] in, [b, s, h, d] out
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    return attend


def our_attention(kernel, backward_kernel):
    def attend(q, k, v):  # layout="bshd": views of the projection, read in place by a strided kernel
        return ak.attention(q, k, v, causal=True, kernel=kernel, backward_kernel=backward_kernel, layout="bshd")

    return attend


def gemma2_mask(seq, window, device):
    """[seq, seq] bool: query i sees keys i - window .. i (causal, a window of `window` keys to the left)."""
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    return (j <= i) & (i - j <= window)


def flex_attention_gemma2(window, softcap):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention)
    masks = {}

    def score_mod(score, b, h, i, j):  # the score is already scaled, as the kernels' softcap expects
        return softcap * torch.tanh(score / softcap)

    def mask_mod(b, h, i, j):
        return (j <= i) & (i - j <= window)

    def attend(q, k, v):
        seq = q.shape[1]
        if seq not in masks:
            masks[seq] = create_block_mask(mask_mod, None, None, seq, seq, device=q.device)
        o = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                     block_mask=masks[seq])
        return o.transpose(1, 2)

    return attend


def eager_attention_gemma2(window, softcap):
    def attend(q, k, v):
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        s = (qh.float() @ kh.float().transpose(-1, -2)) * qh.shape[-1] ** -0.5
        s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~gemma2_mask(q.shape[1], window, q.device), float("-inf"))
        return (torch.softmax(s, dim=-1).to(q.dtype) @ vh).transpose(1, 2)

    return attend


def our_attention_gemma2(window, softcap):
    def attend(q, k, v):  # flash-attn's call on [b, s, h, d]: chapter 09's kernels
        return ak.flash_attn_func(q, k, v, causal=True, window_size=(window, 0), softcap=softcap)

    return attend


def batches(data, steps, batch, context, seed):
    """The same (input, target) batches for every run: offsets from a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + context] for i in starts])
        y = torch.stack([data[i + 1:i + context + 1] for i in starts])
        yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)


class Run:
    """One training run: its model (the same initial weights for every run), optimizer, batches
    and losses; step(n) trains n more steps and returns the seconds they took on the GPU's clock
    (synchronized before and after)."""

    def __init__(self, name, attend, args, train_data, vocab):
        torch.manual_seed(args.seed)  # the same initial weights for every run
        self.name, self.args, self.vocab = name, args, vocab
        self.model = GPT(vocab, args.context, args.width, args.heads, args.layers, attend).cuda()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.lr, weight_decay=0.1, fused=True)
        self.batches = enumerate(batches(train_data, args.steps, args.batch, args.context, args.seed + 1))
        self.losses, self.timed_tokens, self.timed_seconds = [], 0, 0.0

    def step(self, n):
        args = self.args
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = 0
        for _ in range(n):
            step, (x, y) = next(self.batches)
            lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(self.model(x).float().view(-1, self.vocab), y.view(-1))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.losses.append(loss.detach())
            tokens += x.numel()
        torch.cuda.synchronize()
        return tokens, time.perf_counter() - start

    def finish(self, val_data):
        losses = [float(v) for v in torch.stack(self.losses).cpu()]
        self.model.eval()
        args = self.args
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            val = [F.cross_entropy(self.model(x).float().view(-1, self.vocab), y.view(-1)).item()
                   for x, y in batches(val_data, 20, args.batch, args.context, args.seed + 2)]
        result = {"name": self.name, "losses": losses, "val_loss": sum(val) / len(val),
                  "tokens_per_s": self.timed_tokens / self.timed_seconds}
        print(f"{self.name:>11}: final train loss {losses[-1]:.4f}, val loss {result['val_loss']:.4f}, "
              f"{result['tokens_per_s']:,.0f} tokens/s")
        return result


def train(specs, args, train_data, val_data, vocab):
    """Every run of `specs`, interleaved: the runs take turns, --chunk steps each (the order
    rotating every turn), so that a change in the machine's clocks or load while they train
    reaches every run alike. The first --warmup steps of each run are not timed."""
    runs = [Run(name, attend, args, train_data, vocab) for name, _, attend in specs]
    done, turn = 0, 0
    while done < args.steps:
        n = min(args.chunk, args.steps - done, max(args.warmup - done, 0) or args.chunk)
        for run in runs[turn % len(runs):] + runs[:turn % len(runs)]:
            tokens, seconds = run.step(n)
            if done >= args.warmup:
                run.timed_tokens += tokens
                run.timed_seconds += seconds
        done += n
        turn += 1
    return [run.finish(val_data) for run in runs]


def smoothed(values, window=20):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", default="ch06_pingpong_bf16", help="forward kernel (attention_kernels.list_kernels())")
    p.add_argument("--backward-kernel", default="ch07_wgmma_bf16", help="backward kernel")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup", type=int, default=20, help="steps before the tokens/s clock starts")
    p.add_argument("--chunk", type=int, default=20, help="steps a run trains before the next run takes its turn")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8, help="head_dim = width / heads")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=ROOT / "build" / "train_gpt")
    p.add_argument("--features", choices=("none", "gemma2"), default="none",
                   help="gemma2: a sliding window and a logit softcap in every layer (chapter 09's kernels)")
    p.add_argument("--window", type=int, default=64, help="with --features gemma2: keys to the left a query sees")
    p.add_argument("--softcap", type=float, default=30.0, help="with --features gemma2: the logit softcap")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_gpt: torch sees no CUDA device; this example trains on the GPU")
    if args.chunk < 1 or args.warmup < 0 or args.steps <= args.warmup:
        raise SystemExit(f"train_gpt: --chunk must be >= 1, --warmup >= 0 and --steps > --warmup, got {args.chunk}, "
                         f"{args.warmup} and {args.steps}")
    if args.width % args.heads:
        raise SystemExit(f"train_gpt: --width ({args.width}) must be a multiple of --heads ({args.heads})")

    text, files = load_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    train_data, val_data = split_chunks(data)
    params = f"{args.layers} layers, width {args.width}, {args.heads} heads of {args.width // args.heads}"
    print(f"data: {len(text):,} characters from {files} files, vocabulary {len(chars)}; model: {params}; "
          f"{args.steps} steps of {args.batch} x {args.context} tokens")

    if args.features == "gemma2":
        if args.window < 0 or args.softcap <= 0:
            raise SystemExit(f"train_gpt: --window must be >= 0 and --softcap > 0, got {args.window} and {args.softcap}")
        params += f", window {args.window}, softcap {args.softcap:g}"
        prefix = "train_gemma2_"
        specs = [("flex", "FlexAttention", flex_attention_gemma2(args.window, args.softcap)),
                 ("eager", "eager PyTorch", eager_attention_gemma2(args.window, args.softcap)),
                 ("ours", "flash_attn_func (chapter 09)", our_attention_gemma2(args.window, args.softcap))]
        noise_what = "eager vs flex (two PyTorch implementations: the bf16 noise)"
        command = f"examples/train_gpt.py --features gemma2 --window {args.window} --softcap {args.softcap:g}"
    else:
        prefix = "train_"
        specs = [("sdpa-flash", "SDPA FLASH_ATTENTION", sdpa_attention(SDPBackend.FLASH_ATTENTION)),
                 ("sdpa-cudnn", "SDPA CUDNN_ATTENTION", sdpa_attention(SDPBackend.CUDNN_ATTENTION)),
                 ("ours", f"{args.kernel} + {args.backward_kernel}", our_attention(args.kernel, args.backward_kernel))]
        noise_what = "sdpa-cudnn vs sdpa-flash (two PyTorch backends: the bf16 noise)"
        command = f"examples/train_gpt.py --kernel {args.kernel} --backward-kernel {args.backward_kernel}"
    runs = train(specs, args, train_data, val_data, len(chars))
    base, noise, ours = runs
    names = {name: label for name, label, _ in specs}
    tail = slice(args.steps // 2, None)

    def gap(a, b):  # largest gap between two smoothed curves over the second half of training
        return max(abs(x - y) for x, y in zip(smoothed(a["losses"])[tail], smoothed(b["losses"])[tail]))

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{prefix}losses.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [r["name"] for r in runs])
        for step in range(args.steps):
            w.writerow([step] + [f"{r['losses'][step]:.5f}" for r in runs])
    gaps = {base["name"]: 0.0, noise["name"]: gap(noise, base), ours["name"]: gap(ours, base)}
    with open(args.out / f"{prefix}runs.csv", "w", newline="") as f:
        gpu = torch.cuda.get_device_name()
        f.write(f"# {gpu}, PyTorch {torch.__version__}, {datetime.date.today()}: {command}; {params}, context "
                f"{args.context}, batch {args.batch}, {args.steps} steps, bf16 autocast, {len(text):,} characters of "
                f"the repository's text\n")
        w = csv.writer(f)
        w.writerow(["run", "attention", "final_train_loss", "val_loss", "tokens_per_s", "gap_to_" + base["name"].replace("-", "_")])
        for r in runs:
            w.writerow([r["name"], names[r["name"]], f"{r['losses'][-1]:.4f}", f"{r['val_loss']:.4f}",
                        f"{r['tokens_per_s']:.0f}", f"{gaps[r['name']]:.4f}"])
    print(f"largest gap between the smoothed curves over the second half: ours vs {base['name']} {gaps['ours']:.4f}, "
          f"{noise_what} {gaps[noise['name']]:.4f}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    first = smoothed(base["losses"])
    for r, style in zip(runs, ("-", ":", "--")):
        curve = smoothed(r["losses"])
        label = f"{names[r['name']]} ({r['tokens_per_s'] / 1e3:,.0f}k tokens/s)"
        top.plot(curve, style, label=label)
        bottom.plot([c - b for c, b in zip(curve, first)], style, label=label)
    top.set_ylabel("training loss (20-step mean)")
    top.set_yscale("log")
    top.set_title(f"Small GPT on the repository's own text, {gpu}")
    top.legend()
    bottom.set_ylabel(f"minus {names[base['name']]}")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(args.out / f"{prefix}loss_curves.png", dpi=110)
    print(f"wrote {args.out / f'{prefix}loss_curves.png'}")


if __name__ == "__main__":
    main()
