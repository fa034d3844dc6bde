"""Generate a synthetic MIMIC-III-format cohort, chunk by chunk, with its ground-truth oracle files.

Patients are simulated in fixed-size chunks, each from its own random stream `default_rng([seed, chunk])`,
with numpy over whole chunks (no per-row Python loops except the optional note text, one per admission).
Each chunk is appended to gzip files opened with mtime 0 and no file name, so the same seed gives
byte-identical files and memory stays bounded by one chunk whatever the cohort size.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from medtx.synth.death import LEAK_CODE, LEAK_STREAM, DeathModel
from medtx.synth.death import plant_death_code as plant_code
from medtx.synth.shift import RiskShift
from medtx.synth.files import MIMIC_TABLES, ORACLE_TABLES, Writers, with_row_id
from medtx.synth.params import PARAMS_PATH, load_params
from medtx.synth.model import Model, presence_prob
from medtx.synth.notes import discharge_summary

log = logging.getLogger("medtx.synth")

CHUNK_PATIENTS = 1_000
SUBJECT_ID_START = 1_000_000  # the demo's subject ids are < 100,000 and full MIMIC-III's < 100,000
HADM_ID_START = 2_000_000  # MIMIC-III hadm ids are 100,000-199,999
ORACLE_MIN_PROB = 1e-3  # oracle rows below this are left out; the oracle baseline reads missing as 0
MAX_DRUG_ROWS = 60  # cap on repeated rows of one drug in one visit (the demo's heaviest is 784 rows/visit)
MAX_NOISE_ROWS = 300
DAY = 86_400
YEAR = 365.25 * DAY
EPOCH_2100 = int(np.datetime64("2100-01-01T00:00:00", "s").astype(np.int64))


@dataclass(frozen=True)
class SynthSummary:
    """What one generation wrote."""

    out_dir: Path
    dataset: str
    n_patients: int
    seed: int
    notes: bool
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    plant_death_code: bool = False
    risk_shift: str | None = None  # medtx.synth.shift.RiskShift.describe() of a planted subgroup shift


def dataset_name(n_patients: int) -> str:
    """Warehouse dataset name of a generated cohort (ARCHITECTURE.md): synth_<N>."""
    return f"synth_{n_patients}"


def _ts(seconds: np.ndarray, valid: np.ndarray | None = None) -> pl.Series:
    """Epoch seconds -> Datetime series (null where not valid)."""
    values = seconds.astype("datetime64[s]").astype("datetime64[ms]")  # polars takes ms, not s
    if valid is not None:
        values = np.where(valid, values, np.datetime64("NaT", "ms"))
    return pl.Series(values)


MAX_DEATH_AGE = 110.0  # the oldest age at which a synthetic patient dies after the last stay
SHIFTED_AGE = 90.0  # the real age of a patient whose dob MIMIC shifted (> 89 at first admission: ages ~300)


def latest_death(dob: np.ndarray, first_admit: np.ndarray) -> np.ndarray:
    """Per patient (epoch seconds): when the patient reaches MAX_DEATH_AGE in real years. A dob shifted by MIMIC's
    > 89 rule counts as SHIFTED_AGE at the first admission, not its ~300 years."""
    real_age_first = np.minimum((first_admit - dob) / YEAR, SHIFTED_AGE)
    return first_admit + ((MAX_DEATH_AGE - real_age_first) * YEAR).astype(np.int64)


def _midnight(seconds: np.ndarray) -> np.ndarray:
    return (seconds // DAY) * DAY


def _categorical(rng: np.random.Generator, shares: dict[str, float], n: int) -> pl.Series:
    """n draws from a fitted category -> share table ('' = empty field)."""
    values = list(shares)
    probs = np.asarray([shares[v] for v in values], dtype=float)
    idx = rng.choice(len(values), size=n, p=probs / probs.sum())
    return pl.Series(values, dtype=pl.String).replace("", None).gather(idx)


def _rank_within(groups: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random order inside each group: (order to sort rows, 1-based rank of each sorted row in its group)."""
    order = np.lexsort((rng.random(len(groups)), groups))
    sorted_groups = groups[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_groups)) + 1]
    rank = np.arange(len(groups)) - np.repeat(starts, np.diff(np.r_[starts, len(groups)]))
    return order, rank + 1


class Generator:
    """Turns the fitted parameters into chunks of MIMIC tables plus the oracle's probabilities."""

    def __init__(self, params: dict) -> None:
        self.params = params
        self.model = Model(params)
        self.pmf = np.asarray(params["visits"]["pmf"])
        survival = np.cumsum(self.pmf[::-1])[::-1]  # P(N >= n), n = 1..
        # P(N > n | N >= n); 0 past the last visit count with any mass
        self.has_next = np.divide(np.r_[survival[1:], 0.0], survival, out=np.zeros_like(survival),
                                  where=survival > 0)
        vis = params["visits"]
        self.death_share = float(vis["death_share_last_visit"])
        types = vis["categorical"]["admission_type"]
        self.admission_types = pl.Series(list(types), dtype=pl.String)
        self.admission_type_p = np.asarray(list(types.values()), dtype=float) / sum(types.values())
        self.elective = list(types).index("ELECTIVE") if "ELECTIVE" in types else -1
        self.elective_share = float(types.get("ELECTIVE", 0.0))
        self.death = DeathModel(params["diagnoses"]["codes"], list(types))
        self.dx_codes = pl.Series(params["diagnoses"]["codes"], dtype=pl.String)
        self.dx_titles = np.asarray(params["diagnoses"]["titles"], dtype=object)
        self.px_codes = pl.Series(params["procedures"]["codes"], dtype=pl.String)
        self.atc3 = pl.Series(params["drugs"]["atc3"], dtype=pl.String)
        self._drug_templates(params["drugs"])

    def _drug_templates(self, drugs: dict) -> None:
        """Template rows for prescriptions, and a sorted key so one searchsorted picks an NDC per drug."""
        fields = drugs["templates"]["fields"]
        rows, keys = [], []
        for a, atc3 in enumerate(drugs["atc3"]):
            pool = drugs["templates"]["clean"][atc3]
            weights = np.asarray([r[0] for r in pool], dtype=float)
            cum = np.cumsum(weights) / weights.sum()
            keys.extend(a + cum)  # label a owns the key interval (a, a + 1]
            rows.extend(r[1:] for r in pool)
        self.clean_keys = np.asarray(keys)
        frame = lambda rows: pl.DataFrame(rows, schema=fields, orient="row").with_columns(  # noqa: E731
            pl.all().replace("", None))  # empty template fields are NULL (an empty CSV field), as in MIMIC
        self.clean = frame(rows)
        self.zero = frame(drugs["templates"]["zero_ndc"])
        self.unmapped = frame(drugs["templates"]["unmapped"])

    def _patients(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        pat = self.params["patients"]
        ages = rng.choice(np.asarray(pat["first_admission_ages"]), size=n)
        # Jitter real ages; keep MIMIC's > 89 shift (ages around 300) as it is.
        ages = np.where(ages < 89.5, np.clip(ages + rng.uniform(-2.5, 2.5, n), 15.0, 89.0), ages + rng.random(n))
        first_admit = EPOCH_2100 + (rng.random(n) * 100 * YEAR).astype(np.int64) // 60 * 60
        return {
            "n_visits": rng.choice(len(self.pmf), size=n, p=self.pmf) + 1,
            "female": rng.random(n) < pat["female_share"],
            "first_admit": first_admit,
            "dob": _midnight(first_admit - (ages * YEAR).astype(np.int64)),
        }

    def simulate_chunk(self, rng: np.random.Generator, subject_ids: np.ndarray, hadm_start: int,
                       risk_shift: RiskShift | None = None) -> dict:
        """All visits of these patients, visit number by visit number (vectorised over patients); `risk_shift`
        shifts one group's early-readmission log-odds (medtx.synth.shift), and the oracle with it."""
        m, vis = self.model, self.params["visits"]
        readm = vis["readmission"]
        n = len(subject_ids)
        pat = self._patients(rng, n)
        clock = pat["first_admit"].copy()
        prev_dx = np.zeros((n, m.n_dx), dtype=bool)
        prev_drugs = np.zeros((n, m.n_drugs))
        prev_visit = np.full(n, -1)
        earlier_dx = np.zeros((n, m.n_dx), dtype=bool)  # any earlier stay's diagnoses (medtx.synth.death)
        max_visits = int(pat["n_visits"].max())
        # Admission types up front: the gap before a planned (ELECTIVE) admission is never < 30 days, so
        # "first non-elective admission within 30 days" is exactly "next admission early and not elective".
        types = rng.choice(len(self.admission_type_p), size=(n, max_visits + 1), p=self.admission_type_p)
        steps: list[dict] = []
        offset = 0
        for t in range(max_visits):
            active = np.flatnonzero(pat["n_visits"] > t)
            k = len(active)
            rate = np.tile(m.dx_rate0, (k, 1)) if t == 0 else m.next_dx_rate(prev_dx[active])
            step: dict = {"patient": active, "visit_number": np.full(k, t + 1), "local": offset + np.arange(k)}
            if t > 0:  # next-visit oracle of the previous visits, now that their successor exists
                step["next_oracle"] = (prev_visit[active], presence_prob(rate, m.dx_shape))
            dx = m.draw_codes(rng, rate, m.dx_shape)
            px = m.draw_codes(rng, np.tile(m.px_rate0, (k, 1)), m.px_shape)
            drug_p = m.drug_prob(dx, px, prev_drugs[active])
            drugs = rng.random(drug_p.shape) < drug_p
            is_last = pat["n_visits"][active] == t + 1
            age = (clock[active] - pat["dob"][active]) / YEAR
            death_p = self.death.prob(age, earlier_dx[active], types[active, t])
            died = is_last & (rng.random(k) < death_p)
            los = np.clip(np.exp(rng.normal(vis["log_los_mean"], vis["log_los_sd"], k)), 0.1, 120.0)
            admit = clock[active] // 60 * 60
            disch = admit + (los * DAY).astype(np.int64) // 60 * 60
            early_p = m.early_readmission_prob(dx)
            if risk_shift is not None:
                early_p = risk_shift.apply(early_p, pat["female"][active], age)
            early = (rng.random(k) < early_p) & (types[active, t + 1] != self.elective)
            lo, hi = readm["early_gap_days"]
            late_gap = 31.0 + np.minimum(np.exp(rng.normal(readm["late_gap_log_mean"], readm["late_gap_log_sd"], k)),
                                         3000.0)
            gap = np.where(early, rng.uniform(lo, hi, k), late_gap)
            clock[active] = disch + (gap * DAY).astype(np.int64)
            # Readmission label = a next admission, within 30 days, not elective, and this visit survived.
            h = self.has_next[t]
            next_given_alive = h / (h + (1 - h) * (1 - death_p))
            readmit_p = np.where(died, 0.0, next_given_alive * early_p * (1 - self.elective_share))
            step.update(admission_type=types[active, t], dx=dx, px=px, drugs=drugs, drug_p=drug_p, died=died,
                        admit=admit, disch=disch, readmit_p=readmit_p, mortality_p=(1 - h) * death_p)
            steps.append(step)
            prev_dx[active], prev_drugs[active], prev_visit[active] = dx, drugs, step["local"]
            earlier_dx[active] |= dx
            offset += k
        hadm_ids = hadm_start + rng.permutation(offset)  # MIMIC's hadm ids do not follow time order
        return self._tables(rng, subject_ids, pat, steps, hadm_ids)

    def _tables(self, rng: np.random.Generator, subject_ids: np.ndarray, pat: dict, steps: list[dict],
                hadm_ids: np.ndarray) -> dict:
        """Chunk arrays -> one frame per output table (without row_id, added by the writer side)."""
        cat = lambda key: np.concatenate([s[key] for s in steps])  # noqa: E731
        local, patient = cat("local"), cat("patient")
        subj, hadm = subject_ids[patient], hadm_ids[local]
        admit, disch, died = cat("admit"), cat("disch"), cat("died")
        nv = len(local)

        dx_rows = [(s["local"][r], c) for s in steps for r, c in [np.nonzero(s["dx"])]]
        dx_v, dx_c = np.concatenate([r for r, _ in dx_rows]), np.concatenate([c for _, c in dx_rows])
        dx_order, dx_seq = _rank_within(dx_v, rng)
        dx_v, dx_c = dx_v[dx_order], dx_c[dx_order]
        px_rows = [(s["local"][r], c) for s in steps for r, c in [np.nonzero(s["px"])]]
        px_v, px_c = np.concatenate([r for r, _ in px_rows]), np.concatenate([c for _, c in px_rows])
        px_order, px_seq = _rank_within(px_v, rng)
        px_v, px_c = px_v[px_order], px_c[px_order]

        primary = np.full(nv, -1)
        primary[dx_v[dx_seq == 1]] = dx_c[dx_seq == 1]
        adm = self._admissions(rng, subj, hadm, admit, disch, died, primary, cat("admission_type"))
        tables = {
            "ADMISSIONS": adm,
            "DIAGNOSES_ICD": pl.DataFrame({"subject_id": subj[dx_v], "hadm_id": hadm[dx_v], "seq_num": dx_seq,
                                           "icd9_code": self.dx_codes.gather(dx_c)}),
            "PROCEDURES_ICD": pl.DataFrame({"subject_id": subj[px_v], "hadm_id": hadm[px_v], "seq_num": px_seq,
                                            "icd9_code": self.px_codes.gather(px_c)}),
        }
        tables["PATIENTS"] = self._patient_table(rng, subject_ids, pat, patient, admit, disch, died)
        tables["PRESCRIPTIONS"], tables["_drug_pairs"] = self._prescriptions(
            rng, steps, subj, hadm, admit, disch)
        tables["_visits"] = (local, subj, hadm, admit, disch, died, dx_v, dx_c, pat, patient)
        tables.update(self._oracles(steps, hadm))
        return tables

    def _admissions(self, rng: np.random.Generator, subj: np.ndarray, hadm: np.ndarray, admit: np.ndarray,
                    disch: np.ndarray, died: np.ndarray, primary: np.ndarray, types: np.ndarray) -> pl.DataFrame:
        vis = self.params["visits"]
        n = len(subj)
        cats = {c: _categorical(rng, vis["categorical"][c], n) for c in (
            "admission_location", "insurance", "language", "religion", "marital_status",
            "ethnicity")}
        discharge = _categorical(rng, vis["discharge_location"], n)
        discharge = pl.select(pl.when(pl.Series(died)).then(pl.lit("DEAD/EXPIRED")).otherwise(discharge)).to_series()
        cats["admission_type"] = self.admission_types.gather(types)
        in_ed = (cats["admission_type"] == "EMERGENCY").to_numpy() & (rng.random(n) < 0.7)
        edreg = admit - (rng.uniform(1, 8, n) * 3600).astype(np.int64) // 60 * 60
        edout = admit + (rng.uniform(0, 1, n) * 3600).astype(np.int64) // 60 * 60
        diagnosis = pl.Series(np.where(primary >= 0, self.dx_titles[np.maximum(primary, 0)], None).tolist(),
                              dtype=pl.String).str.to_uppercase()
        return pl.DataFrame({
            "subject_id": subj, "hadm_id": hadm, "admittime": _ts(admit), "dischtime": _ts(disch),
            "deathtime": _ts(disch, died), "admission_type": cats["admission_type"],
            "admission_location": cats["admission_location"], "discharge_location": discharge,
            "insurance": cats["insurance"], "language": cats["language"], "religion": cats["religion"],
            "marital_status": cats["marital_status"], "ethnicity": cats["ethnicity"],
            "edregtime": _ts(edreg, in_ed), "edouttime": _ts(edout, in_ed), "diagnosis": diagnosis,
            "hospital_expire_flag": died.astype(np.int8), "has_chartevents_data": np.ones(n, dtype=np.int8),
        })

    def _patient_table(self, rng: np.random.Generator, subject_ids: np.ndarray, pat: dict, patient: np.ndarray,
                       admit: np.ndarray, disch: np.ndarray, died: np.ndarray) -> pl.DataFrame:
        n = len(subject_ids)
        last_disch = np.zeros(n, dtype=np.int64)
        np.maximum.at(last_disch, patient, disch)
        died_in_hospital = np.zeros(n, dtype=bool)
        died_in_hospital[patient[died]] = True
        later = rng.random(n) < self.params["patients"]["dod_share_if_alive"]
        after = (np.exp(rng.normal(np.log(400.0), 1.2, n)) * DAY).astype(np.int64)
        # The lognormal's tail reaches centuries (subject 1031105 of a 46,520-patient cohort: discharged at 18,
        # dead 238 years later, at 256): a death after the last stay comes at the latest at MAX_DEATH_AGE.
        after = np.minimum(after, np.maximum(latest_death(pat["dob"], pat["first_admit"]) - last_disch, 0))
        dod = _midnight(np.where(died_in_hospital, last_disch, last_disch + after))
        has_dod = died_in_hospital | later
        ssn = has_dod & (~died_in_hospital | (rng.random(n) < 0.7))
        return pl.DataFrame({
            "subject_id": subject_ids, "gender": np.where(pat["female"], "F", "M"), "dob": _ts(pat["dob"]),
            "dod": _ts(dod, has_dod), "dod_hosp": _ts(dod, died_in_hospital), "dod_ssn": _ts(dod, ssn),
            "expire_flag": has_dod.astype(np.int8),
        })

    def _prescriptions(self, rng: np.random.Generator, steps: list[dict], subj: np.ndarray, hadm: np.ndarray,
                       admit: np.ndarray, disch: np.ndarray) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Rows for every drawn drug (repeated, one real NDC per drug and visit) plus label-neutral noise rows."""
        drug = self.params["drugs"]
        pairs = [(s["local"][r], a) for s in steps for r, a in [np.nonzero(s["drugs"])]]
        pv, pa = np.concatenate([r for r, _ in pairs]), np.concatenate([a for _, a in pairs])
        template = np.searchsorted(self.clean_keys, pa + rng.random(len(pa)))
        mean, shape = drug["rows_per_drug_mean"] - 1.0, drug["rows_per_drug_shape"]
        repeats = 1 + np.minimum(rng.poisson(rng.gamma(shape, mean / shape, len(pv))), MAX_DRUG_ROWS - 1)
        clean_v = np.repeat(pv, repeats)
        clean = self.clean[np.repeat(template, repeats)]

        n_vis = len(subj)
        nmean, nshape = drug["noise_rows_mean"], drug["noise_rows_shape"]
        n_noise = np.minimum(rng.poisson(rng.gamma(nshape, nmean / nshape, n_vis)), MAX_NOISE_ROWS)
        noise_v = np.repeat(np.arange(n_vis), n_noise)
        is_zero = rng.random(len(noise_v)) < drug["noise_zero_ndc_share"]
        noise = pl.concat([self.zero[rng.integers(0, self.zero.height, int(is_zero.sum()))],
                           self.unmapped[rng.integers(0, self.unmapped.height, int((~is_zero).sum()))]])
        noise_v = np.concatenate([noise_v[is_zero], noise_v[~is_zero]])

        v = np.concatenate([clean_v, noise_v])
        rows = pl.concat([clean, noise])
        day0, last = _midnight(admit[v]), _midnight(disch[v])
        start = np.minimum(day0 + (rng.random(len(v)) * ((last - day0) // DAY + 1)).astype(np.int64) * DAY, last)
        end = start + rng.integers(1, 4, len(v)) * DAY
        order = np.lexsort((start, v))
        out = pl.DataFrame({"subject_id": subj[v], "hadm_id": hadm[v], "icustay_id": pl.Series([None] * len(v),
                                                                                               dtype=pl.Int64),
                            "startdate": _ts(start), "enddate": _ts(end)}).hstack(rows)[order]
        drug_pairs = pl.DataFrame({"visit": pv, "drug": clean["drug"].gather(np.cumsum(repeats) - repeats)})
        return out, drug_pairs

    def _oracles(self, steps: list[dict], hadm: np.ndarray) -> dict[str, pl.DataFrame]:
        """The generating probabilities, kept where prob >= ORACLE_MIN_PROB (readmission: every admission)."""
        drug_v, drug_a, drug_p, next_v, next_c, next_p = [], [], [], [], [], []
        for s in steps:
            r, a = np.nonzero(s["drug_p"] >= ORACLE_MIN_PROB)
            drug_v.append(s["local"][r]), drug_a.append(a), drug_p.append(s["drug_p"][r, a])
            if "next_oracle" in s:
                prev_local, prob = s["next_oracle"]
                r, c = np.nonzero(prob >= ORACLE_MIN_PROB)
                next_v.append(prev_local[r]), next_c.append(c), next_p.append(prob[r, c])
        local = np.concatenate([s["local"] for s in steps])
        cat = lambda xs, dtype: np.concatenate(xs) if xs else np.zeros(0, dtype=dtype)  # noqa: E731
        nv, nc = cat(next_v, np.int64), cat(next_c, np.int64)
        order = np.lexsort((nc, nv))
        dv, da = np.concatenate(drug_v), np.concatenate(drug_a)
        dorder = np.lexsort((da, dv))
        return {
            "ORACLE_DRUG_REC": pl.DataFrame({"hadm_id": hadm[dv[dorder]], "atc3": self.atc3.gather(da[dorder]),
                                             "prob": np.concatenate(drug_p)[dorder]}),
            "ORACLE_NEXT_VISIT": pl.DataFrame({"hadm_id": hadm[nv[order]], "icd9_code": self.dx_codes.gather(
                nc[order]), "prob": cat(next_p, float)[order]}),
            "ORACLE_READMISSION": pl.DataFrame({"hadm_id": hadm[local], "prob": np.concatenate(
                [s["readmit_p"] for s in steps])}).sort("hadm_id"),
            "ORACLE_MORTALITY": pl.DataFrame({"hadm_id": hadm[local], "prob": np.concatenate(
                [s["mortality_p"] for s in steps])}).sort("hadm_id"),
        }

    def notes(self, tables: dict) -> pl.DataFrame:
        """One templated discharge summary per admission (a Python loop per admission, not per row)."""
        local, subj, hadm, admit, disch, died, dx_v, dx_c, pat, patient = tables["_visits"]
        titles_by_visit: dict[int, list[str]] = {}
        for v, c in zip(dx_v.tolist(), dx_c.tolist(), strict=True):  # already in seq_num order
            titles_by_visit.setdefault(v, []).append(self.dx_titles[c])
        meds = tables["_drug_pairs"].group_by("visit", maintain_order=True).agg(pl.col("drug").head(6))
        meds_by_visit = dict(zip(meds["visit"].to_list(), meds["drug"].to_list(), strict=True))
        adm = tables["ADMISSIONS"]
        admit_dt = admit.astype("datetime64[s]").astype(object)
        disch_dt = disch.astype("datetime64[s]").astype(object)
        dob_dt = pat["dob"][patient].astype("datetime64[s]").astype(object)
        gender = np.where(pat["female"][patient], "F", "M")
        types = adm["admission_type"].to_list()
        text = [discharge_summary(admit_dt[i], disch_dt[i], dob_dt[i], gender[i], types[i],
                                  titles_by_visit.get(v, []), meds_by_visit.get(v, []), bool(died[i]), int(hadm[i]))
                for i, v in enumerate(local.tolist())]
        chart = _midnight(disch)
        n = len(local)
        return pl.DataFrame({
            "subject_id": subj, "hadm_id": hadm, "chartdate": _ts(chart),
            "charttime": _ts(chart, np.zeros(n, dtype=bool)), "storetime": _ts(chart, np.zeros(n, dtype=bool)),
            "category": ["Discharge summary"] * n, "description": ["Report"] * n,
            "cgid": pl.Series([None] * n, dtype=pl.Int64), "iserror": pl.Series([None] * n, dtype=pl.Int8),
            "text": text,
        })


def _readme(summary: SynthSummary, params_sha: str) -> str:
    rows = "\n".join(f"| {t}.csv.gz | {n:,} |" for t, n in summary.rows.items())
    return f"""# SYNTHETIC DATA — not real patients

This folder was generated by `medtx synth mimic3` (medtx.synth). Every row is **synthetic**: no record
describes a real person. The tables follow the MIMIC-III v1.4 format (upper-case headers, as the full
release) so `medtx ingest mimic3 --source {summary.out_dir}` reads them like the real thing.

- patients: {summary.n_patients:,}; seed: {summary.seed}; notes: {summary.notes}; dataset name: `{summary.dataset}`
- parameters: `medtx/synth/params.json.gz` (sha256 {params_sha}), fitted by `python -m medtx.synth.fit` from
  the MIMIC-III demo, the ICD-9 dictionaries and the bundled NDC->ATC mappings; visit counts and in-hospital deaths
  follow published full MIMIC-III v1.4 rates. Ids: subject_id >= {SUBJECT_ID_START:,}, hadm_id >= {HADM_ID_START:,}.
- same seed and parameters -> byte-identical files.

| file | rows |
|---|---:|
{rows}

## Ground truth (oracle files)
The generating process is known, so the files below hold the exact probabilities an ideal model would predict:
- `ORACLE_DRUG_REC.csv.gz(hadm_id, atc3, prob)`: P(ATC-3 drug given in this admission | its diagnoses,
  procedures and the previous admission's drugs);
- `ORACLE_NEXT_VISIT.csv.gz(hadm_id, icd9_code, prob)`: P(code among the NEXT admission's diagnoses | history),
  for admissions that have a next one;
- `ORACLE_READMISSION.csv.gz(hadm_id, prob)`: P(next admission within 30 days of discharge, not elective)
  (0 for in-hospital deaths);
- `ORACLE_MORTALITY.csv.gz(hadm_id, prob)`: P(death in this admission | age, admission type, earlier admissions'
  diagnoses, admission number): what is known 48 hours after admission (medtx/synth/death.py).
{"- planted subgroup shift: 30-day readmission log-odds " + summary.risk_shift + " (medtx/synth/shift.py); the readmission oracle includes it" + chr(10) if summary.risk_shift else ""}{"- planted leak: diagnosis " + LEAK_CODE + " at discharge of most stays that end in death (medtx/synth/death.py)" + chr(10) if summary.plant_death_code else ""}Rows with prob < {ORACLE_MIN_PROB:g} are left out (read a missing label as probability ~0).
Drug rows with NDC `0` or an NDC that the bundled mapping cannot map never carry a label.
"""


def generate_mimic3(out_dir: Path, n_patients: int, seed: int = 0, notes: bool = False,
                    params_path: Path = PARAMS_PATH, plant_death_code: bool = False,
                    risk_shift: RiskShift | None = None) -> SynthSummary:
    """Write a synthetic MIMIC-III cohort of `n_patients` into `out_dir` (created), with oracle files and README.

    Deterministic: the same (n_patients, seed, notes, plant_death_code, parameter file) gives byte-identical files.
    `plant_death_code`: plant a discharge-time diagnosis tied to death (medtx.synth.death), a known leak.
    `risk_shift`: one group's readmission risk follows shifted log-odds (medtx.synth.shift); the oracle knows it.
    """
    if n_patients < 1:
        raise ValueError(f"n_patients must be >= 1, got {n_patients}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = Generator(load_params(params_path))
    tables = MIMIC_TABLES if notes else tuple(t for t in MIMIC_TABLES if t != "NOTEEVENTS")
    if not notes:
        (out_dir / "NOTEEVENTS.csv.gz").unlink(missing_ok=True)  # a stale file from a --notes run would mislead
    hadm_next = HADM_ID_START
    with Writers(out_dir, tables + ORACLE_TABLES) as w:
        for chunk, first in enumerate(range(0, n_patients, CHUNK_PATIENTS)):
            subjects = SUBJECT_ID_START + np.arange(first, min(first + CHUNK_PATIENTS, n_patients))
            rng = np.random.default_rng([seed, chunk])
            frames = gen.simulate_chunk(rng, subjects, hadm_next, risk_shift)
            if plant_death_code:
                frames["DIAGNOSES_ICD"] = plant_code(np.random.default_rng([seed, chunk, LEAK_STREAM]),
                                                     frames["ADMISSIONS"], frames["DIAGNOSES_ICD"])
            hadm_next += frames["ADMISSIONS"].height
            if notes:
                frames["NOTEEVENTS"] = gen.notes(frames)
            for name in tables:
                w.files[name].write(with_row_id(frames[name], w.files[name]))
            for name in ORACLE_TABLES:
                w.files[name].write(frames[name])
            log.debug("synth chunk %d: %d patients, %d admissions", chunk, len(subjects), frames["ADMISSIONS"].height)
        rows = {name: f.rows for name, f in w.files.items()}
    summary = SynthSummary(out_dir=out_dir, dataset=dataset_name(n_patients), n_patients=n_patients, seed=seed,
                           notes=notes, rows=rows, seconds=round(time.perf_counter() - started, 3),
                           plant_death_code=plant_death_code,
                           risk_shift=risk_shift.describe() if risk_shift is not None else None)
    params_sha = hashlib.sha256(Path(params_path).read_bytes()).hexdigest()
    (out_dir / "README.md").write_text(_readme(summary, params_sha))
    log.info("synthetic cohort %s: %d patients, %d admissions, %d prescriptions in %.1f s -> %s", summary.dataset,
             n_patients, rows["ADMISSIONS"], rows["PRESCRIPTIONS"], summary.seconds, out_dir)
    return summary
