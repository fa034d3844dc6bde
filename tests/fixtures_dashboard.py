"""A small REAL warehouse for the dashboard tests, built by the real stage functions.

ingest the bundled MIMIC-III demo and 120 MTSamples notes -> reference tables + NDC->ATC mapping ->
drug_rec and specialty samples -> a baseline and a 1-epoch transformer on drug_rec, TF-IDF and a tiny
from-scratch BERT on specialty -> publish. Built once per test session (both dashboard test modules share it).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

from medtx.settings import snapshot_path

DATA = Path(__file__).resolve().parent.parent / "data"
DATASET = "mimic3_demo"
# The smallest BERT that still has 2 layers x 2 heads to select in the attention views.
TINY_BERT = {"epochs": 1, "mlm_epochs": 1, "hidden": 32, "layers": 2, "heads": 2, "max_len": 64,
             "max_chunks": 1, "vocab_size": 1500, "n_showcase": 3, "attention_max_tokens": 48}


@functools.cache
def real_warehouse() -> tuple[Path, Path]:
    """(live warehouse, published snapshot) in a session temp folder."""
    folder = Path(tempfile.mkdtemp(prefix="medtx-dashboard-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # ~100 MB per session
    # Checkpoints and the MLM cache stay in tmp while building; the environment is restored afterwards.
    saved = {k: os.environ.get(k) for k in ("MEDTX_MODELS_DIR", "MEDTX_CACHE_DIR")}
    os.environ["MEDTX_MODELS_DIR"] = str(folder / "models")
    os.environ["MEDTX_CACHE_DIR"] = str(folder / "cache")
    try:
        return _build(folder)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _build(folder: Path) -> tuple[Path, Path]:
    from medtx.codes.mapping import map_prescriptions
    from medtx.codes.reference import load_reference_tables
    from medtx.store.db import connect
    from medtx.ingest import ingest_mimic3, ingest_mtsamples
    from medtx.pipeline.runs import finish_pipeline_run, start_pipeline_run
    from medtx.publish.snapshot import publish_snapshot
    from medtx.tasks.build import build_samples
    from medtx.pipeline.steps import train_in_process
    from medtx.tasks import get_task

    db = folder / "warehouse.duckdb"
    start_pipeline_run(db, "test-pipeline-1", {"purpose": "dashboard tests"})
    ingest_mimic3(db, DATA / "mimic3_demo", DATASET)
    ingest_mtsamples(db, DATA / "mtsamples" / "mtsamples.csv.gz", limit=120)
    con = connect(db)
    try:
        load_reference_tables(con, DATA)
        map_prescriptions(con, DATASET)
        build_samples(con, DATA, tasks=["drug_rec", "specialty"], datasets=[DATASET])
    finally:
        con.close()
    shown = {"n_showcase": 3, "max_attention_tokens": 24}  # run options (medtx.training.runners.ehr.RUN_KEYS)
    train_in_process(db, get_task("drug_rec"), "logreg", 0, shown, dataset=DATASET, models_dir=folder / "models")
    train_in_process(db, get_task("drug_rec"), "transformer", 0,
                     {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "epochs": 1, **shown},
                     dataset=DATASET, models_dir=folder / "models")
    train_in_process(db, get_task("specialty"), "tfidf_logreg", 0)
    train_in_process(db, get_task("specialty"), "bert_scratch", 0, TINY_BERT)
    finish_pipeline_run(db, "test-pipeline-1", failed=[])
    snapshot = snapshot_path(db)
    publish_snapshot(db, snapshot)
    return db, snapshot
