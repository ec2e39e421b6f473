#!/usr/bin/env python3
"""Draws the docs' diagrams as SVG into docs/diagrams/ (committed; rerun after editing).

Usage: python3 tools/diagrams.py

  flash_tiling.svg       chapter 04: a Q tile against one K/V tile; S and P exist only on chip
  loop_orders.svg        chapter 04: K/V tiles outer (the paper) vs Q tiles outer
  warp_split.svg         chapter 05: splitting a block's work by query rows vs by keys
  paged_block_table.svg  chapter 08: two forked sequences, their block tables, the block pool
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "diagrams")
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
BLUE, ORANGE, GREEN, GREY, RED = "#cfe3f7", "#fbd9b0", "#cfeccf", "#eeeeee", "#f4c2c2"


class Svg:
    def __init__(self, width, height, title):
        self.w, self.h = width, height
        self.parts = [f"<title>{title}</title>",
                      "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
                      "orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='#333'/></marker></defs>",
                      f"<rect width='{width}' height='{height}' fill='white'/>"]

    def rect(self, x, y, w, h, fill=GREY, stroke="#333", width=1.2, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<rect x='{x}' y='{y}' width='{w}' height='{h}' fill='{fill}' stroke='{stroke}' "
                          f"stroke-width='{width}'{d}/>")

    def text(self, x, y, s, size=13, anchor="middle", weight="normal", color="#222"):
        s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.parts.append(f"<text x='{x}' y='{y}' {FONT} font-size='{size}' text-anchor='{anchor}' "
                          f"font-weight='{weight}' fill='{color}'>{s}</text>")

    def arrow(self, x1, y1, x2, y2, color="#333", dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{color}' stroke-width='1.5' "
                          f"marker-end='url(#arrow)'{d}/>")

    def grid(self, x, y, w, h, rows, cols, fill=GREY, highlight=None, hl_fill=ORANGE):
        """A matrix cut into rows x cols tiles; highlight = set of (r, c) drawn in hl_fill."""
        for r in range(rows):
            for c in range(cols):
                f = hl_fill if highlight and (r, c) in highlight else fill
                self.rect(x + c * w / cols, y + r * h / rows, w / cols, h / rows, fill=f, width=0.8)

    def save(self, name):
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, name), "w") as f:
            f.write(f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.w}' height='{self.h}' "
                    f"viewBox='0 0 {self.w} {self.h}'>\n" + "\n".join(self.parts) + "\n</svg>\n")


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
            lines = ["each warp: a partial P V over its", "keys for every row; the partial", "maxima, sums and outputs meet in",
                     "shared memory every tile (variant 2)"]
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


if __name__ == "__main__":
    flash_tiling()
    loop_orders()
    warp_split()
    paged_block_table()
    print("diagrams: written to " + os.path.relpath(OUT, ROOT))
