"""Ingest the MTSamples transcriptions (`raw.mtsamples`) from a CSV/CSV.gz file or URL.

Two layouts are accepted: the bundled one (`note_id,description,medical_specialty,...`) and Kaggle's
original `mtsamples.csv`, whose first column is an unnamed 0-based index; there `note_id = index + 1`,
which is how the bundled file numbers the same notes (data/SOURCES.md). Values are stored as read
(Kaggle's leading spaces included): cleaning belongs to the samples stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from medtx.ingest.loader import IngestError, IngestResult
from medtx.ingest.schema import MTSAMPLES
from medtx.ingest.sources import SourceNotFound, fetch
from medtx.ingest.staging import ShrinkGuard, TableSource, ingest_tables

DATASET = "mtsamples"  # dataset key of its log and rejects rows (raw.mtsamples itself has no dataset column)


def ingest_mtsamples(
    db: Path,
    source: str | Path,
    cache_dir: Path | None = None,
    *,
    limit: int | None = None,
    guard: ShrinkGuard = ShrinkGuard(),
    progress: Callable[[int, int | None], None] | None = None,
    plausibility: str = "warn",
) -> IngestResult:
    """Replace raw.mtsamples with the notes of `source` (file or URL), atomically, and log the ingest.
    `limit`: keep only the first N notes (quick demos); `guard`: the row-count guard (staging.ShrinkGuard)."""
    cache_dir = cache_dir or Path(db).parent / "cache"
    try:
        resolved = fetch(source, cache_dir, progress=progress)
    except SourceNotFound as exc:
        raise IngestError(f"{source}: MTSamples file not found ({exc})") from exc
    item = TableSource(MTSAMPLES, resolved, str(source), index_column="note_id")
    return ingest_tables(Path(db), DATASET, [item], guard=guard, limit=limit,
                         command="medtx ingest mtsamples", plausibility=plausibility)[0]
