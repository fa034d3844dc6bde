"""Task `readmission_notes`: 30-day readmission from the discharge summary text (ClinicalBERT). It trains on
the `readmission` task's samples (their `text` column), with the same patient split; it builds nothing."""

from __future__ import annotations

from medtx.tasks.base import Task

TASK = Task(
    name="readmission_notes",
    kind="binary",
    family="text",
    sample_table="samples.readmission",
    sample_columns=("dataset", "subject_id", "hadm_id", "prediction_time", "text", "label"),
    features=("text",),
    label_column="label",
    label_name="readmission",
    split_unit="patient",
    metrics=("auroc", "auprc", "rp80"),
    monitor="auroc",
    compared=(("auprc", "none"), ("rp80", "none")),
    builds="readmission",
    # Every text model pools chunks the ClinicalBERT way here (medtx/models/bert_text.py): "*" = any model.
    model_defaults={"*": {"pooling": "clinicalbert"}},
    # The ClinicalBERT convention: the discharge summary is read at discharge (MIMIC-III charts many summaries a day
    # or more after discharge, so by the note clock (medtx.samples.clock) this is a retrospective task; docs/TASKS.md).
    prediction_time="dischtime",
    clock="at discharge of the admission (ClinicalBERT convention; the summary may be charted later)",
    observation_window="the admission's discharge summaries",
    outcome="a non-elective admission within 30 days of discharge",
    outcome_known="dischtime + INTERVAL 30 DAY",
    order=55,
    description="30-day readmission (binary) from the discharge summary text",
)
