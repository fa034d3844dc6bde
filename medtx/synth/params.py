"""Where the fitted generator parameters live, and how they are read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PARAMS_PATH = Path(__file__).with_name("params.json.gz")
PARAMS_VERSION = 1


def load_params(path: Path = PARAMS_PATH) -> dict:
    """The fitted parameter file written by `python -m medtx.synth.fit`."""
    with gzip.open(path, "rt") as f:
        params = json.load(f)
    if params.get("version") != PARAMS_VERSION:
        raise ValueError(f"{path}: parameter version {params.get('version')} != {PARAMS_VERSION}; "
                         "refit with `python -m medtx.synth.fit`")
    return params
