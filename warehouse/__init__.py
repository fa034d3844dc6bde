"""The warehouse schema: versioned SQL migrations, one file per version, applied in order.

Layers (dbt-style): raw (as ingested, with provenance) -> ref (code dictionaries) ->
core (cleaned, mapped facts) -> samples (task datasets, splits, vocabularies) -> ml (runs,
metrics, predictions, attention). Each table is owned by one stage.
"""

from importlib.resources import files
from pathlib import Path


def migrations_dir() -> Path:
    return Path(str(files("warehouse") / "migrations"))
