"""The drawing kit behind the docs' diagrams: an Svg canvas, the fonts, the colours and a few helpers.

diagrams.py and diagrams_hopper.py both import from here (and from nothing of each other's), so
either can be read, or run through diagrams.py's main(), without the other's names. Svg.save()
writes into docs/diagrams/.
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "diagrams")
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
MONO = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'"
BLUE, ORANGE, GREEN, GREY, RED = "#cfe3f7", "#fbd9b0", "#cfeccf", "#eeeeee", "#f4c2c2"
LIGHT_ORANGE, LIGHT_BLUE, LIGHT_GREEN = "#fdeedd", "#e8f1fb", "#e6f5e6"
INK, SOFT = "#222", "#555"


def _esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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

    def math(self, x, y, s, size=13, anchor="middle", weight="normal", color="#222", mono=False):
        """Text with simple exponents and subscripts: "e^{m_old − m_new}", "ℓ_{1}" (one level, no nesting)."""
        family = MONO if mono else FONT
        s = s.replace(" ", "\u00a0")  # keep runs of spaces (and code indentation)
        out, i, shift = [], 0, 0
        while i < len(s):
            if s[i] in "^_" and i + 1 < len(s) and s[i + 1] == "{":
                end = s.index("}", i)
                dy = -0.35 * size if s[i] == "^" else 0.25 * size
                out.append(f"<tspan dy='{dy:.1f}' font-size='{0.72 * size:.1f}'>{_esc(s[i + 2:end])}</tspan>")
                shift += dy
                i = end + 1
                continue
            j = i
            while j < len(s) and not (s[j] in "^_" and j + 1 < len(s) and s[j + 1] == "{"):
                j += 1
            out.append(f"<tspan dy='{-shift:.1f}'>{_esc(s[i:j])}</tspan>" if shift else _esc(s[i:j]))
            shift = 0
            i = j
        self.parts.append(f"<text x='{x}' y='{y}' {family} font-size='{size}' text-anchor='{anchor}' "
                          f"font-weight='{weight}' fill='{color}'>{''.join(out)}</text>")

    def line(self, x1, y1, x2, y2, color="#333", width=1.2, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{color}' stroke-width='{width}'{d}/>")

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


# ---- helpers on an Svg (the Hopper pictures use them; any picture may) --------------------------
def rich(svg, x, y, s, size=13, anchor="middle", weight="normal", color=INK, mono=False):
    """Text with subscripts written as _{...} (and superscripts as ^{...}), as tspans."""
    parts, shift = [], 0
    for token in re.split(r"([_^]\{[^}]*\})", s):
        if not token:
            continue
        if token[0] in "_^" and token[1:2] == "{":
            dy = round(size * 0.3) if token[0] == "_" else -round(size * 0.4)
            parts.append(f"<tspan dy='{dy}' font-size='{round(size * 0.72, 1)}'>{_esc(token[2:-1])}</tspan>")
            shift += dy
        else:
            parts.append(f"<tspan dy='{-shift}'>{_esc(token)}</tspan>" if shift else _esc(token))
            shift = 0
    family = MONO + " style='white-space:pre'" if mono else FONT
    svg.parts.append(f"<text x='{x}' y='{y}' {family} font-size='{size}' text-anchor='{anchor}' "
                     f"font-weight='{weight}' fill='{color}'>{''.join(parts)}</text>")


def text_width(s, size, mono=False):
    """A rough width of rich() text in pixels (DejaVu Sans averages about 0.6 em a character)."""
    plain = re.sub(r"[_^]\{([^}]*)\}", lambda m: "\0" * len(m.group(1)), s)
    per = 0.602 if mono else 0.6
    return sum(size * per * (0.72 if ch == "\0" else 1.0) for ch in plain)


def rich_bg(svg, x, y, s, size=13, anchor="middle", weight="normal", color=INK, mono=False, pad=3):
    """rich() on a white background, for a label that lies across lines."""
    w = text_width(s, size, mono)
    left = x - w / 2 if anchor == "middle" else (x - w if anchor == "end" else x)
    svg.parts.append(f"<rect x='{left - pad:.1f}' y='{y - size * 0.85:.1f}' width='{w + 2 * pad:.1f}' "
                     f"height='{size * 1.15:.1f}' fill='white'/>")
    rich(svg, x, y, s, size, anchor, weight, color, mono)


def code(svg, x, y, s, size=11, color=INK, anchor="start", weight="normal"):
    rich(svg, x, y, s, size, anchor=anchor, color=color, mono=True, weight=weight)


def line(svg, x1, y1, x2, y2, color="#333", width=1.2, dash=None):
    d = f" stroke-dasharray='{dash}'" if dash else ""
    svg.parts.append(f"<line x1='{x1}' y1='{y1}' x2='{x2}' y2='{y2}' stroke='{color}' stroke-width='{width}'{d}/>")


def polyline(svg, points, color="#333", width=1.5, dash=None, arrow=True):
    d = f" stroke-dasharray='{dash}'" if dash else ""
    m = " marker-end='url(#arrow)'" if arrow else ""
    pts = " ".join(f"{x},{y}" for x, y in points)
    svg.parts.append(f"<polyline points='{pts}' fill='none' stroke='{color}' stroke-width='{width}'{d}{m}/>")


def box(svg, x, y, w, h, fill=GREY, stroke="#333", width=1.2, dash=None, radius=4):
    d = f" stroke-dasharray='{dash}'" if dash else ""
    svg.parts.append(f"<rect x='{x}' y='{y}' width='{w}' height='{h}' rx='{radius}' fill='{fill}' stroke='{stroke}' "
                     f"stroke-width='{width}'{d}/>")


def caption(svg, s):
    svg.text(svg.w / 2, svg.h - 12, s, 11, color=SOFT)
