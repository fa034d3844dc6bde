"""Validation of everything that arrives from the URL or a selector before it reaches a query.

Queries are parameterised anyway; validating first means a bad link shows a clear message instead of an
empty page, and nothing unexpected (huge strings, odd characters) travels further than this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs

from medtx.tasks import task_names

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
_DATASET = re.compile(r"^[a-z0-9_:]{0,64}$")  # '' = runs without a dataset
_SAMPLE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
_MAX_ID = 2**62


_PATHISH = re.compile(r"""(?:[A-Za-z]:)?(?:[\\/][\w.\-~@+]+){2,}[\\/]?""")  # /home/x/medtx/y.py, C:\\x\\y
_LINE_NO = re.compile(r",? line \d+")


def public_error(text: object, limit: int = 200) -> str:
    """What the browser may see of a stored error: one line, no file paths, line numbers or traceback.
    The full text stays in the warehouse (ml.runs.error) and the server log."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback"):
        lines = lines[-1:]  # the exception line of a traceback: `Type: message`
    line = _LINE_NO.sub("", _PATHISH.sub("<path>", lines[0] if lines else ""))
    return line if len(line) <= limit else line[: limit - 1] + "…"


class InvalidParameter(ValueError):
    """A URL or selector value that fails validation; the message names the parameter."""


def run_id(value: object) -> str:
    if not isinstance(value, str) or not _RUN_ID.match(value):
        raise InvalidParameter(f"run_id {str(value)[:40]!r} is not a valid run id")
    return value


def dataset(value: object) -> str:
    if not isinstance(value, str) or not _DATASET.match(value):
        raise InvalidParameter(f"dataset {str(value)[:40]!r} is not a valid dataset name")
    return value


def task(value: object) -> str:
    if value not in (known := task_names()):
        raise InvalidParameter(f"task {str(value)[:40]!r} is not one of {', '.join(known)}")
    return str(value)


def integer_id(name: str, value: object) -> int:
    """subject_id / hadm_id: positive integers only (strings of digits from the URL are accepted)."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or len(text) > 18 or not 0 < int(text) < _MAX_ID:
        raise InvalidParameter(f"{name} {text[:40]!r} is not a positive integer id")
    return int(text)


def sample_id(value: object) -> str:
    if not isinstance(value, str) or not _SAMPLE_ID.match(value):
        raise InvalidParameter(f"sample id {str(value)[:40]!r} is not valid")
    return value


_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")  # an attention module, an averaging convention, a group key


def name(what: str, value: object) -> str:
    """A short identifier chosen from options the page offered (module, averaging, group): nothing else is
    looked up, cached or echoed."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidParameter(f"{what} {str(value)[:40]!r} is not a valid {what}")
    return value


def small_int(what: str, value: object, low: int = -1, high: int = 1024) -> int:
    """A layer or head index (and -1 for the mean of heads)."""
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).lstrip("-").isdigit() \
            or len(str(value)) > 5 or not low <= int(value) <= high:
        raise InvalidParameter(f"{what} {str(value)[:40]!r} is not an integer in [{low}, {high}]")
    return int(value)


def choice(what: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidParameter(f"{what} {str(value)[:40]!r} is not one of {', '.join(allowed)}")
    return str(value)


def url_params(
    params: dict[str, str], checks: dict[str, Callable[[object], object]]
) -> tuple[dict[str, object], list[str]]:
    """Check the URL parameters a page knows: (valid values by key, one message per invalid parameter)."""
    valid, problems = {}, []
    for key, check in checks.items():
        if key in params:
            try:
                valid[key] = check(params[key])
            except InvalidParameter as exc:
                problems.append(str(exc))
    return valid, problems


def query_params(search: str | None) -> dict[str, str]:
    """`?a=1&b=2` -> {'a': '1', 'b': '2'} (first value of each; unknown keys are ignored by pages)."""
    parsed = parse_qs((search or "").lstrip("?"), max_num_fields=20)
    return {key: values[0] for key, values in parsed.items() if values}
