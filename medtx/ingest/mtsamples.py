"""Ingest the MTSamples transcriptions (`raw.mtsamples`) from a CSV/CSV.gz file or URL.

Two layouts are accepted: the bundled one (`note_id,description,medical_specialty,...`) and Kaggle's
original `mtsamples.csv`, whose first column is an unnamed 0-based index; there `note_id = index + 1`,
which is how the bundled file numbers the same notes (data/SOURCES.md). Values are stored as read
(Kaggle's leading spaces included): cleaning belongs to the samples stage.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from medtx.ingest.loader import IngestError, IngestResult, ingest_file
from medtx.ingest.schema import MTSAMPLES
from medtx.ingest.sources import SourceNotFound, fetch

DATASET = "mtsamples"  # dataset key of its log and rejects rows (raw.mtsamples itself has no dataset column)


def ingest_mtsamples(
    db: Path,
    source: str | Path,
    cache_dir: Path | None = None,
    *,
    limit: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> IngestResult:
    """Replace raw.mtsamples with the notes of `source` (file or URL), atomically, and log the ingest.
    `limit`: keep only the first N notes (quick demos)."""
    cache_dir = cache_dir or Path(db).parent / "cache"
    try:
        resolved = fetch(source, cache_dir, progress=progress)
    except SourceNotFound as exc:
        raise IngestError(f"{source}: MTSamples file not found ({exc})") from exc
    return ingest_file(Path(db), MTSAMPLES, resolved, dataset=DATASET, index_column="note_id", limit=limit)
