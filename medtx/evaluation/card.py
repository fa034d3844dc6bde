"""A model card per run: one self-contained page (HTML, and the same content as Markdown) that a clinician or an
ethics board can file. Read-only over a warehouse or a published snapshot (the dashboard serves it from the
snapshot); figures are inline SVG, so the page renders offline with no script, font or stylesheet fetched.

Sections (each an `id` the tests check): summary (the conclusions, each with its reason: medtx.evaluation.summary),
intended-use (from the task's declaration), study (what the user states once per study in the pipeline config:
medtx.evaluation.study), lineage (code version, data fingerprint, config), clock (the task's prediction time), splits,
attrition and population (the cohort flow and Table 1 by split: medtx.evaluation.population), headline (test metrics
with 95% patient-bootstrap intervals and the paired verdict against the reference baseline), drivers (what drives the
score, in plain words: medtx.evaluation.drivers), subgroups (table with the floors' reasons and Holm-adjusted
verdicts, forest plot, largest gaps), calibration (before/after recalibration fitted on validation, each map's status
and reason, reliability curve), operating-points (thresholds chosen on validation, validation beside test figures,
unreachable targets as rows, decision curve), standard-figures (OHDSI PLP's: medtx.evaluation.plp_card), flags
(collapse), leakage (the task's leakage-gate record), limitations.
A failed run's card has only summary (FAILED, the one-line error) and lineage: nothing that reads as a result.

`Card.data` is the card's JSON twin (`medtx report --format json`, docs/MODEL_CARD.md): every figure and every
conclusion with its reason.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

import duckdb

from medtx.evaluation import drivers as dr
from medtx.evaluation import population as pop
from medtx.evaluation import study as st
from medtx.evaluation import summary as sm
from medtx.evaluation.floors import MIN_VAL_ALERTS
from medtx.metrics import intervals as iv
from medtx.tasks import find_task

SECTIONS = ("summary", "intended-use", "study", "lineage", "clock", "splits", "attrition", "population", "headline",
            "drivers", "subgroups", "calibration", "operating-points", "standard-figures", "flags", "leakage",
            "limitations")
FAILED_SECTIONS = ("summary", "lineage")
FIGS = ("sensitivity", "specificity", "ppv", "npv", "alerts_per_100", "nne")


@dataclass
class Section:
    id: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # inline SVG
    details: str | None = None  # preformatted text shown folded (the config)


@dataclass
class Card:
    run_id: str
    title: str
    sections: list[Section]
    data: dict = field(default_factory=dict)  # the JSON twin

    def json(self) -> str:
        return json.dumps(self.data, indent=2, default=str)

    def html(self) -> str:
        parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(self.title)}</title>",
                 f"<style>{CSS}</style></head><body><h1>{_e(self.title)}</h1>",
                 "<nav>" + " · ".join(f"<a href='#{s.id}'>{_e(s.title)}</a>" for s in self.sections) + "</nav>"]
        for s in self.sections:
            parts.append(f"<section id='{s.id}'><h2>{_e(s.title)}</h2>")
            parts += [f"<p>{_e(p)}</p>" for p in s.paragraphs]
            for head, rows in s.tables:
                parts.append("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
                             + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
                             + "</tbody></table>")
            parts += [f"<figure>{svg}</figure>" for svg in s.figures]
            if s.details is not None:
                parts.append(f"<details><summary>config</summary><pre>{_e(s.details)}</pre></details>")
            parts.append("</section>")
        parts.append("</body></html>")
        return "\n".join(parts)

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for s in self.sections:
            out += [f"## {s.title}", ""]
            out += [p + "\n" for p in s.paragraphs]
            for head, rows in s.tables:
                out.append("| " + " | ".join(head) + " |")
                out.append("|" + "---|" * len(head))
                out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
                out.append("")
            out += [svg + "\n" for svg in s.figures]  # inline SVG renders in most Markdown viewers
            if s.details is not None:
                out += ["```json", s.details, "```", ""]
        return "\n".join(out)


CSS = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
       "table{border-collapse:collapse;margin:.5em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:2px 6px}"
       "th{background:#f3f3f3}section{margin-bottom:2em}nav{font-size:.9em;margin-bottom:1em}"
       "figure{margin:.5em 1em .5em 0;display:inline-block;vertical-align:top}"
       "#summary{border:2px solid #333;padding:.5em 1em;background:#fafafa}"
       # printable at A4 width without losing a column: tables shrink and wrap their cells, nothing is cut
       "@page{size:A4;margin:12mm}td{overflow-wrap:anywhere}td:first-child,th{overflow-wrap:break-word}"
       "pre{white-space:pre-wrap;overflow-wrap:anywhere}"
       "svg{max-width:100%;height:auto}@media print{body{max-width:none;margin:0;font-size:9pt}"
       "table{font-size:8pt;width:100%}td,th{padding:1px 3px}nav{display:none}section{break-inside:auto}"
       "figure{break-inside:avoid}details{display:none}}")


def _unit(run: dict) -> str:
    """What the run's test bootstrap resampled, in words (ml.runs.test_unit: patients, text groups, pairs)."""
    return run.get("test_unit") or "patients"


def _interval_method(method: str | None, unit: str) -> str:
    """A stored ci_method under the name of the run's unit. Text-group and pair runs analysed before 2026-11-29
    stored the patients' name (`patient_bootstrap_percentile`); they are shown under their own unit's name."""
    if not method:
        return "–"
    split_unit = {"text groups": "text_group", "pairs": "pair"}.get(unit)
    return method.replace(iv.CI_METHOD, iv.ci_method(split_unit), 1) if split_unit else method


def _e(text: object) -> str:
    return html.escape(str(text))


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(value: float | None, lo: float | None, hi: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f} [{_f(lo, digits)}, {_f(hi, digits)}]" if lo is not None else f"{value:.{digits}f}"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _table_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    schema, name = table.split(".")
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


# ----------------------------------------------------------------------------------------------- SVG


def forest_svg(rows: list[tuple[str, float, float | None, float | None]], overall: float | None, label: str,
               width: int = 640) -> str:
    """A forest plot: one line per (name, value, lo, hi), the overall value as a dashed line."""
    values = [v for _, v, lo, hi in rows for v in (v, lo, hi) if v is not None] + ([overall] if overall else [])
    if not rows or not values:
        return ""
    lo_x, hi_x = min(values), max(values)
    pad = (hi_x - lo_x) * 0.05 or 0.05
    lo_x, hi_x = lo_x - pad, hi_x + pad
    left, right, row_h = 170, 20, 20
    height = row_h * len(rows) + 40
    x = lambda v: left + (v - lo_x) / (hi_x - lo_x) * (width - left - right)  # noqa: E731
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
           f"aria-label='forest plot of {_e(label)}' font-size='11' font-family='sans-serif'>"]
    if overall is not None:
        out.append(f"<line x1='{x(overall):.1f}' y1='5' x2='{x(overall):.1f}' y2='{height - 25}' stroke='#888' "
                   "stroke-dasharray='4 3'/>")
    for i, (name, value, lo, hi) in enumerate(rows):
        y = 15 + i * row_h
        out.append(f"<text x='5' y='{y + 4}'>{_e(name)}</text>")
        if lo is not None and hi is not None:
            out.append(f"<line x1='{x(lo):.1f}' y1='{y}' x2='{x(hi):.1f}' y2='{y}' stroke='#1f77b4' stroke-width='2'/>")
        out.append(f"<circle cx='{x(value):.1f}' cy='{y}' r='4' fill='#1f77b4'/>")
    axis_y = height - 20
    out.append(f"<line x1='{left}' y1='{axis_y}' x2='{width - right}' y2='{axis_y}' stroke='#333'/>")
    for t in (lo_x + pad, (lo_x + hi_x) / 2, hi_x - pad):
        out.append(f"<text x='{x(t):.1f}' y='{axis_y + 14}' text-anchor='middle'>{t:.3f}</text>")
    out.append(f"<text x='{width - right}' y='{axis_y - 4}' text-anchor='end'>{_e(label)}</text></svg>")
    return "".join(out)


def lines_svg(series: list[tuple[str, list[float], list[float], list[float] | None, list[float] | None, str]],
              x_label: str, y_label: str, diagonal: bool = False, width: int = 460, height: int = 320) -> str:
    """Line chart of (name, xs, ys, band_low, band_high, colour) series, bands shaded."""
    xs = [v for s in series for v in s[1]]
    ys = [v for s in series for v in s[2]] + [v for s in series if s[3] for v in s[3] + s[4]]
    if not xs:
        return ""
    x0, x1 = (0.0, max(max(xs), 1e-9)) if not diagonal else (0.0, max(max(xs), max(ys), 1e-9))
    y0, y1 = (min(min(ys), 0.0), max(max(ys), 1e-9)) if not diagonal else (0.0, x1)
    m = 45
    px = lambda v: m + (v - x0) / (x1 - x0) * (width - m - 10)  # noqa: E731
    py = lambda v: height - m - (v - y0) / ((y1 - y0) or 1) * (height - m - 10)  # noqa: E731
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
           f"aria-label='{_e(y_label)} against {_e(x_label)}' font-size='11' font-family='sans-serif'>",
           f"<line x1='{m}' y1='{height - m}' x2='{width - 10}' y2='{height - m}' stroke='#333'/>",
           f"<line x1='{m}' y1='10' x2='{m}' y2='{height - m}' stroke='#333'/>",
           f"<text x='{width / 2}' y='{height - 10}' text-anchor='middle'>{_e(x_label)}</text>",
           f"<text x='12' y='{height / 2}' transform='rotate(-90 12 {height / 2})' text-anchor='middle'>"
           f"{_e(y_label)}</text>",
           f"<text x='{m}' y='{height - m + 14}' text-anchor='middle'>{x0:.2f}</text>",
           f"<text x='{width - 10}' y='{height - m + 14}' text-anchor='end'>{x1:.2f}</text>",
           f"<text x='{m - 3}' y='{py(y1) + 4:.1f}' text-anchor='end'>{y1:.2f}</text>",
           f"<text x='{m - 3}' y='{py(y0):.1f}' text-anchor='end'>{y0:.2f}</text>"]
    if diagonal:
        out.append(f"<line x1='{px(0):.1f}' y1='{py(0):.1f}' x2='{px(x1):.1f}' y2='{py(x1):.1f}' stroke='#aaa' "
                   "stroke-dasharray='4 3'/>")
    for i, (name, sx, sy, blo, bhi, colour) in enumerate(series):
        if blo and bhi:
            pts = [f"{px(a):.1f},{py(b):.1f}" for a, b in zip(sx, bhi, strict=True)] + \
                  [f"{px(a):.1f},{py(b):.1f}" for a, b in zip(reversed(sx), reversed(blo), strict=True)]
            out.append(f"<polygon points='{' '.join(pts)}' fill='{colour}' fill-opacity='0.15' stroke='none'/>")
        pts = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(sx, sy, strict=True))
        out.append(f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='2'/>")
        out.append(f"<text x='{width - 15}' y='{20 + 14 * i}' text-anchor='end' fill='{colour}'>{_e(name)}</text>")
    out.append("</svg>")
    return "".join(out)


COLOURS = {"none": "#d62728", "platt": "#1f77b4", "isotonic": "#2ca02c", "temperature": "#9467bd",
           "model": "#1f77b4", "treat all": "#ff7f0e", "treat none": "#7f7f7f"}


# ----------------------------------------------------------------------------------------------- sections


def build_card(con: duckdb.DuckDBPyConnection, run_id: str) -> Card:
    """The card of one run; ValueError naming the run when it is not in this warehouse/snapshot."""
    found = _rows(con, "SELECT * FROM ml.runs WHERE run_id = ?", [run_id])
    if not found:
        raise ValueError(f"run {run_id!r} is not in this warehouse (medtx status lists the runs)")
    run = found[0]
    task = find_task(run["task"])  # None: a stored name the registry no longer knows
    title = f"Model card: {run['model']} on {run['task']} ({run['dataset'] or '-'}), seed {run['seed']}" + (
        f" ({origin})" if (origin := _config_value(run["config"], "origin")) else "")
    data: dict = {"run_id": run_id, "task": run["task"], "model": run["model"], "dataset": run["dataset"],
                  "seed": run["seed"], "status": run["status"], "origin": origin or "trained in medtx"}
    if run["status"] != "completed":
        return _unfinished_card(run, title, data)
    figures = sm.Figures(collapsed=run["collapse_reason"] or "constant predictions" if run["collapsed"] else None,
                         synthetic=bool(run["is_synthetic"]), n_test_units=run["n_test_units"] or 0,
                         test_unit=_unit(run), min_units=iv.MIN_UNITS)
    headline = _headline(con, run, task, data, figures)
    trust = _trust_sections(con, run, task, data, figures)
    found_ = sm.findings(figures)
    data["summary"] = [{"finding": x.finding, "because": x.because} for x in found_]
    use = sm.intended_use(task, run["dataset"])
    data["intended_use"] = use
    data["title"] = title
    who = [Section(**parts) for parts in pop.sections(con, task, run["dataset"], data)]  # attrition, population
    study = Section(**st.section(con, run, data))
    drivers = Section(**dr.section(con, run, task, data))
    sections = [_summary(found_), Section("intended-use", "Intended use (from the task's declaration)",
                                          tables=[(["", ""], [[k.replace("_", " "), v] for k, v in use.items()])]),
                study, _lineage(run), _clock(task), _splits(con, run), *who, headline, drivers, *trust, _flags(run),
                _leakage(con, run), _limitations(con, run)]
    from medtx.evaluation.plp_card import card_section  # the PLP figures (ROC, PR, E-statistics, age x sex, ...)

    sections.insert(next(i for i, s in enumerate(sections) if s.id == "flags"), card_section(con, run_id, data))
    return Card(run_id, title, sections, data)


def _summary(found: list[sm.Finding]) -> Section:
    return Section("summary", "Summary: what these figures support",
                   ["Each conclusion is generated from the figures below (rules: medtx/evaluation/summary.py)."],
                   tables=[(["conclusion", "because"], [[x.finding, x.because] for x in found])])


def _unfinished_card(run: dict, title: str, data: dict) -> Card:
    """A failed (or still running) run: its status and one-line error, its lineage, nothing that reads as a result."""
    state = "FAILED" if run["status"] == "failed" else run["status"].upper()
    error = (str(run["error"] or "no error recorded").strip().splitlines() or ["no error recorded"])[0]
    title = f"{state}: {title}"
    finding = sm.Finding(f"This run {state.lower()}: it has no results" if state == "FAILED"
                         else "This run has not finished: it has no results yet",
                         f"error: {error}" if state == "FAILED" else "status: " + run["status"])
    data.update(title=title, error=error if state == "FAILED" else None,
                summary=[{"finding": finding.finding, "because": finding.because}], subgroups=[], recalibration=[],
                operating_points=[])
    return Card(run["run_id"], title, [_summary([finding]), _lineage(run)], data)


def _lineage(run: dict) -> Section:
    config = run["config"]
    try:
        pretty = json.dumps(json.loads(config) if isinstance(config, str) else config, indent=2, sort_keys=True)
    except (TypeError, ValueError):
        pretty = str(config)
    rows = [["run id", run["run_id"]], ["status", run["status"]], ["code version", run["code_version"] or "–"],
            ["data fingerprint", run["data_fingerprint"] or "–"], ["dataset", f"{run['dataset'] or '-'}"
                                                                      + (" (synthetic)" if run["is_synthetic"] else "")],
            ["started / finished (UTC)", f"{run['started_at']} / {run['finished_at']}"],
            ["pipeline run", run["pipeline_run_id"] or "–"], ["device", run["device"] or "–"],
            ["cut-off of the stored yes/no predictions (set metrics only; not an alerting threshold: see "
             "Operating points)", f"{_f(run['threshold'])} ({run['threshold_source'] or '-'})"]]
    paragraphs = []
    origin = _config_value(config, "origin")
    if origin:  # imported predictions (medtx.meds.import_predictions): say so before anything else
        rows.insert(1, ["trained", f"{origin}: predictions imported from {_config_value(config, 'source_file')} "
                               f"(sha256 {str(_config_value(config, 'source_sha256'))[:16]})"])
        paragraphs.append(f"This model was {origin.upper()}. medtx did not train it and did not see its "
                          "features; it checked that its predictions are exactly the held-out labels of this "
                          "task and scored them like its own runs (same test patients, same bootstrap, same "
                          "reference baseline). It has no validation predictions: no recalibration, no operating "
                          "points.")
    return Section("lineage", "Data and lineage", paragraphs, tables=[(["", ""], rows)], details=pretty)


def _config_value(config: object, key: str) -> object:
    try:
        parsed = json.loads(config) if isinstance(config, str) else config
    except (TypeError, ValueError):
        return None
    return parsed.get(key) if isinstance(parsed, dict) else None


def _clock(task) -> Section:
    if task is None:
        return Section("clock", "The task's clock", ["The task of this run is no longer registered."])
    when = task.clock.words or "not stated"
    paragraphs = [f"Task {task.name} ({task.kind}): {task.description}",
                  f"Prediction time: {when}" + (f" (SQL: {task.clock.prediction_time})" if task.clock.prediction_time else "")
                  + ". Features hold only events known at or before it (medtx/samples/clock.py)."]
    return Section("clock", "The task's clock", paragraphs)


def _splits(con: duckdb.DuckDBPyConnection, run: dict) -> Section:
    rows = []
    if run["dataset"] and _table_exists(con, "samples.splits"):
        rows = [[s, f"{n:,}"] for s, n in con.execute(
            "SELECT split, count(DISTINCT subject_id) FROM samples.splits WHERE dataset = ? AND task = ? "
            "GROUP BY split ORDER BY split", [run["dataset"], run["task"]]).fetchall()]
    n_test = con.execute("SELECT count(DISTINCT sample_id) FROM ml.predictions WHERE run_id = ?",
                         [run["run_id"]]).fetchall()[0][0]
    n_val = con.execute("SELECT count(DISTINCT sample_id) FROM ml.val_predictions WHERE run_id = ?",
                        [run["run_id"]]).fetchall()[0][0]
    para = [f"Test: {n_test:,} samples, {run['n_test_units'] or 0:,} {run['test_unit'] or 'units'} "
            f"(the bootstrap's units); validation predictions stored: {n_val:,} samples."]
    return Section("splits", "Split sizes", para, tables=[(["split", "patients (units)"], rows)] if rows else [])


def _headline(con: duckdb.DuckDBPyConnection, run: dict, task, data: dict, figures: sm.Figures) -> Section:
    names = list(task.scoring.metrics) if task is not None else []
    rows = _rows(con, "SELECT m.metric, m.averaging, m.value, m.ci_low, m.ci_high, m.ci_method, c.verdict, c.diff, "
                      "c.ci_low AS d_lo, c.ci_high AS d_hi, c.reference_run_id FROM ml.metrics m "
                      "LEFT JOIN ml.comparisons c ON c.run_id = m.run_id AND c.metric = m.metric "
                      "AND c.averaging = m.averaging WHERE m.run_id = ? AND m.split = 'test' "
                      "ORDER BY m.metric, m.averaging", [run["run_id"]])
    order = {n: i for i, n in enumerate(names)}
    rows.sort(key=lambda r: (order.get(r["metric"], len(order)), r["metric"], r["averaging"]))
    shown = [r for r in rows if r["metric"] not in ("n_samples", "n_patients")]
    # a metric the comparisons do not cover (AUROC) takes its overall verdict from the subgroups' 'overall' row:
    # the same paired bootstrap on every test patient, so it has a verdict wherever the groups have one
    whole = {(g["metric"], g["averaging"]): g for g in _rows(
        con, "SELECT metric, averaging, verdict, diff, diff_ci_low, diff_ci_high, reference_run_id FROM ml.subgroups "
             "WHERE run_id = ? AND attribute = 'overall' AND verdict IS NOT NULL", [run["run_id"]])}
    for r in shown:
        g = whole.get((r["metric"], r["averaging"]))
        if r["verdict"] is None and g is not None:
            r.update(verdict=g["verdict"], diff=g["diff"], d_lo=g["diff_ci_low"], d_hi=g["diff_ci_high"],
                     reference_run_id=g["reference_run_id"])
    table = [[r["metric"], r["averaging"], _ci(r["value"], r["ci_low"], r["ci_high"]),
              (r["verdict"] or "–") + (f" ({r['diff']:+.3f} [{_f(r['d_lo'])}, {_f(r['d_hi'])}])"
                                       if r["diff"] is not None and r["verdict"] != "too_small" else ""),
              _interval_method(r["ci_method"], _unit(run))] for r in shown]
    data["headline"] = [{"metric": r["metric"], "averaging": r["averaging"], **_obj(r["value"], r["ci_low"],
                                                                                     r["ci_high"]),
                         "verdict": r["verdict"], "diff": r["diff"], "reference_run_id": r["reference_run_id"]}
                        for r in shown]
    by = {(r["metric"], r["averaging"]): r for r in rows}
    for key, name in ((("auroc", "none"), "AUROC"), (("roc_auc_samples", "visit"), "AUROC (per visit)")):
        if key in by and by[key]["value"] is not None:
            r = by[key]
            figures.auroc, figures.auroc_name = (r["value"], r["ci_low"], r["ci_high"]), name
            break
    refs = {r["reference_run_id"] for r in rows if r["reference_run_id"]}
    unit = _unit(run)
    para = ["Point estimate on the whole test split with its 95% percentile interval over 1,000 bootstrap "
            f"resamples of test {unit}; the verdict is a paired bootstrap against the reference baseline "
            + (f"({', '.join(sorted(refs))}) " if refs else "") + f"on the same resampled {unit}."
            + (" The ECE carries no interval (its bootstrap is biased)." if ("ece", "none") in by else "")
            + (" AUROC's verdict (not among the task's compared metrics) is the same paired bootstrap over every "
               "test patient ('overall' row of the subgroup table)." if ("auroc", "none") in by else "")]
    return Section("headline", "Headline metrics (test)", para,
                   tables=[(["metric", "averaging", "value [95% CI]", "verdict vs reference (diff [95% CI])",
                             "interval method"], table)])


def _obj(value: float | None, lo: float | None, hi: float | None) -> dict:
    return {"value": value, "low": lo, "high": hi}


def _group_cell(g: dict | None) -> str:
    """A group's figure with its (Holm-adjusted) verdict, or why it is withheld."""
    if g is None:
        return "–"
    if g["too_small"]:
        why = g.get("withheld") or f"fewer than {iv.MIN_UNITS} test patients"
        return ("too small: " + why) if why.startswith("fewer than") else why
    text, raw, adjusted = _ci(g["value"], g["ci_low"], g["ci_high"]), g["verdict"], g.get("verdict_adjusted")
    if raw is None:
        return text
    if g["attribute"] == "overall":
        return f"{text} · {raw}"
    if adjusted is None:  # stored before the adjustment existed
        return f"{text} · {raw} (unadjusted)"
    return f"{text} · {adjusted}" + (f" (unadjusted: {raw})" if raw != adjusted else "")


def _subgroup_section(con: duckdb.DuckDBPyConnection, rid: str, task, groups: list[dict], data: dict,
                      figures: sm.Figures) -> Section:
    sub = Section("subgroups", "Subgroups")
    preferred = [*(task.scoring.metrics if task is not None else ()), "citl"]
    metrics = sorted(dict.fromkeys((g["metric"], g["averaging"]) for g in groups),
                     key=lambda m: preferred.index(m[0]) if m[0] in preferred else len(preferred))
    overall = {(m, a): v for m, a, v in con.execute(
        "SELECT metric, averaging, value FROM ml.metrics WHERE run_id = ? AND split = 'test'", [rid]).fetchall()}
    family = [g for g in groups if g["attribute"] != "overall"
              and g["verdict"] in ("better", "worse", "no_detectable_difference")]
    raw = sum(g["verdict"] in ("better", "worse") for g in family)
    adjusted = sum(g.get("verdict_adjusted") in ("better", "worse") for g in family)
    figures.group_verdicts = (len(family), raw, adjusted)
    whole = next((g for g in groups if g["attribute"] == "overall" and g["metric"] in ("auroc", "roc_auc_samples")
                  and not g["too_small"] and g["value"] is not None), None)
    if figures.auroc is None and whole is not None:  # ml.metrics holds no AUROC row: the same figure, recomputed
        figures.auroc = (whole["value"], whole["ci_low"], whole["ci_high"])
    sub.paragraphs.append(
        "Groups: sex, age band at admission (<50, 50-64, 65-79, >=80), ethnicity group, insurance, admission type "
        "(medtx/evaluation/groups.py); 'overall' is every test patient. Each group's figure has a 95% "
        f"patient-bootstrap interval. A group's figures are withheld below {iv.MIN_UNITS} test patients, 10 events "
        "or 10 non-events (medtx/evaluation/floors.py); a withheld group is never part of a gap. citl = observed "
        "minus expected event rate (calibration-in-the-large).")
    if family:
        sub.paragraphs.append(
            f"Verdicts against the reference baseline within each group are Holm-adjusted over the run's "
            f"{len(family)} group verdicts (family level 2.5%): {adjusted} read better/worse. Unadjusted "
            f"(exploratory), {raw} read better/worse, and about {len(family) * iv.ALPHA:.1f} would by chance alone if the model "
            "equalled the reference. The 'overall' row gives each metric's overall verdict.")
    head = ["attribute", "group", "patients", "samples", "events"] + [m for m, _ in metrics]
    keyed = {(g["attribute"], g["grp"], g["metric"], g["averaging"]): g for g in groups}
    seen = sorted(dict.fromkeys((g["attribute"], g["grp"]) for g in groups), key=lambda k: k[0] != "overall")
    table, twin = [], []
    for attribute, grp in seen:
        first = next(g for g in groups if g["attribute"] == attribute and g["grp"] == grp)
        table.append([attribute, grp, str(first["n_patients"]), str(first["n_samples"]), str(first["n_positives"]),
                      *[_group_cell(keyed.get((attribute, grp, m, a))) for m, a in metrics]])
        per = {}
        for m, a in metrics:
            g = keyed.get((attribute, grp, m, a))
            per[m] = None if g is None or g["too_small"] else {
                **_obj(g["value"], g["ci_low"], g["ci_high"]), "verdict": g.get("verdict_adjusted") or g["verdict"],
                "verdict_unadjusted": g["verdict"], "p_value": g.get("p_value")}
        auroc = per.get("auroc")
        twin.append({"attribute": attribute, "group": grp, "patients": first["n_patients"],
                     "samples": first["n_samples"], "events": first["n_positives"],
                     "withheld": (first.get("withheld") or "too small") if first["too_small"] else None,
                     "auroc": None if auroc is None else {k: auroc[k] for k in ("value", "low", "high")},
                     "metrics": per})
    data["subgroups"] = twin
    sub.tables.append((head, table))
    m0 = metrics[0]
    forest = [(f"{g['attribute']}: {g['grp']}", g["value"], g["ci_low"], g["ci_high"]) for g in groups
              if (g["metric"], g["averaging"]) == m0 and not g["too_small"] and g["value"] is not None
              and g["attribute"] != "overall"]
    sub.figures.append(forest_svg(forest, overall.get(m0), m0[0]))
    gaps = _rows(con, "SELECT * FROM ml.subgroup_gaps WHERE run_id = ? ORDER BY metric, gap DESC", [rid])
    data["gaps"] = [{"metric": g["metric"], "attribute": g["attribute"], "group_high": g["group_high"],
                     "group_low": g["group_low"], **_obj(g["gap"], g["ci_low"], g["ci_high"]),
                     "detected": g["detected"], "largest": g["largest"]} for g in gaps]
    if gaps:
        sub.paragraphs.append(
            "Largest gap per attribute: the largest difference between two of its groups (figures shown, not "
            "'unknown') with an interval simultaneous over every pair of groups and the metrics (97.5% level, "
            "bootstrap max-t). Detected = the interval excludes 0.")
        sub.tables.append((["metric", "attribute", "groups (high − low)", "gap [simultaneous CI]", "detected",
                            "run's largest"],
                           [[g["metric"], g["attribute"], f"{g['group_high']} − {g['group_low']}",
                             _ci(g["gap"], g["ci_low"], g["ci_high"]), "yes" if g["detected"] else "no",
                             "yes" if g["largest"] else ""] for g in gaps]))
    return sub


CAL_SHOWN = ("citl", "slope", "brier", "ece")


def _calibration_section(con: duckdb.DuckDBPyConnection, rid: str, data: dict, figures: sm.Figures) -> Section:
    cal = Section("calibration", "Calibration")
    calib = _rows(con, "SELECT * FROM ml.calibration WHERE run_id = ? ORDER BY method, metric", [rid])
    recal = _rows(con, "SELECT * FROM ml.recalibration WHERE run_id = ? ORDER BY method", [rid]) \
        if _table_exists(con, "ml.recalibration") else []
    status = {r["method"]: r for r in recal}
    data["recalibration"] = [{"method": r["method"], "status": r["status"], "reason": r["reason"],
                              "validation_samples": r["n_fit"], "validation_events": r["n_events"],
                              "oof_logloss_original": r["oof_logloss_original"],
                              "oof_logloss_mapped": r["oof_logloss_mapped"], "distinct_risks": r["distinct_risks"]}
                             for r in recal]
    figures.recalibration = [(r["method"], r["status"], r["reason"]) for r in recal]
    if not calib:
        cal.paragraphs.append("No calibration figures (predictions stored truncated, or no validation predictions).")
        data["calibration"] = []
        return cal
    cell = {(c["method"], c["metric"]): c for c in calib}
    for name in ("citl", "slope"):
        c = cell.get(("none", name))
        if c is not None and c["value"] is not None:
            setattr(figures, name, (c["value"], c["ci_low"], c["ci_high"]))
    methods = list(dict.fromkeys(["none", *(c["method"] for c in calib), *status]))
    data["calibration"] = [{"method": m, **{n: _obj(cell[(m, n)]["value"], cell[(m, n)]["ci_low"],
                                                     cell[(m, n)]["ci_high"]) for n in CAL_SHOWN if (m, n) in cell}}
                           for m in methods if any((m, n) in cell for n in CAL_SHOWN)]
    cal.paragraphs.append(
        "Before ('none') and after post-hoc recalibration fitted on the validation predictions only, applied "
        "to test. citl: observed minus expected rate (0 = calibrated); slope: logistic calibration slope "
        "(1 = calibrated, < 1 too extreme); 95% patient-bootstrap intervals; the ECE without one. A map is "
        "recommended only when it lowers the out-of-fold validation log-loss (5 folds of validation patients); "
        "a Platt map with slope <= 0 is refused (it would reverse the ranking); a map is fitted only with at least "
        "20 validation events (medtx/evaluation/floors.py). A monotone map leaves the ranking as it is: the "
        "discrimination is the headline AUROC, whatever a map's ties do to it.")
    best = [m for m, r in status.items() if r["status"] == "recommended"]
    if status:
        cal.paragraphs.append(f"Recommendation: recalibrate with {best[0]}." if best
                              else "Recommendation: keep the original probabilities.")
    rows = []
    for m in methods:
        st = status.get(m)
        note = "original probabilities" if m == "none" else (st["status"] + ": " + st["reason"] if st else "–")
        if st is not None and st["distinct_risks"] is not None and m == "isotonic":
            note += f"; {st['distinct_risks']} distinct test risks after the map"
        rows.append([m, *[_ci(cell[(m, n)]["value"], cell[(m, n)]["ci_low"], cell[(m, n)]["ci_high"])
                          if (m, n) in cell else "–" for n in CAL_SHOWN],
                     f"{cell[(m, 'citl')]['n_fit']} validation samples" if cell.get((m, "citl"), {}).get("n_fit")
                     else "–", note])
    cal.tables.append((["method", *CAL_SHOWN, "fitted on", "status"], rows))
    med, worst = cell.get(("none", "ece_label_median")), cell.get(("none", "ece_label_max"))
    if worst is not None and ("none", "ece") in cell:
        info = json.loads(worst["params"] or "{}")
        cal.paragraphs.append(
            f"Multi-label: pooled ECE {_f(cell[('none', 'ece')]['value'])} over all (sample, label) cells; per "
            f"label (the {info.get('labels', '?')} labels with a test event) median {_f(med['value'])}, worst "
            f"{_f(worst['value'])} (label {info.get('label', '?')}, {info.get('events', '?')} events). A small "
            "pooled ECE can hide badly calibrated labels.")
        data["per_label_ece"] = {"pooled": cell[("none", "ece")]["value"], "median": med["value"],
                                 "max": worst["value"], "worst_label": info.get("label")}
    rel = _rows(con, "SELECT * FROM ml.reliability WHERE run_id = ? ORDER BY method, bin", [rid])
    shown = [m for m in methods if any(r["method"] == m for r in rel)]
    series = []
    for m in shown:
        pts = [r for r in rel if r["method"] == m]
        band = m == "none" or m == shown[-1]
        series.append((m, [r["mean_pred"] for r in pts], [r["observed"] for r in pts],
                       [r["ci_low"] for r in pts] if band else None,
                       [r["ci_high"] for r in pts] if band else None, COLOURS.get(m, "#333")))
    cal.figures.append(lines_svg(series, "mean predicted probability", "observed rate", diagonal=True))
    return cal


def _operating_section(con: duckdb.DuckDBPyConnection, run: dict, data: dict, figures: sm.Figures) -> Section:
    rid = run["run_id"]
    ops = Section("operating-points", "Operating points")
    points = _rows(con, "SELECT * FROM ml.operating_points WHERE run_id = ? AND target <> 'grid' "
                        "ORDER BY threshold DESC, metric", [rid])
    targets = _rows(con, "SELECT * FROM ml.operating_targets WHERE run_id = ?", [rid]) \
        if _table_exists(con, "ml.operating_targets") else []
    cell = {(p["target"], p["metric"]): p for p in points}
    names = list(dict.fromkeys([*(p["target"] for p in points), *(t["target"] for t in targets)]))
    status = {t["target"]: t for t in targets}
    prevalence = con.execute("SELECT avg(CAST(y_true AS DOUBLE)) FROM ml.predictions WHERE run_id = ?",
                             [rid]).fetchall()[0][0]
    figures.prevalence = prevalence
    twin, rows = [], []
    for t in names:
        st = status.get(t)
        if (t, "ppv") not in cell:
            reason = st["reason"] if st else "unreachable"
            rows.append([t, reason, "–", str(st["val_alerts"]) if st else "–", *["–"] * len(FIGS)])
            twin.append({"target": t, "status": "unreachable", "reason": reason, "threshold": None,
                         "validation": None, "test": None})
            figures.operating.append((t, "unreachable", reason, None, None, None))
            continue
        threshold = cell[(t, "ppv")]["threshold"]
        digits = {f: 1 if f in ("alerts_per_100", "nne") else 3 for f in FIGS}
        rows.append([t, "chosen on validation", f"{threshold:.4f}", str(st["val_alerts"]) if st else "–",
                     *[f"{_f(cell[(t, f)]['val_value'], digits[f])} / "
                       + _ci(cell[(t, f)]["value"], cell[(t, f)]["ci_low"], cell[(t, f)]["ci_high"], digits[f])
                       for f in FIGS]])
        twin.append({"target": t, "status": "chosen", "reason": "", "threshold": threshold,
                     "validation_alerts": st["val_alerts"] if st else None,
                     "validation": {f: cell[(t, f)]["val_value"] for f in FIGS},
                     "test": {f: _obj(cell[(t, f)]["value"], cell[(t, f)]["ci_low"], cell[(t, f)]["ci_high"])
                              for f in FIGS}})
        p = cell[(t, "ppv")]
        figures.operating.append((t, "chosen", "", p["value"], p["ci_low"], p["ci_high"]))
    data["operating_points"] = twin
    data["prevalence"] = prevalence
    if rows:
        ops.paragraphs.append(
            "Each threshold is chosen on validation for its target (at least "
            f"{MIN_VAL_ALERTS} validation alerts, else the target is unreachable and says why), then applied to "
            "test. Each cell: validation value / test value [95% patient-bootstrap interval]. alerts_per_100 = "
            "alerts per 100 admissions; nne = number needed to evaluate (alerts per true positive)."
            + (f" Test prevalence {prevalence:.3f}: a PPV at or below it is no better than chance."
               if prevalence is not None else ""))
        ops.tables.append((["target", "status", "threshold", "validation alerts", *FIGS], rows))
    else:
        ops.paragraphs.append("No operating points: they are computed for binary tasks with stored validation "
                              "predictions.")
    curve = _rows(con, "SELECT * FROM ml.decision_curve WHERE run_id = ? ORDER BY threshold", [rid])
    figures.decision = [(c["threshold"], c["net_benefit"], c["ci_low"], c["ci_high"], c["treat_all"]) for c in curve]
    shown = [c for c in curve if c["threshold"] <= 0.5]
    if shown and rows:
        from medtx.evaluation.plp_svg import decision_svg

        floor = -(prevalence or 0.05)  # model and treat-all clipped at the same floor; treat none is the 0 line
        ops.paragraphs.append("Decision curve: net benefit of acting on the model at each threshold probability "
                              "against treating everyone and no one (both curves cut at "
                              f"{floor:.3f}, minus the test prevalence; the band is the model's 95% interval).")
        ops.figures.append(decision_svg([c["threshold"] for c in shown], [c["net_benefit"] for c in shown],
                                        [c["treat_all"] for c in shown], floor, max(prevalence or 0.05, 0.01),
                                        ([c["ci_low"] for c in shown], [c["ci_high"] for c in shown])))
    return ops


def _trust_sections(con: duckdb.DuckDBPyConnection, run: dict, task, data: dict, figures: sm.Figures
                    ) -> list[Section]:
    rid = run["run_id"]
    groups = _rows(con, "SELECT * FROM ml.subgroups WHERE run_id = ? ORDER BY attribute, metric, grp", [rid])
    data.update(subgroups=[], gaps=[], calibration=[], recalibration=[], operating_points=[])
    if not groups:
        note = ("No subgroup, calibration or operating-point figures: they are computed for binary and "
                "multi-label runs whose samples are patients' admissions (the EHR tasks and readmission from "
                "discharge notes) with stored test predictions.")
        return [Section("subgroups", "Subgroups", [note]), Section("calibration", "Calibration", [note]),
                Section("operating-points", "Operating points", [note])]
    return [_subgroup_section(con, rid, task, groups, data, figures), _calibration_section(con, rid, data, figures),
            _operating_section(con, run, data, figures)]


def _flags(run: dict) -> Section:
    if run["collapsed"]:
        return Section("flags", "Collapse flags", [f"COLLAPSED: {run['collapse_reason'] or 'constant predictions'}. "
                                                   "Its figures describe a model that does not discriminate."])
    return Section("flags", "Collapse flags", ["Not collapsed: the test predictions vary (medtx/metrics/collapse.py)."])


def _leakage(con: duckdb.DuckDBPyConnection, run: dict) -> Section:
    if not _table_exists(con, "samples.leakage_gate"):
        return Section("leakage", "Leakage gate", ["This warehouse has no leakage-gate table."])
    rows = _rows(con, "SELECT * FROM samples.leakage_gate WHERE dataset = ? AND task = ?",
                 [run["dataset"], run["task"]])
    if not rows:
        return Section("leakage", "Leakage gate", ["No leakage-gate record for this task and dataset (tasks split "
                                                   "by text group or pair are not gated)."])
    g = rows[0]
    return Section("leakage", "Leakage gate", [f"Status: {g['status']}. {g['message']}"],
                   tables=[(["samples", "split overlap", "late codes", "shortcuts", "acknowledged"],
                            [[str(g["samples"]), str(g["split_overlap"]), str(g["late_codes"]),
                              str(g["shortcuts"]), str(g["acknowledged"])]])])


def _limitations(con: duckdb.DuckDBPyConnection, run: dict) -> Section:
    items = []
    if run["is_synthetic"]:
        items.append("The data are SYNTHETIC (medtx synth): no figure here describes real patients.")
    if (run["n_test_units"] or 0) < iv.MIN_UNITS:
        items.append(f"Fewer than {iv.MIN_UNITS} test {_unit(run)}: no verdict is drawn.")
    small = con.execute("SELECT count(DISTINCT attribute || grp) FROM ml.subgroups WHERE run_id = ? AND too_small",
                        [run["run_id"]]).fetchall()[0][0]
    if small:
        items.append(f"{small} subgroup(s) fall below the floors (fewer than {iv.MIN_UNITS} test patients, 10 events "
                     "or 10 non-events) and show no figure.")
    items.append("One training seed: a claim that one model beats another needs >= 3 seeds that agree.")
    trusted = con.execute("SELECT count(*) FROM ml.subgroups WHERE run_id = ?", [run["run_id"]]).fetchall()[0][0]
    if trusted:  # the run has subgroups, calibration and operating points (admissions of patients)
        items += ["Subgroups are read from the warehouse's demographics (raw.patients/raw.admissions) as recorded; "
                  "'unknown' collects missing and undeclared values.",
                  "Thresholds and recalibration are fitted on the validation split of this dataset; another "
                  "hospital's population would need its own."]
    return Section("limitations", "Limitations", items)


def render(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, str]:
    """(HTML, Markdown) of the run's card."""
    card = build_card(con, run_id)
    return card.html(), card.markdown()
