"""Setup of one EHR training run before its first epoch (issue #18): imports, the task's samples and vocabularies
from the warehouse, the model, encoding every split and collating it once (`EncodedSet`). Prints the seconds.

Time two checkouts side by side from outside, whole process included, e.g.

    farm-bench --vs 'env PYTHONPATH=/path/to/old .venv/bin/python benchmarks/archive/run_setup.py --db W --dataset D' \\
        -- env PYTHONPATH=. .venv/bin/python benchmarks/archive/run_setup.py --db W --dataset D
"""

from __future__ import annotations

import argparse
import time

started = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--task", default="drug_rec")
    parser.add_argument("--model", default="transformer")
    args = parser.parse_args()

    import torch

    from medtx.store.db import open_warehouse
    from medtx.models.encoded import EncodedSet
    from medtx.models.registry import build_ehr_model
    from medtx.tasks import get_task
    from medtx.training.experiment import load_ehr_samples

    torch.set_num_threads(1)
    task = get_task(args.task)
    with open_warehouse(args.db, read_only=True) as con:
        data = load_ehr_samples(con, args.dataset, task, args.model)
    bundle = build_ehr_model(args.model, task, data.vocabs, data.label_vocab, None)
    sizes = {name: len(EncodedSet(bundle.encode(frame), bundle.collate)) for name, frame in data.parts.items()}
    print(f"setup {time.perf_counter() - started:.2f} s for {sizes}")


if __name__ == "__main__":
    main()
