"""The training layer is submitted longest expected first (medtx.pipeline.order)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from medtx.store.db import open_warehouse
from medtx.pipeline.order import completed_durations, longest_first, model_family, train_units
from medtx.tasks import get_task


@dataclass
class _Step:
    name: str
    dataset: str | None = None
    scope: dict = field(default_factory=dict)


def _step(name: str, dataset: str = "d", task: str = "drug_rec") -> _Step:
    return _Step(name, dataset, {"dataset": dataset, "task": task})


def test_history_orders_longest_first_and_unknown_steps_go_first() -> None:
    steps = [_step("a"), _step("b"), _step("new"), _step("c")]
    history = {"a": 3.0, "b": 40.0, "c": 12.0}
    order = longest_first(steps, {}, history, {})
    assert [s.name for s in order] == ["new", "b", "c", "a"]


def test_cold_order_by_cost_class_then_training_units_ties_keep_plan_order() -> None:
    steps = [_step("base", "big"), _step("ehr_small", "small"), _step("ehr_big", "big"), _step("text", "notes"),
             _step("faq", "faq"), _step("ehr_big2", "big")]
    families = {"base": "ehr_baseline", "ehr_small": "ehr", "ehr_big": "ehr", "ehr_big2": "ehr", "text": "text",
                "faq": "faq"}
    units = {("big", "drug_rec"): 1400, ("small", "drug_rec"): 70, ("notes", "drug_rec"): 10}
    order = longest_first(steps, families, {}, units)
    assert [s.name for s in order] == ["text", "faq", "ehr_big", "ehr_big2", "ehr_small", "base"]


def test_reference_baselines_go_first_then_longest_first_within_each_group() -> None:
    """A run's per-group verdicts name its task's reference baseline: a baseline recorded after the neural runs
    made each of them recompute its verdicts (18 recomputes, 30 s of the default pipeline's 310 s)."""
    steps = [_step("transformer"), _step("logreg"), _step("new_rnn"), _step("lightgbm"), _step("gru")]
    history = {"transformer": 90.0, "logreg": 2.0, "lightgbm": 5.0, "gru": 40.0}
    order = longest_first(steps, {}, history, {}, references={"logreg", "lightgbm"})
    assert [s.name for s in order] == ["lightgbm", "logreg", "new_rnn", "transformer", "gru"]
    assert longest_first(steps, {}, history, {}) == longest_first(steps, {}, history, {}, frozenset())


def test_model_family_follows_the_task() -> None:
    assert model_family(get_task("faq"), "seq2seq") == "faq"
    assert model_family(get_task("drug_rec"), "seq2seq") == "ehr"
    assert model_family(get_task("specialty"), "bilstm") == "text"
    assert model_family(get_task("drug_rec"), "logreg") == "ehr_baseline"


def test_history_counts_completed_runs_only_latest_first(tmp_db: Path) -> None:
    with open_warehouse(tmp_db) as con:
        rows = [("r1", "s", "completed", 50.0, "2026-01-01"), ("r2", "s", "completed", 20.0, "2026-01-02"),
                ("r3", "s", "cached", 0.4, "2026-01-03"), ("r3", "t", "failed", 1.0, "2026-01-03")]
        con.executemany("INSERT INTO ml.pipeline_steps (pipeline_run_id, step, kind, state, seconds, finished_at) "
                        "VALUES (?, ?, 'train', ?, ?, ?)", rows)
        con.executemany("INSERT INTO samples.splits VALUES (?, ?, ?, ?, 0)",
                        [("d", "drug_rec", i, "train" if i < 7 else "test") for i in range(10)])
        assert completed_durations(con, ["s", "t", "u"]) == {"s": 20.0}
        assert train_units(con) == {("d", "drug_rec"): 7}
