"""The start of a drug_rec training run, for benchmarks that time what comes after it: samples from the warehouse,
the model built at seed 42, its data-dependent start, every split encoded and collated once (`EncodedSet`).
`medtx.training.experiment` does the same inside a run, interleaved with the run's own bookkeeping."""

from __future__ import annotations

from typing import Any


def encoded_drug_rec(db: str, dataset: str, model: str = "transformer", overrides: dict | None = None
                     ) -> tuple[Any, dict[str, Any]]:
    """-> (the model's bundle, {split: EncodedSet})."""
    from medtx.store.db import open_warehouse
    from medtx.models.encoded import EncodedSet
    from medtx.models.registry import build_ehr_model
    from medtx.tasks import get_task
    from medtx.training.experiment import load_ehr_samples
    from medtx.training.trainer import set_seed

    with open_warehouse(db, read_only=True) as con:
        data = load_ehr_samples(con, dataset, get_task("drug_rec"), model)
    set_seed(42)
    bundle = build_ehr_model(model, get_task("drug_rec"), data.vocabs, data.label_vocab, overrides or None)
    encoded = {name: EncodedSet(bundle.encode(frame), bundle.collate) for name, frame in data.parts.items()}
    bundle.init_from_train(encoded["train"])
    return bundle, encoded
