"""A pipeline config declares ACES tasks (`tasks.<name>.aces`, issue 45): they become tasks of the registry in
this process and the processes it starts, get a samples step (the YAML files hashed into its cache key) and a
train step per model, and every mistake is one line naming the file and key. No ACES run here (the config and
the plan only): tests/test_aces_tasks.py runs ACES itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from medtx.pipeline.config import ConfigError, load_config
from medtx.pipeline.plan import build_plan
from medtx.tasks import get_task, task_names
from medtx.aces.task import ENV, declare
from tests.conftest import DATA, REPO_ROOT

MEDS_DEV = REPO_ROOT / "tests" / "aces" / "meds_dev"
OWN = REPO_ROOT / "tests" / "aces" / "discharged_within_7d.yaml"


@pytest.fixture(autouse=True)
def no_declared_tasks_after():
    yield
    declare([])
    assert ENV not in os.environ and "readmission_30d" not in task_names()


def _config(tmp_path: Path, tasks: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    (tmp_path / "tasks").mkdir(exist_ok=True)
    (tmp_path / "tasks" / "short.yaml").write_text(OWN.read_text())
    path.write_text(f"datasets: [{{source: {DATA / 'mimic3_demo'}}}]\ntasks:\n" + textwrap.indent(textwrap.dedent(tasks), "  "))
    return path


def test_config_declares_aces_tasks_that_plan_like_builtin_ones(tmp_path):
    cfg = load_config(_config(tmp_path, f"""
        readmission_30d:                       # MEDS-DEV's task, its predicates from MEDS-DEV's MIMIC-IV file
          aces: {MEDS_DEV / 'readmission_general_hospital_30d.yaml'}
          predicates: {MEDS_DEV / 'mimic_iv_predicates.yaml'}
          models: [{{model: logreg}}, {{model: gru, overrides: {{epochs: 1}}}}]
        discharged_within_7d:
          aces: tasks/short.yaml               # relative to the config's folder
          models: [{{model: most_frequent}}, {{model: logreg}}]
        mortality:
          models: [{{model: logreg}}]
        """))
    assert {"readmission_30d", "discharged_within_7d", "mortality"} <= set(task_names())
    task = get_task("discharged_within_7d")
    assert task.lineage.files == (str(tmp_path / "tasks" / "short.yaml"),) and task.binary and task.family == "ehr"
    plan = build_plan(cfg, tmp_path / "synth", DATA)
    step = plan["samples.readmission_30d.mimic3_demo"]
    assert step.files == (str(MEDS_DEV / "readmission_general_hospital_30d.yaml"), str(MEDS_DEV / "mimic_iv_predicates.yaml"))
    assert "codes.mimic3_demo" in step.needs and "samples.aces_labels" in step.writes
    assert {"aces/task", "aces/run", "meds/events"} <= set(step.code)  # editing the ACES route redoes the step
    for name in ("train.readmission_30d.mimic3_demo.logreg.s42", "train.readmission_30d.mimic3_demo.gru.s42",
                 "train.discharged_within_7d.mimic3_demo.most_frequent.s42"):
        assert name in plan.names, plan.names
    # a process the pipeline starts (a training worker) knows the declared tasks
    declared = json.loads(os.environ[ENV])
    assert declared["discharged_within_7d"] == {"config": str(tmp_path / "tasks" / "short.yaml"), "predicates": None}
    out = subprocess.run([sys.executable, "-c", "from medtx.tasks import get_task; "
                          "print(get_task('readmission_30d').clock.words)"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert "readmission_general_hospital_30d.yaml" in out.stdout


@pytest.mark.parametrize("tasks, words", [
    ("mine: {aces: tasks/nope.yaml, models: [{model: logreg}]}", "tasks.mine.aces = tasks/nope.yaml: file"),
    (f"mine: {{aces: {OWN}, predicates: nope.yaml, models: [{{model: logreg}}]}}", "tasks.mine.predicates = nope.yaml"),
    (f"mortality: {{aces: {OWN}, models: [{{model: logreg}}]}}", "a built-in task has that name"),
    (f"Mine: {{aces: {OWN}, models: [{{model: logreg}}]}}", "lower-case letters"),
    (f"mine: {{aces: {OWN}, models: [{{model: oracle}}]}}", "tasks.mine.models[0].model = 'oracle': unknown for task mine"),
    ("mortality: {predicates: x.yaml, models: [{model: logreg}]}", "allowed: with `aces: TASK.yaml`"),
])
def test_config_mistakes_are_one_line_naming_the_key(tmp_path, tasks, words):
    path = _config(tmp_path, tasks)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert len(caught.value.lines) == 1 and str(path) in caught.value.lines[0], caught.value.lines
    assert words in caught.value.lines[0], caught.value.lines


def test_a_config_without_aces_tasks_forgets_earlier_ones(tmp_path):
    load_config(_config(tmp_path, f"mine: {{aces: {OWN}, models: [{{model: logreg}}]}}"))
    assert "mine" in task_names()
    load_config(REPO_ROOT / "config" / "default.yaml")
    assert "mine" not in task_names() and ENV not in os.environ
