"""Per-task vocabularies from the training split only, stored in `samples.vocab`.

idx 0 = `<pad>`, 1 = `<unk>`, then any task-specific specials (e.g. `[CLS] [SEP] [MASK]` for BEHRT codes),
then tokens by descending training count, ties by token. `feature` is the samples column the tokens come
from (conditions, procedures, drugs_hist, drugs, visits, codes, label). Tokens seen fewer than `min_count`
times in training are left out and encode as `<unk>`.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from medtx.samples.tokens import PAD, PAD_IDX, UNK, UNK_IDX, Vocab  # noqa: F401  (the class is pure: a worker loads it)
from medtx.store.db import sql_literal


def vocab_rows_sql(token_sql: str, specials: Sequence[str], min_count: int) -> str:
    """SELECT (token, idx, count) from a query yielding one `token` row per training occurrence."""
    special_values_sql = ", ".join(f"({sql_literal(s)}, {int(i)})" for i, s in enumerate([PAD, UNK, *specials]))
    n_special = 2 + len(specials)
    return f"""
        WITH specials(token, idx) AS (VALUES {special_values_sql}),
        counts AS (SELECT token, count(*) AS n FROM ({token_sql}) WHERE token IS NOT NULL GROUP BY token)
        SELECT s.token, s.idx, coalesce(c.n, 0) AS count FROM specials s LEFT JOIN counts c USING (token)
        UNION ALL
        SELECT token, {int(n_special - 1)} + row_number() OVER (ORDER BY n DESC, token), n FROM counts
        WHERE n >= {int(min_count)} AND token NOT IN (SELECT token FROM specials)"""


def write_vocab(
    con: duckdb.DuckDBPyConnection, dataset: str, task: str, feature: str, token_sql: str,
    *, specials: Sequence[str] = (), min_count: int = 1, params: dict | None = None,
) -> int:
    """Replace one stored vocabulary; `token_sql` yields one `token` row per training occurrence."""
    keys = {"d": dataset, "t": task, "f": feature}
    con.execute("DELETE FROM samples.vocab WHERE dataset = $d AND task = $t AND feature = $f", keys)
    con.execute(
        f"INSERT INTO samples.vocab SELECT $d, $t, $f, token, idx, count FROM ({vocab_rows_sql(token_sql, specials, min_count)})",
        {**keys, **(params or {})},
    )
    return con.execute(
        "SELECT count(*) FROM samples.vocab WHERE dataset = $d AND task = $t AND feature = $f", keys
    ).fetchall()[0][0]


def load_vocab(con: duckdb.DuckDBPyConnection, dataset: str, task: str, feature: str) -> Vocab:
    """The stored vocabulary, in index order."""
    rows = con.execute(
        "SELECT token FROM samples.vocab WHERE dataset = ? AND task = ? AND feature = ? ORDER BY idx",
        [dataset, task, feature],
    ).fetchall()
    if not rows:
        raise LookupError(
            f"no vocabulary for dataset={dataset!r} task={task!r} feature={feature!r}: "
            f"run `medtx build-samples --task {task}` first"
        )
    return Vocab([r[0] for r in rows])
