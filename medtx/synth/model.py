"""The generating process of the synthetic cohort, as arrays: what is drawn, and the exact probabilities.

Every random quantity that a label depends on is drawn from a probability this module can also *report*,
which is what makes the oracle exact:

- Codes of a visit (diagnoses, procedures): a visit-level severity s ~ Gamma(k, 1/k) (mean 1) and each code c
  present independently with probability 1 - exp(-s * rate_c). Marginally over s, P(c present) =
  1 - (1 + rate_c / k) ** -k, the Poisson-Gamma (negative binomial) zero-class, so counts per visit are
  over-dispersed like the demo's. First visits use base rates fitted to the demo's per-visit code shares.
- Next visit's diagnoses: rate_c = baseline_scale * base_rate_c + persistence_c * [c in this visit]
  + successor_rate * #(codes of this visit whose successors include c). Chronic code families persist.
- Drugs (ATC-3, per visit): independent Bernoulli with logit = bias_a + dx_logit * #(indicator diagnoses of a
  in the visit) + px_logit * #(indicator procedures) + previous_logit * [a given at the previous visit].
- Readmission: the next admission comes within 30 days with probability sigmoid(base + driver * #drivers),
  when there is one; whether there is one follows the visits-per-patient distribution.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse


def _rate_from_share(share: np.ndarray, shape: float) -> np.ndarray:
    """Inverse of P(present) = 1 - (1 + rate / k) ** -k: the rate that gives a marginal per-visit share."""
    share = np.clip(share, 0.0, 0.999)
    return shape * ((1.0 - share) ** (-1.0 / shape) - 1.0)


def presence_prob(rate: np.ndarray, shape: float) -> np.ndarray:
    """P(code present) for a visit whose severity is not yet known (marginal over s ~ Gamma(k, 1/k))."""
    return 1.0 - (1.0 + rate / shape) ** (-shape)


def _effects(pairs: list[list[int]], n_rows: int, n_cols: int, weight: float) -> sparse.csr_matrix:
    """Sparse feature x label matrix with `weight` at each (feature, label) pair."""
    rows = [p[0] for p in pairs]
    cols = [p[1] for p in pairs]
    return sparse.csr_matrix((np.full(len(pairs), weight), (rows, cols)), shape=(n_rows, n_cols))


class Model:
    """Parameter arrays of the generating process, built once from the fitted parameter dict."""

    def __init__(self, params: dict, drug_bias: np.ndarray | None = None) -> None:
        dx, px, drugs = params["diagnoses"], params["procedures"], params["drugs"]
        self.n_dx, self.n_px, self.n_drugs = len(dx["codes"]), len(px["codes"]), len(drugs["atc3"])
        self.dx_shape = float(dx["gamma_shape"])
        self.px_shape = float(px["gamma_shape"])
        self.dx_rate0 = _rate_from_share(np.asarray(dx["share"]), self.dx_shape)
        self.px_rate0 = _rate_from_share(np.asarray(px["share"]), self.px_shape)
        self.baseline_scale = float(dx["baseline_scale"])
        # Next-visit transition: persistence on the diagonal plus two successor codes per code.
        succ = np.asarray(dx["successors"])
        rows = np.concatenate([np.arange(self.n_dx), np.repeat(np.arange(self.n_dx), succ.shape[1])])
        cols = np.concatenate([np.arange(self.n_dx), succ.ravel()])
        vals = np.concatenate([np.asarray(dx["persistence"]), np.full(succ.size, dx["successor_rate"])])
        self.transition = sparse.csr_matrix((vals, (rows, cols)), shape=(self.n_dx, self.n_dx))
        self.w_dx = _effects(drugs["dx_effects"], self.n_dx, self.n_drugs, drugs["dx_logit"])
        self.w_px = _effects(drugs["px_effects"], self.n_px, self.n_drugs, drugs["px_logit"])
        self.previous_logit = float(drugs["previous_logit"])
        bias = drug_bias if drug_bias is not None else drugs["bias"]
        self.drug_bias = np.asarray(bias, dtype=float)
        readm = params["visits"]["readmission"]
        codes = {c: i for i, c in enumerate(dx["codes"])}
        self.readmit_drivers = np.zeros(self.n_dx)
        self.readmit_drivers[[codes[c] for c in readm["driver_codes"]]] = 1.0
        self.readmit_base, self.readmit_driver = float(readm["base_logit"]), float(readm["driver_logit"])

    @staticmethod
    def draw_codes(rng: np.random.Generator, rate: np.ndarray, shape: float) -> np.ndarray:
        """One visit per row: severity s ~ Gamma(k, 1/k), then each code present w.p. 1 - exp(-s * rate)."""
        severity = rng.gamma(shape, 1.0 / shape, size=rate.shape[0])
        return rng.random(rate.shape) < -np.expm1(-severity[:, None] * rate)

    def next_dx_rate(self, previous: np.ndarray) -> np.ndarray:
        """Diagnosis rates of the next visit given this visit's diagnoses (rows = visits)."""
        carried = sparse.csr_matrix(previous, dtype=float) @ self.transition
        return self.baseline_scale * self.dx_rate0[None, :] + carried.toarray()

    def drug_prob(self, dx: np.ndarray, px: np.ndarray, previous: np.ndarray) -> np.ndarray:
        """P(ATC-3 a given at this visit | this visit's codes, the previous visit's drugs)."""
        logit = (
            self.drug_bias[None, :]
            + (sparse.csr_matrix(dx, dtype=float) @ self.w_dx).toarray()
            + (sparse.csr_matrix(px, dtype=float) @ self.w_px).toarray()
            + self.previous_logit * previous
        )
        return 1.0 / (1.0 + np.exp(-logit))

    def early_readmission_prob(self, dx: np.ndarray) -> np.ndarray:
        """P(next admission within 30 days of discharge | there is a next admission, this visit's diagnoses)."""
        logit = self.readmit_base + self.readmit_driver * (dx @ self.readmit_drivers)
        return 1.0 / (1.0 + np.exp(-logit))
