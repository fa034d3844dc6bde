"""One settings object for every stage: defaults < YAML file < MEDTX_* environment < CLI flags.

The YAML file is `medtx.yaml` in the working directory, or the path in `MEDTX_CONFIG`.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_DATA = PROJECT_ROOT / "data"


def _yaml_path() -> Path:
    return Path(os.environ.get("MEDTX_CONFIG", "medtx.yaml"))


class Settings(BaseSettings):
    """Where things live. Every path can be overridden by `MEDTX_<FIELD>` or the YAML file."""

    model_config = SettingsConfigDict(env_prefix="MEDTX_", extra="ignore")

    # The live, read-write warehouse. Git-ignored, inside the project by default.
    db: Path = PROJECT_ROOT / "var" / "warehouse.duckdb"
    # Bundled offline data (MIMIC-III demo, MTSamples, code dictionaries).
    data_dir: Path = BUNDLED_DATA
    # Download cache for URL sources, model checkpoints, Prefect results.
    cache_dir: Path = PROJECT_ROOT / "var" / "cache"
    models_dir: Path = PROJECT_ROOT / "var" / "models"
    results_dir: Path = PROJECT_ROOT / "var" / "prefect-results"
    # Training and result packages (medtx.exchange): any folder every training worker mounts.
    exchange_dir: Path = PROJECT_ROOT / "var" / "exchange"

    @property
    def snapshot(self) -> Path:
        """The read-only copy published for the dashboard, next to the live warehouse."""
        return snapshot_path(self.db)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_source = YamlConfigSettingsSource(settings_cls, yaml_file=_yaml_path())
        return (init_settings, env_settings, yaml_source)


def snapshot_path(db: Path) -> Path:
    """`var/warehouse.duckdb` -> `var/warehouse.snapshot.duckdb`."""
    return db.with_name(f"{db.stem}.snapshot{db.suffix or '.duckdb'}")


def get_settings(**overrides: object) -> Settings:
    """Settings with explicit overrides (e.g. `db=` from a `--db` flag); None values are ignored."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
