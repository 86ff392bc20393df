"""`dvc plots show` without a network (issue 30, item 5): the template of dmlbench.report.dvc_offline holds vega,
vega-lite and vega-embed, and DVC's page made with it loads nothing from outside."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dvc_render import VegaRenderer, render_html

from dmlbench.report import dvc_offline
from dmlbench.report.dvc_offline import LIBRARIES, OfflineTemplateError, main, offline_template

#: What loads something from outside in a page: a script or style sheet by URL, a fetch of a schema, ...
EXTERNAL = re.compile(r"<(script|link)[^>]+(src|href)\s*=", re.I)


@pytest.fixture(scope="module")
def template() -> str:
    return offline_template()


def test_the_template_holds_the_libraries_and_no_cdn(template: str):
    assert "{plot_divs}" in template and "{scripts}" not in template  # DVC's CDN tags have nowhere to go
    assert not EXTERNAL.search(template) and "cdn.jsdelivr.net" not in template
    assert template.count("<script>") == len(LIBRARIES) == 3
    for name in ("vega", "vega-lite", "vega-embed"):
        assert f"<!-- {name}:\nCopyright (c) 2015" in template  # each library with its BSD licence text
    assert 2e6 < len(template.encode()) < 3e6


def test_dvc_renders_its_plots_into_the_template_offline(tmp_path: Path, template: str):
    (tmp_path / "template.html").write_text(template)
    datapoints = [{"epoch": e, "val_R@1": 0.4 + 0.1 * e, "rev": "workspace"} for e in (1, 2, 3)]
    plot = VegaRenderer(datapoints, "results/runs/synthetic/margin/seed0/log.csv", x="epoch", y="val_R@1")
    render_html([plot], tmp_path / "plots" / "index.html", html_template=tmp_path / "template.html")
    page = (tmp_path / "plots" / "index.html").read_text()
    assert not EXTERNAL.search(page) and "https://cdn" not in page
    assert page.index("vegaEmbed(") > page.index("</head>")  # the plots' calls come after the libraries
    assert '"val_R@1": 0.6' in page or '"val_R@1": 0.6000000000000001' in page  # the data are in the page


def test_main_writes_the_template_and_says_how_to_use_it(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".dvc").mkdir()
    assert main([]) == 0
    assert (tmp_path / ".dvc/tmp/plots_offline.html").read_text() == offline_template()
    out = capsys.readouterr().out
    assert "dvc plots show --html-template .dvc/tmp/plots_offline.html" in out
    assert "dvc config --local plots.html_template tmp/plots_offline.html" in out  # relative to .dvc/


def test_a_missing_library_is_named_with_the_fix(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(dvc_offline, "LIBRARIES", ("vega/vega.js", "vega-nope/vega-nope.js"))
    with pytest.raises(OfflineTemplateError, match=r"vega-nope\.js: not found.*snakemake==9\.27"):
        offline_template()
    assert main(["--out", str(tmp_path / "t.html")]) == 1
    assert "vega-nope" in capsys.readouterr().err and not (tmp_path / "t.html").exists()
