"""An HTML template for ``dvc plots show`` that draws the plots without a network.

``dvc plots show`` writes ``dvc_plots/index.html``, whose Vega plots load vega, vega-lite and vega-embed from a
CDN when the page is opened: offline, the page is blank. DVC takes another page template
(``--html-template``, or the ``plots.html_template`` setting); one that holds the three libraries itself, and
not DVC's ``{scripts}`` placeholder (where DVC puts its CDN ``<script>`` tags), draws every plot offline.

The libraries come from the Snakemake package, which ships them for its own reports (vega 5.21.0, vega-lite
5.2.0, vega-embed 6.20.8 in Snakemake 9.27; DVC 3.67's page asks for vega 5.20.2, vega-lite 5.2.0 and vega-embed
6.18.2: the same major versions). They are BSD-3-Clause licensed; the template carries their licence texts. The
template is about 2.2 MB, so it is written on demand and not kept in the repository::

    python -m dmlbench.report.dvc_offline                  # writes .dvc/tmp/plots_offline.html
    dvc plots show --html-template .dvc/tmp/plots_offline.html

or once per checkout ``dvc config --local plots.html_template tmp/plots_offline.html`` (a path relative to
``.dvc/``; ``config.local`` and ``tmp/`` are not committed), after which a plain ``dvc plots show`` is offline.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dmlbench.atomic import write_text_atomic

#: Where the template goes by default (``.dvc/tmp`` is DVC's own uncommitted folder).
DEFAULT_OUT = Path(".dvc/tmp/plots_offline.html")
#: The libraries, in load order (vega-lite needs vega; vega-embed needs both), as paths of Snakemake's assets.
LIBRARIES = ("vega/vega.js", "vega-lite/vega-lite.js", "vega-embed/vega-embed.js")
#: DVC's placeholders: the plots' ``<div>``s (required) and the refresh ``<meta>`` of ``--open``'s live page.
PLOTS, REFRESH = "{plot_divs}", "{refresh_tag}"


class OfflineTemplateError(RuntimeError):
    """The libraries are not where the template needs them (the message says what to do)."""


def library_sources() -> list[tuple[str, str, str]]:
    """(name, licence text, JavaScript) of each of :data:`LIBRARIES`, from the installed Snakemake.

    Raises:
        OfflineTemplateError: Snakemake without its report assets, or a library whose text would end the page's
            ``<script>`` element or contains one of DVC's placeholders.
    """
    from importlib.resources import files

    base = files("snakemake.assets") / "data"
    sources = []
    for path in LIBRARIES:
        name = path.split("/")[0]
        try:
            code = (base / path).read_text(encoding="utf-8")
            licence = (base / name / "LICENSE").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError) as err:
            raise OfflineTemplateError(
                f"{base / path}: not found; the Snakemake package ships it for its reports (`pip install "
                f"--force-reinstall 'snakemake==9.27.*'` puts it back)"
            ) from err
        unsafe = [text for text in ("</script", "{plot_divs}", "{scripts}", "{refresh_tag}") if text in code]
        if unsafe:
            raise OfflineTemplateError(f"{base / path}: contains {unsafe}, which would break the template")
        sources.append((name, licence.replace("--", "- -"), code))
    return sources


def offline_template() -> str:
    """The page: the three libraries inline in its head, DVC's plots in its body, no ``{scripts}``."""
    scripts = "".join(
        f"<!-- {name}:\n{licence}-->\n<script>\n{code}\n</script>\n" for name, licence, code in library_sources()
    )
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        + REFRESH
        + '\n<meta charset="utf-8">\n<title>DVC Plot</title>\n'
        + scripts
        + "<style>\ntable { border-spacing: 15px; }\n</style>\n</head>\n<body>\n"
        + PLOTS
        + "\n</body>\n</html>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dmlbench.report.dvc_offline",
        description="Write an HTML template for `dvc plots show --html-template` that holds vega, vega-lite and "
        "vega-embed (from the Snakemake package), so that the plots draw without a network.",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the template's path (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    try:
        text = offline_template()
    except OfflineTemplateError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, text)
    # DVC reads a relative plots.html_template from .dvc/
    from_dvc_dir = args.out if args.out.is_absolute() else os.path.relpath(args.out.resolve(), Path(".dvc").resolve())
    print(
        f"wrote {args.out} ({len(text.encode()) / 1e6:.1f} MB); use it with\n"
        f"    dvc plots show --html-template {args.out}\n"
        "or, for every `dvc plots show` of this checkout:\n"
        f"    dvc config --local plots.html_template {from_dvc_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
