"""The claims table: each paper's mechanistic and ablation claims, re-measured on our runs.

A claim (``claims.items`` in params.yaml) compares two *sides* on a metric. A side is a method's
value of a metrics.json key (``higher`` with ``metric`` or ``higher_metric``; ``lower`` with
``metric`` or ``lower_metric``), or, for the lower side, a fixed reference number
(``lower_value``, e.g. 1.0 for uniform attention or 0.0 for uncorrelated learners). The two sides
may be one method's two keys (e.g. DeML's finest scale against its coarsest). A claim is either

- an **order** "higher > lower" (no ``margin``), or
- an **equivalence** "higher ≈ lower" (``margin``: the largest |higher − lower| still called equal,
  in the metric's stored units: 0.01 is one point of R@1); the names of the sides then only fix the
  sign of the difference.

Each claim names what the paper printed (``reported``, with its table or figure) and the seeds
(``claims.seeds`` when set, else the item's ``seeds``, else the top-level ``seeds``: those of the
table whose runs it reuses, so the claims train nothing of their own). ``claims.skip`` lists ids
that a configuration does not run (with ``claims.skip_reason``): their rows stay in the table, marked
*not run*, and none of their runs is required.

**Verdict: the project's paired seed × query bootstrap** (:mod:`.significance`, the tables' own
test). Both sides' values are resampled with the *same* draws of seed slots (matched by seed index)
and test queries, in one :func:`~.significance.bootstrap_means` call, and the difference
d = higher − lower is taken per replicate. Per-query values come from each run's ``per_query.npz``
(R@K, MAP@R, RP, also of views such as ``scale2/R@1``); when a side's key has no per-query
decomposition (NMI, ``self_similarity``, ``learners_mean/…``, ``health/…``), both sides are resampled
over seeds only (with one seed there is nothing to resample: *inconclusive*). With α =
:data:`~.significance.ALPHA`, and P(·) the share of replicates:

- order: *supported* when P(d ≤ 0) < α, *contradicted* when P(d ≥ 0) < α;
- equivalence (two one-sided tests): *supported* when P(d ≤ −margin) < α and P(d ≥ margin) < α
  (the interval below lies inside ±margin), *contradicted* when P(d ≤ margin) < α or
  P(d ≥ −margin) < α (it lies wholly outside);
- otherwise *inconclusive*.

The difference is shown with its central 1 − 2α (90 %) percentile interval, the interval these
one-sided tests at α read (an order is supported exactly when its lower end is above 0); each side
with half the width of its 95 % interval, as in the tables. A side whose runs failed a
mechanism-health check (:mod:`.health`) carries a dagger: the comparison then says nothing about the
mechanism.

Outputs: ``claims.tex`` (booktabs), ``claims.md`` (+ its ``claims.html`` page) and ``claims.csv`` beside
the tables, rendered by the tables' own helpers: the float and tabular of :mod:`.latex` with its escaping, the
pipe table of :mod:`.markdown`, each side shown as a table cell (:func:`~.summary.styled_text`), the intervals'
sentence of :func:`~.significance.interval_text` and the daggers' of :func:`~.health.dead_caption`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dmlbench.atomic import atomic_outputs, write_text_atomic
from dmlbench.config import ConfigError, resolve_method, section
from dmlbench.evaluation.per_query import DECOMPOSABLE

from .collect import ReportInputError, RunDir, collect_runs
from .health import dead_caption, dead_cells
from .html import write_html_page
from .latex import DEAD_MARK, booktabs_tabular, escape_latex, latex_from_plain, latex_row, plain_from_latex, table_float
from .markdown import markdown_table
from .metric_format import metric_format
from .significance import (
    ALPHA,
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_means,
    interval_text,
    percentile_interval,
    worse_p_value,
)
from .spec import TABLE_SUFFIXES, TableSpec
from .summary import MISSING, PLAIN_DEAD_MARK, per_query_block, seed_counts, styled_text

SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
#: The verdict of a claim that ``claims.skip`` leaves out.
NOT_RUN = "not run"
#: The verdicts, in the order the CLI counts them.
VERDICTS = (SUPPORTED, CONTRADICTED, INCONCLUSIVE, NOT_RUN)
#: Coverage of the difference's interval: the two one-sided tests at α read its ends.
DIFFERENCE_CONFIDENCE = 1.0 - 2.0 * ALPHA

CLAIM_COLUMNS = [
    "id",
    "paper",
    "claim",
    "reported",
    "kind",
    "margin",
    "higher",
    "higher_metric",
    "lower",
    "lower_metric",
    "lower_value",
    "seeds",
    "queries",
    "higher_mean",
    "higher_ci_low",
    "higher_ci_high",
    "lower_mean",
    "lower_ci_low",
    "lower_ci_high",
    "difference",
    "difference_low",
    "difference_high",
    "p_not_higher",
    "verdict",
    "higher_dead",
    "lower_dead",
]


@dataclass(frozen=True)
class Claim:
    """One claim (``claims.items[i]``): ``higher`` on ``metric`` against ``lower`` on ``lower_metric``.

    Attributes:
        lower: the lower side's method; None when the lower side is the number ``lower_value``.
        lower_metric: the lower side's key (defaults to ``metric`` in :func:`claims_of`).
        margin: None for an order (higher > lower); the equivalence margin (same units as the metric)
            for higher ≈ lower.
        skipped: listed in ``claims.skip``: reported as *not run*, its runs not read.
    """

    id: str
    paper: str
    claim: str
    reported: str
    metric: str
    higher: str
    lower: str | None
    seeds: tuple[int, ...]
    lower_metric: str = ""
    lower_value: float | None = None
    margin: float | None = None
    skipped: bool = False

    @property
    def sides(self) -> list[tuple[str, str]]:
        """The (method, key) of each side that a run measures: the higher side, then the lower one if a method."""
        return [(self.higher, self.metric)] + ([(self.lower, self.lower_metric)] if self.lower is not None else [])


def claims_of(config: Mapping[str, Any]) -> tuple[str, list[Claim]]:
    """The dataset and the claims of ``claims`` in a validated config (none when absent)."""
    claims = config.get("claims")
    if not claims:
        return "", []
    default_seeds = tuple(config["seeds"])
    override = claims.get("seeds")
    skip = set(claims.get("skip", []))
    return claims["dataset"], [
        Claim(
            id=item["id"],
            paper=item["paper"],
            claim=item["claim"],
            reported=item.get("reported", ""),
            metric=item.get("higher_metric", item["metric"]),
            higher=item["higher"],
            lower=item.get("lower"),
            seeds=tuple(override or item.get("seeds", default_seeds)),
            lower_metric=item.get("lower_metric", item["metric"]),
            lower_value=item.get("lower_value"),
            margin=item.get("margin"),
            skipped=item["id"] in skip,
        )
        for item in claims["items"]
    ]


def check_claims(config: Mapping[str, Any], source: str) -> None:
    """Cross-references of ``claims``: a known dataset, known methods, one lower side, unique ids, ``skip``
    naming known ids, no table named ``claims``.

    Raises:
        ConfigError: naming ``claims.items[i].<key>`` and what is defined.
    """
    if not config.get("claims"):
        return
    dataset, claims = claims_of(config)
    section(config, "datasets", dataset)
    if "claims" in config.get("tables", {}):
        raise ConfigError(
            f"{source}: tables.claims: the name 'claims' belongs to the claims table "
            f"(results/tables/claims.tex); rename the table"
        )
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        if claim.id in seen:
            raise ConfigError(f"{source}: claims.items[{i}].id = {claim.id!r} is used twice; ids must be unique")
        seen.add(claim.id)
        if (claim.lower is None) == (claim.lower_value is None):
            raise ConfigError(
                f"{source}: claims.items[{i}] ({claim.id}): give exactly one of 'lower' (a method) "
                f"and 'lower_value' (a fixed reference number) for the lower side"
            )
        for side, (method, _) in zip(("higher", "lower"), claim.sides):
            if method not in config["methods"]:
                raise ConfigError(
                    f"{source}: claims.items[{i}].{side} = {method!r} is not defined under "
                    f"'methods'; use one of the method names there"
                )
            resolve_method(config, method)
    unknown = sorted(set(config["claims"].get("skip", [])) - seen)
    if unknown:
        raise ConfigError(
            f"{source}: claims.skip names {unknown}, which are not ids of claims.items; use ids listed there"
        )


def claim_runs(config: Mapping[str, Any], runs_dir: Path) -> list[RunDir]:
    """Every run the claims read (each once), in ``runs_dir/<dataset>/<method>/seed<k>``."""
    dataset, claims = claims_of(config)
    keys = sorted({(method, s) for c in claims if not c.skipped for method, _ in c.sides for s in c.seeds})
    return [RunDir.of(dataset, m, s, runs_dir) for m, s in keys]


def _reported(results: pd.DataFrame, method: str, metric: str, seeds: Sequence[int]) -> pd.DataFrame:
    """A method's metrics.json values of ``metric``, indexed by seed (in ``seeds`` order), one column.

    Raises:
        ConfigError: a missing run or key (naming the method, the key and the seeds).
    """
    rows = results[(results["method"] == method) & (results["metric"] == metric) & results["seed"].isin(seeds)]
    values = rows.pivot(index="seed", columns="metric", values="value")
    missing = sorted(set(seeds) - set(values.index))
    if missing:
        raise ConfigError(
            f"claims: {method} has no '{metric}' in metrics.json of seed(s) {missing}; "
            f"is '{metric}' a key that this method's runs write?"
        )
    return values.loc[list(seeds)]


def _per_query(claim: Claim) -> bool:
    """Whether every measured side's key has per-query values (else both sides resample seeds only)."""
    return all(DECOMPOSABLE.match(metric) for _, metric in claim.sides)


def _side_values(claim: Claim, results: pd.DataFrame, runs: Mapping[tuple[str, int], RunDir]) -> np.ndarray:
    """(S, Q, n) values of the claim's n measured sides, seeds in claim order: per-query values when every
    side's key decomposes per query (Q test queries, the same for both sides), else per-run values (Q = 1).

    Raises:
        ReportInputError: a missing per_query.npz, or sides evaluated on other test queries.
    """
    reported = [_reported(results, method, metric, claim.seeds) for method, metric in claim.sides]
    if not _per_query(claim):
        return np.stack([frame.to_numpy(dtype=float)[:, 0] for frame in reported], axis=1)[:, None, :]
    blocks, rows = [], None
    for (method, metric), frame in zip(claim.sides, reported):
        block, side_rows = per_query_block([runs[(method, s)] for s in claim.seeds], [metric], frame)
        if rows is not None and not np.array_equal(rows, side_rows):
            raise ReportInputError(
                f"claims.{claim.id}: {claim.higher} and {method} were evaluated on other test "
                f"queries; a claim pairs the two sides query by query"
            )
        rows = side_rows
        blocks.append(block)
    return np.concatenate(blocks, axis=2)


def _share_at_most(values: np.ndarray, bound: float) -> float:
    """P(value ≤ bound) over replicates (B,), via the tables' paired test."""
    return worse_p_value(values, np.full_like(values, bound))


def _share_at_least(values: np.ndarray, bound: float) -> float:
    """P(value ≥ bound) over replicates (B,)."""
    return worse_p_value(np.full_like(values, bound), values)


def verdict(difference: np.ndarray, margin: float | None, alpha: float = ALPHA) -> str:
    """The claim's verdict from the bootstrap replicates (B,) of d = higher − lower (module docstring).

    Args:
        difference: (B,) replicates of the difference, in the metric's stored units.
        margin: None for an order claim; the equivalence margin (> 0) for an equivalence claim.
        alpha: one-sided level of each test.

    >>> verdict(np.array([0.01, 0.02, 0.03]), None), verdict(np.array([-0.01, 0.02, 0.03]), None)
    ('supported', 'inconclusive')
    >>> verdict(np.array([-0.004, 0.0, 0.004]), 0.005), verdict(np.array([0.02, 0.03]), 0.005)
    ('supported', 'contradicted')
    """
    if margin is None:
        if _share_at_most(difference, 0.0) < alpha:
            return SUPPORTED
        if _share_at_least(difference, 0.0) < alpha:
            return CONTRADICTED
        return INCONCLUSIVE
    if _share_at_most(difference, -margin) < alpha and _share_at_least(difference, margin) < alpha:
        return SUPPORTED
    if _share_at_most(difference, margin) < alpha or _share_at_least(difference, -margin) < alpha:
        return CONTRADICTED
    return INCONCLUSIVE


def evaluate_claim(
    claim: Claim, results: pd.DataFrame, runs: Mapping[tuple[str, int], RunDir], samples: int = BOOTSTRAP_SAMPLES
) -> dict[str, Any]:
    """The bootstrap numbers of one claim: per side mean and 95 % interval, the difference with its
    90 % interval, P(d ≤ 0), the number of resampled queries (0: per-run values) and the verdict."""
    values = _side_values(claim, results, runs)
    num_seeds, num_queries, _ = values.shape
    replicates = bootstrap_means(values, samples, BOOTSTRAP_SEED)  # (B, n): one draw for both sides
    if claim.lower is None:
        replicates = np.concatenate([replicates, np.full((samples, 1), claim.lower_value)], axis=1)
    means = [float(values[:, :, j].mean()) for j in range(values.shape[2])] + (
        [float(claim.lower_value)] if claim.lower_value is not None else []
    )  # lower None ⇔ lower_value set
    low, high = percentile_interval(replicates)
    difference = replicates[:, 0] - replicates[:, 1]
    d_low, d_high = percentile_interval(difference[:, None], DIFFERENCE_CONFIDENCE)
    no_spread = num_seeds == 1 and num_queries == 1
    nan = math.nan
    return {
        "queries": num_queries if _per_query(claim) else 0,
        "higher_mean": means[0],
        "higher_ci_low": nan if no_spread else float(low[0]),
        "higher_ci_high": nan if no_spread else float(high[0]),
        "lower_mean": means[1],
        "lower_ci_low": nan if no_spread or claim.lower is None else float(low[1]),
        "lower_ci_high": nan if no_spread or claim.lower is None else float(high[1]),
        "difference": means[0] - means[1],
        "difference_low": nan if no_spread else float(d_low[0]),
        "difference_high": nan if no_spread else float(d_high[0]),
        "p_not_higher": nan if no_spread else _share_at_most(difference, 0.0),
        "verdict": INCONCLUSIVE if no_spread else verdict(difference, claim.margin),
    }


#: The numbers of a claim that ``claims.skip`` leaves out.
NOT_RUN_NUMBERS: dict[str, Any] = {
    "queries": 0,
    **{f"{side}_{name}": math.nan for side in ("higher", "lower") for name in ("mean", "ci_low", "ci_high")},
    "difference": math.nan,
    "difference_low": math.nan,
    "difference_high": math.nan,
    "p_not_higher": math.nan,
    "verdict": NOT_RUN,
}


def evaluate_claims(
    claims: Sequence[Claim],
    results: pd.DataFrame,
    runs: Sequence[RunDir],
    dead: Mapping[str, bool],
    samples: int = BOOTSTRAP_SAMPLES,
) -> pd.DataFrame:
    """One row per claim (:data:`CLAIM_COLUMNS`) from the long results of their runs.

    Args:
        claims: the claims.
        results: long results (:func:`~dmlbench.report.collect.collect_runs`) of their runs.
        runs: their run directories (``per_query.npz`` is read for per-query keys).
        dead: method → whether a run of it failed a mechanism-health check.
        samples: bootstrap replicates.
    """
    by_key = {(run.method, run.seed): run for run in runs}
    rows = []
    for claim in claims:
        numbers = NOT_RUN_NUMBERS if claim.skipped else evaluate_claim(claim, results, by_key, samples)
        rows.append(
            {
                "id": claim.id,
                "paper": claim.paper,
                "claim": claim.claim,
                "reported": claim.reported,
                "kind": "≈" if claim.margin is not None else ">",
                "margin": math.nan if claim.margin is None else claim.margin,
                "higher": claim.higher,
                "higher_metric": claim.metric,
                "lower": claim.lower or "",
                "lower_metric": claim.lower_metric,
                "lower_value": math.nan if claim.lower_value is None else claim.lower_value,
                "seeds": 0 if claim.skipped else len(claim.seeds),
                **numbers,
                "higher_dead": dead.get(claim.higher, False),
                "lower_dead": claim.lower is not None and dead.get(claim.lower, False),
            }
        )
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS)


def _side_cell(row: Any, side: str) -> pd.Series:
    """One side of a claim as a table cell (the keys of :data:`~.summary.CELL_COLUMNS` that its text reads), never
    bold: shown as the tables show theirs (:func:`~.summary.styled_text`)."""
    return pd.Series(
        {
            "metric": row.higher_metric if side == "higher" else row.lower_metric,
            **{name: getattr(row, f"{side}_{name}") for name in ("mean", "ci_low", "ci_high")},
            "bold": False,
            "dead": getattr(row, f"{side}_dead"),
        }
    )


def _difference_text(row: Any) -> str:
    """``d [low, high]`` in the higher side's display, ``(±margin)`` after an equivalence; :data:`~.summary.MISSING`
    when not run."""
    if row.verdict == NOT_RUN:
        return MISSING
    display = metric_format(row.higher_metric)
    text = display.text(row.difference)
    if not math.isnan(row.difference_low):
        text += f" {display.interval(row.difference_low, row.difference_high)}"
    if row.kind == "≈":
        text += f" (±{display.text(row.margin)})"
    return text


def _verdict_text(row: Any) -> str:
    if row.verdict == NOT_RUN:
        return f"{NOT_RUN} (claims.skip)"
    if row.seeds == 1:
        return f"{row.verdict} (1 seed{', queries only' if row.queries else ''})"
    return row.verdict


def _rows(table: pd.DataFrame, text: Callable[[str], str], dead_mark: str, plus_minus: str) -> list[list[str]]:
    """The cells of each claim: its plain text through ``text`` (as is for Markdown,
    :func:`~.latex.latex_from_plain` for LaTeX), the two sides as table cells with ``dead_mark`` and ``plus_minus``."""
    return [
        [
            *map(text, [row.paper, row.claim, row.reported or MISSING]),
            *(
                styled_text(_side_cell(row, side), dead_mark=dead_mark, plus_minus=plus_minus)
                for side in ("higher", "lower")
            ),
            text(_difference_text(row)),
            text(_verdict_text(row)),
        ]
        for row in table.itertuples()
    ]


HEADER = [
    "Paper",
    "Claim",
    "Paper's numbers",
    "Ours: higher side",
    "Ours: lower side",
    "Difference [90 % CI]",
    "Verdict",
]
#: The LaTeX column specification: the claim and the paper's numbers wrap.
LATEX_COLUMNS = "lp{4.2cm}p{3.6cm}cccl"
#: What the claims' caption adds to the intervals' sentence (:func:`~.significance.interval_text`).
NOTE = (
    f"A lower side without an interval is a fixed reference. Difference: higher − lower side with its 90 % "
    f"interval (the same draws of seeds and test queries for both sides). Verdict: an order (>) is supported when "
    f"fewer than {ALPHA} of the replicates have difference ≤ 0, contradicted when fewer than {ALPHA} have ≥ 0; an "
    f"equivalence (≈, ±margin in parentheses) is supported when the 90 % interval lies inside ±margin, "
    f"contradicted when it lies outside; otherwise inconclusive (always so with 1 seed and no per-query values)."
)


def claims_caption(table: pd.DataFrame, dataset_label: str, dead_note: str = "", skip_reason: str = "") -> str:
    """The claims table's LaTeX caption: the dataset, the intervals as the tables state them, how the difference and
    the verdict are read, the daggers (``dead_note``, :func:`~.health.dead_caption`) and why claims were not run.

    Args:
        table: the claims (:func:`evaluate_claims`; its ``seeds`` say how the intervals count them).
        dataset_label: the claims' dataset, plain text.
        dead_note: LaTeX; empty when every side's mechanism engaged.
        skip_reason: ``claims.skip_reason`` when claims were skipped, plain text.
    """
    return " ".join(
        filter(
            None,
            [
                f"Claims of the papers, re-measured on {escape_latex(dataset_label)}.",
                latex_from_plain(interval_text(seed_counts(table), "Ours")),
                latex_from_plain(NOTE),
                dead_note,
                latex_from_plain(f"Not run: {skip_reason}") if skip_reason else "",
            ],
        )
    )


def render_markdown(table: pd.DataFrame, caption: str) -> str:
    """The claims as a Markdown table followed by ``caption`` (LaTeX, shown as plain text), as the tables' ``.md``."""
    return markdown_table(HEADER, _rows(table, str, PLAIN_DEAD_MARK, "±"), plain_from_latex(caption))


def render_latex(table: pd.DataFrame, caption: str) -> str:
    """The claims as one booktabs ``table*`` in the tables' skeleton (:func:`~.latex.table_float`); long text cells
    wrap."""
    header = latex_row([latex_from_plain(cell) for cell in HEADER])
    body = [latex_row(row) for row in _rows(table, latex_from_plain, DEAD_MARK, "$\\pm$")]
    return table_float("table*", caption, "tab:claims", [booktabs_tabular(LATEX_COLUMNS, [header], body)])


def claims_spec(config: Mapping[str, Any]) -> TableSpec:
    """The claims' dataset, the methods they read and the metrics they compare, with their labels (for the
    daggers' caption, :func:`~.health.dead_caption`)."""
    dataset, claims = claims_of(config)
    methods = claim_methods(config)
    return TableSpec(
        datasets=[dataset],
        methods=methods,
        metrics={dataset: sorted({metric for claim in claims for _, metric in claim.sides})},
        dataset_labels={dataset: config["datasets"][dataset].get("label", dataset)},
        method_labels={m: resolve_method(config, m).get("label", m) for m in methods},
    )


def claim_methods(config: Mapping[str, Any]) -> list[str]:
    """The methods whose runs the claims read, sorted."""
    return sorted({method for claim in claims_of(config)[1] for method, _ in claim.sides})


def write_claims(
    config: Mapping[str, Any], runs_dir: Path, out_dir: Path, checks: Mapping[str, Sequence[Any]]
) -> pd.DataFrame:
    """Evaluate the claims and write ``claims.{tex,md,html,csv}`` to ``out_dir``, renamed into place together
    at the end (:func:`dmlbench.atomic.atomic_outputs`).

    Args:
        checks: method → its mechanism-health checks on the claims' dataset.
    """
    dataset, claims = claims_of(config)
    if not claims:
        raise ConfigError("claims: params define no 'claims' section; nothing to report")
    runs = claim_runs(config, runs_dir)
    results = collect_runs(runs)
    failing = dead_cells(results, {(dataset, m): c for m, c in checks.items()})
    table = evaluate_claims(claims, results, runs, {method: True for _, method in failing})
    spec = claims_spec(config)
    skip_reason = config["claims"].get("skip_reason", "") if any(claim.skipped for claim in claims) else ""
    caption = claims_caption(table, spec.dataset_label(dataset), dead_caption(failing, spec), skip_reason)
    with atomic_outputs({suffix: out_dir / f"claims{suffix}" for suffix in TABLE_SUFFIXES}) as tmp:
        write_text_atomic(tmp[".csv"], table.to_csv(index=False, lineterminator="\n"))
        markdown = render_markdown(table, caption)
        write_text_atomic(tmp[".md"], markdown)
        write_html_page(tmp[".html"], markdown, title="claims")
        write_text_atomic(tmp[".tex"], render_latex(table, caption))
    return table
