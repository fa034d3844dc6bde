"""NDC normalisation, as MIMIC-III stores NDCs: an 11-digit string (5-4-2 without hyphens).

`0`, all zeros and empty mean "no NDC". Hyphenated 10-digit package codes (4-4-2, 5-3-2, 5-4-1) are
zero-padded segment by segment, digit strings that lost leading zeros (read as numbers somewhere upstream)
are left-padded to 11. Anything else is kept trimmed but unchanged, so it shows up, counted, among the
unmapped NDCs instead of silently disappearing.
"""

from __future__ import annotations

import re

_HYPHENATED = re.compile(r"^(\d{1,5})-(\d{1,4})-(\d{1,2})$")
_DIGITS = re.compile(r"^(\d{1,11})(?:\.0+)?$")


def normalize_ndc(value: str | None) -> str | None:
    """One NDC as MIMIC stores it, or None when the row carries no NDC."""
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if match := _HYPHENATED.match(text):
        text = match[1].zfill(5) + match[2].zfill(4) + match[3].zfill(2)
    elif match := _DIGITS.match(text):
        text = match[1].zfill(11)
    if set(text) == {"0"}:
        return None
    return text


def ndc_sql(column: str) -> str:
    """The same rules as `normalize_ndc`, as a DuckDB SQL expression over `column`."""
    t = f"trim({column})"
    return f"""(CASE
        WHEN {column} IS NULL OR {t} = '' OR regexp_full_match({t}, '0+(\\.0+)?') OR regexp_full_match({t}, '0+-0+-0+')
            THEN NULL
        WHEN regexp_full_match({t}, '\\d{{1,5}}-\\d{{1,4}}-\\d{{1,2}}')
            THEN lpad(split_part({t}, '-', 1), 5, '0') || lpad(split_part({t}, '-', 2), 4, '0')
                 || lpad(split_part({t}, '-', 3), 2, '0')
        WHEN regexp_full_match({t}, '\\d{{1,11}}(\\.0+)?')
            THEN lpad(regexp_extract({t}, '^\\d+'), 11, '0')
        ELSE {t}
    END)"""


def drug_name_key(name: str | None) -> str | None:
    """Normalised drug name for the WHO-name fallback: lower case, no parentheses, letters only."""
    if name is None:
        return None
    text = re.sub(r"\([^)]*\)", " ", name.lower())
    text = " ".join(re.sub(r"[^a-z]+", " ", text).split())
    return text or None


def drug_name_key_sql(column: str) -> str:
    """`drug_name_key` as a DuckDB SQL expression."""
    inner = f"regexp_replace(lower({column}), '\\([^)]*\\)', ' ', 'g')"
    letters = f"trim(regexp_replace(regexp_replace({inner}, '[^a-z]+', ' ', 'g'), ' +', ' ', 'g'))"
    return f"nullif({letters}, '')"
