"""One settings object for every stage: defaults < YAML file < MEDTX_* environment < CLI flags.

The YAML file is `medtx.yaml` in the working directory, or the path in `MEDTX_CONFIG`.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import model_validator
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
    """Where things live. Every path can be overridden by `MEDTX_<FIELD>` or the YAML file.

    Every writable path derives from one root (see `root`): `home` (`MEDTX_HOME`) when set, else the folder
    of an explicitly given `db` (`--db`, `MEDTX_DB`), else `<checkout>/var`. So `--db /x/w.duckdb` puts the
    download cache, model checkpoints, Prefect results and Prefect home under `/x/` and nothing is written
    into the checkout. A path set explicitly (e.g. `MEDTX_CACHE_DIR`) still wins.
    """

    model_config = SettingsConfigDict(env_prefix="MEDTX_", extra="ignore")

    # The root of every writable path (MEDTX_HOME); None: the live warehouse's folder (see above).
    home: Path | None = None
    # The live, read-write warehouse; default `<root>/warehouse.duckdb`.
    db: Path | None = None  # always a Path after validation (_derive_paths)
    # Bundled offline data (MIMIC-III demo, MTSamples, code dictionaries): read only.
    data_dir: Path = BUNDLED_DATA
    # Download cache for URL sources, model checkpoints, Prefect results: `<root>/cache` etc. when not set.
    cache_dir: Path | None = None
    models_dir: Path | None = None
    results_dir: Path | None = None
    # Training and result packages (medtx.pipeline.exchange): any folder every training worker mounts.
    exchange_dir: Path | None = None

    @model_validator(mode="after")
    def _derive_paths(self) -> Settings:
        root = writable_root(self.db, self.home)
        if self.db is None:
            self.db = root / "warehouse.duckdb"
        for name, default in (("cache_dir", "cache"), ("models_dir", "models"), ("results_dir", "prefect-results"),
                              ("exchange_dir", "exchange")):
            if getattr(self, name) is None:
                setattr(self, name, root / default)
        return self

    @property
    def root(self) -> Path:
        """The folder every writable path derives from."""
        return writable_root(self.db, self.home)

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect-home"

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


def writable_root(db: Path | None, home: Path | None = None) -> Path:
    """`home` if given, else the folder of `db`, else `<checkout>/var` (the default warehouse's folder)."""
    if home is not None:
        return Path(home).expanduser()
    if db is not None:
        return Path(db).expanduser().parent
    return PROJECT_ROOT / "var"


def snapshot_path(db: Path) -> Path:
    """`var/warehouse.duckdb` -> `var/warehouse.snapshot.duckdb`."""
    return db.with_name(f"{db.stem}.snapshot{db.suffix or '.duckdb'}")


def get_settings(**overrides: object) -> Settings:
    """Settings with explicit overrides (e.g. `db=` from a `--db` flag); None values are ignored."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
