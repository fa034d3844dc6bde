"""Task `readmission`: unplanned readmission within 30 days of discharge, from the admission's codes and the
patient's history (the corrected ClinicalBERT rule; builder in medtx/samples/readmission.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import EHR_SAMPLE_EXTRAS, EHR_VISIT_READS, BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    from medtx.samples.readmission import build_readmission

    return build_readmission(con, ctx.dataset, seed=ctx.seed, fractions=ctx.fractions, min_count=ctx.min_count)


TASK = Task(
    name="readmission",
    kind="binary",
    family="ehr",
    sample_table="samples.readmission",
    sample_columns=("dataset", "subject_id", "hadm_id", "admittime", "dischtime", "prediction_time", "conditions",
                    "procedures", "drugs", "text", "label"),
    features=("conditions", "procedures", "drugs"),
    label_column="label",
    label_name="readmission_30d",
    split_unit="patient",
    metrics=("auroc", "auprc", "rp80"),
    monitor="auprc",
    compared=(("auprc", "none"), ("rp80", "none")),
    # readmission covers nearly every admission, so its split decides the MEDS split of most subjects
    meds_split_rank=0,
    # models: every EHR model serving a binary task (the default; copy_last has no rule for a yes/no outcome
    # and seq2seq generates drug sets, so neither serves it)
    build=build,
    reads=EHR_VISIT_READS,  # raw.noteevents among them: the discharge summaries, for the note-text view
    writes=("samples.readmission", *EHR_SAMPLE_EXTRAS),
    prediction_time="dischtime",
    clock="at discharge of the admission",
    observation_window="every admission of the patient up to and including this one",
    feature_sources=(("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs", "drug")),
    order=30,
    description="unplanned readmission within 30 days (binary), codes of the admission and history",
)
