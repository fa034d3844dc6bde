"""`medtx synth mimic3`: write a synthetic MIMIC-III-format cohort that `medtx ingest mimic3` reads.

Runs medtx.synth directly (no server); in the pipeline a `synth:N` dataset is the step `synth.<dataset>`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flows.cli import app
from medtx.settings import get_settings
from medtx.synth import dataset_name, generate_mimic3
from medtx.synth.shift import RiskShift

synth_app = typer.Typer(help="Generate synthetic cohorts (always labelled synthetic).", no_args_is_help=True)
app.add_typer(synth_app, name="synth")

_console = Console(stderr=True)


@synth_app.command("mimic3")
def mimic3(
    patients: int = typer.Option(..., "--patients", min=1, help="Number of patients (full MIMIC-III: 46520)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed: the same seed writes byte-identical files."),
    out: Path = typer.Option(None, "--out", help="Output folder (default: <cache_dir>/synth/synth_<N>, "
                             "whose name is the dataset name `medtx ingest` derives)."),
    notes: bool = typer.Option(False, "--notes", help="Also write NOTEEVENTS with templated discharge summaries."),
    plant_death_code: bool = typer.Option(
        False, "--plant-death-code", help="Plant a known leak: diagnosis V667 (palliative care) at discharge of most "
        "stays that end in death, as real MIMIC-III has (medtx/synth/death.py); for testing the leakage gate."),
    risk_shift: str = typer.Option(
        None, "--risk-shift", help="Plant a subgroup shift: one group's 30-day readmission log-odds move, e.g. "
        "'sex=female:1.0' or 'age_band=>=80:-0.8' (medtx/synth/shift.py); the readmission oracle knows it."),
) -> None:
    """Write PATIENTS, ADMISSIONS, DIAGNOSES_ICD, PROCEDURES_ICD, PRESCRIPTIONS (+ NOTEEVENTS) as .csv.gz,
    with ORACLE_*.csv.gz ground truth and a README saying the data are synthetic."""
    out = out or get_settings().cache_dir / "synth" / dataset_name(patients)
    try:
        shift = RiskShift.parse(risk_shift) if risk_shift else None
    except ValueError as exc:
        _console.print(f"--risk-shift: {exc}")
        raise typer.Exit(2) from None
    with _console.status(f"generating {patients:,} synthetic patients..."):
        summary = generate_mimic3(out, patients, seed=seed, notes=notes, plant_death_code=plant_death_code,
                                  risk_shift=shift)
    table = Table(title=f"synthetic cohort ({summary.seconds:.1f} s, seed {seed})")
    table.add_column("file")
    table.add_column("rows", justify="right")
    for name, rows in summary.rows.items():
        table.add_row(f"{name}.csv.gz", f"{rows:,}")
    _console.print(table)
    _console.print(f"written to {summary.out_dir}; load with: medtx ingest mimic3 --source {summary.out_dir}")
