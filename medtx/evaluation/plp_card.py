"""The standard figures (OHDSI PatientLevelPrediction) of one run, read from a warehouse or a published snapshot:
what the model card's `standard-figures` section and the run page show. Computed when the page is drawn, from
the stored test predictions (ml.predictions), the test admissions' demographics (raw.patients, raw.admissions)
and the recorded metrics (ml.metrics, ml.epochs); nothing is written. The numbers: medtx.evaluation.plp; the
drawing: medtx.evaluation.plp_svg.

Train vs validation vs test: training figures are ml.metrics' 'train' rows, the apparent performance the EHR runner
records when it scores the fitted model on its own training split once (point estimates, no interval, optimistic by
construction; no training prediction is stored); a run recorded without them (text runners, older runs) shows
'not stored'. A neural run also shows its training loss at its best epoch beside the validation loss (ml.epochs).
Validation figures are ml.metrics' 'val' rows (whole validation split, recorded at training time); test figures
carry their 95% patient-bootstrap interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import numpy as np

from medtx.evaluation import plp
from medtx.evaluation import plp_svg as svg
from medtx.evaluation.groups import GROUP_ORDER, UNKNOWN, sample_groups
from medtx.metrics import intervals as iv

KINDS = ("binary", "multilabel")
SEXES = ("female", "male")
BANDS = tuple(b for b in GROUP_ORDER["age_band"] if b != UNKNOWN)
LABEL_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


@dataclass
class Panel:
    """One figure: its SVG, or (svg == "") the sentence `note` shown instead of empty axes; `caption` is said
    beside a drawn figure (e.g. the cells it leaves out)."""

    id: str
    title: str
    svg: str
    note: str = ""
    caption: str = ""


@dataclass
class Standard:
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    panels: list[Panel] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # the JSON twin's `standard_figures`


def _f(v: float | None, digits: int = 3) -> str:
    return "–" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def _ci(v: dict) -> str:
    return _f(v["value"]) + (f" [{_f(v['low'])}, {_f(v['high'])}]" if np.isfinite(v.get("low") or np.nan) else "")


def _num(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _run(con: duckdb.DuckDBPyConnection, run_id: str) -> dict | None:
    cur = con.execute("SELECT * FROM ml.runs WHERE run_id = ?", [run_id])
    row = cur.fetchone()
    return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))


def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    schema, name = table.split(".")
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


def standard_figures(con: duckdb.DuckDBPyConnection, run_id: str) -> Standard:
    """Every standard figure of a run; a run they do not apply to gets one sentence saying why."""
    from medtx.evaluation.uncertainty import load_run_data
    from medtx.tasks import find_task

    out = Standard()
    run = _run(con, run_id)
    task = find_task(run["task"]) if run is not None else None
    if run is None or run["status"] != "completed":
        out.paragraphs.append("No standard figures: the run has no results.")
        return out
    head, rows = _by_split(con, run, task, out.data)
    if rows:
        out.tables.append((head, rows))
    else:  # no empty table: say why
        out.paragraphs.append("Train vs validation vs test: no metric of this run is stored for both validation and "
                              "test.")
    try:
        data = load_run_data(con, run_id) if task is not None and task.kind in KINDS else None
    except ValueError as exc:  # e.g. predictions stored without their patient: say why, draw nothing
        out.paragraphs.append(f"No ROC, precision-recall or calibration figures: {exc}.")
        return out
    if data is None or data.kind not in KINDS:
        out.paragraphs.append("No ROC, precision-recall or calibration figures: they are drawn for binary and "
                              "multi-label runs with stored test predictions.")
        return out
    if data.truncated:
        out.paragraphs.append("No ROC, precision-recall or calibration figures: this run stored only the true, "
                              "predicted or top labels of each sample, and the missing cells would read as confident "
                              "negatives.")
        return out
    y, p = data.arrays["y"].astype(np.float64), data.arrays["p"].astype(np.float64)
    n_units, inverse = iv.unit_index(data.units)
    counts = iv.resample_counts(n_units, iv.N_BOOT, 0)
    pooled = "" if y.ndim == 1 else " (all sample x label cells pooled)"
    _discrimination(y, p, pooled, out)
    _calibration(y, p, inverse, counts, pooled, out)
    _age_sex(con, run, data, y, p, inverse, counts, out)
    if y.ndim == 2:
        labels = sorted(str(x) for x, in con.execute("SELECT DISTINCT label FROM ml.predictions WHERE run_id = ?",
                                                     [run_id]).fetchall())
        _per_label(y, p, labels, out)
    return out


def _discrimination(y: np.ndarray, p: np.ndarray, pooled: str, out: Standard) -> None:
    fpr, tpr, _ = plp.roc_curve(y, p)
    precision, recall, _ = plp.pr_curve(y, p)
    events = int(y.sum())
    prevalence = float(y.mean())
    if events == 0 or events == y.size:
        note = f"No ROC or precision-recall curve: the test split has {'no events' if not events else 'only events'}."
        out.panels += [Panel("roc", "ROC curve", "", note), Panel("pr", "Precision-recall curve", "", note)]
        out.data.update(roc=None, pr=None)
    else:
        auroc, ap = plp.auc(fpr, tpr), plp.average_precision(precision, recall)
        f, t = plp.thin(fpr, tpr)
        r, pr = plp.thin(np.r_[0.0, recall], np.r_[1.0, precision])
        out.data["roc"] = {"auroc": auroc, "fpr": f, "tpr": t, "points_total": len(fpr)}
        out.data["pr"] = {"average_precision": ap, "prevalence": prevalence, "recall": r, "precision": pr,
                          "points_total": len(recall) + 1}
        out.panels += [Panel("roc", "ROC curve" + pooled, svg.roc_svg(f, t, auroc)),
                       Panel("pr", "Precision-recall curve" + pooled, svg.pr_svg(r, pr, prevalence, ap))]
    edges, ev, ne = plp.distribution(y, p)
    out.data["distribution"] = {"edges": edges, "events": ev, "non_events": ne}
    out.panels.append(Panel("distribution", "Prediction distribution by outcome" + pooled,
                            svg.distribution_svg(edges, ev, ne), "No test predictions to draw."))


def _calibration(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray, pooled: str,
                 out: Standard) -> None:
    smooth = plp.smooth_calibration(y, p)
    e = plp.e_statistics(p, smooth.fitted)
    brier = plp.scaled_brier(y, p, inverse, counts)
    edges, ev, ne = plp.distribution(y, p)
    x, yy = plp.thin(smooth.x, smooth.y)
    out.data["smoothed_calibration"] = {"method": plp.SMOOTHER, "x": x, "y": yy, "histogram_edges": edges,
                                        "histogram": [a + b for a, b in zip(ev, ne, strict=True)]}
    out.data["e_statistics"] = e
    out.data["scaled_brier"] = brier
    out.panels.append(Panel("smoothed-calibration", "Smoothed calibration with the histogram of predictions" + pooled,
                            svg.calibration_svg([("", x, yy, svg.MODEL)],
                                                [a + b for a, b in zip(ev, ne, strict=True)], edges)))
    out.paragraphs.append(
        f"Smoothed calibration: {plp.SMOOTHER} (Austin & Steyerberg, Stat Med 2019). E-statistics, the absolute "
        "difference between the smoothed observed rate and the prediction over the test samples" + pooled + ": "
        f"Eavg (ICI) {_f(e['eavg'])}, E50 {_f(e['e50'])}, E90 {_f(e['e90'])}, Emax {_f(e['emax'])} (no interval). "
        f"Scaled Brier 1 - Brier/Brier_null = {_ci(brier)} (95% patient-bootstrap interval; Brier "
        f"{_f(brier['brier'], 4)}, Brier_null {_f(brier['brier_null'], 4)} = predicting the test prevalence"
        + (" of each label" if pooled else "") + " to everyone; 0 = no better than the prevalence).")


def _age_sex(con: duckdb.DuckDBPyConnection, run: dict, data, y: np.ndarray, p: np.ndarray, inverse: np.ndarray,
             counts: np.ndarray, out: Standard) -> None:
    title = "Calibration by age band x sex (test)"
    if not (_has(con, "raw.admissions") and _has(con, "raw.patients")):
        out.panels.append(Panel("age-sex", title, "", "No calibration by age and sex: this warehouse holds no "
                                                      "demographics (raw.patients, raw.admissions)."))
        out.data["calibration_by_age_sex"] = []
        return
    try:
        hadm = np.array([int(s) for s in data.sample_ids], dtype=np.int64)
    except ValueError:
        out.panels.append(Panel("age-sex", title, "", "No calibration by age and sex: the test samples are not "
                                                      "admissions."))
        out.data["calibration_by_age_sex"] = []
        return
    groups = sample_groups(con, run["dataset"], hadm)
    cells = plp.demographic_cells(y, p, data.units, groups["age_band"], groups["sex"], counts, inverse, BANDS, SEXES)
    out.data["calibration_by_age_sex"] = [
        {"age_band": c.age_band, "sex": c.sex, "patients": c.patients, "samples": c.samples, "events": c.events,
         "withheld": c.withheld, "observed": None if c.withheld else {"value": c.observed, "low": _num(c.observed_low),
                                                                      "high": _num(c.observed_high)},
         "expected": c.expected} for c in cells]
    shown = {(c.age_band, c.sex): (c.observed, c.observed_low, c.observed_high, c.expected) for c in cells
             if c.withheld is None}
    withheld = [c for c in cells if c.withheld]
    left_out = ("Withheld cells: " + "; ".join(f"{c.sex} {c.age_band}: {c.withheld}" for c in withheld) + "."
                if withheld else "")
    note = "No cell reaches the floors (30 test patients, 10 events, 10 non-events): no figure. " + left_out
    out.panels.append(Panel("age-sex", title, svg.cells_svg(list(BANDS), list(SEXES), shown), note, left_out))
    out.tables.append((["age band", "sex", "patients", "samples", "events", "observed [95% CI]", "expected",
                        "observed − expected"],
                       [[c.age_band, c.sex, str(c.patients), str(c.samples), str(c.events),
                         *([c.withheld, "–", "–"] if c.withheld else
                           [f"{_f(c.observed)} [{_f(c.observed_low)}, {_f(c.observed_high)}]", _f(c.expected),
                            f"{c.observed - c.expected:+.3f}"])] for c in cells]))


def _per_label(y: np.ndarray, p: np.ndarray, labels: list[str], out: Standard) -> None:
    items = plp.per_label(y, p, labels)
    shown = [i for i in items if i.smooth is not None]
    out.data["per_label_calibration"] = [{"label": i.label, "events": i.events, "withheld": i.withheld,
                                          **{k: i.e.get(k) for k in ("eavg", "e90", "emax")}} for i in items]
    curves = [(f"{i.label} (Eavg {i.e['eavg']:.3f})", *plp.thin(i.smooth.x, i.smooth.y), LABEL_COLOURS[k])
              for k, i in enumerate(shown[:plp.PER_LABEL_SHOWN])]
    out.panels.append(Panel("per-label", f"Per-label smoothed calibration (the {len(curves)} labels with most test "
                                         "events; the pooled figure beside)",
                            svg.calibration_svg(curves, title="Per-label smoothed calibration (test)"),
                            f"No label has {plp.floors.MIN_GROUP_EVENTS} test events and as many non-events: no "
                            "per-label curve."))
    worst = sorted(shown, key=lambda i: -i.e["eavg"])[:10]
    if worst:
        out.tables.append((["label (worst Eavg first)", "test events", "Eavg", "E90", "Emax"],
                           [[i.label, str(i.events), _f(i.e["eavg"]), _f(i.e["e90"]), _f(i.e["emax"])] for i in worst]))
    out.paragraphs.append(f"Per label: {len(shown)} of {len(items)} labels have at least "
                          f"{plp.floors.MIN_GROUP_EVENTS} test events and non-events and get their own curve and "
                          "E-statistics; the table lists the 10 worst by Eavg.")


def _by_split(con: duckdb.DuckDBPyConnection, run: dict, task, data: dict) -> tuple[list[str], list[list[str]]]:
    """Train vs validation vs test: what is stored for each split (see the module docstring)."""
    rid = run["run_id"]
    rows = con.execute("SELECT split, metric, averaging, value, ci_low, ci_high FROM ml.metrics WHERE run_id = ? "
                       "AND split IN ('train', 'val', 'test') AND metric NOT IN ('n_samples', 'n_patients')",
                       [rid]).fetchall()
    cell = {(s, m, a): (v, lo, hi) for s, m, a, v, lo, hi in rows}
    order = list(task.scoring.metrics) if task is not None else []
    both = sorted({(m, a) for s, m, a in cell if s == "val" and ("test", m, a) in cell},
                  key=lambda k: (order.index(k[0]) if k[0] in order else len(order), k))
    loss = {}
    if run["best_epoch"] is not None:
        loss = dict(con.execute("SELECT split, value FROM ml.epochs WHERE run_id = ? AND epoch = ? AND metric = 'loss'",
                                [rid, run["best_epoch"]]).fetchall())
    train = {(m, a): cell[("train", m, a)][0] for m, a in both if ("train", m, a) in cell}
    table = [[m + ("" if a == "none" else f" ({a})"), _f(train[(m, a)]) if (m, a) in train else "not stored",
              _f(cell[("val", m, a)][0]), _f(cell[("test", m, a)][0])
              + (f" [{_f(cell[('test', m, a)][1])}, {_f(cell[('test', m, a)][2])}]"
                 if cell[("test", m, a)][1] is not None else "")] for m, a in both]
    if loss:
        table.append([f"loss at the best epoch ({run['best_epoch']})", _f(loss.get("train"), 4),
                      _f(loss.get("val"), 4), "–"])
    data["performance_by_split"] = [{"metric": m, "averaging": a, "train": train.get((m, a)),
                                     "validation": cell[("val", m, a)][0],
                                     "test": {"value": cell[("test", m, a)][0], "low": cell[("test", m, a)][1],
                                              "high": cell[("test", m, a)][2]}} for m, a in both]
    data["loss_at_best_epoch"] = {"train": loss.get("train"), "validation": loss.get("val")} if loss else None
    return ["metric", "train (apparent)", "validation", "test [95% CI]"], table


TRAIN_NOTE = ("Train vs validation vs test: train is the apparent performance, the fitted model scored once on the "
              "samples it was fitted on (point estimates, no interval): optimistic by construction, so a gap between "
              "train and validation measures overfitting, not the model's worth; a run recorded without it reads 'not "
              "stored' (no training prediction is kept). A neural run also shows its training loss at the best epoch "
              "beside the validation loss. Validation: the whole validation split, recorded at training time; test: "
              "with its 95% bootstrap interval (over the run's test units: patients, text groups). A large drop from "
              "validation to test means the model or its threshold was tuned to validation.")


def card_section(con: duckdb.DuckDBPyConnection, run_id: str, data: dict):
    """The model card's `standard-figures` section; its JSON twin under data['standard_figures']."""
    from medtx.evaluation.card import Section

    std = standard_figures(con, run_id)
    data["standard_figures"] = std.data
    section = Section("standard-figures", "Standard figures (OHDSI PatientLevelPrediction)",
                      [TRAIN_NOTE, *std.paragraphs], tables=std.tables)
    for panel in std.panels:
        if panel.svg:
            section.figures.append(panel.svg)
            if panel.caption:
                section.paragraphs.append(f"{panel.title}: {panel.caption}")
        else:
            section.paragraphs.append(f"{panel.title}: {panel.note}")
    return section
