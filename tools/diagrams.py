#!/usr/bin/env python3
"""Draws the docs' diagrams as SVG into docs/diagrams/ (committed; rerun after editing).

Usage: python3 tools/diagrams.py

  flash_tiling.svg       chapter 04: a Q tile against one K/V tile; S and P exist only on chip
  loop_orders.svg        chapter 04: K/V tiles outer (the paper) vs Q tiles outer
  warp_split.svg         chapter 05: splitting a block's work by query rows vs by keys
  paged_block_table.svg  chapter 08: two forked sequences, their block tables, the block pool
  ch01_tile_threads.svg  chapter 01 (tiled): the 64 x 64 S tile of a block, a thread's 4 x 4 scores,
                         the Q and K slices in shared memory, the loop over d
  ch03_online_rescale.svg
                         chapter 03: running max m and sum ℓ block by block, the factor e^(m_old - m_new)
  ch03_merge.svg         chapter 03: merging (m1, ℓ1, O1) and (m2, ℓ2, O2), unnormalized O or with LSE
  ch05_mma_fragments.svg chapter 05: mma.m16n8k16 A, B, C fragments, lane -> elements
  ch05_accumulator_reuse.svg
                         chapter 05: two C fragments of S packed into the A fragment of P V
  ch05_cp_async_double_buffer.svg
                         chapter 05 (pipelined): two K/V stages, cp.async groups, the barriers
  ch07_backward_dataflow.svg
                         chapter 07: D, the K/V-outer dK/dV kernel, dQ by atomics or its own kernel
  ch08_split_kv.svg      chapter 08 (split_kv): partitions, block-table gather, partial O and LSE, merge
  ch05_causal_tiles.svg  chapter 05 (tuned): the K/V tiles each block of Q rows visits, masks or skips
                         under the causal mask, seq_q = seq_kv and seq_q < seq_kv (bottom-right)
  ch08_gqa_rows.svg      chapter 08: a decode block's 16 mma rows as (token, query head) pairs of one
                         K/V head, at --seq-q 1 and 3; the padding rows
  ch09_window_band.svg   chapter 09: the sliding window's visible band (causal, bottom-right) and the
                         tiles tile_keys / tile_visible leave a block
Chapter 06's drawings are in diagrams_hopper.py (draw_all(), called from main()). The canvas, fonts,
colours and drawing helpers both use are in svg.py. The last three pictures read their constants
from the sources (_ints) and port the code's rule to Python, so they follow the code.
"""
import math
import os
import re

import diagrams_hopper  # chapter 06's Hopper pictures (the TMA box, the mbarrier ring, ...)
from svg import BLUE, GREEN, GREY, ORANGE, OUT, RED, ROOT, SOFT, Svg, code


def flash_tiling():
    s = Svg(760, 330, "FlashAttention tiling: one Q tile against one K/V tile")
    s.text(380, 22, "One step of the fused loop: Q tile i meets K/V tile j", 15, weight="bold")
    # Q in device memory
    s.text(70, 52, "Q  (N x d)", 13)
    s.grid(30, 60, 80, 200, 5, 1, BLUE, {(1, 0)}, ORANGE)
    s.text(70, 280, "device memory", 11, color="#666")
    # K^T
    s.text(400, 52, "Kᵀ  (d x N)", 13)
    s.grid(250, 60, 300, 60, 1, 5, BLUE, {(0, 2)}, GREEN)
    # V
    s.text(660, 52, "V  (N x d)", 13)
    s.grid(620, 60, 80, 200, 5, 1, BLUE, {(2, 0)}, GREEN)
    s.text(660, 280, "device memory", 11, color="#666")
    # on-chip
    s.rect(190, 150, 410, 165, fill="#fafafa", stroke="#999", dash="6,4")
    s.text(395, 170, "shared memory / registers of one thread block", 12, color="#555")
    s.rect(215, 190, 60, 50, ORANGE)
    s.text(245, 220, "Q_i", 13)
    s.rect(310, 190, 110, 50, RED)
    s.text(365, 212, "S_ij = Q_i K_jᵀ", 12)
    s.text(365, 228, "B_r x B_c", 11, color="#555")
    s.rect(445, 190, 110, 50, RED)
    s.text(500, 212, "P_ij = e^(S - m)", 12)
    s.text(500, 228, "never stored", 11, color="#555")
    s.rect(320, 260, 225, 40, ORANGE)
    s.text(432, 285, "O_i += P_ij V_j  (with m, ℓ rescaled)", 12)
    s.arrow(110, 100, 213, 205)
    s.arrow(400, 120, 365, 188)
    s.arrow(275, 215, 308, 215)
    s.arrow(420, 215, 443, 215)
    s.arrow(620, 150, 547, 275)
    s.arrow(500, 240, 480, 258)
    s.save("flash_tiling.svg")


def loop_orders():
    s = Svg(760, 330, "Loop orders: K/V tiles outer vs Q tiles outer")
    for k, (x, title, sub) in enumerate([(30, "K/V outer (the paper's Algorithm 1)",
                                          "for each K/V tile j: for each Q tile i: read O_i, m_i, ℓ_i, update, write back"),
                                         (400, "Q outer (chapter 04 variant 2, FlashAttention-2)",
                                          "for each Q tile i: keep O_i, m_i, ℓ_i on chip; for each K/V tile j: update")]):
        s.text(x + 165, 24, title, 13, weight="bold")
        s.text(x + 165, 42, sub, 10, color="#555")
        s.text(x + 10, 72, "Q tiles", 11, anchor="start")
        s.text(x + 175, 72, "K/V tiles", 11, anchor="start")
        s.grid(x + 10, 80, 50, 175, 5, 1, BLUE)
        s.grid(x + 175, 80, 150, 35, 1, 5, BLUE)
        order = [(i, j) for j in range(5) for i in range(5)] if k == 0 else [(i, j) for i in range(5) for j in range(5)]
        for n, (i, j) in enumerate(order[:7]):
            s.rect(x + 175 + j * 30, 125 + i * 26, 30, 26, ORANGE if n < 6 else GREY, width=0.8)
            s.text(x + 190 + j * 30, 143 + i * 26, str(n + 1), 11)
        s.text(x + 250, 275, "first steps, in order" + (": down a column" if k == 0 else ": along a row"), 11,
               color="#555")
        if k == 0:
            s.text(x + 10, 292, "O, m, ℓ make a round trip to device memory every step", 11, anchor="start", color="#a33")
        else:
            s.text(x + 10, 292, "O, m, ℓ written once per Q tile; Q tiles run in parallel", 11, anchor="start", color="#283")
    s.save("loop_orders.svg")


def warp_split():
    s = Svg(760, 290, "Splitting a block's work across warps: by query rows or by keys")
    colors = [BLUE, ORANGE, GREEN, RED]
    for k, (x, title) in enumerate([(30, "split Q (FlashAttention-2): warp w owns rows"),
                                    (400, "split K/V (FlashAttention-1): warp w owns keys")]):
        s.text(x + 165, 24, title, 13, weight="bold")
        s.text(x + 60, 55, "S tile (64 rows x 64 keys)", 11)
        for w in range(4):
            if k == 0:
                s.rect(x + 10, 65 + w * 40, 120, 40, colors[w], width=0.8)
                s.text(x + 70, 90 + w * 40, f"warp {w}", 11)
            else:
                s.rect(x + 10 + w * 30, 65, 30, 160, colors[w], width=0.8)
                s.text(x + 25 + w * 30, 150, f"w{w}", 11)
        if k == 0:
            lines = ["each warp: its rows' max, sum and", "P V for all keys; no exchange", "between warps until the end",
                     "(chapter 05 variant 3 onward)"]
        else:
            lines = ["each warp: a partial P V over its", "keys for every row; the maxima", "and outputs meet in shared",
                     "memory every tile, the sums once", "at the end (variant 2)"]
        for n, line in enumerate(lines):
            s.text(x + 150, 95 + n * 18, line, 11, anchor="start")
        s.text(x + 165, 260, "warps never exchange partial results" if k == 0 else "a merge through shared memory every tile", 12,
               color="#283" if k == 0 else "#a33")
    s.save("warp_split.svg")


def paged_block_table():
    s = Svg(760, 390, "Paged KV cache: block tables and a shared prompt")
    s.text(380, 22, "Two samples forked from one prompt (block size 4)", 15, weight="bold")
    pool_y = lambda p: 62 + p * 27  # noqa: E731
    seqs = [("sequence A", ["The", "cat", "sat", "on", "the", "mat", ".", ""], [7, 2]),
            ("sequence B (fork)", ["The", "cat", "sat", "on", "the", "rug", "", ""], [7, 9])]
    for n, (name, tokens, table) in enumerate(seqs):
        y = 60 + n * 140
        s.text(30, y, name, 13, anchor="start", weight="bold")
        for b in range(2):
            for t in range(4):
                tok = tokens[b * 4 + t]
                s.rect(30 + b * 140 + t * 34, y + 10, 34, 28, BLUE if tok else "white", width=0.8)
                if tok:
                    s.text(47 + b * 140 + t * 34, y + 29, tok, 11)
            s.text(98 + b * 140, y + 55, f"logical block {b}", 10, color="#555")
        s.text(330, y, "block table", 12, anchor="start")
        for b, phys in enumerate(table):
            s.rect(330 + b * 40, y + 10, 40, 28, GREEN)
            s.text(350 + b * 40, y + 29, str(phys), 12)
            s.arrow(350 + b * 40, y + 38, 518, pool_y(phys) + 12, color="#2a7", dash="4,3")
        s.arrow(275, y + 24, 326, y + 24)
    s.text(620, 50, "physical block pool", 13, weight="bold")
    labels = {7: "The cat sat on  ·  ref 2", 2: "the mat .  ·  ref 1 (A)", 9: "the rug  ·  ref 1 (B)"}
    for p in range(10):
        s.rect(520, pool_y(p), 200, 25, ORANGE if p in labels else GREY, width=0.8)
        s.text(535, pool_y(p) + 17, str(p), 11, color="#555")
        s.text(550, pool_y(p) + 17, labels.get(p, ""), 11, anchor="start")
    s.text(30, 355, "Block 7 holds the prompt once (reference count 2). When B wrote 'rug' into the last block it shared",
           11, anchor="start")
    s.text(30, 372, "with A, copy-on-write first gave B its own copy (block 9), so A still reads 'mat'. The decode kernels "
           "follow the tables.", 11, anchor="start")
    s.save("paged_block_table.svg")


# ---- chapter 01 ------------------------------------------------------------------------------


def ch01_tile_threads():
    """attention_scores_tiled_kernel (naive_kernels.cuh): kTile 64, kTileDepth 16, 256 threads,
    thread (tx, ty) = (threadIdx.x % 16, threadIdx.x / 16) owns rows ty + 16r, keys tx + 16n."""
    s = Svg(880, 600, "Chapter 01 tiled kernel: which thread computes which scores")
    s.text(440, 24, "Chapter 01, variant tiled: one block computes a 64 × 64 tile of S", 15, weight="bold")
    px, tx, ty = 5, 5, 2                      # pixels per element; the thread drawn
    sx, sy, qx, ky = 190, 200, 70, 76         # S tile, Q tile x, Kᵀ tile y
    strip, steps, c0 = 12, 8, 2               # a 16-dim slice is `strip` px; d = 128: 8 slices
    # Q tile (64 rows x d) left of S, K tile as Kᵀ (d x 64 keys) above it.
    for k in range(steps):
        s.rect(qx + k * strip, sy, strip, 64 * px, ORANGE if k == c0 else GREY, width=0.6)
        s.rect(sx, ky + k * strip, 64 * px, strip, GREEN if k == c0 else GREY, width=0.6)
    s.text(qx + steps * strip / 2, sy - 22, "Q tile", 12, weight="bold")
    s.text(qx + steps * strip / 2, sy - 8, "64 rows × d", 11, color="#555")
    s.text(sx + 32 * px, ky - 10, "K tile, used as Kᵀ: d × 64 keys", 12, weight="bold")
    s.text(sx - 10, ky + c0 * strip + 10, "dims c0 … c0+15", 11, anchor="end", color="#555")
    s.text(qx + c0 * strip + 6, sy + 64 * px + 18, "dims c0 … c0+15", 11, color="#555")
    s.text(sx - 10, ky + c0 * strip + 26, "(d = 128: 8 steps of 16)", 10, anchor="end", color="#777")
    # S tile: 4 x 4 blocks of 16 x 16; one thread's 16 scores.
    s.grid(sx, sy, 64 * px, 64 * px, 4, 4, BLUE)
    for r in range(4):
        y = sy + (ty + 16 * r) * px + px / 2
        s.line(qx + c0 * strip, y, sx + 64 * px, y, "#c33", 0.8, "2,2")
        x = sx + (tx + 16 * r) * px + px / 2
        s.line(x, ky + c0 * strip, x, sy + 64 * px, "#c33", 0.8, "2,2")
    for r in range(4):
        for n in range(4):
            s.rect(sx + (tx + 16 * n) * px - 1, sy + (ty + 16 * r) * px - 1, px + 2, px + 2, "#d22", "#600", 0.8)
    for n in range(4):  # the thread's rows and keys, by number
        s.text(sx + 64 * px + 6, sy + (ty + 16 * n) * px + 7, str(ty + 16 * n), 10, anchor="start", color="#a22")
        s.text(sx + (tx + 16 * n) * px + 3, sy - 6, str(tx + 16 * n), 10, color="#a22")
    s.text(sx + 32 * px, sy + 64 * px + 18, "S tile: rows row0 … row0+63, keys key0 … key0+63", 11, color="#555")
    s.text(sx + 32 * px, sy + 64 * px + 34, "thick lines: the 16 × 16 blocks; 256 threads cover each block once", 11,
           color="#555")
    # Right: the thread, shared memory, the loop.
    x0 = 560
    s.text(x0, 60, "thread (tx, ty) = (5, 2), threadIdx.x = 37", 12, anchor="start", weight="bold", color="#a22")
    s.text(x0, 78, "tx = threadIdx.x % 16, ty = threadIdx.x / 16", 11, anchor="start")
    s.text(x0, 95, "rows ty + 16r and keys tx + 16n, r, n = 0 … 3:", 11, anchor="start")
    s.text(x0, 112, "16 scores in registers, acc[4][4]", 11, anchor="start")
    s.text(x0, 146, "shared memory, per step of the d loop", 12, anchor="start", weight="bold")
    for k, (name, fill, first) in enumerate([("q_tile[16][64]  (float, 4 KiB): Q rows", ORANGE, ty),
                                             ("k_tile[16][64]  (float, 4 KiB): K rows", GREEN, tx)]):
        y = 172 + k * 112
        s.text(x0, y - 6, name, 11, anchor="start")
        s.rect(x0, y, 256, 64, fill, width=0.8)
        for n in range(4):
            x = x0 + (first + 16 * n) * 4 + 2
            s.line(x, y, x, y + 64, "#c33", 1.6)
        s.text(x0 + 262, y + 20, "16 dims", 10, anchor="start", color="#555")
        s.text(x0 + 262, y + 34, "× 64", 10, anchor="start", color="#555")
        s.text(x0 + 262, y + 48, "rows", 10, anchor="start", color="#555")
        s.text(x0, y + 78, f"red: the 4 {'rows' if k == 0 else 'keys'} thread 37 reads, at every one of the 16 dims",
               10, anchor="start", color="#a22")
    code = ["for (c0 = 0; c0 < d; c0 += 16) {",
            "  q_tile, k_tile ← 64 × 16 slices",
            "    (1024 values each, 4 per thread)",
            "  __syncthreads();",
            "  accumulate_tile_step: per dim c,",
            "    4 + 4 loads, 16 FMAs into acc",
            "  __syncthreads();",
            "}"]
    s.rect(x0 - 8, 386, 312, 146, "#fafafa", "#999", dash="6,4")
    for n, line in enumerate(code):
        s.math(x0, 404 + n * 17, line, 11, anchor="start", mono=True)
    s.text(440, 588, "attention_scores_tiled_kernel (naive_kernels.cuh): kTile = 64, kTileDepth = 16, kTileThreads = 256, "
           "kPerThread = 4", 11, color="#555")
    s.save("ch01_tile_threads.svg")


# ---- chapter 03 ------------------------------------------------------------------------------

# One query row's (already scaled) scores, 4 keys per block: the example both chapter 03 pictures use.
CH03_BLOCKS = [[1.0, 0.5, 2.0, 1.5], [0.0, 1.0, 0.5, 1.5], [3.0, 2.5, 1.0, 0.5], [2.0, 3.5, 1.0, 2.0]]


def _max_sum(scores):
    """(m, ℓ) of a set of scores: the max and the sum of e^(s - m)."""
    m = max(scores)
    return m, sum(math.exp(x - m) for x in scores)


def ch03_online_rescale():
    """The online softmax of chapter 03 (online_softmax.cu: fused_online_attention_kernel's
    correction; common/online_softmax.cuh: online_max_update, the base-2 form)."""
    s = Svg(860, 540, "Online softmax: the running max m and sum ℓ, block by block")
    s.text(430, 24, "Online softmax: one pass, a running max m and sum ℓ, block by block", 15, weight="bold")
    s.text(430, 44, "one query row, its scores taken 4 keys at a time (the fused kernel takes 32 per step, chapter 05 "
           "64 per tile)", 11, color="#555")
    base, unit, kw, bw, gap, x0 = 200, 28, 30, 120, 26, 190
    bx = [x0 + b * (bw + gap) for b in range(4)]
    s.line(x0 - 10, base, bx[3] + bw + 10, base, "#333", 1)
    s.text(x0 - 16, base + 4, "0", 10, anchor="end", color="#555")
    s.text(x0 - 16, base - 2 * unit + 4, "2", 10, anchor="end", color="#555")
    s.line(x0 - 12, base - 2 * unit, x0 - 8, base - 2 * unit, "#555", 1)
    s.text(x0 - 36, base - 50, "scores s", 12, anchor="end")
    m, l, rows = -math.inf, 0.0, []
    for b, block in enumerate(CH03_BLOCKS):
        for k, x in enumerate(block):
            s.rect(bx[b] + k * kw + 4, base - x * unit, kw - 8, x * unit, BLUE, width=0.8)
        m_new = max(m, max(block))
        factor = math.exp(m - m_new)
        add = sum(math.exp(x - m_new) for x in block)
        rows.append((m, m_new, factor, l * factor, add, l * factor + add))
        if m != -math.inf and m_new > m:
            s.line(bx[b] - 4, base - m * unit, bx[b] + bw + 4, base - m * unit, "#777", 1.2, "4,3")
            s.arrow(bx[b] + bw + 8, base - m * unit, bx[b] + bw + 8, base - m_new * unit + 2, "#c33")
        s.line(bx[b] - 4, base - m_new * unit, bx[b] + bw + 4, base - m_new * unit, "#c33", 2)
        s.text(bx[b] + bw / 2, base + 16, f"block {b + 1}: keys {4 * b}–{4 * b + 3}", 11)
        m, l = m_new, l * factor + add
    s.line(40, 80, 60, 80, "#c33", 2)
    s.text(66, 84, "running max m", 11, anchor="start", color="#c33")
    s.line(40, 100, 60, 100, "#777", 1.2, "4,3")
    s.text(66, 104, "m before the block", 11, anchor="start", color="#555")

    def num(v):
        return "−∞" if v == -math.inf else f"{v:.2f}"

    labels = ["m_old → m_new", "factor e^{m_old − m_new}", "ℓ_old × factor", "+ Σ e^{s − m_new}", "ℓ_new"]
    for r, label in enumerate(labels):
        y = 250 + r * 24
        s.math(x0 - 16, y, label, 12, anchor="end", weight="bold" if r in (1, 4) else "normal")
        for b, (mo, mn, f, lf, add, ln) in enumerate(rows):
            factor = "0 (first block)" if mo == -math.inf else f"{f:.3f}".rstrip("0").rstrip(".")
            value = [f"{num(mo)} → {num(mn)}", factor, f"{lf:.2f}", f"+ {add:.2f}", f"{ln:.2f}"][r]
            red = r == 1 and 0 < f < 1
            s.text(bx[b] + bw / 2, y, value, 12, weight="bold" if r in (1, 4) else "normal",
                   color="#c33" if red else "#222")
    s.line(30, 236, 830, 236, "#bbb", 0.8)
    s.line(30, 352, 830, 352, "#bbb", 0.8)
    # The same step in the code: chapter 03 in natural units, chapters 05-08 in base 2.
    cols = [(130, "chapter 03, online_softmax.cu (expf)"), (480, "chapters 05–08, online_softmax.cuh (exp2)")]
    for x, title in cols:
        s.text(x, 378, title, 12, anchor="start", weight="bold")
    table = [("running max", "m_new = max(m_old, max_{j} s_{j})", "m′ = m · log₂e, the max of scale_log2 · s"),
             ("factor", "correction = e^{m_old − m_new}",
              "rescale = exp2(m′_old − m′_new) = 2^{(m_old − m_new) · log₂e}"),
             ("p", "p = e^{s − m_new}", "p = exp2(scale_log2 · s − m′_new): one FFMA, one EX2"),
             ("ℓ and O", "ℓ ← ℓ · correction + Σ p,  acc ← acc · correction + Σ p v",
              "l ← l · rescale + Σ p,  out ← out · rescale + P V"),
             ("end", "O = acc / ℓ, once", "O = out / l, once (l summed over the quad)")]
    for r, (label, left, right) in enumerate(table):
        y = 402 + r * 22
        s.text(120, y, label, 11, anchor="end", color="#555")
        s.math(cols[0][0], y, left, 11, anchor="start")
        s.math(cols[1][0], y, right, 11, anchor="start")
    s.text(430, 522, "The factor is 1 while the max holds (block 2) and below 1 when it rises (blocks 3, 4); "
           "ℓ and O are multiplied by the same factor. Values rounded.", 11, color="#555")
    s.save("ch03_online_rescale.svg")


def ch03_merge():
    """Merging two partial states of one row: online_merge (online_softmax.cu) for (m, ℓ) and
    unnormalized O; merge_partitions_kernel (chapter 08) for normalized O with LSE."""
    s = Svg(860, 512, "Merging two partial softmax results of one row")
    s.text(430, 24, "Merging two partial results (m₁, ℓ₁, O₁) and (m₂, ℓ₂, O₂) of one row", 15, weight="bold")
    keys = [x for block in CH03_BLOCKS for x in block]
    kw, x0 = 40, 110
    parts = [_max_sum(keys[:8]), _max_sum(keys[8:])]
    m = max(p[0] for p in parts)
    scaled = [l_p * math.exp(m_p - m) for m_p, l_p in parts]
    ell = sum(scaled)
    lse = [m_p + math.log(l_p) for m_p, l_p in parts]
    for k, x in enumerate(keys):
        s.rect(x0 + k * kw, 60, kw, 26, BLUE if k < 8 else GREEN, width=0.8)
        s.text(x0 + k * kw + kw / 2, 78, f"{x:g}", 11)
    s.text(x0 - 10, 78, "scores s", 12, anchor="end")
    for n, (m_p, l_p) in enumerate(parts):
        cx = x0 + (4 + 8 * n) * kw
        s.text(cx, 52, f"part {n + 1}: keys {8 * n}–{8 * n + 7}", 11, color="#555")
        s.rect(cx - 150, 104, 300, 62, BLUE if n == 0 else GREEN, width=0.8)
        i = "₁₂"[n]
        s.math(cx, 124, f"m{i} = {m_p:.2f},   ℓ{i} = {l_p:.2f},   LSE{i} = {lse[n]:.2f}", 12)
        s.math(cx, 144, f"O{i} = Σ e^{{s − m{i}}} v  over its keys", 12)
        s.text(cx, 160, "(unnormalized; divided by ℓ" + i + " when stored normalized)", 10, color="#555")
        s.arrow(cx + 60 - 120 * n, 167, 392 + 76 * n, 184)
    s.rect(390, 182, 80, 22, ORANGE, width=0.8)
    s.text(430, 197, "merge", 12, weight="bold")
    for panel in range(2):
        s.arrow(390 + 80 * panel, 196, 220 + 420 * panel, 214)
    # Left: unnormalized O. Right: normalized O with LSE.
    panels = [(20, "O unnormalized: rescale and add",
               "online_merge (ch03, for m and ℓ); the 4 warps of ch08's decode block",
               [f"m = max(m₁, m₂) = {m:.2f}",
                "ℓ = ℓ₁ e^{m₁ − m} + ℓ₂ e^{m₂ − m}",
                f"   = {parts[0][1]:.2f} · {math.exp(parts[0][0] - m):.3f} + {parts[1][1]:.2f} · "
                f"{math.exp(parts[1][0] - m):g} = {ell:.2f}",
                "O = O₁ e^{m₁ − m} + O₂ e^{m₂ − m}",
                "divide by ℓ once, at the end"]),
              (440, "O normalized, with its LSE",
               "merge_partitions_kernel (ch08, split-KV decode)",
               ["LSEₚ = mₚ + ln ℓₚ,   Oₚ stored divided by ℓₚ",
                "top = max(LSE₁, LSE₂),   wₚ = e^{LSEₚ − top}",
                "LSE = top + ln(w₁ + w₂)" + f" = {_log_sum_exp(lse):.2f}",
                "O = (w₁ O₁ + w₂ O₂) / (w₁ + w₂)",
                "   = (ℓ₁′ O₁ + ℓ₂′ O₂) / ℓ,   ℓᵢ′ = ℓᵢ e^{mᵢ − m}",
                "weights e^{LSEₚ − LSE} = ℓₚ′ / ℓ sum to 1"])]
    for x, title, sub, lines in panels:
        s.rect(x, 216, 400, 196, "#fafafa", "#999", dash="6,4")
        s.text(x + 200, 238, title, 13, weight="bold")
        s.text(x + 200, 256, sub, 11, color="#555")
        for n, line in enumerate(lines):
            s.math(x + 20, 282 + n * 23, line, 13, anchor="start")
    s.math(430, 440, f"Both give m = {m:.2f}, ℓ = {ell:.2f}, LSE = m + ln ℓ = {m + math.log(ell):.2f}: the values of the "
           "block-by-block pass over all 16 keys.", 12)
    s.text(430, 460, "The merge is associative: any split of the keys, merged in any order or tree, gives the same result.",
           12)
    s.text(430, 496, "online_softmax.cu: online_merge, warp_merge; paged_attention.cu: merge_partitions_kernel "
           "(w = e^(LSEₚ − top), O = Σ w Oₚ / Σ w). Values rounded.", 11, color="#555")
    s.save("ch03_merge.svg")


def _log_sum_exp(lse):
    """log Σ e^(LSE_p), taken as merge_partitions_kernel takes it: top + ln Σ e^(LSE_p − top)."""
    top = max(lse)
    return top + math.log(sum(math.exp(x - top) for x in lse))


# ---- chapter 05 ------------------------------------------------------------------------------

# mma.m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
# common/ampere.cuh), g = lane / 4, t = lane % 4. Each function returns (lane, register) of an element.
def frag_a(r, c):
    """A, 16 x 16: register 0 (g, 2t..2t+1), 1 (g+8, 2t..), 2 (g, 2t+8..), 3 (g+8, 2t+8..)."""
    return (r % 8) * 4 + (c % 8) // 2, (r // 8) + 2 * (c // 8)


def frag_b(k, n):
    """B, 16 x 8 (k x n): register 0 holds k = 2t, 2t+1 of column n = g; register 1 k = 2t+8, 2t+9."""
    return n * 4 + (k % 8) // 2, k // 8


def frag_c(r, c):
    """C/D, 16 x 8 fp32: c[0], c[1] = (g, 2t), (g, 2t+1); c[2], c[3] = (g+8, 2t), (g+8, 2t+1)."""
    return (r % 8) * 4 + c // 2, 2 * (r // 8) + c % 2


REG_FILLS = [BLUE, ORANGE, GREEN, RED]


def _fragment(s, x, y, rows, cols, cw, ch, owner, fill, lane_hl=None, size=9):
    """A matrix of rows x cols cells labelled with the lane that holds each; the cells of lane_hl outlined."""
    for r in range(rows):
        for c in range(cols):
            lane, reg = owner(r, c)
            s.rect(x + c * cw, y + r * ch, cw, ch, fill(reg), "#777", 0.5)
            s.text(x + c * cw + cw / 2, y + r * ch + ch / 2 + size * 0.36, str(lane), size,
                   weight="bold" if lane == lane_hl else "normal")
    s.rect(x, y, cols * cw, rows * ch, "none", "#333", 1.2)
    if lane_hl is not None:
        for r in range(rows):
            for c in range(cols):
                if owner(r, c)[0] == lane_hl:
                    s.rect(x + c * cw, y + r * ch, cw, ch, "none", "#000", 2.2)


def ch05_mma_fragments():
    """The three fragments of mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (common/ampere.cuh)."""
    s = Svg(900, 600, "mma.m16n8k16 fragment layouts: which lane holds which element")
    s.text(450, 24, "mma.sync.m16n8k16 (bf16 × bf16 + fp32): which lane holds which element", 15, weight="bold")
    s.text(450, 44, "D = A · B + C;  number in a cell = the lane holding it;  g = lane / 4 (groupID), "
           "t = lane % 4 (threadID_in_group); lane 5 (g = 1, t = 1) outlined", 11, color="#555")
    cw, ch, y0 = 22, 18, 112
    mats = [(56, 16, 16, frag_a, lambda reg: REG_FILLS[reg], "A  16 × 16, row-major", "rows m, columns k"),
            (462, 16, 8, frag_b, lambda reg: [BLUE, GREEN][reg], "B  16 × 8 (\"col\")", "rows k, columns n"),
            (684, 16, 8, frag_c, lambda reg: [BLUE, ORANGE][reg // 2], "C / D  16 × 8, fp32", "rows m, columns n")]
    for x, rows, cols, owner, fill, title, axes in mats:
        s.text(x + cols * cw / 2, 70, title, 13, weight="bold")
        s.text(x + cols * cw / 2, 86, axes, 11, color="#555")
        for c in range(cols):
            s.text(x + c * cw + cw / 2, y0 - 5, str(c), 8, color="#777")
        for r in range(rows):
            s.text(x - 4, y0 + r * ch + ch / 2 + 3, str(r), 8, anchor="end", color="#777")
        _fragment(s, x, y0, rows, cols, cw, ch, owner, fill, lane_hl=5)
    legends = [(56, [("reg 0 (a0, a1): row g, k = 2t, 2t+1", BLUE), ("reg 1 (a2, a3): row g+8, k = 2t, 2t+1", ORANGE),
                     ("reg 2 (a4, a5): row g, k = 2t+8, 2t+9", GREEN), ("reg 3 (a6, a7): row g+8, k = 2t+8, 2t+9", RED)]),
               (462, [("reg 0 (b0, b1): k = 2t, 2t+1", BLUE), ("reg 1 (b2, b3): k = 2t+8, 2t+9", GREEN),
                      ("both: column n = g", None)]),
               (684, [("c0, c1: row g, n = 2t, 2t+1", BLUE), ("c2, c3: row g+8, n = 2t, 2t+1", ORANGE)])]
    ly = y0 + 16 * ch + 24
    for x, items in legends:
        for n, (label, fill) in enumerate(items):
            if fill:
                s.rect(x, ly + n * 20 - 11, 14, 14, fill, width=0.8)
            s.text(x + 20, ly + n * 20, label, 11, anchor="start")
    notes = ["A register holds two 16-bit values, the lower-numbered column (A) or row k (B) in its low half.",
             "In the code: A = q_frag[ks][0..3] (Q) or p_frag[0..3] (P);  B = two registers of K or V (ldmatrix);  "
             "C = s[nb][0..3], out[db][0..3].",
             "Row g of C is spread over the 4 lanes 4g … 4g+3 (a quad): a row max or sum is quad_max / quad_sum, "
             "two shuffles."]
    for n, line in enumerate(notes):
        s.text(30, ly + 100 + n * 20, line, 12, anchor="start")
    s.text(450, 588, "PTX ISA: \"Matrix Fragments for mma.m16n8k16 with floating point type\";  common/ampere.cuh "
           "(Mma<T>::run, the layout comment)", 11, color="#555")
    s.save("ch05_mma_fragments.svg")


def ch05_accumulator_reuse():
    """flash_attention_v2_mma.cu (mma_pv) and tuned_tile.cuh (tuned_pv): p_frag from s[2kk], s[2kk+1]."""
    s = Svg(860, 600, "S's accumulator fragments become P's A fragment, without shuffles")
    s.text(430, 24, "From S = Q·Kⱼᵀ to O += P·Vⱼ without leaving registers", 15, weight="bold")
    steps = [("S = Q·Kⱼᵀ: mma", "s[8][4] fp32, 16 rows × 64 keys"), ("online softmax", "s becomes P in place"),
             ("Mma<T>::pack", "2 floats → 1 bf16x2 register"), ("O += P·Vⱼ: mma", "A operand = p_frag[4]")]
    for n, (a, b) in enumerate(steps):
        x = 20 + n * 210
        s.rect(x, 42, 190, 44, [BLUE, BLUE, ORANGE, GREEN][n], width=0.8)
        s.text(x + 95, 60, a, 12, weight="bold")
        s.text(x + 95, 77, b, 11)
        if n:
            s.arrow(x - 24, 64, x - 2, 64)
    cw, ch, y0 = 18, 14, 150
    fills = [[BLUE, ORANGE], [GREEN, RED]]  # [which C tile][row half] = the A register it becomes
    for n in range(2):
        x = 40 + n * (8 * cw + 24)
        s.text(x + 4 * cw, y0 - 34, f"s[2kk{'+1' if n else ''}]  (C, fp32)", 12, weight="bold")
        s.text(x + 4 * cw, y0 - 18, f"keys 16kk + {8 * n} … {8 * n + 7}", 11, color="#555")
        _fragment(s, x, y0, 16, 8, cw, ch, frag_c, lambda reg, n=n: fills[n][reg // 2], lane_hl=5, size=8)
    ax = 520
    s.text(ax + 8 * cw, y0 - 34, "p_frag  (A, bf16)", 12, weight="bold")
    s.text(ax + 8 * cw, y0 - 18, "keys 16kk + 0 … 15", 11, color="#555")
    _fragment(s, ax, y0, 16, 16, cw, ch, frag_a, lambda reg: REG_FILLS[reg], lane_hl=5, size=8)
    s.arrow(380, y0 + 8 * ch, 508, y0 + 8 * ch)
    s.text(444, y0 + 8 * ch - 26, "pack, per lane", 11)
    s.text(444, y0 + 8 * ch - 12, "same place", 11)
    s.text(444, y0 + 8 * ch + 20, "no shuffle,", 11, color="#283")
    s.text(444, y0 + 8 * ch + 34, "no shared memory", 11, color="#283")
    s.text(40, y0 + 16 * ch + 18, "rows: the warp's 16 query rows (a lane holds rows g and g+8);  lane 5 outlined", 11,
           anchor="start", color="#555")
    code = [("p_frag[0] = pack(s[2kk][0],   s[2kk][1])", "row g,   keys 2t, 2t+1", "= A reg 0", BLUE),
            ("p_frag[1] = pack(s[2kk][2],   s[2kk][3])", "row g+8, keys 2t, 2t+1", "= A reg 1", ORANGE),
            ("p_frag[2] = pack(s[2kk+1][0], s[2kk+1][1])", "row g,   keys 8+2t, 8+2t+1", "= A reg 2", GREEN),
            ("p_frag[3] = pack(s[2kk+1][2], s[2kk+1][3])", "row g+8, keys 8+2t, 8+2t+1", "= A reg 3", RED)]
    cy = y0 + 16 * ch + 56
    for n, (c, where, reg, fill) in enumerate(code):
        y = cy + n * 22
        s.rect(40, y - 12, 14, 14, fill, width=0.8)
        s.math(62, y, c, 12, anchor="start", mono=True)
        s.math(420, y, where, 12, anchor="start", mono=True)
        s.text(640, y, reg, 12, anchor="start")
    s.text(430, cy + 108, "C holds (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) of its 8 columns; A's registers hold "
           "(g, 2t..2t+1), (g+8, 2t..2t+1),", 12)
    s.text(430, cy + 126, "(g, 2t+8..2t+9), (g+8, 2t+8..2t+9): two C tiles side by side are one A tile, "
           "element for element.", 12)
    s.text(430, cy + 156, "flash_attention_v2_mma.cu (mma_pv) and tuned_tile.cuh (tuned_pv); chapter 07's backward "
           "and chapter 08's decode kernel do the same", 11, color="#555")
    s.save("ch05_accumulator_reuse.svg")


def ch05_cp_async_double_buffer():
    """flash2_mma_kernel with kPipelined = true (flash_attention_v2_mma.cu): two K/V stages in
    shared memory, tile j + 1 copied by cp.async while tile j is computed."""
    s = Svg(880, 580, "Double-buffered K/V with cp.async: compute on one stage while the other fills")
    s.text(440, 24, "Chapter 05 variant 4 (pipelined): two K/V stages, copy of tile j+1 behind the compute of tile j",
           15, weight="bold")
    s.text(440, 46, "while the warps compute on stage j % 2, cp.async fills stage (j + 1) % 2", 12, color="#555")
    x0, copy, comp, lane_y, lane_h = 150, 100, 132, (124, 172), 34
    for n in range(2):
        s.text(20, lane_y[n] + 15, f"stage {n}", 12, anchor="start", weight="bold")
        s.text(20, lane_y[n] + 29, f"K, V tile in kv_s", 10, anchor="start", color="#555")
        s.rect(x0 - 6, lane_y[n], 880 - x0 - 14, lane_h, "#fafafa", "#ccc", 0.6)

    def bar(stage, x, w, fill, label):
        s.rect(x, lane_y[stage] + 3, w, lane_h - 6, fill, width=0.8)
        s.text(x + w / 2, lane_y[stage] + lane_h / 2 + 4, label, 11)

    bar(0, x0, copy, ORANGE, "cp.async K₀, V₀")
    bar(1, x0 + 6, copy, ORANGE, "cp.async K₁, V₁")
    start = x0 + copy + 6
    for j in range(4):
        if j:
            if j + 1 < 4:
                sub = "₀₁₂₃₄"[j + 1]
                bar((j + 1) % 2, start - 8, copy, ORANGE, f"cp.async K{sub}, V{sub}")
        bar(j % 2, start, comp, GREEN, f"compute tile {j}")
        s.line(start - 2, 100, start - 2, 212, "#c33", 1.3, "4,3")
        s.text(start - 2, 80, "wait_group 1" if j < 3 else "wait_group 0", 10, color="#c33")
        s.text(start - 2, 93, "__syncthreads()", 10, color="#c33")
        end = start + comp
        s.line(end + 1, 118, end + 1, 214, "#777", 1.1, "2,2")
        s.text(end + 1, 228, "__syncthreads()", 10, color="#555")
        start = end + 12
    s.arrow(x0, 246, 860, 246, "#999")
    s.text(860, 262, "time (not to scale)", 10, anchor="end", color="#777")
    s.text(x0, 262, "prologue: tile 0 is copied with nothing to hide it", 10, anchor="start", color="#777")
    code = ["load_tile_async(K, V of tile 0 -> stage 0); cp_async_commit();",
            "for (j0 = 0, stage = 0; j0 < key_end; j0 += 64, stage ^= 1) {",
            "  if (tile j+1 exists) {",
            "    load_tile_async(K, V of tile j+1 -> stage ^ 1);",
            "    cp_async_commit();",
            "    cp_async_wait<1>();   // tile j landed, j+1 may fly",
            "  } else {",
            "    cp_async_wait<0>();   // last tile: wait for all",
            "  }",
            "  __syncthreads();        // all threads' copies visible",
            "  S = Q K_j^T, softmax, O += P V_j    // reads stage",
            "  __syncthreads();        // stage free to be refilled",
            "}"]
    s.rect(20, 284, 486, 250, "#fafafa", "#999", dash="6,4")
    for n, line in enumerate(code):
        s.math(32, 304 + n * 18, line, 11, anchor="start", mono=True)
    facts = [("shared memory, bf16 rows padded to d + 8", True),
             ("Q tile: 64 × (d + 8) × 2 B", False),
             ("K/V: 2 stages × (K + V) × 64 × (d + 8) × 2 B", False)]
    for d in (64, 128):
        q, kv = 64 * (d + 8) * 2, 2 * 2 * 64 * (d + 8) * 2
        facts.append((f"d = {d}: {q // 1024} KiB + {kv // 1024} KiB = {(q + kv) // 1024} KiB", False))
    facts += [("", False), ("cp.async groups", True),
              ("each cp.async copies 16 B from global to shared", False),
              ("memory without passing through registers;", False),
              ("commit_group closes a thread's copies so far", False),
              ("into a group; wait_group N waits until at most", False),
              ("N of its groups are still in flight.", False),
              ("", False),
              ("Variant 3: one stage, each tile's load waited for.", False)]
    for n, (line, bold) in enumerate(facts):
        if line:
            s.text(526, 300 + n * 18, line, 11, anchor="start", weight="bold" if bold else "normal")
    s.text(440, 566, "flash2_mma_kernel<T, kD, kPipelined = true> (flash_attention_v2_mma.cu): kKeys = 64, "
           "stage = j % 2, load_tile_async = cp_async_16 per 16 bytes", 11, color="#555")
    s.save("ch05_cp_async_double_buffer.svg")


# ---- chapter 07 ------------------------------------------------------------------------------


def ch07_backward_dataflow():
    """Chapter 07's kernels: delta_kernel (delta.cuh), backward_mma_kernel (backward_mma.cuh; dQ by
    atomics in variant 2), backward_dq_kernel (backward_deterministic.cu, variant 3)."""
    s = Svg(900, 560, "Chapter 07's backward kernels: who owns which gradient")
    s.text(450, 24, "The backward: D first, then dK and dV per K/V tile, dQ by atomics or by its own kernel", 15,
           weight="bold")

    def box(x, y, w, h, fill, title, lines, size=11):
        s.rect(x, y, w, h, fill, width=0.9)
        s.text(x + 10, y + 18, title, 12, anchor="start", weight="bold")
        for n, line in enumerate(lines):
            s.math(x + 10, y + 36 + n * 16, line, size, anchor="start")

    box(20, 44, 550, 58, GREY, "1  delta_kernel (delta.cuh): one warp per query row",
        ["reads O, dO  →  writes D, D_{i} = dO_{i} · O_{i} = rowsum(dO ∘ O), fp32",
         "(D_{i} = Σ_{j} P_{ij} dP_{ij}, the softmax's correction, without P)"])
    s.arrow(295, 102, 295, 118)
    box(20, 120, 550, 186, BLUE, "2  backward_mma_kernel (backward_mma.cuh): one block per 64-key K/V tile j",
        ["grid (seq_kv / 64, batch · heads_kv), 4 warps; warp w owns keys 16w … 16w + 15",
         "K_{j}, V_{j} stay in shared memory; dK_{j}, dV_{j} accumulate in registers (dk_acc, dv_acc)",
         "loops over every Q tile i of every query head that shares this K/V head (GQA):",
         "   Q_{i}, dO_{i}, LSE, D rows by cp.async (2 stages when dQ is not done here)",
         "   Sᵀ = K_{j} Q_{i}ᵀ,   dPᵀ = V_{j} dO_{i}ᵀ          (16 keys × 64 rows per warp)",
         "   Pᵀ = exp(Sᵀ · scale − LSE),   dSᵀ = Pᵀ ∘ (dPᵀ − D)",
         "   dV_{j} += Pᵀ dO_{i},   dK_{j} += dSᵀ Q_{i}        (A = Pᵀ, dSᵀ straight from the accumulators)",
         "reads Q, K, V, dO, LSE, D  →  writes dK_{j} (× scale) and dV_{j} once, no other block touches them",
         "Q tiles above the causal diagonal are skipped (first_tile)"])
    s.arrow(150, 306, 150, 330)
    s.arrow(440, 306, 440, 330)
    box(20, 332, 270, 148, ORANGE, "variant 2, mma: dQ by atomics",
        ["the same kernel, kDq = true:",
         "dS (transposed back) → shared ds_s",
         "dQ_{i} += dS K_{j}, 16 rows per warp",
         "atomicAdd into dq32 (fp32, zeroed",
         "by cudaMemsetAsync), then",
         "round_dq_kernel: dq32 → dQ",
         "order of adds varies run to run"])
    box(300, 332, 270, 148, GREEN, "variant 3, deterministic",
        ["kernel 2 with kDq = false, and",
         "backward_dq_kernel: one block per",
         "64-row Q tile i, loops over K/V tiles",
         "S, dP recomputed (7 products, not 5)",
         "dQ_{i} += dS K_{j} in registers (dq_acc)",
         "writes dQ once: bitwise repeatable",
         "side stream: runs beside kernel 2"])
    # Right: the score matrix, tiles by (Q tile i, K/V tile j); causal: j > i skipped.
    gx, gy, t, n = 630, 96, 36, 6
    s.text(gx + n * t / 2, 60, "S tiles: Q tile i × K/V tile j", 12, weight="bold")
    s.text(gx + n * t, 86, "K/V tiles j →", 11, anchor="end", color="#555")
    s.text(gx, 86, "↓ Q tiles i", 11, anchor="start", color="#555")
    col, row = 2, 4
    for i in range(n):
        for j in range(n):
            fill = "white" if j > i else GREY
            if j == col and j <= i:
                fill = BLUE
            s.rect(gx + j * t, gy + i * t, t, t, fill, "#888", 0.6)
    s.rect(gx + col * t, gy + col * t, t, (n - col) * t, "none", "#1f5fa0", 2.4)
    s.rect(gx, gy + row * t, (row + 1) * t, t, "none", "#2a7a2a", 2.4, dash="5,3")
    s.text(gx + n * t / 2, gy + n * t + 20, "white: above the causal diagonal, skipped", 11, color="#555")
    legend = [("#1f5fa0", "", "kernel 2: block j walks column j"),
              ("", "", "(one Sᵀ tile per Q tile): owns dK_{j}, dV_{j}"),
              ("#2a7a2a", "5,3", "backward_dq_kernel: block i walks"),
              ("", "", "row i: owns dQ_{i}, no atomics"),
              ("", "", "Sᵀ (keys × rows) keeps each warp's"),
              ("", "", "dK, dV rows (its 16 keys) its own;"),
              ("", "", "P, dS feed the next mma unshuffled.")]
    for k, (color, dash, label) in enumerate(legend):
        y = gy + n * t + 50 + k * 17 + (8 if k >= 4 else 0)
        if color:
            s.rect(gx, y - 10, 20, 12, "none", color, 2.2, dash=dash or None)
        if label:
            s.math(gx + 28, y, label, 11, anchor="start")
    s.text(450, 506, "Variants 3 and 4 run kernel 2 and the dQ kernel on two streams, side by side: both need only D. "
           "Variant 4 (Hopper, wgmma)", 11, color="#555")
    s.text(450, 524, "has the same two kernels in backward_wgmma_sm90a.cu.", 11, color="#555")
    s.text(450, 548, "backward_mma.cu (variant 2), backward_deterministic.cu (variant 3), backward_mma.cuh, delta.cuh",
           11, color="#555")
    s.save("ch07_backward_dataflow.svg")


# ---- chapter 08 ------------------------------------------------------------------------------


def ch08_split_kv():
    """Variant 2 (split_kv): paged_attention_kernel<T, kD, true> (decode_kernel.cuh) per partition,
    then merge_partitions_kernel (paged_attention.cu)."""
    s = Svg(900, 600, "Split-KV decode: partitions of one context, partial results, the merge")
    s.text(450, 24, "Split-KV decode (chapter 08, variant 2): one block per partition, then an exact merge", 15,
           weight="bold")
    s.text(450, 46, "one sequence's context of ctx keys, cut into partitions of partition_tokens keys (a multiple of "
           "kChunk = 16); split_plan picks how many", 11, color="#555")
    x0, cw, per, parts, real = 50, 25, 8, 4, 28  # chunk width, chunks per partition, partitions, chunks below ctx
    warp_fill = [BLUE, ORANGE, GREEN, RED]
    for c in range(parts * per):
        x = x0 + c * cw
        if c < real:
            s.rect(x, 62, cw, 26, warp_fill[(c % per) % 4], width=0.6)
            s.text(x + cw / 2, 79, f"w{(c % per) % 4}", 9)
        else:
            s.rect(x, 62, cw, 26, "white", "#999", 0.6, dash="3,2")
    s.text(x0 + (real + (parts * per - real) / 2) * cw, 102, "past ctx", 10, color="#777")
    for p in range(parts):
        x = x0 + p * per * cw
        s.rect(x, 62, per * cw, 26, "none", "#222", 1.8)
        s.text(x + per * cw / 2, 116 if p < 3 else 116, f"partition p = {p}", 11, weight="bold")
    s.text(x0, 134, "16-key chunks dealt round-robin to the block's 4 warps (w0 … w3); each warp has its own cp.async "
           "ring and online softmax", 11, anchor="start", color="#555")
    # The gather of one chunk.
    y = 150
    s.rect(20, y, 860, 92, "#fafafa", "#999", dash="6,4")
    s.text(34, y + 18, "per chunk (paged_gather): one table lookup per key, passed to the copying lanes by __shfl_sync",
           12, anchor="start", weight="bold")
    flow = [("keys k0 … k0+15", "lane l: key k0 + l % 16"),
            ("block table", "table[key >> block_shift]"),
            ("K/V cache rows", "slot key & (block_size − 1)"),
            ("cp.async 16 B", "→ the warp's ring stage"),
            ("mma.sync", "S, softmax, O += P V")]
    for n, (a, b) in enumerate(flow):
        x = 34 + n * 170
        s.rect(x, y + 30, 150, 48, [GREY, GREEN, ORANGE, BLUE, BLUE][n], width=0.8)
        s.text(x + 75, y + 49, a, 12, weight="bold")
        s.text(x + 75, y + 67, b, 11)
        if n:
            s.arrow(x - 19, y + 54, x - 2, y + 54)
    # One block per partition, each writing a normalized partial O and its LSE.
    by = 274
    for p in range(parts):
        x = x0 + p * per * cw + 6
        w = per * cw - 12
        s.rect(x, by, w, 92, BLUE, width=0.9)
        s.text(x + w / 2, by + 18, f"block: blockIdx.x = {p}", 12, weight="bold")
        s.text(x + w / 2, by + 35, "its 4 warps' states merged", 10, color="#444")
        s.math(x + w / 2, by + 58, f"part_o: O{'₀₁₂₃'[p]} = O / ℓ (fp32)", 11)
        s.math(x + w / 2, by + 78, f"part_lse: LSE{'₀₁₂₃'[p]} = m + ln ℓ", 11)
        s.arrow(x + w / 2, by + 92, 450 + (p - 1.5) * 60, 410)
    s.text(450, by - 10, "grid (partitions, heads_kv, num_seqs × row_tiles): one block per (partition, K/V head, "
           "16 query rows)", 11, color="#555")
    s.rect(130, 412, 640, 108, ORANGE, width=0.9)
    s.text(450, 432, "merge_partitions_kernel: one warp per query row", 13, weight="bold")
    s.math(450, 456, "top = maxₚ LSEₚ,     wₚ = e^{LSEₚ − top}", 13)
    s.math(450, 480, "O = Σₚ wₚ Oₚ / Σₚ wₚ  =  Σₚ e^{LSEₚ − LSE} Oₚ,     LSE = top + ln Σₚ wₚ", 13)
    s.text(450, 506, "launched with programmatic dependent launch (sm_90): it waits in griddepcontrol.wait for the partials",
           11, color="#444")
    s.text(450, 546, "A partition that starts past a shorter sequence's ctx returns at once and the merge reads none of it;",
           11, color="#555")
    s.text(450, 562, "the merge is chapter 03's, on normalized O with LSE (ch03_merge.svg, right).", 11, color="#555")
    s.text(450, 588, "decode_kernel.cuh (paged_attention_kernel<T, kD, kSplit = true>, paged_gather); paged_attention.cu "
           "(merge_partitions_kernel, split_plan)", 11, color="#555")
    s.save("ch08_split_kv.svg")


# ---- constants read from the code ------------------------------------------------------------


def _source(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _ints(path, pattern):
    """The integers `pattern` captures in a source file (a match with no groups: []). Stops the run
    with the file and the pattern when the code no longer says it, so a picture never outlives its code."""
    m = re.search(pattern, _source(path))
    if not m:
        raise SystemExit(f"diagrams.py: {path} no longer matches {pattern!r}: update the picture that reads it")
    return [int(g) for g in m.groups()]


def _by_head_dim(path, name):
    """A constant written `constexpr int name = kD == A ? B : C;`, as a function of the head dim."""
    a, b, c = _ints(path, rf"constexpr int {name} = kD == (\d+) \? (\d+) : (\d+);")
    return lambda d: b if d == a else c


CH05 = "chapters/05_flash_attention_v2/"
CH08 = "chapters/08_paged_attention/"
CH09 = "chapters/09_real_model_features/"
FULL_EDGE, MASK_EDGE = "#2a7a2a", "#c0661a"  # outlines of a visited tile: no mask / masked
TILE_KINDS = [("full", GREEN, FULL_EDGE, None), ("mask", ORANGE, MASK_EDGE, "4,2"), ("skip", GREY, "#aaa", None)]


def tuned_tile_sizes(d):
    """(kTunedBlockRows<d>, kTunedKeys<d>): Q rows per block (tuned_tile.cuh: kTunedWarps x
    kTunedWarpRows = 16 x kTunedMTiles) and keys per K/V tile (flash_attention_v2_tuned.cu)."""
    warps, = _ints(CH05 + "tuned_tile.cuh", r"constexpr int kTunedWarps = (\d+),")
    m16, = _ints(CH05 + "tuned_tile.cuh", r"constexpr int kTunedWarpRows = (\d+) \* kTunedMTiles<kD>;")
    _ints(CH05 + "tuned_tile.cuh", r"constexpr int kTunedBlockRows = kTunedWarpRows<kD>\s*\*\s*kTunedWarps;")
    m_tiles = _by_head_dim(CH05 + "tuned_tile.cuh", "kTunedMTiles")
    keys = _by_head_dim(CH05 + "flash_attention_v2_tuned.cu", "kTunedKeys")
    return m16 * m_tiles(d) * warps, keys(d)


def _code_lines(s, x, y, lines, size=10.5, step=16):
    """Code, one line per step; leading spaces become an x offset (renderers differ on white space)."""
    for n, c in enumerate(lines):
        indent = len(c) - len(c.lstrip(" "))
        code(s, round(x + indent * 0.602 * size, 1), y + n * step, c.lstrip(" "), size)


def _tile_legend(s, x, y, names, dx=0, dy=22):
    """Swatches of the three kinds of tile, with names[kind]."""
    for n, (kind, fill, edge, dash) in enumerate(TILE_KINDS):
        s.rect(x + n * dx, y + n * dy - 11, 22, 14, fill, edge, 2 if kind != "skip" else 0.8, dash)
        s.text(x + n * dx + 30, y + n * dy, names[kind], 11, anchor="start")


# ---- chapter 05: which K/V tiles a causal block visits ----------------------------------------


def causal_tile_plan(seq_q, seq_kv, rows, keys):
    """flash2_tuned_kernel's K/V loop under the causal mask (flash_attention_v2_tuned.cu), ported
    line for line: a block of Q rows i0 .. i0 + rows - 1 visits j0 = 0, keys, ... below key_end =
    visible_keys(last_row), and masks a tile when needs_mask; visible_keys is AttentionShape's
    (problem.h, causal_offset = seq_kv - seq_q). Returns [row block][K/V tile] of "full", "mask",
    "skip". needs_mask is checked against CausalMask<true>::tile_visible (common/mask.h)."""
    offset = seq_kv - seq_q

    def visible_keys(i):
        n = i + offset + 1
        return 0 if n < 0 else (seq_kv if n > seq_kv else n)

    plan = []
    for i0 in range(0, seq_q, rows):
        last_row = min(i0 + rows, seq_q) - 1
        key_end = visible_keys(last_row)
        kinds = []
        for j0 in range(0, seq_kv, keys):
            needs_mask = j0 + keys > visible_keys(i0) or j0 + keys > seq_kv or i0 + rows > seq_q
            tile_visible = i0 + rows <= seq_q and j0 + keys <= visible_keys(i0)  # keys(i0).end = visible_keys(i0)
            assert needs_mask == (not tile_visible)
            kinds.append("skip" if j0 >= key_end else ("mask" if needs_mask else "full"))
        plan.append(kinds)
    return plan


def _tile_panel(s, x, y, plan, tw, th, row_label, key_step, keys):
    """plan (row blocks x K/V tiles) as tiles of tw x th pixels from (x, y), rows labelled on the left
    and every key_step-th tile's first key on top."""
    kind_of = {kind: (fill, edge, dash) for kind, fill, edge, dash in TILE_KINDS}
    for b, kinds in enumerate(plan):
        for t, kind in enumerate(kinds):  # skipped tiles first, so the outlines of visited ones lie on top
            if kind == "skip":
                s.rect(x + t * tw, y + b * th, tw, th, GREY, "#bbb", 0.6)
        for t, kind in enumerate(kinds):
            fill, edge, dash = kind_of[kind]
            if kind != "skip":
                s.rect(x + t * tw + 0.75, y + b * th + 0.75, tw - 1.5, th - 1.5, fill, edge, 1.5, dash)
        s.text(x - 6, y + b * th + th / 2 + 4, row_label(b), 10, anchor="end", color=SOFT)
    for t in range(0, len(plan[0]) + 1, key_step):
        s.text(x + t * tw, y - 6, str(t * keys), 9.5, color=SOFT)


def ch05_causal_tiles():
    """The causal mask in chapter 05's tuned kernel (flash2_tuned_kernel, flash_attention_v2_tuned.cu)
    at head_dim 128: blocks of kTunedBlockRows<128> Q rows (tuned_tile.cuh) against K/V tiles of
    kTunedKeys<128> keys (flash_attention_v2_tuned.cu), both read from the sources; each tile's kind
    from causal_tile_plan, the kernel's key_end / needs_mask ported (common/mask.h's CausalMask
    rule, problem.h's causal_offset = seq_kv - seq_q)."""
    d = 128
    rows, keys = tuned_tile_sizes(d)
    s = Svg(940, 540, "Chapter 05's tuned kernel under the causal mask: K/V tiles visited, masked, skipped")
    s.text(470, 24, "Causal attention in chapter 05's tuned kernel: which K/V tiles each block of Q rows visits", 15,
           weight="bold")
    s.text(470, 44, f"head_dim {d}: a block takes kTunedBlockRows = {rows} query rows, the loop takes "
           f"kTunedKeys = {keys} keys per K/V tile; one square = one tile ({rows} rows × {keys} keys)", 11, color=SOFT)
    tw, th = 20, 20 * rows // keys  # to scale: a key is as wide as a row is tall
    panels = [(90, 1024, 1024), (560, 384, 1024)]
    totals = []
    for x, seq_q, seq_kv in panels:
        plan = causal_tile_plan(seq_q, seq_kv, rows, keys)
        off = seq_kv - seq_q
        title = "seq_q = seq_kv = 1024" if seq_q == seq_kv else f"seq_q = {seq_q} < seq_kv = {seq_kv}"
        s.text(x + len(plan[0]) * tw / 2, 70, title, 12.5, weight="bold")
        s.text(x + len(plan[0]) * tw / 2, 86, f"causal_offset = seq_kv − seq_q = {off}", 10.5, color=SOFT)
        y = 108
        s.text(x - 6, y - 6, "key", 9.5, anchor="end", color=SOFT)
        _tile_panel(s, x, y, plan, tw, th, lambda b: f"rows {b * rows}–{min((b + 1) * rows, seq_q) - 1}", 4, keys)
        s.line(x + off * tw / keys, y, x + seq_kv * tw / keys, y + seq_q * th / rows, "#c33", 1.8)
        flat = [k for kinds in plan for k in kinds]
        totals.append((x, y + len(plan) * th, flat.count("full"), flat.count("mask"), flat.count("skip"), plan))
    for x, bottom, full, mask, skip, plan in totals:
        s.text(x + len(plan[0]) * tw / 2, bottom + 18, f"{full + mask} tiles visited ({mask} masked), {skip} skipped",
               11)
    # The second panel's text, under it.
    x2, b2 = totals[1][0], totals[1][1]
    s.text(x2, b2 + 44, "Aligned bottom-right: the last query row sees every key,", 11, anchor="start")
    s.text(x2, b2 + 60, f"row i sees keys 0 … i + {panels[1][2] - panels[1][1]}; no block skips the first tiles.",
           11, anchor="start")
    s.line(x2, b2 + 84, x2 + 24, b2 + 84, "#c33", 1.8)
    s.text(x2 + 32, b2 + 88, "the diagonal: key j = i + causal_offset", 11, anchor="start")
    _tile_legend(s, x2, b2 + 114, {"full": "visited, no mask: inside every row's keys",
                                   "mask": "visited, masked: the diagonal cuts it (tuned_mask)",
                                   "skip": "skipped: j0 ≥ key_end, never loaded"})
    _code_lines(s, x2, b2 + 192, ["key_end = visible_keys(last_row); // per block",
                                  "for (j0 = 0; j0 < key_end; j0 += kKeys)",
                                  "  needs_mask = j0 + kKeys > visible_keys(i0)",
                                  "    || j0 + kKeys > n_k || i0 + kBlockRows > n_q;"])
    s.text(470, 510, "flash2_tuned_kernel (flash_attention_v2_tuned.cu): key_end and needs_mask, the same test as "
           "CausalMask<true>::tile_visible (common/mask.h);", 11, color=SOFT)
    last = (panels[0][1] - 1) // rows * rows
    s.text(470, 527, f"blocks run last rows first (blockIdx.x = 0 takes rows {last}–{panels[0][1] - 1}), so the "
           "longest rows start first", 11, color=SOFT)
    s.save("ch05_causal_tiles.svg")


# ---- chapter 08: a decode block's 16 rows under GQA ---------------------------------------------


def decode_rows(group, query_len, kv_head, tile, ctx, k_rows):
    """paged_attention_kernel's rows (decode_kernel.cuh), ported: row r of row tile `tile` is gr =
    tile * kRows + r, query token gr / group, query head kv_head * group + gr % group (row_index);
    it sees keys [0, max(0, min(ctx, ctx - query_len + token + 1))) (visible); rows past last_row =
    min(kRows, group * query_len - first_row) - 1 are padding (zeros in Q, never written). Returns
    [(token, head, visible keys) or None] for the kRows rows."""
    first_row = tile * k_rows
    last_row = min(k_rows, group * query_len - first_row) - 1
    out = []
    for r in range(k_rows):
        if r > last_row:
            out.append(None)
            continue
        gr = first_row + r
        token, head = gr // group, kv_head * group + gr % group
        out.append((token, head, max(0, min(ctx, ctx - query_len + token + 1))))
    return out


def ch08_gqa_rows():
    """Chapter 08's decode block (paged_attention_kernel, decode_kernel.cuh): its kRows = 16 query
    rows (one mma.m16n8k16 M tile) are the (token, query head) pairs of one K/V head; rows from
    decode_rows (row_index, visible, last_row ported), kRows read from decode_kernel.cuh and the
    chapter's default heads_q, heads_kv and seq_kv (context) from main.cu's run_chapter. Which lanes
    and A registers hold row r: the m16n8k16 A layout (frag_a above), as ldmatrix_x4 loads qf."""
    k_rows, = _ints(CH08 + "decode_kernel.cuh", r"constexpr int kRows = (\d+);")
    heads_q, = _ints(CH08 + "main.cu", r'"--heads"\)\) shape\.heads_q = (\d+);')
    heads_kv, = _ints(CH08 + "main.cu",
                      r'shape\.heads_kv = flag_given\(argc, argv, "--heads"\) \? shape\.heads_q : (\d+);')
    ctx, = _ints(CH08 + "main.cu", r'"--seq-kv"\)\) shape\.seq_kv = (\d+);')
    group, kv_head = heads_q // heads_kv, 1
    s = Svg(980, 660, "Chapter 08 decode: one K/V head's query heads fill the 16 rows of the mma tile")
    s.text(490, 24, f"Chapter 08's decode block: its {k_rows} query rows are (token, query head) pairs of one K/V head",
           15, weight="bold")
    s.text(490, 44, f"heads_q = {heads_q}, heads_kv = {heads_kv} (the chapter's defaults): group = {group} query heads "
           f"per K/V head; drawn: the block of K/V head {kv_head}, query heads {kv_head * group}–"
           f"{kv_head * group + group - 1}", 11, color=SOFT)
    head_fill = [BLUE, ORANGE, GREEN, "#e3d3f2"]
    y0, rh = 128, 24
    cols = [(34, "row r"), (98, "lanes"), (180, "A registers")]
    panels = [(260, 1, "decode: --seq-q 1", "query_len = 1"),
              (530, 3, "a prefill chunk: --seq-q 3", f"query_len = 3, ctx = {ctx}")]
    pw = 220
    for x, name in cols:
        s.text(x, y0 - 12, name, 11, weight="bold")
    s.text(110, y0 - 40, "who holds row r of the A fragment", 10.5, color=SOFT)
    s.text(110, y0 - 26, "(mma.m16n8k16; ldmatrix_x4 into qf)", 10, color=SOFT)
    for r in range(k_rows):
        y = y0 + r * rh
        g = r % 8
        s.text(34, y + 16, str(r), 11)
        s.text(98, y + 16, f"{4 * g}–{4 * g + 3}", 11)
        s.math(180, y + 16, "qf[·][0], qf[·][2]" if r < 8 else "qf[·][1], qf[·][3]", 10.5, mono=True)
    for x, query_len, title, sub in panels:
        rows = decode_rows(group, query_len, kv_head, 0, ctx, k_rows)
        real = sum(1 for row in rows if row)
        s.text(x + pw / 2, y0 - 40, title, 12.5, weight="bold")
        s.text(x + pw / 2, y0 - 26, f"{sub}: {real} of {k_rows} rows real", 10.5, color=SOFT)
        s.text(x + pw / 2, y0 - 12, "(token, query head)", 11, weight="bold")
        for r, row in enumerate(rows):
            y = y0 + r * rh
            if row:
                token, head, visible = row
                s.rect(x, y, pw, rh, head_fill[head % group], width=0.8)
                s.text(x + pw / 2, y + 16, f"token {token}, head {head}", 11)
                if query_len > 1:
                    s.text(x + pw + 8, y + 16, f"keys 0 … {visible - 1}", 10.5, anchor="start")
            else:
                s.rect(x, y, pw, rh, GREY, "#aaa", 0.6)
                s.text(x + pw / 2, y + 16, "padding: zeros", 10.5, color="#888")
        if query_len > 1:
            s.text(x + pw + 8, y0 - 12, "visible(r)", 11, anchor="start", weight="bold")
        s.rect(x, y0, pw, k_rows * rh, "none", "#333", 1.4)
    # The two halves of the tile: rows g and g + 8.
    s.line(14, y0 + 8 * rh, 966, y0 + 8 * rh, "#333", 1.6, "6,3")
    s.text(966, y0 + 8 * rh - 6, "rows g = lane / 4", 10, anchor="end", color=SOFT)
    s.text(966, y0 + 8 * rh + 14, "rows g + 8", 10, anchor="end", color=SOFT)
    ny = y0 + k_rows * rh + 30
    notes = [f"Row r of row tile t: gr = {k_rows}t + r, token gr / group, query head kv_head · group + gr % group "
             "(row_index); the grid has",
             f"ceil(group · query_len / {k_rows}) row tiles per sequence (row_tiles). Rows past the last real one "
             "are zeros in the Q tile and are never written.",
             f"At decode {group} of {k_rows} rows are real; rows {group}–{k_rows - 1} are padding, all of 8–15 among "
             "them, so qf[·][1] and qf[·][3] are zero in every lane.",
             f"The mma costs the same, and each K/V row the block gathers through the block table serves all {group} "
             "heads of the group: read once, not once per head.",
             "A prefill chunk puts its tokens at the end of the context: token i sees keys [0, ctx − query_len + i + 1) "
             "(visible), causal among themselves."]
    for n, line in enumerate(notes):
        s.text(30, ny + n * 18, line, 11, anchor="start")
    s.text(490, 648, "decode_kernel.cuh: kRows, paged_attention_kernel (row_index, visible, last_row, the qf "
           "ldmatrix); paged_attention.cu: row_tiles; main.cu: the defaults", 11, color=SOFT)
    s.save("ch08_gqa_rows.svg")


# ---- chapter 09: the sliding window's band and the tiles it leaves -------------------------------


class WindowMask:
    """WindowMask (common/attention_features.h), ported: offset = causal_offset = seq_kv - seq_q,
    first_visible_key, visible_keys and visible(i, j) as the code writes them."""

    def __init__(self, seq_q, seq_kv, left, right, causal):
        self.seq_q, self.seq_kv, self.offset = seq_q, seq_kv, seq_kv - seq_q
        self.left, self.right, self.causal = left, right, causal

    def visible_keys(self, i):
        n = self.seq_kv
        if self.causal or self.right == 0:
            n = i + self.offset + 1
        if self.right > 0 and not self.causal:
            n = i + self.offset + self.right + 1
        return 0 if n < 0 else (self.seq_kv if n > self.seq_kv else n)

    def first_visible_key(self, i):
        if self.left < 0:
            return 0
        j = i + self.offset - self.left
        return 0 if j < 0 else (self.seq_kv if j > self.seq_kv else j)

    def visible(self, i, j):
        diagonal = i + self.offset
        if (self.causal or self.right == 0) and j > diagonal:
            return False
        if self.right > 0 and j > diagonal + self.right:
            return False
        return self.left < 0 or j >= diagonal - self.left


def window_tile_plan(mask, rows, keys):
    """features.h's tile_keys and WindowMask::tile_visible, ported, as a kernel calls them
    (features_ampere_kernel): a block of rows i0 .. i0 + rows - 1 visits j0 = span.begin, + keys, ...
    below span.end, and masks a tile unless tile_visible. Returns [row block][K/V tile] of
    "full", "mask", "skip"; checks that no skipped tile holds a visible (row, key)."""
    plan = []
    for i0 in range(0, mask.seq_q, rows):
        last_row = min(i0 + rows, mask.seq_q) - 1
        begin = mask.first_visible_key(i0) // keys * keys  # tile_keys
        end = mask.visible_keys(last_row)
        kinds = []
        for j0 in range(0, mask.seq_kv, keys):
            if not begin <= j0 < end:
                assert not any(mask.visible(i, j) for i in range(i0, last_row + 1)
                               for j in range(j0, min(j0 + keys, mask.seq_kv)))
                kinds.append("skip")
                continue
            fully = (i0 + rows - 1 < mask.seq_q and j0 + keys <= mask.seq_kv and  # tile_visible
                     j0 >= mask.first_visible_key(i0 + rows - 1) and j0 + keys <= mask.visible_keys(i0))
            kinds.append("full" if fully else "mask")
        plan.append(kinds)
    return plan


def ch09_window_band():
    """Chapter 09's sliding window: the (row, key) pairs WindowMask (common/attention_features.h)
    leaves visible, causal and bottom-right aligned (offset = causal_offset), and the K/V tiles a
    block visits, masks or skips by tile_keys (features.h) / WindowMask::tile_visible, all ported to
    Python (WindowMask, window_tile_plan). Left: every (row, key) of a small problem, cut into
    4 x 4 tiles to be seen; right: the tiles of features_ampere_kernel at head_dim 128, kBlockRows
    (tuned_tile.cuh) by kKeys (features_ampere.cu), both read from the sources."""
    s = Svg(1000, 570, "Chapter 09's sliding window: the visible band, and the K/V tiles a block visits")
    s.text(500, 24, "Sliding window, causal, aligned bottom-right: the keys each row sees, and the tiles a block "
           "visits",
           15, weight="bold")
    s.math(500, 46, "query i sees key j iff i + off − window_left ≤ j ≤ i + off + window_right   "
           "(off = seq_kv − seq_q; causal caps window_right at 0)", 12)
    # Left: every (row, key), 4 x 4 tiles.
    seq_q, seq_kv, left, tile = 12, 16, 7, 4
    mask = WindowMask(seq_q, seq_kv, left, 0, True)
    plan = window_tile_plan(mask, tile, tile)
    x0, y0, c = 70, 118, 24
    s.text(x0 + seq_kv * c / 2, 78, f"seq_q = {seq_q}, seq_kv = {seq_kv} (off = {mask.offset}), window ({left}, 0): "
           f"w = {left + 1} keys", 12, weight="bold")
    s.text(x0 + seq_kv * c / 2, 94, f"a cell is one (row, key); tiles of {tile} rows × {tile} keys here, to be legible",
           10.5,
           color=SOFT)
    for j in range(seq_kv):
        s.text(x0 + j * c + c / 2, y0 - 6, str(j), 9.5, color=SOFT)
    s.text(x0 - 6, y0 - 6, "key", 9.5, anchor="end", color=SOFT)
    for i in range(seq_q):
        s.text(x0 - 6, y0 + i * c + c / 2 + 4, f"row {i}", 10, anchor="end", color=SOFT)
        for j in range(seq_kv):
            kind = plan[i // tile][j // tile]
            fill = BLUE if mask.visible(i, j) else (GREY if kind == "skip" else "white")
            if j == i + mask.offset:
                fill = "#8fbbe6"
            s.rect(x0 + j * c, y0 + i * c, c, c, fill, "#bbb", 0.5)
    for b, kinds in enumerate(plan):
        for t, kind in enumerate(kinds):
            if kind != "skip":
                edge, dash = (FULL_EDGE, None) if kind == "full" else (MASK_EDGE, "5,3")
                s.rect(x0 + t * tile * c + 1.5, y0 + b * tile * c + 1.5, tile * c - 3, tile * c - 3, "none", edge,
                       2.6, dash)
        i0 = b * tile
        begin = mask.first_visible_key(i0) // tile * tile
        end = mask.visible_keys(min(i0 + tile, seq_q) - 1)
        s.text(x0 + seq_kv * c + 10, y0 + b * tile * c + tile * c / 2 - 2, f"rows {i0}–{i0 + tile - 1}:", 10.5,
               anchor="start")
        s.text(x0 + seq_kv * c + 10, y0 + b * tile * c + tile * c / 2 + 13, f"keys [{begin}, {end})", 10.5,
               anchor="start", color=SOFT)
    ly = y0 + seq_q * c + 26
    s.text(x0 + seq_kv * c + 10, y0 - 6, "tile_keys", 10.5, anchor="start", weight="bold")
    cells = [(0, BLUE, "visible"), (90, "#8fbbe6", "the diagonal, j = i + off"), (290, "white", "hidden: masked")]
    for dx, fill, name in cells:
        s.rect(x0 + dx, ly - 11, 14, 14, fill, "#888", 0.8)
        s.text(x0 + dx + 20, ly, name, 11, anchor="start")
    s.text(x0 - 40, ly + 30, "tile_keys: from the first row's first key, rounded down to a whole tile, to one past the "
           "last row's", 11, anchor="start")
    s.text(x0 - 40, ly + 46, "last key. A visited tile skips the mask only if every row of the block sees every key "
           "of it.", 11, anchor="start")
    s.text(x0 - 40, ly + 62, "Grey: never loaded. The outlines are the kinds of tile in the legend on the right.", 11,
           anchor="start")
    # Right: the kernel's tiles at a real size.
    d = 128
    warp_rows, = _ints(CH05 + "tuned_tile.cuh",
                       r"constexpr int kWarpRows = (\d+), kBlockRows = kWarpRows \* kTunedWarps;")
    warps, = _ints(CH05 + "tuned_tile.cuh", r"constexpr int kTunedWarps = (\d+),")
    rows = warp_rows * warps
    keys = _by_head_dim(CH09 + "features_ampere.cu", "kKeys")(d)
    big = WindowMask(1024, 2048, 511, 0, True)
    bplan = window_tile_plan(big, rows, keys)
    tw, th = 10, 10 * rows // keys
    x1, y1 = 630, 118
    s.text(x1 + len(bplan[0]) * tw / 2, 78,
           f"seq_q = {big.seq_q}, seq_kv = {big.seq_kv}, window ({big.left}, 0): w = {big.left + 1}", 12,
           weight="bold")
    s.text(x1 + len(bplan[0]) * tw / 2, 94, f"head_dim {d}: kBlockRows = {rows} rows × kKeys = {keys} keys per tile",
           10.5, color=SOFT)
    s.text(x1 - 6, y1 - 6, "key", 9.5, anchor="end", color=SOFT)
    _tile_panel(s, x1, y1, bplan, tw, th, lambda b: f"rows {b * rows}–{(b + 1) * rows - 1}", 8, keys)
    bottom = y1 + len(bplan) * th
    for edge in (big.offset + 1, big.offset - big.left):  # the band's right and left edges (keys, at row 0)
        s.line(x1 + edge * tw / keys, y1, x1 + (edge + big.seq_q) * tw / keys, bottom, "#c33", 1.6)
    flat = [k for kinds in bplan for k in kinds]
    per_block = [sum(k != "skip" for k in kinds) for kinds in bplan]
    s.text(x1, bottom + 22, f"{flat.count('full') + flat.count('mask')} of {len(flat)} tiles visited, "
           f"{flat.count('mask')} of them masked;", 11, anchor="start")
    s.text(x1, bottom + 38, f"at most {max(per_block)} per block (w + {rows - 1} keys), whatever seq_kv is", 11,
           anchor="start")
    s.line(x1, bottom + 60, x1 + 24, bottom + 60, "#c33", 1.6)
    s.text(x1 + 32, bottom + 64, "the window's edges", 11, anchor="start")
    _tile_legend(s, x1, bottom + 92, {"full": "visited, no mask (tile_visible)",
                                      "mask": "visited, masked: an edge cuts it",
                                      "skip": "skipped: outside tile_keys, never loaded"})
    _code_lines(s, x1 - 40, bottom + 176, ["span = tile_keys(mask, i0, last_row, kKeys);",
                                           "for (j0 = span.begin; j0 < span.end; j0 += kKeys)",
                                           "  if (!mask.tile_visible(i0, kBlockRows, j0, kKeys))",
                                           "    tuned_mask(...);"])
    s.text(500, 558, "WindowMask, its tile_visible (common/attention_features.h); tile_keys (features.h); "
           "features_ampere_kernel (features_ampere.cu)", 11, color=SOFT)
    s.save("ch09_window_band.svg")


def main():
    flash_tiling()
    loop_orders()
    warp_split()
    paged_block_table()
    ch01_tile_threads()
    ch03_online_rescale()
    ch03_merge()
    ch05_mma_fragments()
    ch05_accumulator_reuse()
    ch05_cp_async_double_buffer()
    ch07_backward_dataflow()
    ch08_split_kv()
    ch05_causal_tiles()
    ch08_gqa_rows()
    ch09_window_band()
    diagrams_hopper.draw_all()
    print("diagrams: written to " + os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()
