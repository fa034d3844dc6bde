"""Synthetic MIMIC-III-format cohort generator with a known generating process (and its oracle)."""

from medtx.synth.generate import SynthSummary, dataset_name, generate_mimic3
from medtx.synth.params import load_params

__all__ = ["SynthSummary", "dataset_name", "generate_mimic3", "load_params"]
