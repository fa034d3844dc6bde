"""Every SQL statement the dashboard runs, in one package: the snapshot reader and caches (`core`), and one
module per page (`overview`, `leaderboard`, `run_detail`, `patient`, `notes`). Importers use `dashboard.queries`
(`from dashboard import queries`); the rules every query keeps are in `dashboard.queries.core`.
"""

from __future__ import annotations

from dashboard.queries.core import (  # noqa: F401  (the public names of the package)
    Signature,
    _cached_query,  # its cache_info() is what the cache tests read
    cached_view,
    clear_cache,
    has_snapshot,
    open_snapshot,
    query,
    snapshot_signature,
)
from dashboard.queries.overview import (  # noqa: F401
    cohort_counts,
    datasets,
    ingest_checks,
    ingest_log,
    ingest_rejects,
    last_pipeline_run,
    leakage_gate,
    leakage_gates,
    mapping_coverage,
    meds_codes,
    pipeline_progress,
    pipeline_steps,
    run_status_counts,
    sample_counts,
    top_unmapped_drugs,
)
from dashboard.queries.leaderboard import (  # noqa: F401
    RUN_VARIANT_SQL,
    averaging_options,
    default_leaderboard_dataset,
    leaderboard_metrics,
    leaderboard_runs,
    leaderboard_trust,
    leaderboard_sizes,
    run_comparisons,
    task_datasets,
)
from dashboard.queries.run_detail import (  # noqa: F401
    default_run,
    run,
    run_calibration,
    run_confusion,
    run_epochs,
    run_label_metrics,
    run_metrics,
    runs_index,
)
from dashboard.queries.patient import (  # noqa: F401
    attention,
    attention_modules,
    ddi_pairs,
    explorer_runs,
    label_descriptions,
    patient_history,
    patient_visits,
    run_patients,
    visit_predictions,
)
from dashboard.queries.notes import (  # noqa: F401
    admission_notes,
    discharge_note_text,
    note_layers,
    note_text,
    note_token_attention,
    run_notes,
    top_tokens_per_class,
)
