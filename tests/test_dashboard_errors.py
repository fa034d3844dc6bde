"""Issue 12 part B, case 8: what the browser sees when something is wrong. A real (small) warehouse with a
failed run whose error is a full traceback, published to a real snapshot, served through the Flask test client.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dashboard.app import create_app
from dashboard.security import FailureBackoff
from dashboard.validate import public_error
from medtx.store.db import connect
from medtx.publish.snapshot import publish_snapshot
from medtx.training import records

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/home/ci/medtx/medtx/training/experiment.py", line 212, in run_ehr_experiment\n'
    "    outcome = _run_neural(db, run_id, task, model, parts)\n"
    "RuntimeError: shape mismatch in /home/ci/medtx/var/models/x.safetensors"
)
FAILED = "drug_rec.gru.d.s0.fail"
MALFORMED = [None, 12345, "x" * 5000, {"a": [1]}, "../../etc/passwd", [1, 2], True, -1.5]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dash_errors")
    db = folder / "w.duckdb"
    con = connect(db)
    records.start_run(con, FAILED, task="drug_rec", model="gru", dataset="d", seed=0, config={})
    records.fail_run(con, FAILED, TRACEBACK)
    con.close()
    snap = folder / "w.snapshot.duckdb"
    publish_snapshot(db, snap)
    return snap


def _outputs(key: str) -> list[dict] | dict:
    outs = [dict(zip(("id", "property"), o.rsplit(".", 1), strict=True)) for o in key.strip(".").split("...")]
    return outs if key.startswith("..") else outs[0]


def _call(client, key: str, cb: dict, value: object):
    body = {
        "output": key, "outputs": _outputs(key),
        "inputs": [{"id": i["id"], "property": i["property"], "value": value} for i in cb["inputs"]],
        "state": [{"id": s["id"], "property": s["property"], "value": value} for s in cb.get("state", [])],
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in cb["inputs"]],
    }
    return client.post("/_dash-update-component", json=body)


def test_public_error_is_one_line_without_paths_or_line_numbers() -> None:
    shown = public_error(TRACEBACK)
    assert shown == "RuntimeError: shape mismatch in <path>"
    assert public_error("ValueError: bad\nmore detail") == "ValueError: bad"
    assert len(public_error("E: " + "x" * 1000, 80)) == 80 and public_error(None) == ""


def test_run_detail_shows_one_line_and_the_warehouse_keeps_the_full_text(snapshot: Path) -> None:
    app = create_app(snapshot)
    client = app.server.test_client()
    cb = app.callback_map["run-body.children"]  # the run detail body, for the run chosen in its selector
    values = {"run-select": FAILED, "snapshot-version": "v1"}
    body = {"output": "run-body.children", "outputs": _outputs("run-body.children"),
            "inputs": [{**i, "value": values[i["id"]]} for i in cb["inputs"]],
            "changedPropIds": ["run-select.value"]}
    response = client.post("/_dash-update-component", json=body)
    assert response.status_code == 200
    text = json.dumps(response.get_json())  # decoded: Dash escapes `<` as \u003c
    assert "RuntimeError: shape mismatch in <path>" in text
    assert "/home/ci" not in text and "line 212" not in text and "Traceback" not in text
    import duckdb

    with duckdb.connect(str(snapshot), read_only=True) as con:
        assert con.execute("SELECT error FROM ml.runs WHERE run_id = ?", [FAILED]).fetchall()[0][0] == TRACEBACK


def test_every_callback_answers_malformed_input_without_a_500(snapshot: Path) -> None:
    app = create_app(snapshot)
    client = app.server.test_client()
    statuses: dict[int, int] = {}
    validation_messages = 0
    for key, cb in app.callback_map.items():
        for value in MALFORMED:
            response = _call(client, key, cb, value)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            body = response.get_data(as_text=True)
            assert response.status_code < 500, (key, value, body[:300])
            assert "Traceback" not in body and "/site-packages/" not in body
            validation_messages += "is not a valid" in body or "is not one of" in body
        for raw in ("not json", "{}", json.dumps({"output": key}), json.dumps({"output": key, "inputs": 5})):
            response = client.post("/_dash-update-component", data=raw, content_type="application/json")
            assert response.status_code < 500, (key, raw, response.get_data(as_text=True)[:300])
    assert len(app.callback_map) >= 10 and validation_messages >= 10, statuses


def test_dash_config_does_not_report_the_python_build(snapshot: Path) -> None:
    import sys

    page = create_app(snapshot).server.test_client().get("/").get_data(as_text=True)
    assert '"dash_version"' in page  # the config is there
    assert "python_version" not in page and sys.version.split()[0] not in page


def test_basic_auth_backs_off_per_client(snapshot: Path) -> None:
    now = [1000.0]
    backoff = FailureBackoff(free=3, cap_s=60, clock=lambda: now[0])
    from dashboard.security import install_basic_auth

    app = create_app(snapshot)
    install_basic_auth(app.server, "medtx", "s3cret", backoff)  # what credentials= installs, on a test clock
    client = app.server.test_client()

    def get(password: str, addr: str = "10.0.0.1"):
        token = base64.b64encode(f"medtx:{password}".encode()).decode()
        return client.get("/", headers={"Authorization": f"Basic {token}"}, environ_base={"REMOTE_ADDR": addr})

    assert [get("guess").status_code for _ in range(3)] == [401, 401, 401]  # free failures
    assert get("guess").status_code == 401  # the 4th failure starts a 1 s lock-out
    locked = get("s3cret")  # even the right password waits: no oracle while locked
    assert locked.status_code == 429 and locked.headers["Retry-After"] == "1"
    assert get("s3cret", addr="10.0.0.2").status_code == 200  # per client
    now[0] += 1.5
    assert get("guess").status_code == 401  # 5th failure: 2 s
    assert get("guess").status_code == 429 and backoff.wait_s("10.0.0.1") == pytest.approx(2.0)
    now[0] += 2.5
    assert get("s3cret").status_code == 200 and backoff.wait_s("10.0.0.1") == 0  # success resets
