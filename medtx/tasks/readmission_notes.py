"""Task `readmission_notes`: 30-day readmission from the discharge summary text (ClinicalBERT). It trains on
the `readmission` task's samples (their `text` column), with the same patient split; it builds nothing.

Notes follow the clock (medtx.samples.clock): the text holds only the admission's discharge summaries charted
before the patient's next admission began (and within the 30-day window), and the prediction time is the last
one's chart time (`text_time`), not the discharge: MIMIC-III charts many summaries a day or more after discharge.
Every readmission the label counts began after that time (a summary charted once the next admission began is
not a feature), so the label is readmission's. The rows without such a summary are not this task's samples.
"""

from __future__ import annotations

from dataclasses import replace

from medtx.samples.clock import summary_time_sql
from medtx.tasks.base import BINARY_SCORING, Clock, Lineage, Samples, Task

TASK = Task(
    name="readmission_notes",
    kind="binary",
    family="text",
    description="30-day readmission (binary) from the discharge summary text",
    order=55,
    # The ClinicalBERT setting (the discharge summary), with its prediction time declared honestly: the chart time
    # of the last summary that may be read (recomputed by the leakage gate from raw.noteevents; docs/TASKS.md).
    clock=Clock(
        prediction_time=summary_time_sql("stay.hadm_id", "stay.subject_id", "stay.admittime",
                                         "stay.dischtime + INTERVAL 30 DAY"),
        column="text_time",
        words="at the chart time of the admission's last discharge summary charted before the next admission began",
        observation_window="the admission's discharge summaries charted by then",
        feature_sources=(("text", "note"),),
        outcome="a non-elective admission within 30 days of discharge",
        outcome_known="dischtime + INTERVAL 30 DAY",
    ),
    samples=Samples(table="samples.readmission", columns=("dataset", "subject_id", "hadm_id", "text_time", "text", "label"),
                    features=("text",), label_column="label", label_name="readmission", split_unit="patient",
                    filter="text IS NOT NULL"),
    lineage=Lineage(builds="readmission"),
    scoring=replace(BINARY_SCORING, monitor="auroc"),
    # Every text model pools chunks the ClinicalBERT way here (medtx/models/bert_text.py): "*" = any model.
    model_defaults={"*": {"pooling": "clinicalbert"}},
)
