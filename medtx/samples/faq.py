"""`samples.faq`: the Mental Health FAQ with mojibake fixed, a held-out paraphrase per question and k folds.

The FAQ ships as UTF-8 with six answers double-encoded (`â€™` for `’`); `ftfy.fix_text` repairs them.
Paraphrases come from `paraphrases.csv` next to the FAQ (written by the medtx team, see PARAPHRASES.md).
Folds are assigned by pair, deterministic from the seed.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import ftfy

from medtx.store.db import transaction
from medtx.samples.common import EmptyCohortError, write_summary
from medtx.samples.splits import assign_folds

TASK = "faq"
DATASET = "mental_health_faq"
FAQ_FILE = Path("mental_health_faq") / "Mental_Health_FAQ.csv.gz"
PARAPHRASE_FILE = Path("mental_health_faq") / "paraphrases.csv"


def clean_text(text: str) -> str:
    """Repair mojibake and normalise line ends (the file is CRLF)."""
    return ftfy.fix_text(text, uncurl_quotes=False).replace("\r\n", "\n").strip()


def read_faq(con: duckdb.DuckDBPyConnection, data_dir: Path) -> tuple[list[tuple[int, str, str, str | None]], int]:
    """(pair_id, question, answer, paraphrase) rows, cleaned (paraphrase None when none is written), and the
    number of question/answer cells whose mojibake was repaired."""
    faq, para = data_dir / FAQ_FILE, data_dir / PARAPHRASE_FILE
    if not faq.exists():
        raise EmptyCohortError(f"faq: {faq} does not exist")
    rows = con.execute(
        "SELECT Question_ID, Questions, Answers FROM read_csv(?, header = true, all_varchar = true)", [str(faq)]
    ).fetchall()
    paraphrases: dict[int, str] = {}
    if para.exists():
        for pair_id, text in con.execute(
            "SELECT pair_id, paraphrase FROM read_csv(?, header = true, all_varchar = true)", [str(para)]
        ).fetchall():
            if not (pair_id or "").strip().isdigit():
                raise ValueError(f"{para}: pair_id {pair_id!r} is not a number")
            paraphrases[int(pair_id)] = clean_text(text or "") or None
    out, repaired = [], 0
    for line, (pair_id, question, answer) in enumerate(rows, start=2):
        if not (pair_id or "").strip().isdigit() or not (question or "").strip() or not (answer or "").strip():
            raise ValueError(f"{faq} record {line}: needs a numeric Question_ID, a question and an answer")
        question, answer = question.strip(), answer.strip()
        fixed = (clean_text(question), clean_text(answer))
        repaired += sum(ftfy.fix_text(raw, uncurl_quotes=False) != raw for raw in (question, answer))
        out.append((int(pair_id), *fixed, paraphrases.get(int(pair_id))))
    unknown = set(paraphrases) - {r[0] for r in out}
    if unknown:
        raise ValueError(f"{para}: pair_id(s) {sorted(unknown)} are not in {faq}")
    return out, repaired


def build_faq(con: duckdb.DuckDBPyConnection, data_dir: Path, *, seed: int, k_folds: int = 5) -> int:
    """Rewrite `samples.faq` from the bundled FAQ file."""
    rows, repaired = read_faq(con, data_dir)
    if not rows:
        raise EmptyCohortError(f"faq: {data_dir / FAQ_FILE} has no question/answer pairs")
    folds = assign_folds([r[0] for r in rows], seed, k_folds)
    with transaction(con):
        con.execute("DELETE FROM samples.faq")
        con.executemany("INSERT INTO samples.faq VALUES (?, ?, ?, ?, ?)", [[*r, folds[r[0]]] for r in rows])
        write_summary(con, DATASET, TASK, {
            "samples": len(rows), "paraphrases": sum(r[3] is not None for r in rows), "folds": k_folds,
            "mojibake_cells_fixed": repaired,
        })
    return len(rows)
