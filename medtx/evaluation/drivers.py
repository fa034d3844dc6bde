"""What drives the score: a model summary for the card, with every code in plain words where a dictionary knows it
(ref.icd9_diagnoses, ref.icd9_procedures, ref.atc; static tokens spelled out). Read-only over a warehouse or snapshot.

| model | what the card shows | stored where |
|---|---|---|
| `logreg` | the largest coefficients (log-odds per present code: every feature is a 0/1 code indicator); binary: the most positive and most negative, multi-label: the largest (code, label) pairs | `ml.runs.config.drivers`, kept at fit time (medtx.models.logreg.top_coefficients) |
| `lightgbm` | the codes with the largest share of the total split gain (no sign: a code matters, not in which direction) | `ml.runs.config.drivers` (medtx.models.gbm.top_importances) |
| neural models | the codes receiving the most attention in the showcase test samples whose weights are stored (last layer, mean over heads and queries, as a multiple of a uniform spread over the sequence) | `ml.attention` |

A run recorded before the drivers were kept, a baseline without parameters (most_frequent, copy_last, oracle) or an
imported run says so instead. Attention is where a model looked in a few samples, not why it predicted what it did
(Jain & Wallace, NAACL 2019): the card says so beside it.
"""

from __future__ import annotations

import json
import re

import duckdb

from medtx.tasks import Task

TOP_ATTENTION = 15
_VISIT = re.compile(r"^v\d+:")
SPECIAL = ("[CLS]", "[SEP]", "[MASK]", "<pad>", "<unk>", "[PAD]", "[UNK]")
DICTIONARIES = {"diagnosis": "SELECT icd9_code, long_title FROM ref.icd9_diagnoses WHERE icd9_code IN "
                             "(SELECT unnest($codes))",
                "procedure": "SELECT icd9_code, long_title FROM ref.icd9_procedures WHERE icd9_code IN "
                             "(SELECT unnest($codes))",
                "drug": "SELECT atc_code, atc_name FROM ref.atc WHERE atc_code IN (SELECT unnest($codes))"}
# A multi-label task's labels: the dictionary of what its label column holds.
LABEL_SOURCES = {"drug_rec": "drug", "next_visit": "diagnosis"}
SOURCE_WORDS = {"diagnosis": "diagnosis", "procedure": "procedure", "drug": "drug (ATC-3)", "static": "at admission"}


def parse_token(token: str, task: Task | None, default_feature: str | None) -> dict:
    """A feature name as a model stores it -> {feature, source, code, current}: `now:conditions:4019` (logreg's
    current visit), `conditions:4019`, `v3:procedures:3893` (an attention token), `4019` (a module's own code)."""
    current = token.startswith("now:")
    rest = _VISIT.sub("", token.removeprefix("now:"))
    features = set(task.samples.features) if task is not None else set()
    head, sep, tail = rest.partition(":")
    feature, code = (head, tail) if sep and head in features else (default_feature, rest)
    sources = dict(task.clock.feature_sources) if task is not None else {}
    return {"feature": feature, "source": sources.get(feature or ""), "code": code, "current": current}


def _static_words(code: str) -> str:
    prefix, _, value = code.partition("//")
    return f"{prefix.lower().replace('_', ' ')}: {value}" if value else code


def translate(con: duckdb.DuckDBPyConnection, wanted: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """{(source, code): plain words} for the codes a dictionary of this warehouse knows."""
    words = {}
    for source, codes in wanted.items():
        sql = DICTIONARIES.get(source)
        if sql is None or not codes:
            continue
        table = sql.split(" FROM ")[1].split()[0]
        schema, name = table.split(".")
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                           [schema, name]).fetchall()[0][0]:
            continue
        words.update({(source, c): w for c, w in con.execute(sql, {"codes": sorted(codes)}).fetchall() if w})
    return words


def _words(parsed: dict, names: dict[tuple[str, str], str]) -> str:
    source, code = parsed["source"], parsed["code"]
    if source == "static":
        text = _static_words(code)
    else:
        text = f"{SOURCE_WORDS.get(source, source or 'token')} {code}"
        if (source, code) in names:
            text += f" ({names[(source, code)]})"
        elif source in DICTIONARIES:
            text += " (not in the dictionary)"
    if parsed["feature"] == "drugs_hist":
        text += " [earlier visits]"
    return ("this visit: " if parsed["current"] else "") + text


def stored_drivers(run: dict) -> dict | None:
    """The drivers a baseline kept in its config at fit time, or None."""
    config = run.get("config")
    try:
        parsed = json.loads(config) if isinstance(config, str) else config
    except (TypeError, ValueError):
        return None
    found = parsed.get("drivers") if isinstance(parsed, dict) else None
    return found if isinstance(found, dict) and isinstance(found.get("rows"), list) else None


def attention_drivers(con: duckdb.DuckDBPyConnection, run_id: str, k: int = TOP_ATTENTION) -> dict | None:
    """The codes receiving the most attention in the stored showcase samples, per module's last layer: a key's
    weight averaged over heads and queries, then over its occurrences; or None without stored attention."""
    rows = con.execute(
        """WITH last AS (SELECT module, max(layer) AS layer FROM ml.attention WHERE run_id = $run GROUP BY 1),
                per_key AS (
                    SELECT a.module, a.sample_id, a.key_pos, any_value(a.key_token) AS token, avg(a.weight) AS w
                    FROM ml.attention a JOIN last USING (module, layer) WHERE a.run_id = $run GROUP BY ALL),
                -- a key's weight against a uniform spread over its row's keys (1 = no preference), so that
                -- modules of different lengths compare
                scaled AS (SELECT *, w * count(*) OVER (PARTITION BY module, sample_id) AS ratio FROM per_key)
           SELECT module, token, avg(ratio) AS weight, count(DISTINCT sample_id) AS samples, count(*) AS occurrences
           FROM scaled GROUP BY ALL""", {"run": run_id}).fetchall()
    if not rows:
        return None
    n_samples = con.execute("SELECT count(DISTINCT sample_id) FROM ml.attention WHERE run_id = ?",
                            [run_id]).fetchall()[0][0]
    kept = sorted((r for r in rows if _VISIT.sub("", r[1] or "") not in SPECIAL and r[1]),
                  key=lambda r: (-r[2], r[1]))[:k]
    return {"kind": "attention", "samples": int(n_samples),
            "rows": [[token, None, float(weight), module, int(samples)] for module, token, weight, samples, _ in kept]}


def drivers(con: duckdb.DuckDBPyConnection, run: dict, task: Task | None) -> dict:
    """The run's drivers in plain words: {kind, note, rows: [{feature, words, label, label_words, value, ...}]}."""
    found = stored_drivers(run)
    if found is None and run["model"] not in ("logreg", "lightgbm", "most_frequent", "copy_last", "oracle"):
        found = attention_drivers(con, run["run_id"])
    if found is None:
        why = ("a baseline with no fitted parameters" if run["model"] in ("most_frequent", "copy_last", "oracle")
               else "nothing stored for this run (recorded before drivers were kept, imported, or no attention "
                    "exported)")
        return {"kind": None, "note": why, "rows": []}
    kind = found.get("kind")
    parsed = []
    for row in found["rows"]:
        token, label, value = row[0], row[1], row[2]
        module = row[3] if len(row) > 3 else None
        default = module if task is not None and module in task.samples.features else (
            task.samples.features[0] if task is not None and task.family == "ehr" and module is not None else None)
        parsed.append((row, parse_token(str(token), task, default), label, value))
    wanted: dict[str, set[str]] = {}
    for _, p, label, _ in parsed:
        wanted.setdefault(p["source"] or "", set()).add(p["code"])
        if label is not None and task is not None and task.name in LABEL_SOURCES:
            wanted.setdefault(LABEL_SOURCES[task.name], set()).add(str(label))
    names = translate(con, wanted)
    rows = []
    for row, p, label, value in parsed:
        label_source = LABEL_SOURCES.get(task.name) if task is not None else None
        label_words = None if label is None else (
            f"{label} ({names[(label_source, str(label))]})" if (label_source, str(label)) in names else str(label))
        rows.append({"feature": row[0], "source": p["source"], "code": p["code"], "current_visit": p["current"],
                     "words": _words(p, names) if task is not None and task.family == "ehr" else str(row[0]),
                     "label": label, "label_words": label_words, "value": value,
                     **({"module": row[3], "samples": row[4]} if kind == "attention" else {})})
    return {"kind": kind, "note": NOTES[kind], "rows": rows,
            **({"samples": found.get("samples")} if kind == "attention" else {})}


NOTES = {
    "coefficient": "Largest logistic-regression coefficients: log-odds added when the code is present (every "
                   "feature is a 0/1 indicator of a code in the history, or in this visit), fitted with the chosen "
                   "regularisation; associations the model uses, not causes.",
    "gain": "LightGBM features with the largest share of the total split gain over the kept trees: how much the "
            "model relies on a code, not in which direction; associations, not causes.",
    "attention": "Codes receiving the most attention in the few showcase test samples whose attention is stored: "
                 "the last layer's weight on the code, mean over heads and queries, as a multiple of a uniform spread "
                 "over the codes of its sequence (1 = no preference), averaged over the code's occurrences. Where "
                 "the model looked, not why it predicted what it did (attention is not an attribution: Jain & "
                 "Wallace, NAACL 2019).",
}


def section(con: duckdb.DuckDBPyConnection, run: dict, task: Task | None, data: dict) -> dict:
    """The card's `drivers` section (Section keyword arguments); fills the JSON twin's `drivers`."""
    found = drivers(con, run, task)
    data["drivers"] = found
    out = {"id": "drivers", "title": "What drives the score", "paragraphs": [], "tables": []}
    if found["kind"] is None:
        out["paragraphs"].append(f"No model summary: {found['note']}.")
        return out
    note = found["note"] + (f" {found['samples']} showcase samples." if found["kind"] == "attention" else "")
    out["paragraphs"].append(note)
    value = {"coefficient": "coefficient", "gain": "share of gain", "attention": "attention ÷ uniform"}[found["kind"]]
    multilabel = any(r["label"] is not None for r in found["rows"])
    head = ["feature", "in plain words", *(["label"] if multilabel else []), value,
            *(["samples"] if found["kind"] == "attention" else [])]
    rows = [[r["feature"], r["words"], *([r["label_words"] or "–"] if multilabel else []),
             f"{r['value']:+.3f}" if found["kind"] == "coefficient" else f"{r['value']:.3f}",
             *([str(r["samples"])] if found["kind"] == "attention" else [])] for r in found["rows"]]
    out["tables"].append((head, rows))
    return out
