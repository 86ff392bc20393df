"""`snakemake --report report.html` on a tiny finished project: every table (as an HTML page) and every
plot, each with its caption, category and labels, and the merged configuration on the first page.

The report is a single-page app whose data is embedded as JSON (`var results = {...};`); the tests parse
that. Marked ``slow`` (builds the project: about a minute on 2 cores).
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from test_workflow_e2e import BIN, TINY_PARAMS, run

pytestmark = pytest.mark.slow
PARAMS = {
    **TINY_PARAMS,
    "figures": {
        "tiny_curves": {
            "kind": "training_curves",
            "title": "Validation R@1 per epoch",
            "dataset": "tiny",
            "methods": ["triplet", "norm_softmax"],
            "columns": ["val_R@1"],
        }
    },
    "claims": {
        "dataset": "tiny",
        "items": [
            {
                "id": "softmax_wins",
                "paper": "Test",
                "claim": "NormSoftmax > Triplet",
                "metric": "R@1",
                "higher": "norm_softmax",
                "lower": "triplet",
            }
        ],
    },
}
OVERLAY = {"datasets": {"tiny": {"label": "Tiny overlay"}}}


def embedded(page: str, name: str) -> Any:
    """The JSON value that the report page's ``<script id="<name>">`` assigns to ``var <name>``."""
    match = re.search(rf'<script id="{name.replace("_", "-")}">\s*var {name} = (.*?);\s*</script>', page, flags=re.S)
    assert match, f"no `var {name}` in the report"
    return json.loads(match.group(1))


def decoded(data_uri: str) -> str:
    """The text of a base64 data URI."""
    return base64.b64decode(data_uri.split("base64,", 1)[1]).decode("utf-8")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The workflow with the tiny params and an overlay, every default target built by Snakemake."""
    root = tmp_path_factory.mktemp("report_project")
    for name in ("Snakefile", "workflow"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / name)
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    (root / "overlay.yaml").write_text(yaml.safe_dump(OVERLAY))
    run([str(BIN / "snakemake"), "--cores", "2", "--configfile", "overlay.yaml"], root)
    return root


@pytest.fixture(scope="module")
def page(project: Path) -> str:
    run([str(BIN / "snakemake"), "--report", "report.html", "--configfile", "overlay.yaml"], project)
    return (project / "report.html").read_text()


def test_every_table_and_plot_is_in_the_report_with_a_caption(project: Path, page: str):
    results = embedded(page, "results")
    tables = sorted(f"results/tables/{path.stem}.html" for path in (project / "results/tables").glob("*.tex"))
    plots = sorted(str(path.relative_to(project)) for path in (project / "results/plots").glob("*.png"))
    assert tables == ["results/tables/claims.html", "results/tables/table1.html"]
    assert len(plots) == 3  # table1's training curves and Recall@K, figure tiny_curves
    assert sorted(results) == sorted(tables + plots)
    for path, result in results.items():
        assert result["caption"].strip(), f"{path} has no caption"
        assert "System Message" not in result["caption"], f"{path}: the caption's reStructuredText has errors"
    captions = {path: html.unescape(result["caption"]) for path, result in results.items()}
    assert "Validation R@1 per epoch" in captions["results/plots/tiny_curves.png"]
    assert "Recall@K of table table1" in re.sub("<[^>]+>", "", captions["results/plots/table1_recall_at_k.png"])
    assert "results/tables/table1.csv" in captions["results/tables/table1.html"]


def test_results_are_grouped_by_kind_and_dataset_with_labels(page: str):
    results = embedded(page, "results")
    categories = {
        name: {sub: sorted(paths) for sub, paths in subs.items()} for name, subs in embedded(page, "categories").items()
    }
    assert categories == {
        "Tables": {
            "Tiny overlay": [
                "results/plots/table1_recall_at_k.png",
                "results/plots/table1_training_curves.png",
                "results/tables/claims.html",
                "results/tables/table1.html",
            ]
        },
        "Figures": {"Tiny overlay": ["results/plots/tiny_curves.png"]},
    }
    assert results["results/plots/table1_recall_at_k.png"]["labels"] == {"table": "table1", "shows": "Recall@K"}
    assert results["results/plots/tiny_curves.png"]["labels"] == {"figure": "tiny_curves"}


def test_tables_are_rendered_html_pages(page: str):
    results = embedded(page, "results")
    for path in ("results/tables/table1.html", "results/tables/claims.html"):
        assert results[path]["mime_type"] == "text/html"
        table = decoded(results[path]["data_uri"])
        assert "<table>" in table and "\\toprule" not in table
    table1 = decoded(results["results/tables/table1.html"]["data_uri"])
    assert "<th>Method</th>" in table1 and "<td>Triplet</td>" in table1 and "NormSoftmax" in table1


def test_first_page_shows_the_merged_configuration(page: str):
    description = embedded(page, "workflow_desc")
    assert "Merged configuration" in description
    assert '"label": "Tiny overlay"' in description and '"num_classes": 8' in description
    assert "System Message" not in description  # the reStructuredText rendered without errors


def test_the_report_opens_on_table1_and_its_plots(project: Path, page: str):
    """What Snakemake 9 shows first is the workflow description beside the rule graph (the app's initial content,
    "rulegraph", without --report-metadata): workflow/report/workflow.rst puts table1's page there, with its
    plots embedded, above everything else."""
    assert 'this.content = "rulegraph"' in page, "Snakemake's report no longer opens on the workflow description"
    description = embedded(page, "workflow_desc")
    table = description.index('<main class="dmlbench-table">')
    assert table < description.index("About this report") < description.index("Merged configuration")
    assert "<td>Triplet</td>" in description[table:] and "<th>R@1</th>" in description[table:]
    plots = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', description[table:])
    assert [html.unescape(alt).split(" ")[0] for alt, _ in plots] == ["Recall@K", "Training"]
    assert [base64.b64decode(data) for _, data in plots] == [
        (project / f"results/plots/table1_{name}.png").read_bytes() for name in ("recall_at_k", "training_curves")
    ]
    for css in re.findall(r"<style>(.*?)</style>", description, flags=re.S):  # the page's and the landing's
        for selector in re.findall(r"([^{}]+)\{", re.sub(r"/\*.*?\*/", "", css, flags=re.S)):
            assert all("dmlbench-table" in part for part in selector.split(",")), f"unscoped style: {selector}"
    assert "javascript:app.showCategory('Tables')" in description  # the way to every table and plot
