"""The floors on small counts under which a figure of the model card is withheld: every rule in ONE place, each
with its reason. A withheld figure keeps its counts (so a reader sees why) but shows no value, interval or
verdict, and never takes part in a comparison (a withheld group is never the "largest gap").

| figure | floor | withheld as |
|---|---|---|
| a subgroup's figure, interval and verdict | >= `MIN_UNITS` (30) test patients, >= `MIN_GROUP_EVENTS` (10) events and >= `MIN_GROUP_NON_EVENTS` (10) non-events in the group | "fewer than 30 test patients (n)", "too few events (n)", "too few non-events (n)" |
| a recalibration map (Platt, isotonic, temperature) | >= `MIN_RECAL_EVENTS` (20) validation events and as many non-events | "not fitted: too few events (n)" |
| an operating point (a threshold chosen on validation for a target) | >= `MIN_VAL_ALERTS` (10) validation alerts at the chosen threshold | "unreachable: ..." (a row that says so) |

Events are positive samples for a binary task and positive (sample, label) cells for a multi-label one.

Why these numbers. Ten events (and ten non-events) is the smallest count at which a group's AUROC has an
interval that is not mostly noise (with 3 events one patient moves the AUROC by a third); the same ten alerts is
the smallest count at which a validation PPV is a rate rather than an anecdote (2 alerts put the `ppv_0.50`
threshold where one true alert decides it). A recalibration map is a small prediction model fitted on the
validation split, so it takes the rule for fitting one: at least 10 events per estimated parameter (Peduzzi et
al., J Clin Epidemiol 1996; kept as a floor, not as a sufficient size, by Riley et al., "Calculating the sample
size required for developing a clinical prediction model", BMJ 2020;368:m441). Platt scaling estimates two
parameters (intercept and slope), so 2 x 10 = 20 events, and as many non-events; isotonic regression (a
step function, more flexible than two parameters) and temperature scaling (one parameter) take the same floor
so that one number governs every map.
"""

from __future__ import annotations

from medtx.metrics.intervals import MIN_UNITS

MIN_GROUP_EVENTS = 10
MIN_GROUP_NON_EVENTS = 10
EVENTS_PER_PARAMETER = 10
PLATT_PARAMETERS = 2
MIN_RECAL_EVENTS = EVENTS_PER_PARAMETER * PLATT_PARAMETERS  # 20
MIN_VAL_ALERTS = 10

__all__ = ["MIN_UNITS", "MIN_GROUP_EVENTS", "MIN_GROUP_NON_EVENTS", "MIN_RECAL_EVENTS", "MIN_VAL_ALERTS",
           "group_withheld", "recalibration_withheld"]


def group_withheld(n_patients: int, n_events: int, n_non_events: int, min_units: int = MIN_UNITS) -> str | None:
    """Why a subgroup's figures are withheld, or None when they are shown."""
    if n_patients < min_units:
        return f"fewer than {min_units} test patients ({n_patients})"
    if n_events < MIN_GROUP_EVENTS:
        return f"too few events ({n_events})"
    if n_non_events < MIN_GROUP_NON_EVENTS:
        return f"too few non-events ({n_non_events})"
    return None


def recalibration_withheld(n_events: int, n_non_events: int) -> str | None:
    """Why no recalibration map is fitted on these validation counts, or None when one may be."""
    if n_events < MIN_RECAL_EVENTS:
        return f"not fitted: too few events ({n_events} validation events; the floor is {MIN_RECAL_EVENTS})"
    if n_non_events < MIN_RECAL_EVENTS:
        return (f"not fitted: too few non-events ({n_non_events} validation non-events; the floor is "
                f"{MIN_RECAL_EVENTS})")
    return None
