"""The claims table: each paper's mechanistic and ablation claims, re-measured on our runs.

A claim (``claims.items`` in params.yaml) says that one method scores higher than
another on one metric, e.g. "ABE-8 > 8-heads in R@1" or "the self-pair cosine of
ABE-8 is higher without L_div". It names the two methods, the metric, what the paper
printed (``reported``, transcribed with its table) and the seeds (those of the table
whose runs it reuses, so the claims train nothing of their own). The table gives our
mean ± std over seeds for both sides, their difference and whether the direction
holds:

- ``yes`` / ``no``: the sign of the mean difference (higher − lower);
- ``(within noise)`` is added when |difference| is at most the larger of the two
  sample standard deviations over seeds (with one seed there is no noise estimate
  and the cell says ``(1 seed)``);
- a side whose runs failed a mechanism-health check (:mod:`.health`) carries a dagger:
  the comparison then says nothing about the mechanism.

Outputs: ``claims.tex`` (booktabs), ``claims.md`` (+ its ``claims.html`` page) and ``claims.csv`` beside
the tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dmlbench.atomic import write_text_atomic
from dmlbench.config import ConfigError, resolve_method, section

from .collect import RunDir, collect_runs
from .health import dead_cells
from .html import write_html_page
from .latex import DEAD_MARK, escape_latex
from .metric_format import metric_format

CLAIM_COLUMNS = ["id", "paper", "claim", "reported", "metric", "higher", "lower", "seeds", "higher_mean",
                 "higher_std", "lower_mean", "lower_std", "difference", "holds", "within_noise",
                 "higher_dead", "lower_dead"]


@dataclass(frozen=True)
class Claim:
    """One claim: ``higher`` scores above ``lower`` on ``metric`` (``claims.items[i]``)."""

    id: str
    paper: str
    claim: str
    reported: str
    metric: str
    higher: str
    lower: str
    seeds: tuple[int, ...]


def claims_of(config: Mapping[str, Any]) -> tuple[str, list[Claim]]:
    """The dataset and the claims of ``claims`` in a validated config (none when absent)."""
    claims = config.get("claims")
    if not claims:
        return "", []
    seeds = tuple(config["seeds"])
    return claims["dataset"], [
        Claim(id=item["id"], paper=item["paper"], claim=item["claim"], reported=item.get("reported", ""),
              metric=item["metric"], higher=item["higher"], lower=item["lower"],
              seeds=tuple(item.get("seeds", seeds)))
        for item in claims["items"]
    ]


def check_claims(config: Mapping[str, Any], source: str) -> None:
    """Cross-references of ``claims``: a known dataset, known methods, unique ids, no table named ``claims``.

    Raises:
        ConfigError: naming ``claims.items[i].<key>`` and what is defined.
    """
    if not config.get("claims"):
        return
    dataset, claims = claims_of(config)
    section(config, "datasets", dataset)
    if "claims" in config.get("tables", {}):
        raise ConfigError(f"{source}: tables.claims: the name 'claims' belongs to the claims table "
                          f"(results/tables/claims.tex); rename the table")
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        if claim.id in seen:
            raise ConfigError(f"{source}: claims.items[{i}].id = {claim.id!r} is used twice; ids must be unique")
        seen.add(claim.id)
        for side in ("higher", "lower"):
            method = getattr(claim, side)
            if method not in config["methods"]:
                raise ConfigError(f"{source}: claims.items[{i}].{side} = {method!r} is not defined under "
                                  f"'methods'; use one of the method names there")
            resolve_method(config, method)


def claim_runs(config: Mapping[str, Any], runs_dir: Path) -> list[RunDir]:
    """Every run the claims read (each once), in ``runs_dir/<dataset>/<method>/seed<k>``."""
    dataset, claims = claims_of(config)
    keys = sorted({(m, s) for c in claims for m in (c.higher, c.lower) for s in c.seeds})
    return [RunDir(dataset, m, s, runs_dir / dataset / m / f"seed{s}") for m, s in keys]


def _side(results: pd.DataFrame, method: str, metric: str, seeds: Sequence[int]) -> pd.Series:
    """The metric of a method's runs, indexed by seed; a missing run/key is a clear error."""
    rows = results[(results["method"] == method) & (results["metric"] == metric) & results["seed"].isin(seeds)]
    values = rows.set_index("seed")["value"]
    missing = sorted(set(seeds) - set(values.index))
    if missing:
        raise ConfigError(f"claims: {method} has no '{metric}' in metrics.json of seed(s) {missing}; "
                          f"is '{metric}' a key that this method's runs write?")
    return values


def evaluate_claims(claims: Sequence[Claim], results: pd.DataFrame,
                    dead: Mapping[str, bool]) -> pd.DataFrame:
    """One row per claim (:data:`CLAIM_COLUMNS`) from the long results of their runs.

    Args:
        claims: the claims.
        results: long results (:func:`~dmlbench.report.collect.collect_runs`) of their runs.
        dead: method → whether a run of it failed a mechanism-health check.

    >>> frame = pd.DataFrame({"dataset": "s", "method": ["a", "a", "b", "b"], "seed": [0, 1, 0, 1],
    ...                       "metric": "R@1", "value": [0.50, 0.52, 0.40, 0.44]})
    >>> row = evaluate_claims([Claim("x", "P", "a > b", "", "R@1", "a", "b", (0, 1))], frame, {}).iloc[0]
    >>> round(float(row.difference), 3), bool(row.holds), bool(row.within_noise)
    (0.09, True, False)
    """
    rows = []
    for claim in claims:
        high = _side(results, claim.higher, claim.metric, claim.seeds)
        low = _side(results, claim.lower, claim.metric, claim.seeds)
        difference = float(high.mean() - low.mean())
        noise = max(float(high.std(ddof=1)), float(low.std(ddof=1))) if len(claim.seeds) > 1 else math.nan
        rows.append([claim.id, claim.paper, claim.claim, claim.reported, claim.metric, claim.higher, claim.lower,
                     len(claim.seeds), float(high.mean()), float(high.std(ddof=1)), float(low.mean()),
                     float(low.std(ddof=1)), difference, difference > 0, abs(difference) <= noise,
                     dead.get(claim.higher, False), dead.get(claim.lower, False)])
    return pd.DataFrame(rows, columns=CLAIM_COLUMNS)


def _ours(mean: float, std: float, metric: str, is_dead: bool) -> str:
    display = metric_format(metric)
    text = display.text(mean) if math.isnan(std) else f"{display.text(mean)} ± {display.text(std)}"
    return text + (" †" if is_dead else "")


def _verdict(row: pd.Series) -> str:
    verdict = "yes" if row.holds else "no"
    if row.seeds == 1:
        return f"{verdict} (1 seed)"
    return f"{verdict} (within noise)" if row.within_noise else verdict


def _plain_rows(table: pd.DataFrame) -> list[list[str]]:
    return [[row.paper, row.claim, row.reported or "—",
             _ours(row.higher_mean, row.higher_std, row.metric, row.higher_dead),
             _ours(row.lower_mean, row.lower_std, row.metric, row.lower_dead),
             metric_format(row.metric).text(row.difference), _verdict(row)]
            for row in table.itertuples()]


HEADER = ["Paper", "Claim", "Paper's numbers", "Ours: higher side", "Ours: lower side", "Difference", "Holds"]
NOTE = ("Ours: mean ± sample std over the seeds, in percent for evaluation metrics. Holds: the sign of the "
        "mean difference (higher − lower side); '(within noise)' when its size is at most the larger std. "
        "†: a run of that side failed its mechanism-health check (docs/methods).")


def render_markdown(table: pd.DataFrame, dataset_label: str) -> str:
    """The claims as a Markdown table with the explanatory note."""
    lines = [f"# Claims of the papers, re-measured on {dataset_label}", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in _plain_rows(table)]
    return "\n".join([*lines, "", NOTE, ""])


def render_latex(table: pd.DataFrame, dataset_label: str) -> str:
    """The claims as one booktabs ``table*`` (long text cells wrap)."""
    def tex(cell: str) -> str:
        return escape_latex(cell).replace("±", "$\\pm$").replace("−", "$-$").replace(" †", DEAD_MARK)

    body = [" & ".join(tex(cell) for cell in row) + " \\\\" for row in _plain_rows(table)]
    caption = f"Claims of the papers, re-measured on {escape_latex(dataset_label)}. {tex(NOTE)}"
    return "\n".join([
        "\\begin{table*}[tbp]", "\\centering", "\\small", f"\\caption{{{caption}}}", "\\label{tab:claims}",
        "\\begin{tabular}{lp{4.2cm}p{3.6cm}cccl}", "\\toprule", " & ".join(HEADER) + " \\\\", "\\midrule",
        *body, "\\bottomrule", "\\end{tabular}", "\\end{table*}", "",
    ])


def write_claims(config: Mapping[str, Any], runs_dir: Path, out_dir: Path,
                 checks: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    """Evaluate the claims and write ``claims.{tex,md,html,csv}`` to ``out_dir`` (atomically).

    Args:
        checks: method → its mechanism-health checks on the claims' dataset.
    """
    dataset, claims = claims_of(config)
    if not claims:
        raise ConfigError("claims: params define no 'claims' section; nothing to report")
    results = collect_runs(claim_runs(config, runs_dir))
    failing = dead_cells(results, {(dataset, m): c for m, c in checks.items()})
    table = evaluate_claims(claims, results, {method: True for _, method in failing})
    label = config["datasets"][dataset].get("label", dataset)
    write_text_atomic(out_dir / "claims.csv", table.to_csv(index=False, lineterminator="\n"))
    markdown = render_markdown(table, label)
    write_text_atomic(out_dir / "claims.md", markdown)
    write_html_page(out_dir / "claims.html", markdown, title="claims")
    write_text_atomic(out_dir / "claims.tex", render_latex(table, label))
    return table
