"""Inline SVG of the standard (PLP) figures, beside medtx.evaluation.card's forest and line charts: no script,
no font or stylesheet fetched. Each function returns "" when it has nothing to draw (the caller then writes a
sentence instead of empty axes)."""

from __future__ import annotations

import html
import math

FONT = "font-size='11' font-family='sans-serif'"
EVENT, NON_EVENT, MODEL, TREAT_ALL = "#d62728", "#1f77b4", "#1f77b4", "#ff7f0e"


def _e(text: object) -> str:
    return html.escape(str(text))


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About n round ticks on [lo, hi], 0 among them when the range spans it."""
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if m * step >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out, t = [], first
    while t <= hi + 1e-9:
        out.append(0.0 if abs(t) < step * 1e-6 else t)
        t += step
    return out


class Axes:
    """A plotting frame: data ranges mapped to pixels, axes with ticks and labels."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], x_label: str, y_label: str,
                 width: int = 380, height: int = 300, title: str = "", bottom: int = 45, x_ticks: bool = True):
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range if y_range[1] > y_range[0] else (y_range[0], y_range[0] + 1)
        self.w, self.h, self.left, self.bottom, self.top = width, height, 50, bottom, 22 if title else 10
        self.parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
                      f"aria-label='{_e(title or y_label)}' {FONT}>"]
        if title:
            self.parts.append(f"<text x='{width / 2}' y='14' text-anchor='middle' font-weight='bold'>"
                              f"{_e(title)}</text>")
        base, top = height - bottom, self.top
        self.parts += [f"<line x1='{self.left}' y1='{base}' x2='{width - 10}' y2='{base}' stroke='#333'/>",
                       f"<line x1='{self.left}' y1='{top}' x2='{self.left}' y2='{base}' stroke='#333'/>",
                       f"<text x='{(self.left + width - 10) / 2}' y='{base + 30}' text-anchor='middle'>"
                       f"{_e(x_label)}</text>",
                       f"<text x='12' y='{(top + base) / 2}' transform='rotate(-90 12 {(top + base) / 2})' "
                       f"text-anchor='middle'>{_e(y_label)}</text>"]
        for t in _ticks(self.x0, self.x1) if x_ticks else ():  # categorical x: the caller labels it
            self.parts.append(f"<text x='{self.px(t):.1f}' y='{base + 14}' text-anchor='middle'>{t:g}</text>")
        for t in _ticks(self.y0, self.y1):
            self.parts.append(f"<text x='{self.left - 3}' y='{self.py(t) + 4:.1f}' text-anchor='end'>{t:g}</text>")
            if t == 0.0 and self.y0 < 0:  # the zero line of a range that spans it
                self.parts.append(f"<line x1='{self.left}' y1='{self.py(0):.1f}' x2='{width - 10}' "
                                  f"y2='{self.py(0):.1f}' stroke='#999' stroke-width='0.8'/>")

    def px(self, v: float) -> float:
        return self.left + (v - self.x0) / ((self.x1 - self.x0) or 1) * (self.w - self.left - 10)

    def py(self, v: float) -> float:
        base = self.h - self.bottom
        return base - (v - self.y0) / (self.y1 - self.y0) * (base - self.top)

    def line(self, xs: list[float], ys: list[float], colour: str, dash: str = "", width: float = 2) -> None:
        pts = " ".join(f"{self.px(a):.1f},{self.py(min(max(b, self.y0), self.y1)):.1f}"
                       for a, b in zip(xs, ys, strict=True) if b is not None and math.isfinite(b))
        if pts:
            self.parts.append(f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='{width}'"
                              + (f" stroke-dasharray='{dash}'" if dash else "") + "/>")

    def legend(self, items: list[tuple[str, str]], x: float | None = None, y: float | None = None) -> None:
        x = self.w - 15 if x is None else x
        for i, (name, colour) in enumerate(items):
            self.parts.append(f"<text x='{x}' y='{(y or self.top + 12) + 13 * i}' text-anchor='end' "
                              f"fill='{colour}'>{_e(name)}</text>")

    def svg(self) -> str:
        return "".join(self.parts) + "</svg>"


def roc_svg(fpr: list[float], tpr: list[float], auroc: float | None) -> str:
    if len(fpr) < 2:
        return ""
    ax = Axes((0, 1), (0, 1), "1 - specificity (false positive rate)", "sensitivity", title="ROC curve (test)")
    ax.line([0, 1], [0, 1], "#aaa", "4 3", 1)
    ax.line(fpr, tpr, MODEL)
    ax.legend([(f"AUROC {auroc:.3f}" if auroc is not None else "model", MODEL)], y=ax.h - 60)
    return ax.svg()


def pr_svg(recall: list[float], precision: list[float], prevalence: float | None, ap: float | None) -> str:
    if len(recall) < 2:
        return ""
    ax = Axes((0, 1), (0, 1), "recall (sensitivity)", "precision (PPV)", title="Precision-recall curve (test)")
    if prevalence is not None:
        ax.line([0, 1], [prevalence, prevalence], "#aaa", "4 3", 1)
    ax.line(recall, precision, MODEL)
    ax.legend([(f"average precision {ap:.3f}" if ap is not None else "model", MODEL),
               (f"prevalence {prevalence:.3f}" if prevalence is not None else "", "#777")])
    return ax.svg()


def distribution_svg(edges: list[float], events: list[int], non_events: list[int]) -> str:
    """Share of each outcome's samples per bin of predicted probability (events and non-events side by side)."""
    n_e, n_n = sum(events), sum(non_events)
    if not n_e and not n_n:
        return ""
    share_e = [v / n_e if n_e else 0.0 for v in events]
    share_n = [v / n_n if n_n else 0.0 for v in non_events]
    top = max(share_e + share_n) or 1.0
    ax = Axes((0, 1), (0, top * 1.1), "predicted probability", "share of the outcome's samples",
              title="Prediction distribution by outcome (test)")
    for i in range(len(edges) - 1):
        a, b = edges[i], edges[i + 1]
        mid = (a + b) / 2
        for share, colour, left in ((share_n, NON_EVENT, a), (share_e, EVENT, mid)):
            if share[i] > 0:
                ax.parts.append(f"<rect x='{ax.px(left):.1f}' y='{ax.py(share[i]):.1f}' "
                                f"width='{ax.px(mid) - ax.px(a):.1f}' height='{ax.py(0) - ax.py(share[i]):.1f}' "
                                f"fill='{colour}' fill-opacity='0.75'/>")
    ax.legend([(f"events (n={n_e:,})", EVENT), (f"non-events (n={n_n:,})", NON_EVENT)])
    return ax.svg()


def calibration_svg(curves: list[tuple[str, list[float], list[float], str]], hist: list[int] | None = None,
                    edges: list[float] | None = None, title: str = "Smoothed calibration (test)",
                    width: int = 380, height: int = 330) -> str:
    """Smoothed calibration curves against the diagonal on [0, 1] x [0, 1], the histogram of the predictions
    along the bottom."""
    if not any(len(xs) for _, xs, _, _ in curves):
        return ""
    ax = Axes((0, 1), (0, 1), "predicted probability", "observed rate (smoothed)", width, height, title, bottom=75)
    ax.line([0, 1], [0, 1], "#aaa", "4 3", 1)
    for _, xs, ys, colour in curves:
        ax.line(xs, ys, colour)
    if hist and edges and max(hist):
        base, top = ax.h - 32, ax.h - 32 - 22  # a strip under the axis labels
        biggest = max(hist)
        for i, n in enumerate(hist):
            if n:
                hgt = (base - top) * n / biggest
                ax.parts.append(f"<rect x='{ax.px(edges[i]):.1f}' y='{base - hgt:.1f}' "
                                f"width='{ax.px(edges[i + 1]) - ax.px(edges[i]):.1f}' height='{hgt:.1f}' fill='#777'/>")
        ax.parts.append(f"<text x='{ax.w - 10}' y='{base + 11}' text-anchor='end' fill='#555'>predictions per bin "
                        f"(max {biggest:,})</text>")
    if len(curves) > 1 or curves[0][0]:
        ax.legend([(name, colour) for name, _, _, colour in curves], x=ax.left + 120)
    return ax.svg()


def cells_svg(bands: list[str], sexes: list[str], cells: dict[tuple[str, str], tuple[float, float, float, float]]
              ) -> str:
    """Observed (with its interval) and expected rate per age band, one panel per sex; a cell under the floors is
    absent from `cells` and not drawn."""
    if not cells:
        return ""
    top = max(max(o, hi if hi == hi else o, e) for o, lo, hi, e in cells.values())
    panels = []
    for s in sexes:
        ax = Axes((-0.5, len(bands) - 0.5), (0, min(1.0, top * 1.15) or 1.0), "age band", "rate",
                  width=300, height=260, title=f"{s}: observed vs expected", x_ticks=False)
        for i, band in enumerate(bands):
            ax.parts.append(f"<text x='{ax.px(i):.1f}' y='{ax.h - ax.bottom + 14}' text-anchor='middle'>"
                            f"{_e(band)}</text>")
            if (band, s) not in cells:
                continue
            o, lo, hi, e = cells[(band, s)]
            if lo == lo and hi == hi:
                ax.parts.append(f"<line x1='{ax.px(i - 0.08):.1f}' y1='{ax.py(lo):.1f}' x2='{ax.px(i - 0.08):.1f}' "
                                f"y2='{ax.py(hi):.1f}' stroke='{EVENT}' stroke-width='2'/>")
            ax.parts.append(f"<circle cx='{ax.px(i - 0.08):.1f}' cy='{ax.py(o):.1f}' r='4' fill='{EVENT}'/>")
            ax.parts.append(f"<rect x='{ax.px(i + 0.08) - 4:.1f}' y='{ax.py(e) - 4:.1f}' width='8' height='8' "
                            f"fill='none' stroke='{NON_EVENT}' stroke-width='2'/>")
        ax.legend([("observed [95% CI]", EVENT), ("expected (mean predicted)", NON_EVENT)])
        panels.append(ax.svg())
    return "".join(panels)


def decision_svg(thresholds: list[float], model: list[float | None], treat_all: list[float], floor: float,
                 ceiling: float, band: tuple[list[float | None], list[float | None]] | None = None) -> str:
    """Net benefit of the model and of treating everyone, both clipped at the same `floor`, treat-none the zero
    line (with its tick)."""
    if not thresholds or all(v is None for v in model):
        return ""
    clip = lambda vs: [None if v is None else max(v, floor) for v in vs]  # noqa: E731
    ax = Axes((0, max(thresholds)), (floor, ceiling), "threshold probability", "net benefit",
              width=460, height=300, title="Decision curve (test)")
    if band is not None:
        lo, hi = clip(band[0]), clip(band[1])
        pts = [(t, a, b) for t, a, b in zip(thresholds, lo, hi, strict=True) if a is not None and b is not None]
        if pts:
            poly = [f"{ax.px(t):.1f},{ax.py(b):.1f}" for t, _, b in pts] + \
                   [f"{ax.px(t):.1f},{ax.py(a):.1f}" for t, a, _ in reversed(pts)]
            ax.parts.append(f"<polygon points='{' '.join(poly)}' fill='{MODEL}' fill-opacity='0.15'/>")
    ax.line(thresholds, clip(treat_all), TREAT_ALL)
    ax.line(thresholds, [0.0] * len(thresholds), "#7f7f7f", "4 3", 1.5)
    ax.line(thresholds, clip(model), MODEL)
    ax.legend([("model", MODEL), ("treat all", TREAT_ALL), ("treat none", "#7f7f7f")])
    return ax.svg()
