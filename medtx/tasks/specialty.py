"""Task `specialty`: MTSamples transcription -> medical specialty, split by groups of identical text. Its
record and its SQL (`samples.specialty`).

Empty transcriptions are dropped. Notes whose normalised text is identical (lower case, letters and digits
only, so whitespace and punctuation differences do not hide a duplicate) form one group, identified by its
smallest note_id; a group holding more than one label is `conflicting`. The split assigns whole groups, so
no note text crosses train/val/test. The label-noise ceiling is the best accuracy any model can reach when
identical texts carry different labels: per group, only its most frequent label can be right.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import SAMPLE_EXTRAS, BuildContext, Lineage, Samples, Scoring, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "specialty"
TABLE = "samples.specialty"
DATASET = "mtsamples"

GROUPS_SQL = """
    WITH notes AS (
        SELECT note_id, trim(transcription) AS text, trim(medical_specialty) AS label,
               regexp_replace(lower(transcription), '[^a-z0-9]+', '', 'g') AS norm
        FROM raw.mtsamples
        WHERE note_id IS NOT NULL AND nullif(trim(transcription), '') IS NOT NULL
          AND nullif(trim(medical_specialty), '') IS NOT NULL
    )
    SELECT note_id, text, label, min(note_id) OVER (PARTITION BY norm) AS group_id,
           count(DISTINCT label) OVER (PARTITION BY norm) > 1 AS conflicting
    FROM notes"""


def label_noise_ceiling(con: duckdb.DuckDBPyConnection, where: str = "true") -> float | None:
    """Best reachable accuracy over the notes matching `where`: per text group, its majority label's count."""
    where_sql = where  # a condition written in code by the callers, never from data
    return con.sql(
        f"""SELECT sum(best) / sum(n) FROM (
                SELECT group_id, max(k) AS best, sum(k) AS n FROM (
                    SELECT group_id, label, count(*) AS k FROM samples.specialty WHERE {where_sql} GROUP BY ALL
                ) GROUP BY group_id)"""
    ).fetchall()[0][0]


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite `samples.specialty` (+ group split, label vocab, summary) from raw.mtsamples."""
    from medtx.samples.common import EmptyCohortError, write_summary
    from medtx.samples.splits import split_counts, write_splits
    from medtx.samples.vocab import write_vocab
    from medtx.store.db import transaction

    total = con.sql("SELECT count(*) FROM raw.mtsamples").fetchall()[0][0]
    con.execute(f"CREATE OR REPLACE TEMP TABLE _samples_specialty AS {GROUPS_SQL}")
    n = con.sql("SELECT count(*) FROM _samples_specialty").fetchall()[0][0]
    if n == 0:
        raise EmptyCohortError(
            f"specialty: raw.mtsamples holds {total} rows and none has both a transcription and a "
            "medical_specialty; run `medtx ingest mtsamples` first"
        )
    groups = [r[0] for r in con.sql("SELECT DISTINCT group_id FROM _samples_specialty").fetchall()]
    with transaction(con):
        assignment = write_splits(con, DATASET, NAME, groups, ctx.seed, ctx.fractions)
        con.execute("DELETE FROM samples.specialty")
        con.execute("""
            INSERT INTO samples.specialty
            SELECT s.note_id, s.text, s.label, s.group_id, p.split, s.conflicting
            FROM _samples_specialty s
            JOIN samples.splits p ON p.dataset = $d AND p.task = $t AND p.subject_id = s.group_id""",
            {"d": DATASET, "t": NAME})
        write_vocab(con, DATASET, NAME, "label", "SELECT label AS token FROM samples.specialty WHERE split = 'train'",
                    min_count=ctx.min_count)
        figures = dict(zip(
            ("samples", "text_groups", "conflicting_groups", "conflicting_notes", "classes"),
            con.sql("""SELECT count(*), count(DISTINCT group_id), count(DISTINCT group_id) FILTER (WHERE conflicting),
                              count(*) FILTER (WHERE conflicting), count(DISTINCT label) FROM samples.specialty""")
            .fetchall()[0], strict=True,
        ))
        figures["dropped_empty"] = total - n
        figures["label_noise_ceiling"] = label_noise_ceiling(con)
        for split in ("train", "val", "test"):
            figures[f"label_noise_ceiling_{split}"] = label_noise_ceiling(con, f"split = '{split}'")
        figures["majority_class_accuracy_test"] = con.sql(
            """SELECT max(k) / sum(k) FROM (SELECT label, count(*) AS k FROM samples.specialty
               WHERE split = 'test' GROUP BY label)""").fetchall()[0][0]
        write_summary(con, DATASET, NAME, {**figures, **split_counts(assignment)})
    con.execute("DROP TABLE IF EXISTS _samples_specialty")
    return n


TASK = Task(
    name=NAME,
    kind="multiclass",
    family="text",
    description="medical specialty of a transcription (multi-class)",
    order=50,
    samples=Samples(table=TABLE, columns=("note_id", "text", "label", "group_id", "split", "conflicting"),
                    features=("text",), label_column="label", label_feature="label", split_unit="text_group",
                    dataset=DATASET),
    lineage=Lineage(build=build, writes=(TABLE, *SAMPLE_EXTRAS),
                    reads=("raw.mtsamples", "raw.meds_splits")),  # splits: medtx.samples.splits honours MEDS splits
    scoring=Scoring(metrics=("accuracy", "macro_f1"), monitor="macro_f1",
                    compared=(("macro_f1", "none"), ("accuracy", "none"))),
)
