"""Mechanism health: the numbers that would expose a method's mechanism dead, and their bounds.

Each recipe names, through :meth:`~dmlbench.methods.base.Recipe.health_checks`, the
``metrics.json`` keys that show its mechanism working (an attention that left
uniform, learners that did not collapse, crops that contain the object, clusters
that follow the data) and the bound each must satisfy. Recipes write their own
numbers as ``health/<name>`` keys (``summary()`` for metrics.json, ``epoch_log()`` for
log.csv); a check may also read an evaluation key (``self_similarity``,
``learners_mean/R@1``). The report marks every table cell whose run failed a check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Prefix of the recipe-written health numbers in ``metrics.json`` and ``log.csv``.
HEALTH_PREFIX = "health/"

#: A value this close to a bound counts as on it: a bound holds up to float rounding (an R@1 shortfall of
#: 211/400 − 203/400 is 0.020000000000000018 in float64, exactly the 0.02 it is checked against).
BOUND_TOLERANCE = 1e-9


@dataclass(frozen=True)
class HealthCheck:
    """One bound on one number of a run.

    Attributes:
        key: the ``metrics.json`` key (e.g. ``health/mask_std``, ``self_similarity``).
        minimum: the mechanism engaged only if value ≥ minimum (None: no lower bound).
        maximum: the mechanism engaged only if value ≤ maximum (None: no upper bound).
        meaning: what a failure means, in words (shown in the report and the docs).
    """

    key: str
    minimum: float | None = None
    maximum: float | None = None
    meaning: str = ""

    def __post_init__(self) -> None:
        if self.minimum is None and self.maximum is None:
            raise ValueError(f"health check {self.key!r}: give a minimum, a maximum or both")
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"health check {self.key!r}: minimum {self.minimum:g} > maximum {self.maximum:g}")

    def passes(self, value: float) -> bool:
        """Whether ``value`` is finite and inside the bounds, up to :data:`BOUND_TOLERANCE`.

        >>> check = HealthCheck("health/mask_std", minimum=0.05)
        >>> check.passes(0.2), check.passes(0.01), check.passes(float("nan"))
        (True, False, False)
        >>> HealthCheck("health/init_shortfall", maximum=0.02).passes(0.5275 - 0.5075)  # 0.020000000000000018
        True
        """
        if not math.isfinite(value):
            return False
        if self.minimum is not None and value < self.minimum - BOUND_TOLERANCE:
            return False
        return self.maximum is None or value <= self.maximum + BOUND_TOLERANCE

    def bound_text(self) -> str:
        """The bound as text, e.g. ``health/mask_std >= 0.05``.

        >>> HealthCheck("self_similarity", maximum=0.9).bound_text()
        'self_similarity <= 0.9'
        >>> HealthCheck("health/x", minimum=0.1, maximum=0.5).bound_text()
        '0.1 <= health/x <= 0.5'
        """
        if self.minimum is not None and self.maximum is not None:
            return f"{self.minimum:g} <= {self.key} <= {self.maximum:g}"
        if self.minimum is not None:
            return f"{self.key} >= {self.minimum:g}"
        return f"{self.key} <= {self.maximum:g}"


def failed_checks(checks: Iterable[HealthCheck], metrics: Mapping[str, float]) -> list[str]:
    """The checks a run fails, each as ``"<bound> (got <value>): <meaning>"``; a key the run
    did not record fails too (a health number that is missing proves nothing).

    Args:
        checks: the recipe's :class:`HealthCheck` list.
        metrics: the run's ``metrics.json``.

    >>> checks = [HealthCheck("health/entropy_ratio", maximum=0.95, meaning="attention stays uniform")]
    >>> failed_checks(checks, {"health/entropy_ratio": 0.5})
    []
    >>> failed_checks(checks, {"health/entropy_ratio": 0.999})
    ['health/entropy_ratio <= 0.95 (got 0.999): attention stays uniform']
    >>> failed_checks(checks, {})
    ['health/entropy_ratio <= 0.95 (not recorded): attention stays uniform']
    """
    failures = []
    for check in checks:
        value = metrics.get(check.key)
        if value is None:
            failures.append(f"{check.bound_text()} (not recorded): {check.meaning}")
        elif not check.passes(float(value)):
            failures.append(f"{check.bound_text()} (got {float(value):.4g}): {check.meaning}")
    return failures


#: ``metrics.json`` keys of init parity: the validation R@1 (fraction) of the run's test-time embedding
#: before its first step; the mean and the lowest over seeded draws of the plain baselines' linear head
#: on the same backbone; the gap to that mean; and the shortfall below the lowest draw (the checked one).
INIT_VAL_R1_KEY = f"{HEALTH_PREFIX}init_val_r1"
INIT_LINEAR_HEAD_VAL_R1_KEY = f"{HEALTH_PREFIX}init_val_r1_linear_head"
INIT_LINEAR_HEAD_LOWEST_KEY = f"{HEALTH_PREFIX}init_val_r1_linear_head_lowest"
INIT_GAP_KEY = f"{HEALTH_PREFIX}init_gap"
INIT_SHORTFALL_KEY = f"{HEALTH_PREFIX}init_shortfall"
#: Largest R@1 shortfall at init (fraction: 0.02 = 2 points) below the lowest linear-head draw that still
#: counts as starting where the baseline starts.
INIT_SHORTFALL_MAXIMUM = 0.02


def init_parity_check() -> HealthCheck:
    """Every trained method must start where its baseline starts: a module it inserts into a pretrained
    backbone (attention, masks, crops) that is not the identity at initialisation destroys the
    pretrained features before the first step, and a short schedule does not win them back.

    The bound is on the shortfall below the *lowest* of the seeded linear-head draws, not on the gap
    to their mean: one random head's R@1 varies with its draw (0.7 points std on CUB's 1,179
    validation images, several points on the embedded default's 128), so a method whose test-time
    embedding is itself a random linear head (MPN, D&C) would otherwise fail by chance.

    >>> init_parity_check().bound_text()
    'health/init_shortfall <= 0.02'
    """
    return HealthCheck(
        INIT_SHORTFALL_KEY,
        maximum=INIT_SHORTFALL_MAXIMUM,
        meaning="the run started more than 2 R@1 points below the lowest of 8 random linear heads "
        "on the same backbone (validation, before the first step): what the method inserts "
        "is not the identity at initialisation",
    )
