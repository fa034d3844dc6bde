"""PyHealth 1.1.6's own drug-recommendation path, timed: `MIMIC3Dataset` parse + `drug_recommendation_mimic3_fn`.

Run by `benchmarks/samples.py --pyhealth-python PY` in a separate interpreter that has PyHealth 1.1.6 installed
(its pins, pandas<2 and numpy<2, clash with medtx's environment), e.g.:

    python3 -m venv /tmp/pyhealth-venv
    /tmp/pyhealth-venv/bin/pip install torch==2.13.0 "numpy<2" "pandas<2" "pandarallel<1.6.5" tqdm \
        scikit-learn networkx "urllib3<=1.26.15" "setuptools<80" pillow torchvision mne
    /tmp/pyhealth-venv/bin/pip install --no-deps pyhealth==1.1.6

No NDC->ATC mapping: PyHealth's `code_mapping={"NDC": "ATC"}` downloads its mapping files at run time, which
this offline machine cannot do, so the drugs stay NDC codes. Mapping would only add time: the figure is a lower
bound on PyHealth's cost. Prints one JSON line.

    python benchmarks/pyhealth_drug_rec.py CSV_FOLDER
"""

import json
import resource
import sys
import time

from pyhealth.datasets import MIMIC3Dataset
from pyhealth.tasks import drug_recommendation_mimic3_fn


def main(root: str) -> None:
    start = time.perf_counter()
    dataset = MIMIC3Dataset(root=root, tables=["DIAGNOSES_ICD", "PROCEDURES_ICD", "PRESCRIPTIONS"],
                            refresh_cache=True)
    parsed = time.perf_counter()
    samples = dataset.set_task(drug_recommendation_mimic3_fn)
    done = time.perf_counter()
    print(json.dumps({"parse_s": parsed - start, "task_s": done - parsed, "total_s": done - start,
                      "samples": len(samples),
                      "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}))


if __name__ == "__main__":
    main(sys.argv[1])
