"""One model system for the text models (issue 32): each text model is one file that registers its build and
settings; the text runner reads the registry and never branches on a model's name."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sklearn.dummy import DummyClassifier

from medtx.models import registry
from medtx.models.bounds import Width
from medtx.models.registry import ModelSpec, ModelContext, merge_settings, register_model, specs
from medtx.tasks import get_task
from medtx.training.text_config import TextConfig, TextData, TextReportConfig, TextTrainerConfig, TokenizerConfig
from medtx.training.runners.text import text_config
from medtx.training.text_fitting import fit_text_model

MEDTX = Path(__file__).resolve().parents[1] / "medtx"
TEXT_FAMILIES = ("text", "text_baseline")


def test_every_text_model_registers_a_build_and_declares_its_settings():
    for spec in (*specs("text"), *specs("text_baseline")):
        assert spec.build is not None, spec.name
        assert all(dataclasses.is_dataclass(cls) for cls in spec.settings), spec.name
    # the flat settings are exactly the runner's, the tokenizer's and the models' own fields, nothing else
    parts = [TextTrainerConfig, TokenizerConfig, TextReportConfig,
             *(cls for s in (*specs("text"), *specs("text_baseline")) for cls in s.settings)]
    declared = {f.name for cls in parts for f in dataclasses.fields(cls)}
    assert {f.name for f in dataclasses.fields(TextConfig)} == declared
    # a model reads its own part: the bilstm's settings from the flat keys it was given
    cfg = text_config("bilstm", {"bilstm_max_len": 64, "mlm_epochs": 1}, task=get_task("specialty"))
    bilstm = next(s for s in specs("text") if s.name == "bilstm")
    ctx = ModelContext(settings=cfg, train_texts=[], val_texts=[], n_outputs=2, binary=True, class_weights=None, seed=0)
    assert ctx.config(bilstm.settings[0]).bilstm_max_len == 64
    assert cfg.lr == 2e-3 and cfg.mlm_epochs == 1  # the model's registered default; any text key still accepted


def test_no_text_model_is_named_outside_its_own_file():
    """A string constant equal to a text model's name appears only in the file that registers it (docstrings
    aside): the runner, the checks and the evaluation read the registry instead."""
    homes = {}
    for path in MEDTX.rglob("*.py"):
        text = path.read_text()
        for spec in (*specs("text"), *specs("text_baseline")):
            if f'name="{spec.name}"' in text:
                homes[spec.name] = path
    assert set(homes) == {s.name for f in TEXT_FAMILIES for s in specs(f)}
    found = []
    for path in MEDTX.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        where = str(path.relative_to(MEDTX.parent))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in homes and id(node) not in docstrings
                    and path != homes[node.value] and (where, node.value) not in ALLOWED):
                found.append(f"{where}:{node.lineno} {node.value!r}")
    assert found == []


# FAQ retrieval's own setting `embedding: tfidf | minilm` names the MiniLM weights, not the text model.
ALLOWED = {("medtx/models/text_baselines.py", "minilm")}


def test_every_faq_model_registers_a_build_and_the_faq_settings_are_theirs():
    from medtx.training.runners.faq import FAQConfig, FAQReportConfig, FAQTrainerConfig

    parts = [FAQTrainerConfig, FAQReportConfig, *(cls for s in specs("faq") for cls in s.settings)]
    assert all(s.build is not None and s.settings for s in specs("faq"))
    assert {f.name for f in dataclasses.fields(FAQConfig)} == {f.name for c in parts for f in dataclasses.fields(c)}


def test_merged_settings_refuse_a_field_two_parts_declare_differently():
    @dataclasses.dataclass
    class A:
        width: Width = 8

    @dataclasses.dataclass
    class B:
        width: Width = 16

    with pytest.raises(ValueError, match="field 'width' of B disagrees"):
        merge_settings("Both", (A, B), __name__)
    merged = merge_settings("Same", (A, A), __name__)
    assert [f.name for f in dataclasses.fields(merged)] == ["width"] and merged().width == 8


def _notes() -> TextData:
    rng = np.random.default_rng(0)
    rows = [(f"n{i}", " ".join(rng.choice(["fever", "cough", "rash", "pain"], 5)), int(i % 3 == 0), split)
            for i, split in enumerate(["train"] * 30 + ["val"] * 6 + ["test"] * 9)]
    frame = pl.DataFrame(rows, schema=["sample_id", "text", "y", "split"], orient="row").with_columns(
        pl.col("sample_id").alias("unit"))
    return TextData(frame, ["no", "yes"], binary=True)


def test_a_new_text_model_trains_through_the_runner_from_its_registration_alone(tmp_path):
    """What a new text model file does (register a ModelSpec with a build) is all the runner needs."""
    seen = {}

    def build(ctx: ModelContext) -> DummyClassifier:
        seen["ctx"] = ctx
        return DummyClassifier(strategy="stratified", random_state=ctx.seed)

    spec = register_model(ModelSpec(name="toy_text", family="text_baseline", kinds=("binary",), build=build))
    try:
        data = _notes()
        fitted = fit_text_model(data, "toy_text", TextConfig(), seed=3, out_dir=tmp_path / "run")
        assert fitted.probs.shape == (9,) and set(np.unique(fitted.probs)) <= {0.0, 1.0}
        assert seen["ctx"].seed == 3 and seen["ctx"].n_outputs == 1 and len(seen["ctx"].train_texts) == 30
        with pytest.raises(ValueError, match="unknown text model 'toy_txt'"):
            fit_text_model(data, "toy_txt", TextConfig(), seed=3, out_dir=tmp_path / "run")
    finally:
        del registry._SPECS[(spec.family, spec.name)]
