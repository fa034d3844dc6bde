"""What a pipeline cannot know about a study, written once by the user in the pipeline config (`study:`, checked in
medtx.pipeline.config.StudyConfig) and shown on every model card of the pipeline run that recorded the model: who
developed it, the ethics approval, funding, registration, ... (the items docs/CARD_COVERAGE.md marks "study field").
A field left out (or empty) reads "not stated": the card never invents it, and a reader sees what is missing.

Read from the run's pipeline run (`ml.pipeline_runs.config`, the validated config as JSON); a run trained outside a
pipeline (`medtx train`) or recorded before the field existed has every field "not stated".
"""

from __future__ import annotations

import json

import duckdb

NOT_STATED = "not stated"
# key -> (what the card calls it, the reporting items it answers: TRIPOD+AI 2024 item / Model Cards section)
FIELDS: dict[str, tuple[str, str]] = {
    "title": ("study title", "TRIPOD+AI 1"),
    "organization": ("developed by (person or organisation)", "Model Cards: model details"),
    "contact": ("contact for questions or comments", "Model Cards: model details"),
    "data_source": ("where and when the data were collected (centres, dates)", "TRIPOD+AI 5, 6a"),
    "ethics_approval": ("ethics approval (committee, reference) or waiver", "TRIPOD+AI 17"),
    "funding": ("funding and the funders' role", "TRIPOD+AI 18a"),
    "conflicts_of_interest": ("conflicts of interest", "TRIPOD+AI 18b"),
    "protocol": ("study protocol (where to read it)", "TRIPOD+AI 18c"),
    "registration": ("registration (registry, number)", "TRIPOD+AI 18d"),
    "data_availability": ("data availability", "TRIPOD+AI 18e"),
    "code_availability": ("code availability", "TRIPOD+AI 18f"),
    "patient_public_involvement": ("patient and public involvement", "TRIPOD+AI 19"),
    "ethical_considerations": ("ethical considerations (sensitive data, risks, mitigations)",
                               "Model Cards: ethical considerations"),
    "license": ("licence of the model and its card", "Model Cards: model details"),
}


def study_fields(con: duckdb.DuckDBPyConnection, pipeline_run_id: str | None) -> dict[str, str | None]:
    """{field: the user's text, or None when not stated}, from the run's pipeline config."""
    stated: dict = {}
    if pipeline_run_id is not None:
        row = con.execute("SELECT config FROM ml.pipeline_runs WHERE pipeline_run_id = ?",
                          [pipeline_run_id]).fetchall()
        try:
            config = json.loads(row[0][0]) if row and row[0][0] else {}
        except (TypeError, ValueError):
            config = {}
        stated = config.get("study") or {} if isinstance(config, dict) else {}
    return {key: (str(stated[key]).strip() or None) if isinstance(stated, dict) and stated.get(key) is not None
            else None for key in FIELDS}


def section(con: duckdb.DuckDBPyConnection, run: dict, data: dict) -> dict:
    """The card's `study` section (Section keyword arguments); fills the JSON twin's `study`."""
    fields = study_fields(con, run.get("pipeline_run_id"))
    data["study"] = fields
    missing = sum(v is None for v in fields.values())
    return {"id": "study", "title": "Study (stated by the user in the pipeline config)",
            "paragraphs": ["What no pipeline can know, written once per study in the pipeline config's `study:` "
                           f"block (docs/MODEL_CARD.md); {missing} of {len(fields)} not stated."],
            "tables": [(["", "", "answers"], [[name, fields[key] or NOT_STATED, item]
                                              for key, (name, item) in FIELDS.items()])]}
