#!/usr/bin/env python3
"""Chapter 06's diagrams (Hopper): drawn by `python3 tools/diagrams.py`, which calls draw_all().

  ch06_tma_swizzle.svg              a TMA box copied into shared memory with the 128-byte swizzle
  ch06_mbarrier_ring.svg            the K/V ring: full/empty mbarriers and the phase parity
  ch06_warp_specialization.svg      producer and consumer warpgroups, registers, shared memory
  ch06_pingpong.svg                 two consumer warpgroups taking turns on the tensor cores
  ch06_pingpong_timeline.svg        the same to scale: head_dim 128 from the measured clocks, 64 as a model
  ch06_intra_warpgroup_overlap.svg  softmax of S_{j+1} while P_j V_j runs, in one warpgroup
  ch06_fp8_v_layout.svg             V stored transposed and slot-permuted for e4m3 wgmma
  ch07_wide_handover.svg            chapter 07 at head_dim 256: P^T from consumer 0 to consumer 1

Each picture states facts of chapters/06_flash_attention_v3/ (and the last, of chapter 07's
backward_wgmma_sm90a.cu) and common/hopper.cuh; the names on it are the code's.
"""
from svg import (BLUE, GREEN, GREY, INK, LIGHT_BLUE, LIGHT_GREEN, LIGHT_ORANGE, ORANGE, RED, SOFT,  # noqa: F401
                 Svg, box, caption, code, line, polyline, rich, rich_bg, text_width)

# One color per thread t of a quad (the FP8 picture): t = 0, 1, 2, 3.
QUAD = [BLUE, ORANGE, GREEN, "#e3d3f2"]


# ---- 1. the TMA box and the 128-byte swizzle ---------------------------------------------------
def tma_swizzle():
    s = Svg(900, 535, "TMA copies a box of K into shared memory with the 128-byte swizzle")
    s.text(450, 24, "TMA: one thread copies a whole box, swizzled on the way into shared memory", 15, weight="bold")

    # Device memory: one (batch, head) plane of K, [seq_kv x d], d = 128 = two boxes side by side.
    x0, y0, w, h = 70, 82, 150, 250
    s.text(145, 52, "K in device memory", 13, weight="bold")
    s.text(145, 70, "one plane: [seq_kv × d] bf16, d contiguous", 10.5, color=SOFT)
    s.rect(x0, y0, w, h, fill=LIGHT_BLUE)
    s.rect(x0, 150, 75, 60, fill=ORANGE)
    s.rect(x0 + 75, 150, 75, 60, fill=LIGHT_ORANGE)
    s.text(107, 176, "box", 11)
    s.text(107, 191, "b = 0", 11)
    s.text(182, 176, "box", 11)
    s.text(182, 191, "b = 1", 11)
    line(s, x0 + 75, y0, x0 + 75, y0 + h, color="#99b", dash="3,3")
    s.text(64, 176, "tile j", 11, anchor="end")
    s.text(64, 191, "128 rows", 10, anchor="end", color=SOFT)
    s.text(107, 346, "64 cols", 10, color=SOFT)
    s.text(182, 346, "64 cols", 10, color=SOFT)
    s.text(145, 364, "(d = 128: 2 boxes; d = 64: 1)", 10, color=SOFT)
    s.text(145, 386, "box = 128 rows × 64 bf16", 11)
    s.text(145, 401, "= 128 rows of 128 B = 16 KiB", 11)

    # The copy: device box -> shared memory, issued by one thread with the tensor map.
    s.arrow(222, 180, 532, 180)
    s.text(377, 152, "TMA copy of box b = 0 (16 KiB)", 12, weight="bold")
    s.text(377, 170, "tensor map tm_k: shape, strides, box, SWIZZLE_128B", 10.5, color=SOFT)

    # The issuing thread and its two calls.
    box(s, 250, 222, 256, 128, fill="#fafafa", stroke="#999")
    s.text(378, 240, "producer, one thread (tid == 0)", 12, weight="bold")
    code(s, 262, 260, "mbarrier_arrive_expect_tx(", 10.5)
    code(s, 278, 275, "&k_full[stage], kTileBytes);", 10.5)
    code(s, 262, 293, "for (b = 0; b < kBoxes; ++b)", 10.5)
    code(s, 278, 308, "tma_load_3d(dst, &tm_k,", 10.5)
    code(s, 294, 323, "64 * b, j * kBlockN,", 10.5)
    code(s, 294, 338, "kv_plane, &k_full[stage]);", 10.5)
    s.arrow(378, 222, 378, 184)
    s.text(386, 208, "issues", 10, anchor="start", color=SOFT)

    # The mbarrier the bytes complete on.
    box(s, 250, 364, 256, 62, fill=GREEN)
    code(s, 378, 382, "k_full[stage]", 11, anchor="middle", weight="bold")
    s.text(378, 399, "expect_tx: + kTileBytes to come", 10.5)
    s.text(378, 416, "the phase completes when they have landed", 10.5)
    polyline(s, [(690, 322), (690, 395), (510, 395)], color="#2a7", dash="5,3")
    s.text(698, 358, "complete_tx:", 10.5, anchor="start", color="#283")
    s.text(698, 372, "bytes counted as they land", 10.5, anchor="start", color="#283")

    # Shared memory: rows 0..7 of the box, 8 chunks of 16 bytes each.
    gx, gy, cw, ch = 540, 98, 36, 22
    s.text(gx + 4 * cw, 52, "the box in shared memory, rows 0–7", 13, weight="bold")
    s.text(gx + 4 * cw, 70, "cell = which 16-B chunk c of the row is stored there", 10.5, color=SOFT)
    for p in range(8):
        s.text(gx + p * cw + cw / 2, gy - 6, f"pos {p}", 9.5, color=SOFT)
    for r in range(8):
        for p in range(8):
            c = p ^ r
            s.rect(gx + p * cw, gy + r * ch, cw, ch, fill=ORANGE if c == 0 else (LIGHT_BLUE if r % 2 else "white"),
                   width=0.8)
            s.text(gx + p * cw + cw / 2, gy + r * ch + 15, str(c), 11, weight="bold" if c == 0 else "normal")
        s.text(gx + 8 * cw + 6, gy + r * ch + 15, f"row {r}", 10, anchor="start", color=SOFT)
    for p in range(8):
        s.text(gx + p * cw + cw / 2, gy + 8 * ch + 13, f"{4 * p}–{4 * p + 3}", 9, color=SOFT)
    s.text(gx - 4, gy + 8 * ch + 13, "banks", 9, anchor="end", color=SOFT)
    rich(s, gx + 4 * cw, 312, "chunk c of row r sits at position c XOR (r mod 8)", 11.5, weight="bold")

    # Bottom: a read of chunk 0 (bf16 columns 0-7) in rows 0-7, without and with the swizzle.
    by = 462
    s.text(450, 450, "8 rows read at chunk 0 (bf16 columns 0–7), as wgmma or ldmatrix does: how many hit each group of 4 banks",
           11.5)
    for k, (x, name, hits, color, verdict) in enumerate([
            (30, "plain rows", [8, 0, 0, 0, 0, 0, 0, 0], RED, "8-way conflict"),
            (470, "swizzled", [1] * 8, GREEN, "conflict-free")]):
        s.text(x, by + 15, name, 11, anchor="start", weight="bold")
        for p in range(8):
            s.rect(x + 72 + p * 28, by, 28, 22, fill=color if hits[p] else "white", width=0.8)
            s.text(x + 72 + p * 28 + 14, by + 15, str(hits[p]), 11)
        s.text(x + 72 + 8 * 28 + 8, by + 15, verdict, 11, anchor="start", color="#a33" if k == 0 else "#283")
    caption(s, "The pattern repeats every 8 rows (8 × 128 B = 1024 B), so tiles start 1024-byte aligned; "
               "Swizzled128::at computes it as a ^ ((a >> 3) & 0x70).")
    s.save("ch06_tma_swizzle.svg")


# ---- 2. the ring of stages, full/empty mbarriers, phase parity ----------------------------------
def mbarrier_ring():
    s = Svg(900, 570, "The K/V ring: kStages stages, each with a full and an empty mbarrier")
    s.text(450, 24, "The ring: item j goes into stage j % kStages; its barriers are waited on by parity", 15,
           weight="bold")
    # A sequence diagram for item j in stage s: five lifelines, time running down.
    lanes = [(95, "producer", "warpgroup 0, tid 0", LIGHT_ORANGE),
             (285, "k_empty[s]", "mbarrier, 256 arrivals", RED),
             (450, "K tile, stage s", "shared memory", LIGHT_BLUE),
             (615, "k_full[s]", "mbarrier, 1 arrival + bytes", GREEN),
             (800, "consumers", "warpgroups 1, 2", LIGHT_BLUE)]
    top, bottom = 46, 326
    for x, name, sub, fill in lanes:
        box(s, x - 78, top, 156, 40, fill=fill)
        rich(s, x, top + 17, name, 12, weight="bold", mono=name.startswith("k_"))
        s.text(x, top + 33, sub, 10, color=SOFT)
        line(s, x, top + 40, x, bottom, color="#aaa", dash="4,3")
    px, ex, tx, fx, cx = (x for x, *_ in lanes)
    steps = [  # (y, from x, to x, label, second line under the arrow, dashed)
        (114, px, ex, "1  wait empty_parity(j)", "only if j ≥ kStages", False),
        (150, px, fx, "2  arrive.expect_tx(kTileBytes)", "", False),
        (184, px, tx, "3  TMA: K_{j} into stage s", "", False),
        (218, tx, fx, "4  complete_tx", "as the bytes land", True),
        (254, cx, fx, "5  wait full_parity(j)", "", False),
        (288, cx, tx, "6  wgmma reads K_{j}", "", False),
        (318, cx, ex, "7  arrive: each of the 256 threads", "", False)]
    for y, a, b, label, under, dashed in steps:
        s.arrow(a, y, b + (-4 if b > a else 4), y, color="#2a7" if dashed else "#333", dash="5,3" if dashed else None)
        mid = (a + b) / 2
        rich_bg(s, mid, y - 6, label, 11)
        if under:
            rich_bg(s, mid, y + 14, under, 10, color=SOFT)
    s.text(450, 346, "7 completes k_empty[s]'s phase: the producer may then refill stage s with item j + kStages. "
                     "V has its own v_full / v_empty.", 11, color=SOFT)

    # The table: j = 0..7 with kStages = 2 (variants 3 and 4).
    ty, lx, cw, rh = 382, 300, 68, 26
    s.text(30, ty - 8, "kStages = 2 (variants 3, 4; variant 5 uses 4, 2 at head_dim 256)", 12, anchor="start", weight="bold")
    rows = [("item j", lambda j: str(j), None),
            ("stage(j) = j % kStages", lambda j: str(j % 2), None),
            ("use u = j / kStages", lambda j: str(j // 2), None),
            ("full_parity(j) = u & 1", lambda j: str((j // 2) & 1), lambda j: (j // 2) & 1),
            ("empty_parity(j) = full_parity ^ 1", lambda j: "—" if j < 2 else str(((j // 2) & 1) ^ 1),
             lambda j: None if j < 2 else ((j // 2) & 1) ^ 1)]
    for r, (name, val, parity) in enumerate(rows):
        y = ty + r * rh
        s.rect(30, y, lx - 30, rh, fill=GREY if r == 0 else "white", width=0.8)
        code(s, 38, y + 17, name, 10.5, weight="bold" if r == 0 else "normal")
        for j in range(8):
            pv = parity(j) if parity else None
            fill = GREY if r == 0 else (LIGHT_BLUE if pv == 0 else ORANGE if pv == 1 else "white")
            s.rect(lx + j * cw, y, cw, rh, fill=fill, width=0.8)
            s.text(lx + j * cw + cw / 2, y + 17, val(j), 12, weight="bold" if r == 0 else "normal")
    for j in (2, 4, 6):
        x = lx + j * cw
        line(s, x, ty - 4, x, ty + 5 * rh + 4, color="#c33", width=2, dash="5,3")
    s.text(lx + 4 * cw, ty + 5 * rh + 18, "each red line: the ring wraps, and both parities flip", 11, color="#a33")
    s.text(165, ty + 5 * rh + 18, "— : a fresh stage, no wait", 10.5, color=SOFT)
    caption(s, "Ring<kStages> in common/hopper.cuh: an mbarrier's phase goes up by one each time it completes; "
               "a wait names the parity of the phase it waits for.")
    s.save("ch06_mbarrier_ring.svg")


# ---- 3. warp specialization: the warpgroups, their registers, shared memory ---------------------
def warp_specialization():
    s = Svg(900, 580, "Warp specialization: a producer warpgroup and two consumer warpgroups")
    s.text(450, 24, "Variants 3 and 4: one thread block of kThreads = 384, three warpgroups of 128 threads", 15,
           weight="bold")
    top = 62
    # The producer (left).
    box(s, 20, top, 250, 256, fill=LIGHT_ORANGE)
    s.text(32, top + 20, "warpgroup 0: producer", 12.5, anchor="start", weight="bold")
    s.text(32, top + 36, "threads 0–127", 10.5, anchor="start", color=SOFT)
    code(s, 32, top + 62, "setmaxnreg_dec<24>()", 11, weight="bold")
    for n, ln in enumerate(["then tid 0 alone issues every", "TMA copy: Q once, then K_{j}", "and V_{j} into the ring,",
                            "waiting on k_empty / v_empty", "before it refills a stage"]):
        rich(s, 32, top + 86 + n * 16, ln, 11, anchor="start")
    s.text(32, top + 176, "each copy's bytes are announced", 11, anchor="start")
    s.text(32, top + 192, "on q_full, k_full[s] or v_full[s]", 11, anchor="start")
    s.text(32, top + 226, "the other 127 threads return", 11, anchor="start", color=SOFT)

    # Shared memory (middle), heights to scale at d = 128: Q 32 KiB, each stage 32 KiB.
    sx, sw = 330, 150
    s.text(sx + sw / 2, 52, "shared memory, d = 128", 12, weight="bold")
    items = [("Q rows 0–63", 24, BLUE), ("Q rows 64–127", 24, GREEN),
             ("K tile, stage 0", 48, LIGHT_BLUE), ("K tile, stage 1", 48, LIGHT_BLUE),
             ("V tile, stage 0", 48, LIGHT_GREEN), ("V tile, stage 1", 48, LIGHT_GREEN),
             ("10 mbarriers", 16, GREY)]
    y = top
    for name, hgt, fill in items:
        s.rect(sx, y, sw, hgt, fill=fill, width=0.9)
        s.text(sx + sw / 2, y + hgt / 2 + 4, name, 10.5 if hgt < 20 else 11)
        y += hgt
    s.arrow(272, 150, 326, 150)
    s.text(298, 140, "TMA", 10.5, color=SOFT)

    # The consumers (right).
    for k, fill in enumerate([BLUE, GREEN]):
        y = top + k * 136
        box(s, 540, y, 340, 120, fill=fill)
        s.text(552, y + 20, f"warpgroup {k + 1}: consumer {k}", 12.5, anchor="start", weight="bold")
        s.text(868, y + 20, f"threads {128 * (k + 1)}–{128 * (k + 2) - 1}", 10.5, anchor="end", color=SOFT)
        code(s, 552, y + 44, "setmaxnreg_inc<240>()", 11, weight="bold")
        rows = f"i0 + {64 * k} … {64 * k + 63}"
        for n, ln in enumerate([f"owns Q rows {rows} (64 of kBlockM = 128)",
                                "per tile j: S = Q K_{j}ᵀ (wgmma, 64 × 128),",
                                "online softmax, O += P V_{j} (wgmma),",
                                "then arrive on k_empty / v_empty"]):
            rich(s, 552, y + 64 + n * 15, ln, 11, anchor="start")
        s.arrow(482, y + 60, 536, y + 60)
    s.text(510, top + 52, "wgmma", 10, color=SOFT)
    s.text(510, top + 188, "wgmma", 10, color=SOFT)

    # The register file: 65536 registers per SM, split by setmaxnreg.
    ry, rx, rw = 372, 20, 860
    s.text(rx, ry - 12, "the register file of the SM: 65536 × 32-bit registers", 12.5, anchor="start", weight="bold")
    scale = rw / 65536
    segs = [(128 * 24, LIGHT_ORANGE), (128 * 240, BLUE), (128 * 240, GREEN), (65536 - 128 * 24 - 256 * 240, "white")]
    x = rx
    for n, fill in segs:
        s.rect(x, ry, n * scale, 30, fill=fill, width=0.9)
        x += n * scale
    s.text(rx + 128 * 24 * scale / 2, ry + 46, "128 × 24", 10.5)
    s.text(rx + 128 * 24 * scale / 2, ry + 60, "= 3072", 10.5)
    for k in range(2):
        cx = rx + (128 * 24 + 128 * 240 * (k + 0.5)) * scale
        s.text(cx, ry + 20, f"consumer {k}: 128 × 240 = 30720", 11.5)
    s.text(rx + rw - 6, ry + 46, "1024 free", 10.5, anchor="end", color=SOFT)
    rich(s, 450, ry + 84, "128 × 24 + 256 × 240 = 64512 ≤ 65536", 13, weight="bold")
    s.text(450, ry + 102, "ptxas -v prints 168 a thread: the share of __launch_bounds__(384, 1); "
                          "setmaxnreg moves registers between the warpgroups at run time", 10.5, color=SOFT)

    # Shared memory bytes, both head dims.
    s.text(450, 506, "shared memory: Q 128·d·2 B + 2 K stages + 2 V stages of 128·d·2 B + 10 × 8 B + 1024 B alignment slack",
           11)
    def smem_bytes(d):  # Smem<kD, kBlockM = 128, kStages = 2, kBarriers = 2 + 4 * kStages = 10>::kBytes
        tile = (d // 64) * 128 * 128
        return tile + 2 * tile + 2 * tile + 8 * 10 + 1024
    s.text(450, 526, f"d = 64: {smem_bytes(64):,} B;  d = 128: {smem_bytes(128):,} B (a block may use up to 227 KiB)",
           11.5, weight="bold")
    caption(s, "pingpong_ops.cuh: kConsumers = 2, kBlockM = 128, kStages = 2; "
               "Layout = Smem<kD, kBlockM, kStages, 2 + 4 · kStages> (Smem in flash3_tile.cuh).")
    s.save("ch06_warp_specialization.svg")


# ---- 4. ping-pong: two consumers take turns on the tensor cores ----------------------------------
def pingpong():
    s = Svg(900, 450, "Ping-pong: two consumer warpgroups alternate GEMMs and softmax")
    s.text(450, 24, "Variant 4, ping-pong: one consumer's GEMMs run while the other does its softmax", 15,
           weight="bold")
    x0, u, t_end = 180, 50, 14  # time in units of one GEMM (S = Q Kᵀ or P V of one tile)
    X = lambda t: x0 + u * t  # noqa: E731

    def block(t0, t1, y, h, fill, label, size=10.5, dash=None):
        a, b = max(t0, 0), min(t1, t_end)
        if b <= a:
            return
        s.rect(X(a), y, X(b) - X(a), h, fill=fill, width=0.8, dash=dash)
        if label and b - a >= 0.8:
            rich(s, (X(a) + X(b)) / 2, y + h / 2 + 4, label, size)

    # Lanes: consumer 0's GEMMs above its threads; consumer 1's threads above its GEMMs, so that the
    # turn hand-overs run between the two thread lanes.
    lane = {(0, "mma"): 70, (0, "thr"): 100, (1, "thr"): 180, (1, "mma"): 210}
    lh = 26
    color = {0: BLUE, 1: GREEN}
    for c in range(2):
        y = lane[(c, "mma")] if c == 0 else lane[(c, "thr")]
        s.text(20, y + 18, f"consumer {c}", 12, anchor="start", weight="bold")
        s.text(20, y + 34, f"(warpgroup {c + 1})", 10.5, anchor="start", color=SOFT)
        s.text(x0 - 8, lane[(c, "mma")] + 17, "its wgmma", 10, anchor="end", color=SOFT)
        s.text(x0 - 8, lane[(c, "thr")] + 17, "its threads", 10, anchor="end", color=SOFT)
        base0 = 2 * c
        for base in range(base0 - 4, t_end + 1, 4):
            block(base, base + 1, lane[(c, "mma")], lh, color[c], "QKᵀ")
            block(base + 1, base + 2, lane[(c, "mma")], lh, color[c], "PV")
            block(base, base + 1, lane[(c, "thr")], lh, "white", "wait", 10, dash="3,2")
            block(base + 1, base + 3, lane[(c, "thr")], lh, ORANGE, "softmax")
            block(base + 3, base + 4, lane[(c, "thr")], lh, LIGHT_ORANGE, "rescale", 10)
    # The turn hand-overs: at each issue, bar.sync on my id, issue, bar.arrive on the other's id.
    for base in range(0, t_end, 2):
        c = (base // 2) % 2
        ya = lane[(c, "thr")] + (lh if c == 0 else 0)
        yb = lane[(1 - c, "thr")] + (0 if c == 0 else lh)
        line(s, X(base), lane[(c, "thr")] - 2, X(base), lane[(c, "thr")] + lh + 2, color="#c33", width=3)
        if base + 2 <= t_end:
            s.arrow(X(base) + 3, ya + (3 if c == 0 else -3), X(base + 2) - 3, yb - (3 if c == 0 else -3),
                    color="#c33", dash="4,3")
    line(s, X(t_end), lane[(1, "thr")] - 2, X(t_end), lane[(1, "thr")] + lh + 2, color="#c33", width=3)
    rich_bg(s, X(1), 150, "bar.arrive 2", 10.5, color="#a33")
    rich_bg(s, X(3), 150, "bar.arrive 1", 10.5, color="#a33")

    # The tensor cores: the union of both consumers' GEMMs, never idle.
    ty = 262
    s.text(x0 - 8, ty + 17, "tensor cores", 10.5, anchor="end", weight="bold")
    for base in range(-4, t_end + 1, 2):
        c = (base // 2) % 2
        block(base, base + 1, ty, lh, color[c], f"QKᵀ c{c}", 10)
        block(base + 1, base + 2, ty, lh, color[c], f"PV c{c}", 10)
    s.text(X(t_end) + 6, 300, "…", 13, anchor="start")

    # The legend.
    ly = 322
    line(s, 40, ly, 40, ly + 16, color="#c33", width=3)
    rich(s, 58, ly + 12, "a turn: bar.sync on my id (consumer 0: id 1, consumer 1: id 2), then S_{j+1} = Q K_{j+1}ᵀ "
                        "and O += P_{j} V_{j} are issued together", 11, anchor="start")
    s.arrow(30, ly + 34, 50, ly + 34, color="#c33", dash="4,3")
    rich(s, 58, ly + 38, "bar.arrive on the other's id right after issuing releases the other's bar.sync "
                        "(named barriers of 256 threads)", 11, anchor="start")
    rich(s, 58, ly + 64, "wait: wgmma_wait<1> until S_{j+1} is done.  softmax of S_{j+1}, overlapping the own P_{j} V_{j}.  "
                        "rescale: O by the new row max, P_{j+1} packed.", 11, anchor="start")
    rich(s, 58, ly + 86, "Durations are schematic: a softmax about as long as the other consumer's two GEMMs keeps the "
                        "tensor cores busy.", 11, anchor="start", color=SOFT)
    caption(s, "pingpong_schedule, turn_wait / turn_give in flash3_tile.cuh: consumer 1 gives consumer 0 the first turn.")
    s.save("ch06_pingpong.svg")


# ---- 4b. ping-pong to scale: head_dim 128 as measured, head_dim 64 as a model ----------------------
# The clocks, in SM cycles, from chapters/06_flash_attention_v3/performance_notes.md ("Why three
# consumers: the measurements", H100): a clock64 trace of one block of variant 4 in bf16 at head_dim
# 128 (medians over the middle tiles), and a micro-benchmark of the wgmma rates.
PP_SOFTMAX = 1104        # the softmax of one 64 x 128 tile
PP_ISSUE_STEP = 2105     # turn_wait, then issuing S_{j+1} and P_j V_j (blocked while the pipe is full)
PP_PERIOD = 3838         # one consumer, from the start of one issue step to the start of its next
PP_WGMMA_ALONE = 73.5    # one bf16 m64n128k16 wgmma, one warpgroup issuing
PP_WGMMA_BESIDE = (127, 129)  # each, while the other warpgroup's run too
# m64n128k16 products per 64 x 128 tile: S = Q Kᵀ takes d / 16 of them; P V takes 8 at d = 128 and
# 8 m64n64k16 at d = 64, the work of 4.
PP_WGMMA_PER_TILE = {128: 8 + 8, 64: 4 + 4}


def pingpong_model(products, softmax, rest):
    """The steady state of two consumers taking turns, in cycles. A consumer's turn holds the pipe
    for `products` (its issue step after the turn: it waits while the pipe is full), then it runs
    its softmax and the rest (rescale O, pack P) before it can take its next turn. The pipe runs one
    consumer's tile per turn, so a period is the longer of two turns and one consumer's round."""
    period = max(2 * products, products + softmax + rest)
    return {"products": products, "softmax": softmax, "rest": rest, "period": period,
            "turn_wait": period - (products + softmax + rest), "idle": period - 2 * products}


def pingpong_timeline():
    # Derived from the trace: the rest of a round; a tile's products hold the pipe for half a
    # period, since the turns alternate and at d = 128 each consumer waits for its turn.
    rest = PP_PERIOD - PP_ISSUE_STEP - PP_SOFTMAX
    d128 = pingpong_model(PP_PERIOD / 2, PP_SOFTMAX, rest)
    assert d128["period"] == PP_PERIOD and d128["turn_wait"] + d128["products"] == PP_ISSUE_STEP
    # The model at d = 64: half the tensor-core work per tile, the same softmax and rest.
    d64 = pingpong_model(round(d128["products"] * PP_WGMMA_PER_TILE[64] / PP_WGMMA_PER_TILE[128]), PP_SOFTMAX, rest)

    s = Svg(960, 650, "Ping-pong to scale: head_dim 128 measured, head_dim 64 modelled from the same clocks")
    s.text(480, 24, "Ping-pong to scale: does one warpgroup's softmax fit under the other's products?", 15,
           weight="bold")
    x0, t_end, lh = 170, 7700, 22
    px = 760 / t_end  # pixels per cycle, the same in both panels
    X = lambda t: round(x0 + px * min(max(t, 0), t_end), 1)  # noqa: E731
    fmt = lambda c: f"{round(c):,}"  # noqa: E731

    def block(t0, t1, y, fill, labels, dash=None, size=10):
        """A bar from cycle t0 to t1, with the first of `labels` (longest first) that fits in it."""
        a, b = X(t0), X(t1)
        if b - a <= 0:
            return
        s.rect(a, y, round(b - a, 1), lh, fill=fill, width=0.8, dash=dash)
        fits = [t for t in ([labels] if isinstance(labels, str) else labels) if text_width(t, size) + 6 <= b - a]
        if fits:
            rich(s, round((a + b) / 2, 1), y + lh / 2 + 4, fits[0], size)

    def bracket(t0, t1, y, label, color=INK):
        a, b = X(t0), X(t1)
        line(s, a, y, b, y, color=color)
        line(s, a, y - 4, a, y + 4, color=color)
        line(s, b, y - 4, b, y + 4, color=color)
        rich_bg(s, round((a + b) / 2, 1), y + 4, label, 10, color=color)

    def panel(m, y, title, note, dash):
        s.text(20, y, title, 12.5, anchor="start", weight="bold")
        rich(s, 20, y + 16, note, 10.5, anchor="start", color=SOFT)
        lanes = {0: y + 46, 1: y + 76, "pipe": y + 112}
        for c in (0, 1):
            s.text(20, lanes[c] + 15, f"consumer {c}", 11.5, anchor="start", weight="bold")
            s.text(x0 - 8, lanes[c] + 15, "threads", 10, anchor="end", color=SOFT)
        s.text(20, lanes["pipe"] + 15, "tensor pipe", 11.5, anchor="start", weight="bold")
        own = {0: BLUE, 1: GREEN}
        w, p, sm = m["turn_wait"], m["products"], m["softmax"]
        for c in (0, 1):
            start = c * m["period"] / 2 - m["period"]
            while start < t_end:
                t = start
                block(t, t + w, lanes[c], "white", "", dash="3,2")
                block(t + w, t + w + p, lanes[c], own[c], ["issue: S, P V in the pipe", "issue S, P V"], dash)
                block(t + w, t + w + p, lanes["pipe"], own[c], f"c{c}: S, P V", dash)
                block(t + w + p, t + w + p + m["idle"] / 2, lanes["pipe"], RED, "idle", dash)
                block(t + w + p, t + w + p + sm, lanes[c], ORANGE, "softmax", dash)
                block(t + w + p + sm, t + m["period"], lanes[c], LIGHT_ORANGE, "rest", dash)
                start += m["period"]
        # c1's round after its turn, against c0's products on the pipe below it.
        t1 = m["period"] / 2 + w + p  # c1's softmax starts: it has just handed c0 the turn
        guide = dict(color="#a33", dash="2,2")
        line(s, X(t1), lanes[1] - 2, X(t1), lanes["pipe"] + lh + 2, **guide)
        line(s, X(t1 + sm), lanes[1] + lh, X(t1 + sm), lanes["pipe"] + lh + 2, **guide)
        bracket(m["period"], 2 * m["period"], y + 34, f"period {fmt(m['period'])}")
        bracket(t1, t1 + sm, lanes["pipe"] + lh + 12, f"c1's softmax {fmt(sm)}", color="#a33")
        # The cycle axis.
        ay = lanes["pipe"] + lh + 30
        line(s, x0, ay, X(t_end), ay)
        for k in range(0, t_end + 1, 1000):
            line(s, X(k), ay, X(k), ay + 4)
            s.text(X(k), ay + 15, fmt(k), 9.5, color=SOFT)
        s.text(X(t_end), ay + 28, "SM cycles", 10, anchor="end", color=SOFT)
        return ay + 28

    ya = panel(d128, 58, "(a) head_dim 128: the measured clock trace",
               f"softmax {fmt(PP_SOFTMAX)}, issue step {fmt(PP_ISSUE_STEP)} (turn wait {fmt(d128['turn_wait'])} + "
               f"products {fmt(d128['products'])}), period {fmt(PP_PERIOD)}; rest {fmt(rest)} = period − "
               "issue step − softmax", None)
    rich(s, 20, ya + 4, f"c1's softmax ({fmt(PP_SOFTMAX)}), and with the rest ({fmt(PP_SOFTMAX + rest)}), fits "
                        f"under c0's products ({fmt(d128['products'])}): a tile always holds the pipe, and the "
                        "consumers wait for their turns.", 11, anchor="start")
    yb = panel(d64, ya + 42, "(b) head_dim 64: a MODEL from the same clocks, not measured",
               f"dashed: modelled. Products half of (a)'s, {fmt(d64['products'])}; softmax and rest as in (a); "
               f"period {fmt(d64['period'])} for half the FLOPs of a period in (a)", "5,3")
    rich(s, 20, yb + 4, f"c1's softmax alone ({fmt(PP_SOFTMAX)}) outlasts c0's products ({fmt(d64['products'])}): "
                        f"the pipe waits for the softmax, idle {fmt(d64['idle'])} cycles a period "
                        f"({round(100 * d64['idle'] / d64['period'])}%).", 11, anchor="start")

    # Legend and where the numbers come from.
    ly = yb + 30
    for k, (fill, name, dash) in enumerate([(BLUE, "consumer 0's S = Q Kᵀ and P V", None),
                                            (GREEN, "consumer 1's", None), (ORANGE, "softmax", None),
                                            (LIGHT_ORANGE, "rest: rescale O, pack P", None),
                                            ("white", "waits for its turn", "3,2"), (RED, "pipe idle", None)]):
        x = 20 + [0, 210, 330, 420, 600, 760][k]
        s.rect(x, ly, 22, 13, fill=fill, width=0.8, dash=dash)
        rich(s, x + 28, ly + 11, name, 10.5, anchor="start")
    n128, n64 = PP_WGMMA_PER_TILE[128], PP_WGMMA_PER_TILE[64]
    notes = [
        "Measured (performance_notes.md, H100, bf16): clock64 at each step of pingpong_schedule, medians over "
        "the middle tiles.",
        f"A tile's products hold the pipe (held, not at its peak rate) for half a period: {fmt(d128['products'])} cycles for {n128} m64n128k16, "
        f"{d128['products'] / n128:.0f} each,",
        f"between the micro-benchmark's {PP_WGMMA_ALONE} (one warpgroup alone) and {PP_WGMMA_BESIDE[0]}–"
        f"{PP_WGMMA_BESIDE[1]} (two at once).",
        f"Model at 64: S has k = 64 and P V has n = 64, the work of {n64} m64n128k16; the softmax is over the same "
        "64 × 128 scores.",
        f"At either rate, {n64} × {PP_WGMMA_ALONE} = {fmt(n64 * PP_WGMMA_ALONE)} or {n64} × {PP_WGMMA_BESIDE[1]} = "
        f"{fmt(n64 * PP_WGMMA_BESIDE[1])}, a d = 64 tile's products are shorter than the softmax and rest "
        f"({fmt(PP_SOFTMAX + rest)}).",
    ]
    for k, t in enumerate(notes):
        rich(s, 20, ly + 36 + 16 * k, t, 10.5, anchor="start", color=SOFT)
    caption(s, "pingpong_schedule in flash3_tile.cuh; a turn starts when the other consumer hands it over "
               "(turn_give) and has just begun its softmax.")
    s.save("ch06_pingpong_timeline.svg")


# ---- 5. inside one consumer warpgroup: softmax of S_{j+1} while P_j V_j runs ----------------------
def intra_warpgroup_overlap():
    s = Svg(900, 510, "Intra-warpgroup overlap: the softmax of S(j+1) runs while P(j) V(j) is on the tensor cores")
    rich(s, 450, 24, "Inside one consumer warpgroup: issue S_{j+1} and P_{j} V_{j} together, then softmax while "
                     "P_{j} V_{j} runs", 15, weight="bold")
    x0, u, t_end, lh = 190, 46, 14, 24
    X = lambda t: x0 + u * t  # noqa: E731
    soft, resc = 2.0, 0.6  # schematic durations, in units of one GEMM

    def block(t0, t1, y, fill, label, size=10.5, dash=None):
        a, b = max(t0, 0), min(t1, t_end)
        if b <= a:
            return
        s.rect(X(a), y, X(b) - X(a), lh, fill=fill, width=0.8, dash=dash)
        if label and b - a >= 0.75:
            rich(s, (X(a) + X(b)) / 2, y + lh / 2 + 4, label, size)

    def lanes(y, title, sub):
        s.text(20, y - 12, title, 12.5, anchor="start", weight="bold")
        rich(s, 196, y - 12, sub, 10.5, anchor="start", color=SOFT)
        s.text(x0 - 8, y + 16, "its wgmma", 10, anchor="end", color=SOFT)
        s.text(x0 - 8, y + lh + 20, "its threads", 10, anchor="end", color=SOFT)
        return y, y + lh + 4

    # (a) variant 3: every step waits for the one before it.
    ma, ta = lanes(66, "variant 3, specialized", "per tile: issue S_{j}, wait, softmax, issue P_{j} V_{j}, wait")
    t = 0.0
    for j in range(4):
        block(t, t + 1, ma, BLUE, f"S_{{{j}}}")
        block(t, t + 1, ta, "white", "wait", 10, dash="3,2")
        block(t + 1, t + 1 + soft, ta, ORANGE, f"softmax S_{{{j}}}")
        block(t + 1 + soft, t + 1 + soft + resc, ta, LIGHT_ORANGE, "")
        t1 = t + 1 + soft + resc
        block(t1, t1 + 1, ma, GREEN, f"P_{{{j}}}V_{{{j}}}")
        block(t1, t1 + 1, ta, "white", "wait", 10, dash="3,2")
        t = t1 + 1

    # (b) variant 4: a two-stage pipeline.
    mb, tb = lanes(176, "variant 4, pingpong", "pingpong_schedule: S_{j+1} and P_{j} V_{j} issued back to back")
    block(0, 1, mb, BLUE, "S_{0}")
    block(0, 1, tb, "white", "wait", 10, dash="3,2")
    block(1, 1 + soft, tb, ORANGE, "softmax S_{0}")
    block(1 + soft, 1 + soft + resc, tb, LIGHT_ORANGE, "")
    marks = [(0, "prologue")]
    t = 1 + soft + resc
    for j in range(4):
        marks.append((t, f"j = {j}"))
        block(t, t + 1, mb, BLUE, f"S_{{{j + 1}}}")
        block(t + 1, t + 2, mb, GREEN, f"P_{{{j}}}V_{{{j}}}")
        block(t, t + 1, tb, "white", "wait<1>", 9.5, dash="3,2")
        block(t + 1, t + 1 + soft, tb, ORANGE, f"softmax S_{{{j + 1}}}")
        block(t + 1 + soft, t + 1 + soft + resc, tb, LIGHT_ORANGE, "")
        t += 1 + soft + resc
    for k, (tm, name) in enumerate(marks):
        if tm >= t_end:
            break
        line(s, X(tm), mb - 2, X(tm), tb + lh + 18, color="#888", dash="2,2")
        end = min(marks[k + 1][0] if k + 1 < len(marks) else t_end, t_end)
        s.text((X(tm) + X(end)) / 2, tb + lh + 15, name, 10.5, color=SOFT)
    s.text(X(t_end) + 6, tb + 18, "…", 13, anchor="start")
    s.text(X(t_end) + 6, ta + 18, "…", 13, anchor="start")

    # Legend.
    ly = 270
    for k, (fill, name) in enumerate([(BLUE, "S = Q Kᵀ (wgmma)"), (GREEN, "O += P V (wgmma)"),
                                      (ORANGE, "mask + online softmax"), (LIGHT_ORANGE, "rescale O, pack P"),
                                      ("white", "wgmma_wait")]):
        x = 40 + k * 170
        s.rect(x, ly, 22, 14, fill=fill, width=0.8, dash="3,2" if fill == "white" else None)
        s.text(x + 30, ly + 12, name, 11, anchor="start")

    # The loop body, in the order the code runs it.
    cy = 318
    s.text(20, cy, "the loop body (flash3_tile.cuh, pingpong_schedule)", 12, anchor="start", weight="bold")
    body = [("for (j = 0; j + 1 < n_tiles; ++j) {", ""),
            ("  wait_k(j + 1); wait_v(j); turn_wait(me);", ""),
            ("  scores(j + 1, s);", "S_{j+1} = Q K_{j+1}ᵀ"),
            ("  pv(j);", "O += P_{j} V_{j}"),
            ("  turn_give(other);", ""),
            ("  wgmma_wait<1>();", "S_{j+1} done"),
            ("  release_k(j + 1); softmax(j + 1, ...);", ""),
            ("  wgmma_wait<0>();", "P_{j} V_{j} done"),
            ("  release_v(j); rescale_out(); pack(s);", ""),
            ("}", "")]
    for n, (c, note) in enumerate(body):
        code(s, 24, cy + 20 + n * 15, c, 10.5)
        if note:
            rich(s, 225, cy + 20 + n * 15, "// " + note, 10.5, anchor="start", color="#283", mono=True)

    # The two-stage pipeline as a table.
    tx, ty, cw, rh = 460, 336, 56, 28
    s.text(tx, cy, "a two-stage software pipeline over the tiles", 12, anchor="start", weight="bold")
    cols = ["prologue", "j = 0", "j = 1", "…", "j = n−2", "after"]
    st1 = ["0", "1", "2", "…", "n−1", "—"]
    st2 = ["—", "0", "1", "…", "n−2", "n−1"]
    names = ["", "S, softmax", "P V"]
    lw = 80
    for r, vals in enumerate([cols, st1, st2]):
        y = ty + r * rh
        s.rect(tx, y, lw, rh, fill=GREY if r == 0 else (BLUE if r == 1 else GREEN), width=0.8)
        s.text(tx + 6, y + 18, names[r], 10.5, anchor="start")
        for k, v in enumerate(vals):
            s.rect(tx + lw + k * cw, y, cw, rh, fill=GREY if r == 0 else "white", width=0.8)
            s.text(tx + lw + k * cw + cw / 2, y + 18, v if r == 0 else ("tile " + v if v not in "—…" else v), 10.5)
    s.text(tx, ty + 3 * rh + 20, "stage 1 works on tile j + 1 while stage 2 finishes tile j:", 11, anchor="start")
    rich(s, tx, ty + 3 * rh + 36, "the softmax no longer waits for P_{j} V_{j}, nor P_{j} V_{j} for it", 11,
         anchor="start")
    caption(s, "Durations are schematic. The other consumer's turns (ping-pong) fill the gaps left in this warpgroup's "
               "wgmma lane.")
    s.save("ch06_intra_warpgroup_overlap.svg")


# ---- 6. FP8: V transposed and slot-permuted -------------------------------------------------------
def p_slot_key(slot):
    """fp8_quantize.cuh's p_slot_key: the key (0..31 within a 32-key step) in A-fragment slot `slot`."""
    return (slot // 16) * 16 + ((slot % 4) // 2) * 8 + 2 * ((slot % 16) // 4) + slot % 2


def p_key_slot(key):
    """fp8_quantize.cuh's p_key_slot: the inverse."""
    return (key // 16) * 16 + 4 * ((key % 8) // 2) + 2 * ((key % 16) // 8) + key % 2


def fp8_v_layout():
    s = Svg(900, 650, "FP8 wgmma needs V transposed, with the keys of each 32-key group permuted")
    s.text(450, 24, "FP8 P V: V is stored transposed, and its keys permuted to match P's registers", 15, weight="bold")

    # (a) bf16: V [keys x d] read as an MN-major B operand.
    s.text(130, 54, "bf16 (variants 2–4)", 12.5, weight="bold")
    s.rect(95, 66, 70, 150, fill=LIGHT_BLUE)
    for k in range(6):
        s.arrow(101, 76 + k * 24, 159, 76 + k * 24, color="#7a9")
    s.text(130, 232, "V tile: 128 keys × d", 11)
    s.text(130, 247, "d contiguous (2 B each)", 10.5, color=SOFT)
    s.text(130, 266, "B = V read MN-major:", 10.5)
    code(s, 130, 281, "wgmma_m64n128k16_rs<1>", 10.5, anchor="middle")
    s.text(130, 296, "(kTransB = 1 in issue_pv)", 10.5, color=SOFT)

    # The preprocessing step.
    s.arrow(235, 140, 385, 140)
    code(s, 315, 122, "quantize_v_kernel", 11, anchor="middle", weight="bold")
    s.text(315, 160, "e4m3, one scale per 128 keys,", 10.5)
    s.text(315, 175, "transposed, keys slot-permuted", 10.5)

    # (b) e4m3: V^T [d x keys], keys contiguous: K-major B.
    s.text(620, 54, "e4m3 (variant 5)", 12.5, weight="bold")
    s.rect(420, 96, 400, 80, fill=LIGHT_GREEN)
    for k in range(3):
        s.arrow(428, 112 + k * 24, 812, 112 + k * 24, color="#7a9")
    s.text(620, 88, "Vᵀ tile: d rows × 128 keys, keys contiguous (1 B each): a row is 128 B", 11)
    s.text(412, 140, "d", 11, anchor="end")
    s.text(620, 196, "wgmma …e4m3 takes both operands K-major only (no transpose for 8-bit types);", 10.5)
    s.text(620, 211, "in P V the reduction runs over the keys, so V's rows must be key-contiguous", 10.5)
    s.text(620, 230, "tm_vt: boxes of 128 keys × d rows with the 128-byte swizzle", 10.5, color=SOFT)

    # The permutation within one 32-key step.
    x0, cw, ch = 112, 24, 22
    s.text(450, 320, "Inside one 32-key step (k = 32 per e4m3 wgmma), for one row g of P:", 12.5, weight="bold")
    ya, yb, yc = 350, 442, 536
    s.text(20, ya + 15, "S, P in", 11, anchor="start", weight="bold")
    s.text(20, ya + 29, "registers", 11, anchor="start", weight="bold")
    rich(s, x0, ya - 6, "the S accumulator: thread t = lane % 4 holds keys 8i + 2t, 8i + 2t + 1 (i = 0…3)", 11,
         anchor="start")
    for k in range(32):
        s.rect(x0 + k * cw, ya, cw, ch, fill=QUAD[(k % 8) // 2], width=0.7)
        s.text(x0 + k * cw + cw / 2, ya + 15, str(k), 10.5)
    for k in range(32):
        slot = p_key_slot(k)
        line(s, x0 + k * cw + cw / 2, ya + ch, x0 + slot * cw + cw / 2, yb, color="#777", width=0.9)
    s.text(20, yb + 15, "A fragment", 11, anchor="start", weight="bold")
    s.text(20, yb + 29, "slots", 11, anchor="start", weight="bold")
    for slot in range(32):
        s.rect(x0 + slot * cw, yb, cw, ch, fill=QUAD[(slot % 16) // 4], width=0.7)
        s.text(x0 + slot * cw + cw / 2, yb + 15, str(p_slot_key(slot)), 10.5)
        s.text(x0 + slot * cw + cw / 2, yb + ch + 12, str(slot), 8.5, color=SOFT)
    s.text(x0 - 4, yb + ch + 12, "slot", 8.5, anchor="end", color=SOFT)
    rich(s, x0, yb + ch + 30, "thread t's a[0] = slots 4t…4t+3, a[2] = slots 16+4t…19+4t: pack_p_e4m3 fills them with the "
                             "keys it already holds, no shuffles", 11, anchor="start")
    s.text(x0, yb + ch + 46, "at d = 128 stmatrix stores these bytes to shared memory in the same order (fp8_three_consumers.cuh)",
           10.5, anchor="start", color=SOFT)
    s.text(20, yc + 15, "Vᵀ row x", 11, anchor="start", weight="bold")
    for slot in range(32):
        s.rect(x0 + slot * cw, yc, cw, ch, fill="white", width=0.7)
        s.text(x0 + slot * cw + cw / 2, yc + 15, str(p_slot_key(slot)), 10.5)
    rich(s, x0, yc + ch + 18, "byte 32g + slot of row x holds V[32g + p_slot_key(slot)][x]: the same key order as P's slots",
         11, anchor="start")
    rich(s, x0, yc + ch + 36, "P V sums over the keys, so any order gives the same O as long as P and Vᵀ use the same one",
         11, anchor="start", color=SOFT)
    caption(s, "fp8_quantize.cuh: p_slot_key / p_key_slot and quantize_v_kernel; cell colors: thread t = 0, 1, 2, 3 "
               "of a quad (blue, orange, green, violet).")
    s.save("ch06_fp8_v_layout.svg")


# ---- chapter 07 at head_dim 256: the P^T hand-over between the two consumers -------------------
def wide_handover():
    s = Svg(1000, 400, "dkdv_wide_kernel: consumer 0 hands P transposed to consumer 1 through two buffers")
    s.text(500, 24, "Chapter 07, head_dim 256: one block of 64 keys, dV in consumer 0, dK in consumer 1", 15,
           weight="bold")
    x0, u = 150, 76  # time: one unit = one 64 x 64 x 256 product
    X = lambda t: x0 + u * t  # noqa: E731
    lh = 28
    y0, y1, yb = 62, 232, 150  # consumer 0's lane, consumer 1's lane, the buffers
    s.text(20, y0 + 18, "consumer 0", 12, anchor="start", weight="bold")
    s.text(20, y0 + 34, "(warpgroup 1)", 10.5, anchor="start", color=SOFT)
    s.text(20, y1 + 18, "consumer 1", 12, anchor="start", weight="bold")
    s.text(20, y1 + 34, "(warpgroup 2)", 10.5, anchor="start", color=SOFT)
    s.text(20, yb + 18, "shared memory", 11, anchor="start", weight="bold")

    def block(t0, t1, y, fill, label, size=10.5, dash=None):
        s.rect(X(t0), y, X(t1) - X(t0), lh, fill=fill, width=0.8, dash=dash)
        rich(s, (X(t0) + X(t1)) / 2, y + lh / 2 + 4, label, size)

    for a in range(3):
        t, b = 3.5 * a, a % 2
        block(t, t + 1, y0, BLUE, "Sᵀ = K Qᵀ")
        block(t + 1, t + 1.6, y0, ORANGE, "Pᵀ", 10)
        block(t + 1.6, t + 2.6, y0, BLUE, "dV += Pᵀ dO", 10)
        block(t, t + 1, y1, GREEN, "dPᵀ = V dOᵀ")
        block(t + 1.6, t + 2.2, y1, ORANGE, "dSᵀ", 10)
        block(t + 2.2, t + 3.2, y1, GREEN, "dK += dSᵀ Q", 10)
        # Pᵀ written to buffer b, arrive on kPFull + b; consumer 1 waits on it, reads, arrives on kPEmpty + b.
        bx = X(t + 1.3) - 34
        box(s, bx, yb, 68, lh, fill=LIGHT_ORANGE)
        rich(s, bx + 34, yb + lh / 2 + 4, f"Pᵀ buffer {b}", 10)
        s.arrow(X(t + 1.45), y0 + lh, X(t + 1.45), yb - 2, color="#c33")
        s.arrow(X(t + 1.6), yb + lh, X(t + 1.6), y1 - 2, color="#c33")
        rich_bg(s, X(t + 1.45) + 4, y0 + lh + 17, f"arrive {1 + b}", 9.5, anchor="start", color="#a33")
        rich_bg(s, X(t + 1.6) + 4, y1 - 8, f"sync {1 + b}, read, arrive {3 + b}", 9.5, anchor="start", color="#a33")
        if a >= 2:
            rich_bg(s, X(t + 1.3), y0 - 8, f"sync {3 + b} first: buffer {b} was read", 9.5, color="#a33")
    s.text(X(10.2) + 6, y0 + 20, "…", 13, anchor="start")
    ly = 300
    rich(s, 40, ly, "Both consumers hold the same (key, row) elements of their 64 × 64 accumulators, thread by thread: "
                    "thread t writes its 32 floats of Pᵀ", 11, anchor="start")
    rich(s, 40, ly + 20, "and thread t of the other consumer reads them. Named barriers of 256 threads: 1, 2 = buffer "
                         "0, 1 full (kPFull); 3, 4 = buffer 0, 1 read (kPEmpty).", 11, anchor="start")
    rich(s, 40, ly + 40, "Each consumer runs two of the four products and keeps one accumulator (128 floats); "
                         "durations are schematic.", 11, anchor="start", color=SOFT)
    caption(s, "dkdv_wide_kernel in backward_wgmma_sm90a.cu; the trailing syncs after the loop take consumer 1's "
               "last two arrivals.")
    s.save("ch07_wide_handover.svg")


def draw_all():
    tma_swizzle()
    mbarrier_ring()
    warp_specialization()
    pingpong()
    pingpong_timeline()
    intra_warpgroup_overlap()
    fp8_v_layout()
    wide_handover()
