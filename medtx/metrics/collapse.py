"""The collapse guard: flag a run whose predictions are (nearly) one class or one constant answer.

The PyHealth book's ClinicalBERT run on MTSamples (accuracy 0.254, macro-F1 0.0116) predicted the majority
class for every note; its accuracy looks like a result but it is not one. Every run (text and EHR) passes its
test predictions through `is_collapsed` and stores the verdict in `ml.runs.collapsed` / `collapse_reason`.

Rule (`share` defaults to 0.95):
- class labels (1-D ints/strings), or multi-class probabilities/logits (2-D, argmax taken):
  collapsed when >= share of the predictions are one class;
- multi-label predictions (2-D with `multilabel=True`; probabilities are thresholded at `threshold`):
  collapsed when >= share of the samples have the identical predicted label set;
- binary scores (1-D floats): collapsed when >= share of the scores are one value (rounded to 4 decimals),
  since a constant score carries no ranking (AUROC/AUPRC are then meaningless).
An empty prediction set is not judged (returns False with a reason saying so).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

DEFAULT_SHARE = 0.95


def _modal_share(keys: Sequence) -> tuple[object, float]:
    value, count = Counter(keys).most_common(1)[0]
    return value, count / len(keys)


def is_collapsed(
    predictions: Sequence | np.ndarray,
    *,
    multilabel: bool = False,
    threshold: float = 0.5,
    share: float = DEFAULT_SHARE,
) -> tuple[bool, str]:
    """(collapsed?, human-readable reason) for one run's test predictions; see the module docstring."""
    arr = np.asarray(predictions)
    n = arr.shape[0] if arr.ndim else 0
    if n == 0:
        return False, "no predictions to judge"
    if arr.ndim == 2 and multilabel:
        sets = arr >= threshold if arr.dtype.kind == "f" else arr.astype(bool)
        value, frac = _modal_share([row.tobytes() for row in sets])
        size = int(np.frombuffer(value, dtype=bool).sum())
        kind = f"the same predicted label set (size {size})"
    elif arr.ndim == 2:
        value, frac = _modal_share(arr.argmax(axis=1).tolist())
        kind = f"class index {value}"
    elif arr.ndim == 1 and arr.dtype.kind == "f":
        value, frac = _modal_share(np.round(arr, 4).tolist())
        kind = f"the constant score {value}"
    elif arr.ndim == 1:
        value, frac = _modal_share(arr.tolist())
        kind = f"class {value!r}"
    else:
        raise ValueError(f"is_collapsed: predictions of shape {arr.shape} are neither 1-D nor 2-D")
    collapsed = frac >= share
    verb = "collapsed" if collapsed else "not collapsed"
    return collapsed, f"{verb}: {frac:.1%} of {n} predictions are {kind} (limit {share:.0%})"
