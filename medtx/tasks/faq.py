"""Task `faq`: answer generation / retrieval for the Mental Health FAQ, cross-validated over question-answer
pairs. Its record and its builder (`samples.faq`: it reads the bundled CSV files, no warehouse table).

The FAQ ships as UTF-8 with six answers double-encoded (`â€™` for `’`); `ftfy.fix_text` repairs them.
Paraphrases come from `paraphrases.csv` next to the FAQ (written by the medtx team, see PARAPHRASES.md).
Folds are assigned by pair, deterministic from the seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from medtx.tasks.base import BuildContext, Lineage, Samples, Scoring, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "faq"
TABLE = "samples.faq"
DATASET = "mental_health_faq"
FAQ_FILE = Path("mental_health_faq") / "Mental_Health_FAQ.csv.gz"
PARAPHRASE_FILE = Path("mental_health_faq") / "paraphrases.csv"


def clean_text(text: str) -> str:
    """Repair mojibake and normalise line ends (the file is CRLF)."""
    import ftfy  # here: the task registry loads on the torch-only worker (medtx.worker)

    return ftfy.fix_text(text, uncurl_quotes=False).replace("\r\n", "\n").strip()


def read_faq(con: duckdb.DuckDBPyConnection, data_dir: Path) -> tuple[list[tuple[int, str, str, str | None]], int]:
    """(pair_id, question, answer, paraphrase) rows, cleaned (paraphrase None when none is written), and the
    number of question/answer cells whose mojibake was repaired."""
    import ftfy

    from medtx.samples.common import EmptyCohortError

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


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite `samples.faq` from the bundled FAQ file."""
    from medtx.samples.common import EmptyCohortError, write_summary
    from medtx.samples.splits import assign_folds
    from medtx.store.db import transaction

    rows, repaired = read_faq(con, ctx.data_dir)
    if not rows:
        raise EmptyCohortError(f"faq: {ctx.data_dir / FAQ_FILE} has no question/answer pairs")
    folds = assign_folds([r[0] for r in rows], ctx.seed, ctx.k_folds)
    with transaction(con):
        con.execute("DELETE FROM samples.faq")
        con.executemany("INSERT INTO samples.faq VALUES (?, ?, ?, ?, ?)", [[*r, folds[r[0]]] for r in rows])
        write_summary(con, DATASET, NAME, {
            "samples": len(rows), "paraphrases": sum(r[3] is not None for r in rows), "folds": ctx.k_folds,
            "mojibake_cells_fixed": repaired,
        })
    return len(rows)


TASK = Task(
    name=NAME,
    kind="generation",
    family="text",
    description="answer to a mental-health question (generation; retrieval baseline)",
    order=60,
    samples=Samples(table=TABLE, columns=("pair_id", "question", "answer", "paraphrase", "fold"),
                    features=("question",), label_column="answer", split_unit="pair", dataset=DATASET),
    lineage=Lineage(build=build, writes=(TABLE, "samples.task_summary"), files=("mental_health_faq",)),
    scoring=Scoring(metrics=("token_f1", "exact_match"), monitor="loss",
                    compared=(("token_f1", "none"), ("exact_match", "none"))),
    models=("retrieval", "seq2seq"),
)
