"""The seed-level claims of recorded GPU runs: for each (task, model, device) among the runs just recorded, every
seed's paired verdict against its (task, dataset)'s reference baseline (ml.comparisons, computed by the writer),
and the claim they support (benchmarks/results_intervals.seed_claim: 'beats' only when every one of >= 3 seeds is
`better`). What benchmarks/gpu/record.py prints after recording."""

from __future__ import annotations

from pathlib import Path

import duckdb

from benchmarks.results_intervals import seed_claim


def verdict_lines(db: Path, run_ids: list[str]) -> list[str]:
    """One line per (task, dataset, model, device, compared metric) of `run_ids`' completed runs."""
    if not run_ids:
        return []
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT r.task, r.dataset, r.model, r.device, c.metric, c.averaging, r.seed, c.verdict, ref.model "
            "FROM ml.comparisons c JOIN ml.runs r USING (run_id) JOIN ml.runs ref ON ref.run_id = c.reference_run_id "
            "WHERE r.status = 'completed' AND r.run_id IN (SELECT unnest(?::VARCHAR[])) AND r.model <> ref.model "
            "ORDER BY 1, 2, 3, 4, 5, 6, 7", [run_ids]).fetchall()
    grouped: dict[tuple, list] = {}
    for task, dataset, model, device, metric, averaging, seed, verdict, reference in rows:
        grouped.setdefault((task, dataset, model, device, metric, averaging, reference), []).append((seed, verdict))
    return [f"{task} ({dataset}) {model} on {device} - {reference}, {metric} ({averaging}): "
            + "; ".join(f"s{seed} {verdict}" for seed, verdict in seeds) + " -> "
            + seed_claim(model, reference, [v for _, v in seeds]).replace("**", "")
            for (task, dataset, model, device, metric, averaging, reference), seeds in grouped.items()]
