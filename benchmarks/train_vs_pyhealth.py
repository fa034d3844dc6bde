"""Training throughput: medtx's `transformer` against PyHealth's `Transformer` on the same drug_rec samples.

Both train on the same training patients (medtx's stored patient split of a synthetic cohort), with batch size
32, the same number of epochs and torch threads, validating on the same validation patients every epoch, and
are scored on the same test patients. Runs are interleaved (medtx, PyHealth, medtx, PyHealth, ...), each in
its own subprocess. Printed: samples/s of each (training samples x epochs / seconds of the epoch loop: training,
validation and each epoch's checkpoint writes on both sides, and medtx's ml.epochs rows; before 2026-11-25's round 6
medtx's side counted only the training + validation seconds ml.epochs records, which medtx's line still shows as
"epochs alone"), the ratio, and the test PR-AUC of each (`pr_auc_samples`: sklearn's sample-averaged average
precision over each side's own test probabilities).

PyHealth lives in its own virtualenv (its pins clash with medtx's; see benchmarks/pyhealth_drug_rec.py). On
this machine (Python 3.11) PyHealth 2.x cannot install (it requires Python >= 3.12), so 1.1.6 is used:

    python3 -m venv /tmp/pyhealth-venv
    /tmp/pyhealth-venv/bin/pip install torch==2.13.0 "numpy<2" "pandas<2" "pandarallel<1.6.5" tqdm \\
        scikit-learn networkx "urllib3<=1.26.15" "setuptools<80" pillow
    /tmp/pyhealth-venv/bin/pip install --no-deps pyhealth==1.1.6

PyHealth 1.1.6 imports torchvision, mne and rdkit at package import time for image/EEG/SafeDrug code that the
EHR Transformer never runs; the worker stubs those three modules instead of installing them.

The cohort: `medtx synth mimic3 --patients N`, `medtx ingest mimic3`, `medtx map-codes`,
`medtx build-samples --task drug_rec` into WAREHOUSE (see --help). `--medtx-root` may be given twice
(e.g. main's checkout and a branch's) to compare medtx versions in the same interleaved rounds; a root may
carry its own overrides as JSON after `@` (`--medtx-root '/work/main@{"length_buckets": 16}'`).
`--length-buckets K` (K > 0) sets TrainConfig.length_buckets for every root; the default 0 leaves each checkout its
own default. Since 2026-11-25 (round 5) drug_rec's transformer buckets by default (`Task.train_defaults`);
`--medtx-root 'ROOT@{"length_buckets": 0}'` times the plain shuffle. Before 2026-11-24's third round the script
defaulted to 16, so a bare root meant "with the opt-in buckets".

    .venv/bin/python benchmarks/train_vs_pyhealth.py --db W.duckdb --dataset synth_10000 \\
        --pyhealth-python /tmp/pyhealth-venv/bin/python [--medtx-root /work/main] [--epochs 5] [--rounds 2] \\
        [--threads N|auto] [--set key=value ...] [--background K] [--model M]

`--threads auto`: each side picks its own threads, as a user running it would get them: PyHealth torch's default
(every core), medtx `medtx train`'s rule (every available core, capped at cores // trainings running on the
machine, rechecked every epoch; checkouts without that rule just use every core). `--background K` keeps K
more medtx trainings of this checkout (threads auto) running during every round, in their own warehouse copies: the
benchmark under load. `--set key=value` passes a model/trainer override to medtx (e.g. the generic
transformer defaults instead of drug_rec's: `--set max_visits=20 --set max_codes=128 --set attention_dropout=0.1`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEATURES = ("conditions", "procedures", "drugs_hist")


# ----------------------------------------------------------------------------------------------- shared


def sample_ap(y_true, y_prob) -> float:
    """Sample-averaged average precision (PyHealth's and medtx's `pr_auc_samples`), samples with a positive."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    keep = np.asarray(y_true).sum(1) > 0
    return float(average_precision_score(np.asarray(y_true)[keep], np.asarray(y_prob)[keep], average="samples"))


def export_samples(db: Path, dataset: str, out: Path) -> dict[str, int]:
    """medtx's drug_rec samples with their split, as JSON (the PyHealth worker's input)."""
    import tempfile

    import polars as pl

    from medtx.pipeline.exchange import export_training_package
    from medtx.tasks import get_task
    from medtx.training.runners.ehr import split_samples
    from medtx.training.packages import read_training_package

    task = get_task("drug_rec")  # the rows its training package holds, as a run reads them
    with tempfile.TemporaryDirectory() as exchange:
        package = export_training_package(db, (task.samples.table, "samples.splits"),
                                          {"dataset": dataset, "task": task.name}, exchange, "pyhealth")
        tables = read_training_package(package)[1]
        parts = {k: pl.from_arrow(v) for k, v in split_samples(tables, dataset, task).items()}
    rows = []
    for split, frame in parts.items():
        for r in frame.select("subject_id", "hadm_id", *FEATURES, "drugs").iter_rows(named=True):
            rows.append({"patient_id": str(r["subject_id"]), "visit_id": str(r["hadm_id"]), "split": split,
                         **{f: [list(v or []) for v in r[f]] for f in FEATURES}, "drugs": list(r["drugs"] or [])})
    out.write_text(json.dumps(rows))
    return {split: frame.height for split, frame in parts.items()}


# ----------------------------------------------------------------------------------------------- workers


def medtx_worker(db: str, dataset: str, epochs: int, threads: str, seed: int, buckets: int = 0,
                 extra: dict | None = None, model: str = "transformer") -> dict:
    """One medtx run through train_in_process (the pipeline's path), timed over its whole epoch loop
    (`_epoch_loop_clock`; ml.epochs' training + validation seconds come back as "epoch_seconds"). `buckets` (> 0) sets
    TrainConfig.length_buckets where the checkout has it (0: the checkout's own default). `threads`
    "auto": every core the process may use, as `medtx train` sets it (its trainer then caps it at its share)."""
    import dataclasses

    import numpy as np
    import torch

    from medtx.tasks import get_task
    from medtx.pipeline.steps import train_in_process
    from medtx.store.db import open_warehouse
    from medtx.training.trainer import TrainConfig

    overrides: dict = {"batch_size": 32, "patience": epochs + 1}
    if threads == "auto":
        from medtx.runtime.resources import threads_per_training  # what `medtx train` alone sets

        torch.set_num_threads(threads_per_training(1))
    else:
        overrides["num_threads"] = int(threads)
    if buckets and "length_buckets" in {f.name for f in dataclasses.fields(TrainConfig)}:
        overrides["length_buckets"] = buckets
    overrides.update(extra or {})
    models = tempfile.mkdtemp(prefix="bench-medtx-")
    with _epoch_loop_clock() as clock:
        run = train_in_process(db, get_task("drug_rec"), model, seed, {**overrides, "epochs": epochs, "n_boot": 2},
                               dataset=dataset, device="cpu", models_dir=Path(models))
    shutil.rmtree(models, ignore_errors=True)
    with open_warehouse(db, read_only=True) as con:
        epoch_seconds = con.sql("SELECT sum(s) FROM (SELECT any_value(seconds) s FROM ml.epochs WHERE run_id = ? "
                                "GROUP BY epoch)", params=[run]).fetchall()[0][0]
        preds = con.sql("SELECT hadm_id, label, prob, y_true FROM ml.predictions WHERE run_id = ? "
                        "ORDER BY hadm_id, label", params=[run]).pl()
        n_train = con.sql("SELECT count(*) FROM samples.splits sp JOIN samples.drug_rec s USING (subject_id) "
                          "WHERE sp.task = 'drug_rec' AND sp.dataset = ? AND s.dataset = ? AND sp.split = 'train'",
                          params=[dataset, dataset]).fetchall()[0][0]
    n_labels = preds["label"].n_unique()
    prob = preds["prob"].to_numpy().reshape(-1, n_labels)
    truth = preds["y_true"].to_numpy().reshape(-1, n_labels).astype(np.float64)
    # The whole epoch loop, as PyHealth's Trainer.train is timed (its checkpoint writes included): each epoch's
    # checkpoints and its ml.epochs rows too, not only the training + validation seconds ml.epochs records.
    seconds = clock[-1]["end"] - clock[-1]["start"] if clock and "end" in clock[-1] else epoch_seconds
    return {"samples_per_s": n_train * epochs / seconds, "seconds": seconds, "epoch_seconds": epoch_seconds,
            "n_train": n_train, "test_pr_auc": sample_ap(truth, prob), "run_id": run}


@contextlib.contextmanager
def _epoch_loop_clock() -> Iterator[list[dict[str, float]]]:
    """Times `fit`'s epoch loops: from a loop's first epoch to the loading of its best weights after its last epoch
    (each epoch's bookkeeping included); one {"start", "end"} per fit (BEHRT's MLM pre-training is a fit of its
    own: the last one is the task's). Checkouts whose trainer lacks these names give [] (ml.epochs' seconds)."""
    from medtx.training import trainer

    loops: list[dict[str, float]] = []
    if not (hasattr(trainer, "_train_and_validate") and hasattr(trainer, "load_weights")):
        yield loops
        return
    epoch, load = trainer._train_and_validate, trainer.load_weights

    def timed_epoch(*args, **kwargs):
        if not loops or "end" in loops[-1]:
            loops.append({"start": time.perf_counter()})
        return epoch(*args, **kwargs)

    def timed_load(*args, **kwargs):
        if loops and "end" not in loops[-1]:
            loops[-1]["end"] = time.perf_counter()
        return load(*args, **kwargs)

    trainer._train_and_validate, trainer.load_weights = timed_epoch, timed_load
    try:
        yield loops
    finally:
        trainer._train_and_validate, trainer.load_weights = epoch, load


def _stub_attribute(name: str):
    """Any public name of a stubbed module is a placeholder class; dunders stay absent (inspect probes them)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def _stub_unused_pyhealth_imports() -> None:
    """PyHealth 1.1.6 imports torchvision (images), mne (EEG) and rdkit (SafeDrug) at package import."""
    import importlib.abc
    import importlib.machinery
    import types

    class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torchvision", "mne", "rdkit"):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = _stub_attribute
            return module

        def exec_module(self, module) -> None:
            pass

    sys.meta_path.insert(0, Stubs())


def pyhealth_worker(samples: str, epochs: int, threads: str, seed: int) -> dict:
    """PyHealth's Transformer + Trainer on the exported samples (its defaults, batch 32; threads "auto": torch's
    default)."""
    _stub_unused_pyhealth_imports()
    import numpy as np
    import torch
    from pyhealth.datasets import SampleEHRDataset, get_dataloader
    from pyhealth.models import Transformer
    from pyhealth.trainer import Trainer
    from torch.utils.data import Subset

    if threads != "auto":
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    np.random.seed(seed)
    rows = json.loads(Path(samples).read_text())
    # PyHealth's own drug_rec task keeps only visits with codes of every kind; the same rows for both here,
    # with empty visits padded to one "<empty>" code (PyHealth's tokenizer needs at least one per visit).
    clean = [{**r, **{f: [v or ["<empty>"] for v in r[f]] for f in FEATURES}} for r in rows]
    dataset = SampleEHRDataset(clean, dataset_name="synth", task_name="drug_rec")
    split = {s: [i for i, r in enumerate(rows) if r["split"] == s] for s in ("train", "val", "test")}
    loaders = {s: get_dataloader(Subset(dataset, idx), batch_size=32, shuffle=(s == "train"))
               for s, idx in split.items()}
    model = Transformer(dataset=dataset, feature_keys=list(FEATURES), label_key="drugs", mode="multilabel")
    trainer = Trainer(model=model, metrics=["pr_auc_samples"], output_path=tempfile.mkdtemp(prefix="bench-pyh-"),
                      enable_logging=False)
    started = time.perf_counter()
    trainer.train(train_dataloader=loaders["train"], val_dataloader=loaders["val"], epochs=epochs,
                  monitor="pr_auc_samples")
    seconds = time.perf_counter() - started
    y_true, y_prob, _ = trainer.inference(loaders["test"])
    return {"samples_per_s": len(split["train"]) * epochs / seconds, "seconds": seconds,
            "n_train": len(split["train"]), "test_pr_auc": sample_ap(y_true, y_prob)}


# ----------------------------------------------------------------------------------------------- driver


def _env(pythonpath: str | None, threads: str) -> dict[str, str]:
    env = dict(os.environ)
    if threads != "auto":
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def _run(python: str, args: list[str], pythonpath: str | None, threads: str) -> dict:
    out = subprocess.run([python, str(Path(__file__).resolve()), *args], env=_env(pythonpath, threads),
                         capture_output=True, text=True, cwd=pythonpath or str(ROOT))
    if out.returncode:
        raise RuntimeError(f"worker {args[:2]} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path)
    parser.add_argument("--dataset")
    parser.add_argument("--pyhealth-python", help="interpreter with PyHealth installed (omit: medtx only)")
    parser.add_argument("--medtx-root", action="append", help="medtx checkout(s) to time (default: this one)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="2", help="torch threads of both sides, or auto (see above)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="medtx model/trainer override (repeatable; values parsed as JSON when they parse)")
    parser.add_argument("--background", type=int, default=0, help="medtx trainings kept running meanwhile")
    parser.add_argument("--model", default="transformer",
                        help="medtx model (PyHealth's side runs only for the transformer; other models: per-model "
                             "throughput of the medtx roots)")
    parser.add_argument("--overrides", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--length-buckets", type=int, default=0,
                        help="medtx TrainConfig.length_buckets for every root (default 0: each checkout's own default; "
                             "drug_rec's transformer buckets since 2026-11-25); ignored by checkouts without the field")
    parser.add_argument("--worker", choices=("medtx", "pyhealth"), help=argparse.SUPPRESS)
    parser.add_argument("--samples", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "medtx":
        print(json.dumps(medtx_worker(str(args.db), args.dataset, args.epochs, args.threads, args.seed,
                                      args.length_buckets, json.loads(args.overrides or "{}"), args.model)))
        return
    if args.worker == "pyhealth":
        print(json.dumps(pyhealth_worker(args.samples, args.epochs, args.threads, args.seed)))
        return
    sys.path.insert(0, str(ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    samples = work / "drug_rec.json"
    print("samples per split:", export_samples(args.db, args.dataset, samples))
    roots = args.medtx_root or [str(ROOT)]
    common = ["--epochs", str(args.epochs), "--threads", str(args.threads), "--seed", str(args.seed)]
    if args.model != "transformer":
        args.pyhealth_python = None
    overrides = json.dumps(dict(_parse_set(item) for item in args.set))
    print(f"medtx overrides: {overrides}; threads: {args.threads}; background trainings: {args.background}")
    # The background trainings run this checkout (the newest thread rule), whatever the timed roots are.
    background = [_background_training(work / f"background{i}.duckdb", args, str(ROOT)) for i in range(args.background)]
    results: dict[str, list[dict]] = {}
    try:
        _rounds(args, work, samples, roots, common, overrides, results)
    finally:
        for proc in background:
            proc.kill()
            proc.wait()
    _summary(results)
    shutil.rmtree(work, ignore_errors=True)


def _parse_set(item: str) -> tuple[str, object]:
    key, _, value = item.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _background_training(db: Path, args: argparse.Namespace, root: str) -> subprocess.Popen:
    """A long medtx training (threads auto) on its own copy of the warehouse, left running until killed."""
    shutil.copy(args.db, db)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "medtx", "--db", str(db), "--dataset",
           args.dataset, "--epochs", "1000", "--threads", "auto", "--seed", "7", "--length-buckets", "0"]
    proc = subprocess.Popen(cmd, env=_env(root, "auto"), cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(20)  # past its data loading: training when the first timed run starts
    return proc


def _rounds(args: argparse.Namespace, work: Path, samples: Path, roots: list[str], common: list[str],
            overrides: str, results: dict[str, list[dict]]) -> None:
    for round_no in range(1, args.rounds + 1):
        for i, spec in enumerate(roots):
            root, _, own = spec.partition("@")
            db = work / f"medtx{i}.duckdb"  # each version writes its ml.* rows into its own copy
            shutil.copy(args.db, db)
            merged = json.dumps({**json.loads(overrides), **json.loads(own or "{}")})
            r = _run(sys.executable, ["--worker", "medtx", "--db", str(db), "--dataset", args.dataset, *common,
                                      "--length-buckets", str(args.length_buckets), "--overrides", merged,
                                      "--model", args.model],
                     root, args.threads)
            results.setdefault(f"medtx@{spec}", []).append(r)
            alone = r["n_train"] * args.epochs / r["epoch_seconds"]  # this file's medtx_worker always returns it
            print(f"round {round_no} medtx@{spec}: {r['samples_per_s']:.0f} samples/s (epochs alone {alone:.0f}), "
                  f"test PR-AUC {r['test_pr_auc']:.4f} (load {_load()})", flush=True)
        if args.pyhealth_python:
            r = _run(args.pyhealth_python, ["--worker", "pyhealth", "--samples", str(samples), *common], None,
                     args.threads)
            results.setdefault("pyhealth", []).append(r)
            print(f"round {round_no} pyhealth: {r['samples_per_s']:.0f} samples/s, test PR-AUC "
                  f"{r['test_pr_auc']:.4f} (load {_load()})", flush=True)


def _summary(results: dict[str, list[dict]]) -> None:
    print("\nmean over rounds:")
    mean = {k: sum(r["samples_per_s"] for r in v) / len(v) for k, v in results.items()}
    for key, runs in results.items():
        print(f"  {key}: {mean[key]:.0f} samples/s, test PR-AUC {runs[-1]['test_pr_auc']:.4f}")
    if "pyhealth" in mean:
        for key in mean:
            if key != "pyhealth":
                print(f"  {key} / pyhealth = {mean[key] / mean['pyhealth']:.2f}x")


if __name__ == "__main__":
    main()
