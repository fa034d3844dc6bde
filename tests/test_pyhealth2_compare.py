"""benchmarks/samples_pyhealth2.py: medtx's drug_rec samples against PyHealth 2.1.0's on the same CSV files.

The equality used by the benchmark (per (patient, visit): the per-visit code sets of the history and the label set)
is tested here on hand-made samples, including the differences it must report. The end-to-end comparison on a
tiny synthetic cohort runs only where a PyHealth 2.1.0 interpreter exists (MEDTX_PYHEALTH2_PYTHON, default
/tmp/pyhealth2-venv/bin/python, set up as benchmarks/pyhealth2_drug_rec.py's docstring says); it is skipped
elsewhere, since PyHealth 2.x needs Python >= 3.12 and its own dependency pins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.samples_pyhealth2 import compare, normalize, pyhealth_samples

ROOT = Path(__file__).resolve().parents[1]
PYHEALTH2 = os.environ.get("MEDTX_PYHEALTH2_PYTHON", "/tmp/pyhealth2-venv/bin/python")


def medtx_row(**kw):
    row = {"patient": 1, "visit": 11, "conditions": [["4019", "25000"], ["4280"]], "procedures": [["3893"], ["9904"]],
           "drugs_hist": [["A02B"], []], "drugs": ["B01A", "C07A"]}
    row.update(kw)
    return normalize(row["patient"], row["visit"], row["conditions"], row["procedures"], row["drugs_hist"],
                     row["drugs"])


def test_pyhealth_lists_with_duplicates_other_order_nulls_and_string_ids_are_the_same_sample():
    ours = dict([medtx_row()])
    theirs = dict([normalize("1", "11", [["25000", "4019", "4019"], ["4280", None]], [["3893"], ["9904", ""]],
                             [["A02B"], []], ["C07A", "B01A"])])
    result = compare(ours, theirs)
    assert result["equal"] and result["common"] == 1 and result["samples_differing"] == 0


def test_a_different_label_a_missing_visit_and_an_extra_sample_are_each_reported():
    ours = dict([medtx_row(), medtx_row(visit=12)])
    theirs = dict([medtx_row(drugs=["B01A"]), medtx_row(visit=13)])
    result = compare(ours, theirs)
    assert not result["equal"]
    assert (result["common"], result["only_medtx"], result["only_pyhealth"]) == (1, 1, 1)
    assert result["samples_differing"] == 1
    assert result["differ_by_field"] == {"conditions": 0, "procedures": 0, "drugs_hist": 0, "drugs": 1}


def test_a_code_in_the_wrong_history_visit_is_a_difference():
    ours = dict([medtx_row()])
    theirs = dict([medtx_row(conditions=[["4019"], ["4280", "25000"]])])
    result = compare(ours, theirs)
    assert not result["equal"] and result["differ_by_field"]["conditions"] == 1


def test_a_dump_holding_one_visit_twice_is_refused(tmp_path):
    line = json.dumps({"patient_id": "1", "visit_id": "11", "conditions": [["1"]], "procedures": [["2"]],
                       "drugs_hist": [[]], "drugs": ["A01A"]})
    dump = tmp_path / "d.jsonl"
    dump.write_text(line + "\n" + line + "\n")
    with pytest.raises(ValueError, match="two PyHealth samples for patient 1 visit 11"):
        pyhealth_samples(dump)


@pytest.mark.slow
@pytest.mark.skipif(not Path(PYHEALTH2).exists(), reason=f"no PyHealth 2.1.0 interpreter at {PYHEALTH2}")
def test_medtx_and_pyhealth_2_build_equal_samples_from_the_same_tiny_cohort(tmp_path):
    done = subprocess.run(
        [sys.executable, "benchmarks/samples_pyhealth2.py", "--pyhealth2-python", PYHEALTH2, "--patients", "300",
         "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PyHealth 2.1.0" in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("samples:"))
    assert line.endswith("equal: True"), line
    assert "only medtx 0, only PyHealth 0, differing 0" in line
