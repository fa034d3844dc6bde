"""Ingest stage: MIMIC-III-format tables and MTSamples from folders, files or URLs into `raw.*`.

Public API (one table per call, so an orchestrator can run one task per table):
`ingest_mimic3_table`, `ingest_mimic3`, `resolve_mimic3_source`, `ingest_mtsamples`, `IngestResult`.
"""

from medtx.ingest.loader import IngestError, IngestResult
from medtx.ingest.mimic3 import check_dataset, ingest_mimic3, ingest_mimic3_table, resolve_mimic3_source
from medtx.ingest.mtsamples import ingest_mtsamples
from medtx.ingest.schema import CORE_MIMIC3_TABLES, MIMIC3_TABLES, OPTIONAL_MIMIC3_TABLES
from medtx.ingest.sources import ChecksumError, DownloadError, SourceNotFound, dataset_name, fetch
from medtx.ingest.staging import DEFAULT_MAX_SHRINK, ShrinkGuard

__all__ = [
    "CORE_MIMIC3_TABLES",
    "DEFAULT_MAX_SHRINK",
    "MIMIC3_TABLES",
    "OPTIONAL_MIMIC3_TABLES",
    "ChecksumError",
    "DownloadError",
    "IngestError",
    "IngestResult",
    "ShrinkGuard",
    "SourceNotFound",
    "check_dataset",
    "dataset_name",
    "fetch",
    "ingest_mimic3",
    "ingest_mimic3_table",
    "ingest_mtsamples",
    "resolve_mimic3_source",
]
