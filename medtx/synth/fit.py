"""Fit the synthetic-cohort parameters from the bundled data and write `medtx/synth/params.json.gz`.

Run `python -m medtx.synth.fit [--data DIR] [--out FILE]`. Generation reads only the parameter file, so the
generator works without `data/`. Everything here is deterministic (fixed seed for the few random choices),
so refitting from the same data rewrites the same file.

What comes from where:
- the MIMIC-III demo (data/mimic3_demo): ages, genders, admission categoricals, length of stay, codes per
  visit, code frequencies, drug (ATC-3) frequencies, prescription rows per drug, share of `0`/unmappable NDCs,
  the drug <-> code associations (lift) that seed the planted drug structure;
- the ICD-9 dictionaries: the long tail of real codes the demo does not contain, and the short titles used in
  the synthetic discharge summaries;
- the drug mapping files: for each ATC-3, real NDCs that map to exactly that ATC-3 (GAMENet NDC->RxCUI +
  fabkury RxCUI->ATC, and fabkury's direct NDC->ATC either absent or agreeing), so labels are exact;
- published full MIMIC-III v1.4 figures (MISSION.md, Johnson et al. 2016) where the demo is known to be
  biased: the demo holds patients who died, so visits per patient and in-hospital death use full-cohort rates.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
from pathlib import Path

import numpy as np
import polars as pl
from scipy import sparse

from medtx.settings import BUNDLED_DATA
from medtx.synth.model import Model
from medtx.synth.params import PARAMS_PATH, PARAMS_VERSION

log = logging.getLogger("medtx.synth")

FIT_SEED = 20261121  # the few random choices in fitting (tail codes, successor codes)

# Full MIMIC-III v1.4 (MISSION.md): 46,520 patients, 58,976 admissions, about 7.5k with >= 2 admissions.
FULL_MIMIC_MULTI_VISIT_SHARE = 7_537 / 46_520
FULL_MIMIC_VISITS_PER_PATIENT = 58_976 / 46_520
FULL_MIMIC_IN_HOSPITAL_DEATH_RATE = 0.115  # per admission (Johnson et al., Sci Data 2016)
FULL_MIMIC_DOD_SHARE = 15_759 / 46_520  # patients with a date of death (in or out of hospital)
MAX_VISITS = 30

N_TAIL_DX = 2_000  # real ICD-9 diagnosis codes absent from the demo, to give a long tail
N_TAIL_PX = 500
TAIL_MASS = 0.15  # share of expected codes per visit that goes to the tail

# Codes whose presence raises the planted 30-day readmission probability (real ICD-9, common in MIMIC).
READMISSION_DRIVERS = ["4280", "5849", "5859", "496", "5715", "42731", "2851", "40391", "25000", "51881"]
# ICD-9 families that behave as chronic: they tend to be coded again at the next admission.
CHRONIC_PREFIXES = ("250", "401", "403", "272", "428", "414", "4273", "585", "496", "491", "571", "V45", "V58",
                    "V10", "V12", "V15", "2449", "311", "300", "303", "305", "530", "715", "733")


def _read_csv(path: Path) -> pl.DataFrame:
    """Every column as text (codes and NDCs keep leading zeros), headers lower-cased."""
    df = pl.read_csv(path, infer_schema=False)
    return df.rename({c: c.lower() for c in df.columns})


def _per_visit_counts(df: pl.DataFrame, visits: list[str]) -> np.ndarray:
    """Rows per hadm_id, including visits with none."""
    counts = dict(df.group_by("hadm_id").len().iter_rows())
    return np.array([counts.get(h, 0) for h in visits], dtype=float)


def _gamma_shape(counts: np.ndarray) -> float:
    """Shape k of the visit-level Gamma(k, 1/k) severity so a Poisson-Gamma count has the demo's variance."""
    mean, var = counts.mean(), counts.var()
    return float(np.clip(mean**2 / max(var - mean, 1e-6), 0.3, 50.0))


def _value_shares(series: pl.Series) -> dict[str, float]:
    """Category -> share, nulls as '' (written as an empty CSV field)."""
    counts = series.fill_null("").value_counts().sort(["count", series.name], descending=[True, False])
    total = counts["count"].sum()
    return {str(v): round(n / total, 6) for v, n in counts.iter_rows()}


def _code_vocab(
    demo_codes: pl.Series, n_visits: int, dictionary: pl.DataFrame, n_tail: int, rng: np.random.Generator
) -> tuple[list[str], np.ndarray]:
    """Demo codes with their per-visit shares, plus `n_tail` real dictionary codes with a Zipf tail."""
    counts = demo_codes.value_counts().sort(["count", "icd9_code"], descending=[True, False])  # stable ties
    codes = counts["icd9_code"].to_list()
    shares = counts["count"].to_numpy() / n_visits * (1 - TAIL_MASS)
    others = sorted(set(dictionary["icd9_code"].to_list()) - set(codes))
    tail = [others[i] for i in sorted(rng.choice(len(others), size=min(n_tail, len(others)), replace=False))]
    tail = [tail[i] for i in rng.permutation(len(tail))]  # random Zipf rank
    zipf = 1.0 / (np.arange(len(tail)) + 20.0)
    tail_shares = zipf / zipf.sum() * shares.sum() / (1 - TAIL_MASS) * TAIL_MASS
    return codes + tail, np.concatenate([shares, tail_shares])


def _ndc_to_atc3_sets(mappings: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Both NDC routes the samples stage uses: NDC->RxCUI->ATC-3 (route B) and direct NDC11->ATC-3 (C)."""
    ndc2rxcui = _read_csv(mappings / "gamenet" / "ndc2rxcui.csv.gz").filter(pl.col("ndc").str.len_chars() == 11)
    rx2atc = _read_csv(mappings / "fabkury_ndc_map" / "derived_rxcui_to_atc.csv.gz")
    route_b = ndc2rxcui.join(rx2atc, on="rxcui").group_by("ndc").agg(pl.col("atc3").unique())
    direct = _read_csv(mappings / "fabkury_ndc_map" / "derived_ndc11_to_atc.csv.gz")
    route_c = direct.group_by("ndc11").agg(pl.col("atc3").unique())
    return ({n: set(a) for n, a in route_b.iter_rows()}, {n: set(a) for n, a in route_c.iter_rows()})


def _normalised(name: str) -> str:
    """Drug name as medtx.codes normalises it for the WHO-name fallback: no parentheses, letters only."""
    return " ".join(re.sub(r"[^a-z]+", " ", re.sub(r"\([^)]*\)", " ", name.lower())).split())


def _who_name_atc3(atc_file: Path) -> dict[str, set[str]]:
    """Lower-case WHO ATC name (any level) -> ATC-3 codes it could be mapped to by a drug-name fallback."""
    who = _read_csv(atc_file).filter(pl.col("atc_code").str.len_chars() >= 4)
    out: dict[str, set[str]] = {}
    for code, name in who.select("atc_code", "atc_name").iter_rows():
        if name:
            for key in {name.lower().strip(), _normalised(name)} - {""}:
                out.setdefault(key, set()).add(code[:4])
    return out


def _name_keys(name: str | None) -> set[str]:
    """Every key a drug-name fallback might try: the whole name and its first one or two words, both raw
    (lower case) and normalised as medtx.codes does (no parentheses, letters only)."""
    raw = (name or "").lower().strip()
    keys = set()
    for text in (raw, _normalised(raw)):
        words = re.split(r"[\s,/()]+", text)
        keys |= {text, words[0], " ".join(words[:2])}
    return keys - {""}


def _name_atc3(names: list[str | None], who: dict[str, set[str]]) -> set[str]:
    """ATC-3 codes a name-based fallback could reach from these drug names."""
    found: set[str] = set()
    for name in names:
        for key in _name_keys(name):
            found |= who.get(key, set())
    return found


def _ndc10_to_11(ndc: str) -> str | None:
    """FDA hyphenated 10-digit NDC (4-4-2, 5-3-2, 5-4-1) -> MIMIC's 11-digit 5-4-2 form."""
    parts = ndc.split("-")
    if len(parts) != 3:
        return None
    return parts[0].zfill(5) + parts[1].zfill(4) + parts[2].zfill(2)


TEMPLATE_FIELDS = ("drug_type", "drug", "drug_name_poe", "drug_name_generic", "formulary_drug_cd", "gsn", "ndc",
                   "prod_strength", "dose_val_rx", "dose_unit_rx", "form_val_disp", "form_unit_disp", "route")


def _drug_templates(rx: pl.DataFrame, data: Path, who: dict[str, set[str]]) -> dict:
    """Prescription row templates: per ATC-3 the clean NDCs (exact single-ATC-3 mapping), plus noise rows."""
    route_b, route_c = _ndc_to_atc3_sets(data / "drug_mappings")
    demo_rows = rx.unique(subset="ndc", keep="first", maintain_order=True)
    demo_by_ndc = {r["ndc"]: r for r in demo_rows.iter_rows(named=True)}
    demo_ndc_rows = dict(rx.group_by("ndc").len().iter_rows())

    raw = pl.read_csv(data / "drug_mappings" / "fabkury_ndc_map" / "ndc_map_2020_06_17_atc5_atc4_ingredients.csv.gz",
                      infer_schema=False, columns=["ndc", "in_name"], null_values=["NA"])
    fda_names: dict[str, str] = {}
    for ndc, name in raw.drop_nulls().iter_rows():
        ndc11 = _ndc10_to_11(ndc)
        if ndc11 and ndc11 not in fda_names:
            fda_names[ndc11] = name

    clean: dict[str, list[list]] = {}
    for ndc in sorted(route_b):
        b, c = route_b[ndc], route_c.get(ndc)
        if len(b) != 1 or (c is not None and c != b):
            continue
        atc3 = next(iter(b))
        if ndc in demo_by_ndc:
            row = demo_by_ndc[ndc]
            template = [row[f] or "" for f in TEMPLATE_FIELDS]
            weight = 3.0 + demo_ndc_rows[ndc]  # NDCs the demo actually uses dominate, as in real data
        elif ndc in fda_names:
            name = fda_names[ndc].capitalize()
            template = ["MAIN", name, name, name, "", "", ndc, "", "", "", "", "", ""]
            weight = 1.0
        else:
            continue
        if not _name_atc3([template[1], template[3]], who) <= {atc3}:
            continue  # a name fallback would reach another ATC-3: the label would no longer be exact
        weight *= 2.0 if c is not None else 1.0  # both routes agree: preferred
        clean.setdefault(atc3, []).append([round(weight, 3), *template])
    # Keep the parameter file small: the demo NDCs plus the heaviest few others per ATC-3.
    for atc3, rows in clean.items():
        rows.sort(key=lambda r: (-r[0], r[7]))
        clean[atc3] = rows[:8]

    # Noise rows never affect labels: their NDC maps nowhere and no name fallback can rescue them.
    def noise_templates(rows: pl.DataFrame) -> list[list[str]]:
        return [[r[f] or "" for f in TEMPLATE_FIELDS] for r in rows.iter_rows(named=True)
                if not _name_atc3([r["drug"], r["drug_name_poe"], r["drug_name_generic"]], who)]

    no_ndc = pl.col("ndc").is_null() | (pl.col("ndc") == "0")
    zero = noise_templates(rx.filter(no_ndc).unique(subset="drug", keep="first", maintain_order=True))
    mapped = sorted(set(route_b) | set(route_c))
    unmapped = noise_templates(demo_rows.filter(~no_ndc & ~pl.col("ndc").is_in(mapped)))
    return {"fields": list(TEMPLATE_FIELDS), "clean": dict(sorted(clean.items())), "unmapped": unmapped,
            "zero_ndc": zero, "route_b": route_b, "route_c": route_c}


def _lift_pairs(x: np.ndarray, y: np.ndarray, top: int, min_support: int = 3) -> list[tuple[int, int]]:
    """(feature, label) pairs with the highest lift in the demo, `top` per label: seeds of the planted structure."""
    co = x.T @ y
    expected = np.outer(x.sum(0), y.sum(0)) / len(x)
    lift = np.where(co >= min_support, co / np.maximum(expected, 1e-9), 0.0)
    pairs = []
    for a in range(y.shape[1]):
        for i in np.argsort(-lift[:, a], kind="stable")[:top]:
            if lift[i, a] > 1.0:
                pairs.append((int(i), a))
    return pairs


def fit_params(data: Path = BUNDLED_DATA) -> dict:
    """Fit every generator parameter from the bundled data; returns the JSON-ready dict."""
    rng = np.random.default_rng(FIT_SEED)
    demo = data / "mimic3_demo"
    patients = _read_csv(demo / "PATIENTS.csv.gz")
    adm = _read_csv(demo / "ADMISSIONS.csv.gz").sort("subject_id", "admittime")
    dx = _read_csv(demo / "DIAGNOSES_ICD.csv.gz").drop_nulls("icd9_code")
    px = _read_csv(demo / "PROCEDURES_ICD.csv.gz").drop_nulls("icd9_code")
    rx = _read_csv(demo / "PRESCRIPTIONS.csv.gz")
    d_dx = _read_csv(demo / "D_ICD_DIAGNOSES.csv.gz")
    d_px = _read_csv(demo / "D_ICD_PROCEDURES.csv.gz")
    who = _who_name_atc3(data / "atc" / "WHO_ATC-DDD_2026-04-25.csv.gz")
    visits = adm["hadm_id"].to_list()
    diagnoses, procedures, x_dx, x_px = _code_params(dx, px, d_dx, d_px, visits, rng)  # the only draws of rng
    drivers = [c for c in READMISSION_DRIVERS if c in set(diagnoses["codes"])]
    return {
        "version": PARAMS_VERSION,
        "fitted_from": "MIMIC-III demo v1.4 + ICD-9 dictionaries + GAMENet/fabkury NDC maps + WHO ATC names",
        "patients": _patient_params(patients, adm),
        "visits": _visit_params(adm, drivers),
        "diagnoses": diagnoses,
        "procedures": procedures,
        "drugs": _drug_params(rx, data, who, visits, x_dx, x_px),
    }


def _patient_params(patients: pl.DataFrame, adm: pl.DataFrame) -> dict:
    """Sex, age at first admission and out-of-hospital death."""
    # Patients: age at first admission (demo ages > 89 are shifted to ~300 years, as in MIMIC).
    first = adm.group_by("subject_id").agg(pl.col("admittime").min()).join(patients, on="subject_id")
    ts = first.select(pl.col("admittime").str.to_datetime(), pl.col("dob").str.to_datetime())
    ages = ((ts["admittime"] - ts["dob"]).dt.total_days() / 365.25).round(1).sort().to_list()
    return {
        "female_share": round(float((patients["gender"] == "F").mean()), 6),
        "first_admission_ages": ages,
        "dod_share_if_alive": round((FULL_MIMIC_DOD_SHARE - 0.146) / (1 - 0.146), 6),
    }


def _visit_params(adm: pl.DataFrame, drivers: list[str]) -> dict:
    """Visits per patient, length of stay, admission categories, deaths and readmission."""
    times = adm.select(pl.col("admittime").str.to_datetime(), pl.col("dischtime").str.to_datetime())
    los_days = ((times["dischtime"] - times["admittime"]).dt.total_seconds() / 86400).clip(0.05).to_numpy()

    # Visits per patient: P(1) and a geometric tail matching full MIMIC-III's share and mean.
    p_multi = FULL_MIMIC_MULTI_VISIT_SHARE
    extra = (FULL_MIMIC_VISITS_PER_PATIENT - 1 - p_multi) / p_multi  # E[N - 2 | N >= 2]
    ratio = extra / (1 + extra)
    tail = p_multi * (1 - ratio) * ratio ** np.arange(MAX_VISITS - 1)
    visit_pmf = np.concatenate([[1 - p_multi], tail])
    visit_pmf /= visit_pmf.sum()

    alive = adm["hospital_expire_flag"] == "0"
    return {
        "pmf": [round(float(p), 8) for p in visit_pmf],
        "death_share_last_visit": round(FULL_MIMIC_IN_HOSPITAL_DEATH_RATE * FULL_MIMIC_VISITS_PER_PATIENT, 6),
        "log_los_mean": round(float(np.log(los_days).mean()), 6),
        "log_los_sd": round(float(np.log(los_days).std()), 6),
        "categorical": {c: _value_shares(adm[c]) for c in (
            "admission_type", "admission_location", "insurance", "language", "religion", "marital_status",
            "ethnicity")},
        "discharge_location": _value_shares(adm.filter(alive)["discharge_location"]),
        "readmission": {
            "base_logit": -1.6, "driver_codes": drivers, "driver_logit": 1.1,
            "early_gap_days": [0.5, 29.5], "late_gap_log_mean": float(np.log(240.0)), "late_gap_log_sd": 1.0,
        },
    }


def _code_params(dx: pl.DataFrame, px: pl.DataFrame, d_dx: pl.DataFrame, d_px: pl.DataFrame, visits: list,
                 rng: np.random.Generator) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    """Diagnoses and procedures parameters, and each visit's code indicator matrices (for the drug effects)."""
    n_visits = len(visits)
    visit_idx = {h: i for i, h in enumerate(visits)}
    # Diagnoses / procedures: per-visit shares -> Poisson-Gamma inclusion (see generate.py).
    dx_counts = _per_visit_counts(dx, visits)
    px_counts = _per_visit_counts(px, visits)
    dx_codes, dx_share = _code_vocab(dx.unique(subset=["hadm_id", "icd9_code"])["icd9_code"], n_visits, d_dx,
                                     N_TAIL_DX, rng)
    px_codes, px_share = _code_vocab(px.unique(subset=["hadm_id", "icd9_code"])["icd9_code"], n_visits, d_px,
                                     N_TAIL_PX, rng)
    titles = dict(d_dx.select("icd9_code", "short_title").iter_rows())
    chronic = np.array([c.startswith(CHRONIC_PREFIXES) for c in dx_codes])
    # Successors: each code makes two other (frequent) codes likelier at the next visit.
    frequent = np.arange(min(200, len(dx_codes)))
    successors = [[int(s) for s in rng.choice(frequent[frequent != i], size=2, replace=False)]
                  for i in range(len(dx_codes))]

    x_dx = np.zeros((n_visits, len(dx_codes)))
    dx_pos = {c: i for i, c in enumerate(dx_codes)}
    for h, c in dx.select("hadm_id", "icd9_code").iter_rows():
        x_dx[visit_idx[h], dx_pos[c]] = 1
    x_px = np.zeros((n_visits, len(px_codes)))
    px_pos = {c: i for i, c in enumerate(px_codes)}
    for h, c in px.select("hadm_id", "icd9_code").iter_rows():
        x_px[visit_idx[h], px_pos[c]] = 1

    diagnoses = {
        "codes": dx_codes,
        "share": [round(float(s), 8) for s in dx_share],
        "titles": [titles.get(c, c) for c in dx_codes],
        "gamma_shape": round(_gamma_shape(dx_counts), 6),
        "demo_mean_per_visit": round(float(dx_counts.mean()), 6),
        # next visit: rate = baseline_scale * base rate + persistence of own code + successor codes
        "baseline_scale": 0.55,
        "persistence": [0.9 if c else 0.08 for c in chronic],
        "successors": successors,
        "successor_rate": 0.12,
    }
    procedures = {
        "codes": px_codes,
        "share": [round(float(s), 8) for s in px_share],
        "gamma_shape": round(_gamma_shape(px_counts), 6),
        "demo_mean_per_visit": round(float(px_counts.mean()), 6),
    }
    return diagnoses, procedures, x_dx, x_px


def _drug_params(rx: pl.DataFrame, data: Path, who, visits: list, x_dx: np.ndarray, x_px: np.ndarray) -> dict:
    """ATC-3 shares, the planted diagnosis/procedure effects, rows per drug and noise rows."""
    n_visits = len(visits)
    # Drugs: ATC-3 per demo visit via both NDC routes (what the samples stage will compute).
    templates = _drug_templates(rx, data, who)
    route_b, route_c = templates.pop("route_b"), templates.pop("route_c")
    rx_atc = [(h, a) for h, n in rx.select("hadm_id", "ndc").iter_rows()
              for a in route_b.get(n or "", set()) | route_c.get(n or "", set())]
    atc3_list = sorted(templates["clean"])
    atc_idx = {a: i for i, a in enumerate(atc3_list)}
    visit_idx = {h: i for i, h in enumerate(visits)}
    y = np.zeros((n_visits, len(atc3_list)))
    for h, a in rx_atc:
        if a in atc_idx:
            y[visit_idx[h], atc_idx[a]] = 1
    rx_visits = rx["hadm_id"].n_unique()
    atc_share = np.clip((y.sum(0) + 0.5) / (rx_visits + 1), 0.002, 0.95)
    pair_rows = pl.DataFrame(rx_atc, schema=["hadm_id", "atc3"], orient="row")
    rows_per_drug = pair_rows.group_by("hadm_id", "atc3").len()["len"].to_numpy().astype(float)
    noise = rx.filter(~pl.col("ndc").fill_null("").is_in(list(route_b) + list(route_c)))
    noise_per_visit = _per_visit_counts(noise, rx["hadm_id"].unique().to_list())
    zero_share = rx.filter(pl.col("ndc").is_null() | (pl.col("ndc") == "0")).height / max(noise.height, 1)

    return {
        "atc3": atc3_list,
        "share": [round(float(s), 6) for s in atc_share],
        "dx_effects": [[i, a] for i, a in _lift_pairs(x_dx, y, top=3)],
        "px_effects": [[i, a] for i, a in _lift_pairs(x_px, y, top=1)],
        "dx_logit": 2.0,
        "px_logit": 1.5,
        "previous_logit": 2.0,
        # repeats per drug chosen so rows per visit match the demo (mapped rows + noise rows)
        "rows_per_drug_mean": round(float(max(1.5, (rx.height / rx_visits - noise_per_visit.mean())
                                              / atc_share.sum())), 6),
        "rows_per_drug_shape": round(_gamma_shape(rows_per_drug - 1), 6),
        "noise_rows_mean": round(float(noise_per_visit.mean()), 6),
        "noise_rows_shape": round(_gamma_shape(noise_per_visit), 6),
        "noise_zero_ndc_share": round(float(zero_share), 6),
        "templates": templates,
    }


def calibrate_drug_bias(params: dict, n_visits: int = 4000) -> list[float]:
    """Per-ATC-3 intercepts so first-visit drug shares match the fitted shares, given the planted effects.

    Monte Carlo over first visits drawn by the generator itself, then a vectorised bisection per label."""
    model = Model(params, drug_bias=np.zeros(len(params["drugs"]["atc3"])))
    rng = np.random.default_rng(FIT_SEED)
    x_dx = model.draw_codes(rng, np.tile(model.dx_rate0, (n_visits, 1)), model.dx_shape)
    x_px = model.draw_codes(rng, np.tile(model.px_rate0, (n_visits, 1)), model.px_shape)
    effects = (sparse.csr_matrix(x_dx, dtype=float) @ model.w_dx + sparse.csr_matrix(x_px, dtype=float) @ model.w_px)
    effects = effects.toarray()
    target = np.array(params["drugs"]["share"])
    lo, hi = np.full(len(target), -15.0), np.full(len(target), 10.0)
    for _ in range(50):
        mid = (lo + hi) / 2
        mean = (1 / (1 + np.exp(-(mid + effects)))).mean(0)
        lo, hi = np.where(mean < target, mid, lo), np.where(mean < target, hi, mid)
    return [round(float(b), 5) for b in (lo + hi) / 2]


def write_params(params: dict, path: Path = PARAMS_PATH) -> Path:
    """Deterministic gzip (no timestamp, no file name) of compact JSON, so a refit rewrites identical bytes."""
    data = json.dumps(params, separators=(",", ":"), sort_keys=True).encode()
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=BUNDLED_DATA, help="bundled data folder")
    parser.add_argument("--out", type=Path, default=PARAMS_PATH, help="parameter file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    params = fit_params(args.data)
    params["drugs"]["bias"] = calibrate_drug_bias(params)
    path = write_params(params, args.out)
    log.info("wrote %s (%d bytes): %d diagnosis codes, %d procedure codes, %d ATC-3 drugs",
             path, path.stat().st_size, len(params["diagnoses"]["codes"]), len(params["procedures"]["codes"]),
             len(params["drugs"]["atc3"]))


if __name__ == "__main__":
    main()
