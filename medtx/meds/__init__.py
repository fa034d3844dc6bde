"""MEDS (Medical Event Data Standard 0.4) export and import.

`export_meds(con, dataset, out)` writes a warehouse dataset as MEDS; `ingest_meds(db, source, dataset)` reads
a MEDS dataset into `raw.*` so every task builder runs on it unchanged. Code conventions: docs/MEDS.md.
"""

from medtx.meds.export import ExportError, ExportResult, export_meds
from medtx.meds.ingest import MedsIngestResult, ingest_meds
from medtx.meds.mapping import CodeMapping, load_mapping
from medtx.meds.validate import MedsFormatError

__all__ = ["CodeMapping", "ExportError", "ExportResult", "MedsFormatError", "MedsIngestResult", "export_meds",
           "ingest_meds", "load_mapping"]
