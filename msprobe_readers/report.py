"""``msprobe-dump report``: one self-contained HTML file (inline SVG, inline CSS, no script, no network).

It shows the findings first (first NaN/Inf of the job and per rank with its source line, the first rank
that departs from the others, incomplete steps and errors), then rank x layer heat maps of gradient norms,
then the statistics of chosen records over steps, one line per rank. The dump is read in one pass:
the summary, the cross-rank check and the collectors below share it.
"""

from __future__ import annotations

import datetime
import html
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Pattern, Sequence, Tuple

from msprobe_inject.dumpformat import names
from msprobe_readers import __version__, flight
from msprobe_readers import stats as st
from msprobe_readers.ranks import DEFAULT_ATOL, DEFAULT_RTOL, RankChecker, RanksResult
from msprobe_readers.reading import ProcDir, ProgressFn
from msprobe_readers.summary import NanHit, RankSummary, global_first_nan, summarize
from msprobe_readers.text import describe_departure, format_leaves, human_bytes

DEFAULT_SERIES = (r"loss", r"parameters_grad")
_VIRIDIS = [(68, 1, 84), (72, 40, 120), (62, 74, 137), (49, 104, 142), (38, 130, 142), (31, 158, 137),
            (53, 183, 121), (109, 205, 89), (180, 222, 44), (253, 231, 37)]
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
            "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]
_RED, _ORANGE, _PURPLE = "#d62728", "#ff7f0e", "#9467bd"
_MAX_BOXES = 16  # findings boxes per kind; the table has every rank


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


# ---- collectors (fed by summarize's on_record) ----

@dataclass
class SeriesCollector:
    """Statistics over steps of the records matching ``patterns`` (per record, tensor leaf and rank)."""

    patterns: Sequence[str] = ()
    max_series: int = 24
    data: Dict[Tuple[str, str], Dict[str, Dict[int, st.Stats]]] = field(default_factory=dict)
    fallback: Dict[Tuple[str, str], Dict[str, Dict[int, st.Stats]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rx: List[Pattern[str]] = [re.compile(p) for p in (self.patterns or DEFAULT_SERIES)]

    @staticmethod
    def _pick(name: str, value: Any) -> List[st.Leaf]:
        parsed = names.parse(name)
        if parsed is not None and parsed.direction == names.FORWARD and isinstance(value, dict) and "output" in value:
            chosen = st.leaves(value["output"], "output")
        else:
            chosen = st.leaves(value)
        return chosen[:4]

    def _store(self, into: Dict, proc: ProcDir, name: str, value: Any) -> None:
        for leaf in self._pick(name, value):
            key = (name, leaf.path)
            if key not in into and len(into) >= self.max_series:
                return
            into.setdefault(key, {}).setdefault(proc.label, {})[proc.step] = leaf.stats

    def on_record(self, proc: ProcDir, position: int, name: str, value: Any) -> None:
        if any(rx.search(name) for rx in self._rx):
            self._store(self.data, proc, name, value)
        elif not self.patterns and position < 3:  # when nothing matches the defaults: the first records
            self._store(self.fallback, proc, name, value)

    def series(self) -> Dict[Tuple[str, str], Dict[str, Dict[int, st.Stats]]]:
        return self.data or ({} if self.patterns else self.fallback)


@dataclass
class GradCollector:
    """Gradient norm per rank, step and layer: parameters_grad records, else backward records (L1)."""

    params: Dict[str, Dict[int, Dict[str, float]]] = field(default_factory=dict)
    backward: Dict[str, Dict[int, Dict[str, float]]] = field(default_factory=dict)
    param_layers: Dict[str, None] = field(default_factory=dict)
    backward_layers: Dict[str, None] = field(default_factory=dict)

    @staticmethod
    def _norm(leaves: List[st.Leaf]) -> Optional[float]:
        norms = [leaf.stats[3] for leaf in leaves if leaf.stats[3] is not None]
        if not norms:
            return None
        return math.sqrt(sum(n * n for n in norms))  # NaN and Inf propagate

    def on_record(self, proc: ProcDir, position: int, name: str, value: Any) -> None:
        if not isinstance(value, dict):
            return
        parsed = names.parse(name)
        if parsed is None:
            return
        if parsed.direction == names.PARAMETERS_GRAD:
            layer = parsed.path or name  # a root module has no path
            into, layers, leaves = self.params, self.param_layers, st.leaves(value)
        elif self.params:
            return
        elif parsed.direction == names.BACKWARD:
            layer = names.call_of(name)
            into, layers, leaves = self.backward, self.backward_layers, st.leaves(value.get("output"), "output")
        else:
            return
        norm = self._norm(leaves)
        if norm is None:
            return
        layers.setdefault(layer, None)
        into.setdefault(proc.label, {}).setdefault(proc.step, {})[layer] = norm  # the last accumulation wins

    def table(self) -> Tuple[str, List[str], Dict[str, Dict[int, Dict[str, float]]]]:
        """(what the norms are, layers in forward order, rank -> step -> layer -> norm)."""
        if self.params:
            # gradients arrive in backward order: reversed, they follow the forward pass
            return "parameters_grad", list(reversed(self.param_layers)), self.params
        return "backward outputs (no parameters_grad: L1 dump)", list(reversed(self.backward_layers)), self.backward


# ---- SVG ----

def _color(t: float) -> str:
    t = min(1.0, max(0.0, t)) * (len(_VIRIDIS) - 1)
    i = min(int(t), len(_VIRIDIS) - 2)
    f = t - i
    c = [round(a + (b - a) * f) for a, b in zip(_VIRIDIS[i], _VIRIDIS[i + 1])]
    return "#{:02x}{:02x}{:02x}".format(*c)


def _finite(v: Optional[float]) -> bool:
    return v is not None and math.isfinite(v)


def _scale(values: List[float]) -> Tuple[bool, float, float]:
    """(log scale?, low, high) for a colour or y axis."""
    vals = [v for v in values if _finite(v)]
    if not vals:
        return False, 0.0, 1.0
    lo, hi = min(vals), max(vals)
    if lo > 0 and hi / lo > 100:
        return True, math.log10(lo), math.log10(hi)
    return False, lo, hi


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1):]


def heatmap_svg(rows: List[str], cols: List[str], cell: Dict[Tuple[str, str], Optional[float]],
                highlight_rows: Sequence[str] = (), title: str = "", row_title: str = "rank",
                col_title: str = "layer") -> str:
    if not rows or not cols:
        return ""
    cw = max(6, min(64, 900 // len(cols)))
    ch = max(6, min(30, 420 // len(rows)))
    left, top = 120, 34
    longest = max(len(_short(c)) for c in cols)
    label_h = int(24 + 5.6 * longest) if cw >= 10 else 40
    width = left + cw * len(cols) + 150
    height = max(top + ch * len(rows) + label_h, top + 196)  # room for the colour bar and its legend
    log, lo, hi = _scale([v for v in cell.values() if v is not None])
    span = (hi - lo) or 1.0
    out = [f'<svg class="heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
           f'<text x="{left}" y="18" class="t">{_e(title)}</text>']
    for r, row in enumerate(rows):
        y = top + r * ch
        weight = ' font-weight="bold" fill="#d62728"' if row in highlight_rows else ""
        if ch >= 9:
            out.append(f'<text x="{left - 6}" y="{y + ch / 2 + 4:.1f}" text-anchor="end"{weight}>'
                       f'{_e(row_title)} {_e(row)}</text>')
        for c, col in enumerate(cols):
            x = left + c * cw
            v = cell.get((row, col))
            if v is None:
                fill, text = "#eeeeee", "missing"
            elif not math.isfinite(v):
                fill, text = _RED, "NaN" if math.isnan(v) else "Inf"
            else:
                t = ((math.log10(v) if log and v > 0 else v) - lo) / span if not (log and v <= 0) else 0.0
                fill, text = _color(t), f"{v:.4g}"
            out.append(f'<rect x="{x}" y="{y}" width="{cw}" height="{ch}" fill="{fill}" stroke="#fff" '
                       f'stroke-width="0.5"><title>{_e(row_title)} {_e(row)}, {_e(col)}: {_e(text)}</title></rect>')
            if v is not None and not math.isfinite(v) and cw >= 22 and ch >= 12:
                out.append(f'<text x="{x + cw / 2}" y="{y + ch / 2 + 4}" text-anchor="middle" fill="#fff" '
                           f'font-weight="bold">{text}</text>')
        if row in highlight_rows:
            out.append(f'<rect x="{left}" y="{y}" width="{cw * len(cols)}" height="{ch}" fill="none" '
                       f'stroke="{_RED}" stroke-width="2"/>')
    base = top + ch * len(rows)
    step = 1 if cw >= 10 else math.ceil(10 / cw)
    for c in range(0, len(cols), step):
        x = left + c * cw + cw / 2
        out.append(f'<text transform="translate({x + 4:.1f},{base + 6}) rotate(60)" class="s">'
                   f'{_e(_short(cols[c]))}</text>')
    out.append(f'<text x="{left + cw * len(cols) / 2:.0f}" y="{height - 4}" text-anchor="middle" class="s">'
               f'{_e(col_title)}</text>')
    # colour bar
    bx = left + cw * len(cols) + 20
    for i in range(50):
        out.append(f'<rect x="{bx}" y="{top + (49 - i) * 3}" width="14" height="3" fill="{_color(i / 49)}"/>')
    fmt_v = (lambda x: f"{10 ** x:.3g}") if log else (lambda x: f"{x:.3g}")
    out.append(f'<text x="{bx + 18}" y="{top + 8}" class="s">{fmt_v(hi)}</text>')
    out.append(f'<text x="{bx + 18}" y="{top + 150}" class="s">{fmt_v(lo)}</text>')
    if log:
        out.append(f'<text x="{bx}" y="{top + 168}" class="s">log scale</text>')
    out.append(f'<rect x="{bx}" y="{top + 178}" width="14" height="10" fill="{_RED}"/>'
               f'<text x="{bx + 18}" y="{top + 187}" class="s">NaN/Inf</text>')
    out.append("</svg>")
    return "".join(out)


def line_chart_svg(title: str, series: Dict[str, Dict[int, Optional[float]]],
                   marks: Sequence[Tuple[int, str, str]] = (), colors: Optional[Dict[str, str]] = None) -> str:
    """One line per rank over steps; NaN/Inf points as red crosses on the top edge; vertical step marks."""
    width, height, left, right, top, bottom = 460, 250, 62, 14, 30, 44
    steps = sorted({s for pts in series.values() for s in pts})
    if not steps:
        return ""
    vals = [v for pts in series.values() for v in pts.values()]
    log, lo, hi = _scale(vals)
    if hi == lo:
        lo, hi = lo - (abs(lo) or 1.0) * 0.05, hi + (abs(hi) or 1.0) * 0.05
    pw, ph = width - left - right, height - top - bottom
    x0, x1 = steps[0], steps[-1]

    def sx(s: int) -> float:
        return left + (pw * (s - x0) / (x1 - x0) if x1 > x0 else pw / 2)

    def sy(v: float) -> float:
        y = math.log10(v) if log else v
        return top + ph - ph * (y - lo) / (hi - lo)

    out = [f'<svg class="series" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
           f'<text x="{left}" y="16" class="t">{_e(_short(title, 62))}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>']
    for i in range(5):
        yv = lo + (hi - lo) * i / 4
        y = top + ph - ph * i / 4
        label = f"{10 ** yv:.3g}" if log else f"{yv:.3g}"
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="s">{label}</text>')
    tick = max(1, math.ceil(len(steps) / 10))
    for s in steps[::tick]:
        out.append(f'<text x="{sx(s):.1f}" y="{top + ph + 14}" text-anchor="middle" class="s">{s}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 18}" text-anchor="middle" class="s">step'
               f'{" (log scale)" if log else ""}</text>')
    for s, color, text in marks:
        if x0 <= s <= x1:
            x = sx(s)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="{color}" '
                       f'stroke-dasharray="4 3" stroke-width="1.5"><title>{_e(text)}</title></line>')
    colors = colors or {}
    for i, (label, pts) in enumerate(series.items()):
        color = colors.get(label, _PALETTE[i % len(_PALETTE)])
        path, pen = [], "M"
        for s in sorted(pts):
            v = pts[s]
            if _finite(v) and (not log or v > 0):
                path.append(f"{pen}{sx(s):.1f},{sy(v):.1f}")
                pen = "L"
            else:
                pen = "M"
                if v is not None:
                    x = sx(s)
                    out.append(f'<path d="M{x - 4:.1f},{top + 2} l8,8 m0,-8 l-8,8" stroke="{_RED}" stroke-width="2">'
                               f'<title>rank {_e(label)} step {s}: {v}</title></path>')
        if path:
            out.append(f'<path d="{" ".join(path)}" fill="none" stroke="{color}" stroke-width="1.8"/>')
            for s in sorted(pts):
                v = pts[s]
                if _finite(v) and (not log or v > 0):
                    out.append(f'<circle cx="{sx(s):.1f}" cy="{sy(v):.1f}" r="2.5" fill="{color}">'
                               f'<title>rank {_e(label)} step {s}: {v:.6g}</title></circle>')
    if len(series) <= 8:
        x = left
        for i, label in enumerate(series):
            color = colors.get(label, _PALETTE[i % len(_PALETTE)])
            out.append(f'<rect x="{x}" y="{height - 10}" width="10" height="4" fill="{color}"/>'
                       f'<text x="{x + 13}" y="{height - 5}" class="s">rank {_e(label)}</text>')
            x += 24 + 7 * len(label) + 30
    out.append("</svg>")
    return "".join(out)


# ---- the page ----

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#666} code{font:12px ui-monospace,Menlo,Consolas,monospace}
.box{border-left:6px solid;padding:8px 12px;margin:8px 0;border-radius:4px}
.nan{border-color:#d62728;background:#fdecea} .div{border-color:#ff7f0e;background:#fff4e5}
.warn{border-color:#e6b800;background:#fffbe6} .ok{border-color:#2ca02c;background:#eef8ee}
table{border-collapse:collapse;margin:6px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td.bad{background:#fdecea;color:#a00;font-weight:600} td.inc{background:#fff4e5}
.grid{display:flex;flex-wrap:wrap;gap:10px} svg text{font:11px system-ui,sans-serif} svg text.t{font-size:13px;
font-weight:600} svg text.s{font-size:10px;fill:#444}
"""


def _hit_html(hit: NanHit, first: bool = False) -> str:
    leaves = format_leaves(hit.leaves)
    src = ""
    if hit.source is not None:
        src = (f'<br>source: <code>{_e(hit.source.file)}:{hit.source.line}</code> in <code>{_e(hit.source.func)}'
               f'</code>: <code>{_e(hit.source.code)}</code>')
        if hit.stack_of and hit.stack_of != hit.record:
            src += f" (stack of {_e(hit.stack_of)})"
    head = "<b>First NaN/Inf of the job</b>: " if first else ""
    return (f"{head}rank <b>{_e(hit.label)}</b>, step <b>{hit.step}</b>, record #{hit.position} "
            f"<code>{_e(hit.record)}</code><br>non-finite: <code>{_e(leaves)}</code>{src}")


def _sharded_html(o: Dict[str, Any]) -> str:
    """Whole-tensor figures of the sharded (DTensor) leaves, combined from the shards of all ranks."""
    rows = [f"<section id='sharded'><h2>Sharded tensors (whole-tensor figures)</h2><p>{o['leaves']} DTensor leaves "
            f"in {o['records']} records: {o['whole']} combined from all their shards (max of maxes, min of mins, "
            f"count-weighted mean, root of summed squared norms), {o['partial']} partial (not combined), "
            f"{o['incomplete']} with shards missing. Per-shard figures are in each rank's dump.json.</p>"]
    for n in o["nonfinite"]:
        rows.append(f"<div class='box nan'>NaN/Inf in the whole tensor: step {n['step']}, "
                    f"<code>{_e(n['record'])}</code> {_e(n['leaf'])}</div>")
    if o["largest"]:
        rows.append("<table><tr><th>step</th><th>record</th><th>tensor</th><th>shape</th>"
                    + "".join(f"<th>{k}</th>" for k in st.STATS) + "</tr>")
        for x in o["largest"]:
            rows.append(f"<tr><td>{x['step']}</td><td><code>{_e(x['record'])}</code></td><td>{_e(x['leaf'])}</td>"
                        f"<td>{_e(st.fmt(tuple(x['shape'])))}</td>"
                        + "".join(f"<td>{_e(st.fmt(x[k]))}</td>" for k in st.STATS) + "</tr>")
        rows.append("</table>")
    rows.append("</section>")
    return "".join(rows)


def render(dump_path: str, summaries: List[RankSummary], ranks: RanksResult, series: SeriesCollector,
           grads: GradCollector, stats: Sequence[str] = ("Norm",), heatmap_steps: Optional[Sequence[int]] = None,
           title: Optional[str] = None, sharded: Optional[Dict[str, Any]] = None,
           flight_info: Optional[Dict[str, Any]] = None) -> str:
    title = title or f"msprobe dump report: {os.path.basename(os.path.abspath(dump_path))}"
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1><div class='meta'>dump <code>{_e(os.path.abspath(dump_path))}</code> · "
             f"{len(summaries)} rank directories · generated "
             f"{datetime.datetime.now().isoformat(timespec='seconds')} by msprobe-launch {_e(__version__)}</div>"]

    # findings
    parts.append("<section id='findings'><h2>Findings</h2>")
    for line in flight.describe(flight_info):
        parts.append(f"<div class='box warn flight'>{_e(line)}</div>")
    first_nan = global_first_nan(summaries)
    nan_steps: List[int] = []
    if first_nan is not None:
        parts.append(f"<div class='box nan' id='first-nan'>{_hit_html(first_nan, True)}</div>")
        others = [s.nan for s in summaries if s.nan is not None and s.nan is not first_nan]
        for hit in others[:_MAX_BOXES]:
            parts.append(f"<div class='box nan'>{_hit_html(hit)}</div>")
        if len(others) > _MAX_BOXES:
            parts.append(f"<div class='box nan'>… and {len(others) - _MAX_BOXES} more ranks with a NaN/Inf "
                         "(see the table below).</div>")
        nan_steps = [first_nan.step]
    else:
        parts.append("<div class='box ok'>No NaN/Inf in any record.</div>")
    dep = ranks.first_overall
    if dep is not None:
        parts.append(f"<div class='box div' id='first-departure'><b>Cross-rank divergence</b>: rank "
                     f"<b>{_e(dep.label)}</b> departs first at {_e(describe_departure(dep))}</div>")
        others_dep = [ranks.first[label] for label in ranks.labels
                      if label in ranks.first and ranks.first[label] is not dep]
        for d in others_dep[:_MAX_BOXES]:
            parts.append(f"<div class='box div'>rank <b>{_e(d.label)}</b> departs at {_e(describe_departure(d))}</div>")
        if len(others_dep) > _MAX_BOXES:
            parts.append(f"<div class='box div'>… and {len(others_dep) - _MAX_BOXES} more departing ranks.</div>")
    elif any(ranks.compared.values()):
        parts.append(f"<div class='box ok'>All {len(ranks.labels)} ranks agree on parameters, gradients and "
                     f"optimizer records (rtol={ranks.rtol:g}, atol={ranks.atol:g}).</div>")
    for note in ranks.notes:
        parts.append(f"<div class='box warn'>cross-rank check: {_e(note)}</div>")
    if ranks.rank_local:
        parts.append(f"<div class='box warn'>{len(ranks.rank_local)} parameters_grad record(s) never agree on every "
                     "rank: treated as rank-local (captured before the gradient all-reduce), not compared.</div>")
    problems = [(s.label, p) for s in summaries for p in s.problems]
    for label, problem in problems[:_MAX_BOXES]:
        parts.append(f"<div class='box warn'>rank {_e(label)}: {_e(problem)}</div>")
    if len(problems) > _MAX_BOXES:
        parts.append(f"<div class='box warn'>… and {len(problems) - _MAX_BOXES} more problems.</div>")
    parts.append("</section>")

    # heat maps
    what, layers, table = grads.table()
    parts.append("<section id='heatmaps'><h2>Gradient norms: rank × layer</h2>")
    ranks_order = [s.label for s in summaries if s.label in table]
    bad_ranks = sorted({d.label for d in ranks.first.values()} | {s.label for s in summaries if s.nan})
    if not layers:
        parts.append("<p>No gradient records in this dump (backward records are needed: data_mode all or "
                     "backward).</p>")
    else:
        all_steps = sorted({step for per in table.values() for step in per})
        if heatmap_steps:
            chosen = [s for s in heatmap_steps if s in all_steps]
        elif len(all_steps) <= 3:
            chosen = all_steps
        else:
            chosen = sorted(set(nan_steps + ([dep.step] if dep else []) + [all_steps[-1]]))
        parts.append(f"<p>L2 norm of each layer's gradient ({_e(what)}; parameters of a layer combined). "
                     "parameters_grad is captured when the gradient accumulates: under DDP that is each rank's "
                     "local gradient, before the all-reduce. Rows in red: ranks with a NaN/Inf or a cross-rank "
                     "departure.</p><div class='grid'>")
        for step in chosen:
            cell = {(r, layer): table.get(r, {}).get(step, {}).get(layer) for r in ranks_order for layer in layers}
            parts.append(heatmap_svg(ranks_order, layers, cell, bad_ranks, f"step {step}"))
        if len(all_steps) > 1:
            cell = {}
            for r in ranks_order:
                for step in all_steps:
                    norms = list(table.get(r, {}).get(step, {}).values())
                    cell[(r, str(step))] = math.sqrt(sum(n * n for n in norms)) if norms else None
            parts.append(heatmap_svg(ranks_order, [str(s) for s in all_steps], cell, bad_ranks,
                                     "total gradient norm: rank × step", col_title="step"))
        parts.append("</div>")
    parts.append("</section>")

    # series
    data = series.series()
    parts.append("<section id='series'><h2>Statistics over steps</h2>")
    if not data:
        parts.append("<p>No record matched.</p>")
    else:
        marks = [(first_nan.step, _RED, "first NaN/Inf")] if first_nan else []
        if dep is not None:
            marks.append((dep.step, _ORANGE, f"rank {dep.label} departs"))
        for t in (flight_info or {}).get("triggers", []):
            if isinstance(t.get("step"), int):
                marks.append((t["step"], _PURPLE, f"flight recorder trigger: {t.get('kind')} on rank {t.get('rank')}"
                                                  f" ({t.get('record') or ''})"))
        labels = [s.label for s in summaries]
        colors = {label: _PALETTE[i % len(_PALETTE)] for i, label in enumerate(labels)}
        chosen_stats = [s for s in stats if s in st.STATS] or ["Norm"]
        parts.append("<p>One line per rank; red crosses on the top edge are NaN/Inf values; dashed lines mark the "
                     "first NaN/Inf (red), the first cross-rank departure (orange) and a flight-recorder trigger "
                     "(purple).</p><div class='grid'>")
        for (record, leaf), per_rank in data.items():
            for stat in chosen_stats:
                j = st.STATS.index(stat)
                lines = {label: {step: v[j] for step, v in per_rank[label].items()}
                         for label in labels if label in per_rank}
                parts.append(line_chart_svg(f"{record} {leaf} {stat}", lines, marks, colors))
        parts.append("</div>")
    parts.append("</section>")

    # summary table
    n_rows = sum(len(s.per_step) for s in summaries)
    parts.append("<section id='summary'><h2>Per rank and step</h2>"
                 + (f"<details><summary>{n_rows} rows</summary>" if n_rows > 64 else "")
                 + "<table><tr><th>rank</th><th>attempt</th>"
                 "<th>step</th><th>records</th><th>bytes</th><th>errors</th><th>status</th><th>first NaN/Inf</th>"
                 "<th>departing records</th></tr>")
    for s in summaries:
        for r in s.per_step:
            nan = f"#{r.first_nan[0]} {r.first_nan[1]}" if r.first_nan else "-"
            deps = ranks.step_counts.get((s.label, r.step), 0)
            parts.append(f"<tr><td>{_e(s.label)}</td><td>{s.attempt}</td><td>{r.step}</td><td>{r.records}</td>"
                         f"<td>{human_bytes(r.bytes)}</td><td{' class=bad' if r.errors else ''}>{r.errors}</td>"
                         f"<td{' class=inc' if r.incomplete else ''}>{'incomplete' if r.incomplete else 'ok'}</td>"
                         f"<td{' class=bad' if r.first_nan else ''}>{_e(nan)}</td>"
                         f"<td{' class=bad' if deps else ''}>{deps}</td></tr>")
    parts.append("</table>" + ("</details>" if n_rows > 64 else "") + "</section>")
    if sharded is not None:
        parts.append(_sharded_html(sharded))

    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(dump_path: str, out_path: str, records: Sequence[str] = (), stats: Sequence[str] = ("Norm",),
                 heatmap_steps: Optional[Sequence[int]] = None, patterns: Sequence[str] = (),
                 rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL, title: Optional[str] = None,
                 max_series: int = 24, progress: Optional[ProgressFn] = None) -> Dict[str, Any]:
    """Read the dump once and write the HTML report. Returns what the report found (for the CLI)."""
    series = SeriesCollector(tuple(records), max_series)
    grads = GradCollector()
    checker = RankChecker(patterns, rtol=rtol, atol=atol)
    from msprobe_readers import shards
    from msprobe_readers.reading import discover

    collector = shards.ShardCollector() if any(shards.has_dtensors(p) for p in discover(dump_path)) else None

    def on_record(proc: ProcDir, position: int, name: str, value: Any) -> None:
        series.on_record(proc, position, name, value)
        grads.on_record(proc, position, name, value)
        checker.on_record(proc, position, name, value)
        if collector is not None:
            collector.on_record(proc, position, name, value)

    summaries = summarize(dump_path, on_record=on_record, progress=progress)
    ranks = checker.finish()
    sharded = shards.overview(collector.globals()) if collector is not None else None
    page = render(dump_path, summaries, ranks, series, grads, stats, heatmap_steps, title, sharded,
                  flight.read(dump_path))
    with open(out_path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return {"summaries": summaries, "ranks": ranks, "first_nan": global_first_nan(summaries),
            "series": len(series.series()), "out": out_path}
