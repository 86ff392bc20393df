"""``dmlbench``: one console entry point; every workflow rule calls it, so any step runs by hand.

    dmlbench download KIND                        → data/raw/KIND/ (official archives, checksummed)
    dmlbench download-weights BACKBONE            → $TORCH_HOME/hub/checkpoints/<file> (ImageNet, checksummed)
    dmlbench prepare DATASET                      → data/prepared/DATASET/manifest.csv
    dmlbench pretrain --dataset D                  → data/pretrained/D/<backbone>.pt (+ .sha256, <backbone>_run/)
    dmlbench train --dataset D --method M --seed S → results/runs/D/M/seedS/{checkpoint.pt,log.csv}
    dmlbench tune --dataset D --method M           → results/tuning/D/M/{best.yaml,trials.csv} (+ study.journal)
    dmlbench embed RUN_DIR                         → RUN_DIR/embeddings.npz
    dmlbench embed RUN_DIR --method M              → results/runs/D/M/seedS/embeddings.npz (M re-embeds RUN_DIR)
    dmlbench evaluate EMBEDDINGS.npz --out METRICS.json   (+ per_query.npz beside it)
    dmlbench report TABLE                          → results/tables/TABLE.{tex,csv,md} + results/plots/TABLE_*.png
    dmlbench summary TABLE                         prints results/tables/TABLE.csv as a text table
    dmlbench claims                                → results/tables/claims.{tex,md,csv}
    dmlbench info backbones                        stages and output shapes of every backbone
    dmlbench list methods|tables|figures|datasets|losses|backbones   what exists, one line each
    dmlbench show run --dataset D --method M [--seed S]       each effective setting and the file:line that sets it
    dmlbench show method M                         its base: chain and resolved section, with sources

Parameters come from ``--config`` files (default ``params.yaml``; more files are
overlays merged on top, like Snakemake's ``--configfile``).

Any error ends a command with one line on stderr and exit status 2 (Ctrl-C: one line and 130);
``DMLBENCH_TRACEBACK=1`` lets the exception through with its traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from dmlbench import __version__
from dmlbench.catalog import KINDS, catalog, plain_text
from dmlbench.config import resolve_run, section
from dmlbench.errors import DmlbenchError, did_you_mean
from dmlbench.layout import CHECKPOINT_FILE, EMBEDDINGS_FILE, PER_QUERY_FILE, RUNS_DIR, manifest_path, run_dir
from dmlbench.names import name_argument
from dmlbench.params import load_config
from dmlbench.paths import contained

if TYPE_CHECKING:
    from dmlbench.settings import EvaluationSettings

TUNING_DIR = Path("results/tuning")
PLOTS_DIR = Path("results/plots")
SCRATCH_DIR = Path(".scratch")
#: environment variable: ``1`` lets an error through with its traceback (for debugging) instead of one line.
TRACEBACK_ENV = "DMLBENCH_TRACEBACK"
#: exit status of a command that stopped on an error.
EXIT_ERROR = 2
#: exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: the arguments that name a command's input files, for a missing key's message (:func:`error_line`).
INPUT_ARGUMENTS = ("config", "run_dir", "manifest", "prepared", "embeddings", "members")


def _set_threads(threads: int | None) -> None:
    """faiss's and torch's CPU threads. torch's are set as soon as torch is imported, not by importing it
    here: a command that never uses torch (evaluate on a machine without a GPU) is spared its seconds."""
    if threads:
        import faiss

        _when_imported("torch", lambda torch: torch.set_num_threads(threads))
        faiss.omp_set_num_threads(threads)


def _when_imported(name: str, action: Callable[[ModuleType], object]) -> None:
    """Call ``action(module)`` on the top-level module ``name``: now if it is imported, else right after its
    import has run (before any code that imported it sees it)."""
    if name in sys.modules:
        action(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_act(module: ModuleType) -> None:
                    exec_module(module)
                    action(module)

                spec.loader.exec_module = exec_then_act  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


def _integer_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers ≥ ``minimum``; ``what`` says what the number counts."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expects an integer ({what}), got {text!r}") from err
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expects an integer >= {minimum} ({what}), got {value}")
        return value

    return parse


_parse_threads = _integer_at_least(1, "CPU threads")


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(k) for k in text.split(",") if k.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--recall-ks expects comma-separated integers, got {text!r}") from err
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError(f"--recall-ks needs positive integers, got {text!r}")
    return ks


def cmd_prepare(args: argparse.Namespace) -> None:
    from dmlbench.data.registry import prepare_dataset

    config = load_config(args.config)
    out = Path(args.out) if args.out else manifest_path(args.dataset).parent
    path = prepare_dataset(section(config, "datasets", args.dataset), out)
    print(f"prepared {args.dataset}: {path}")


def cmd_download_weights(args: argparse.Namespace) -> None:
    from dmlbench.data.download import DownloadError
    from dmlbench.models.backbones.download import download_weights
    from dmlbench.models.backbones.weights import PretrainedWeightsError

    try:
        path = download_weights(args.backbone, args.weights, Path(args.dir) if args.dir else None)
    except (DownloadError, PretrainedWeightsError) as err:
        print(f"dmlbench download-weights: error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    use = f"pretrained: {path}" if args.dir else f"pretrained: {args.weights}"
    print(f"verified {path}; use it with training.backbone {{name: {args.backbone}, {use}}}")


def cmd_download(args: argparse.Namespace) -> None:
    from dmlbench.data.download import DownloadError, download, fetch_archive

    try:
        if args.archive:
            path = fetch_archive(
                args.kind,
                args.archive,
                contained(args.raw_dir, args.kind, args.archive),
                allow_unverified=args.allow_unverified,
            )
            print(f"fetched {path} (not extracted; `download: true` in a dataset's params extracts it)")
            return
        root = download(args.kind, Path(args.raw_dir), allow_unverified=args.allow_unverified)
    except DownloadError as err:
        print(f"dmlbench download: error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    print(
        f"downloaded {args.kind} to {root}\nprepare it with: DMLBENCH_{args.kind.upper()}_ROOT={root} "
        f"dmlbench prepare <dataset of kind {args.kind}>"
    )


def cmd_train(args: argparse.Namespace) -> None:
    from dmlbench.training.trainer import train_run

    config = load_config(args.config)
    run = resolve_run(config, args.dataset, args.method, args.seed)
    out = Path(args.out) if args.out else run_dir(args.dataset, args.method, args.seed)
    scratch = Path(args.scratch_dir) if args.scratch_dir else SCRATCH_DIR / out
    manifest = Path(args.manifest) if args.manifest else manifest_path(args.dataset)
    result = train_run(run, manifest, out, scratch, progress=not args.no_progress, configs=args.config)
    print(
        f"trained {out}: selected epoch {result.best_epoch} ({run['training']['selection']} score "
        f"{result.best_score:.4f})"
    )


def cmd_tune(args: argparse.Namespace) -> None:
    from dmlbench.tuning.job import tune

    out = Path(args.out) if args.out else contained(TUNING_DIR, args.dataset, args.method)
    scratch = Path(args.scratch_dir) if args.scratch_dir else SCRATCH_DIR / out
    manifest = Path(args.manifest) if args.manifest else manifest_path(args.dataset)
    result = tune(
        load_config(args.config), args.dataset, args.method, manifest, out, scratch, progress=not args.no_progress
    )
    print(
        f"tuned {args.method} on {args.dataset}: {result.completed} trials, best score {result.best_score:.4f} "
        f"-> {result.best}, {result.trials}"
    )


def cmd_pretrain(args: argparse.Namespace) -> None:
    from dmlbench.training.pretrain import pretrain_backbone

    prepared = Path(args.prepared) if args.prepared else Path(manifest_path(args.dataset)).parent
    weights = pretrain_backbone(
        load_config(args.config),
        args.dataset,
        prepared,
        out_root=Path(args.out) if args.out else None,
        progress=not args.no_progress,
    )
    print(f"pretrained {weights}")


def cmd_embed(args: argparse.Namespace) -> None:
    from dmlbench.training.checkpoint import load_checkpoint
    from dmlbench.training.embed import embed_run

    directory = Path(args.run_dir)
    checkpoint = directory / CHECKPOINT_FILE
    trained = load_checkpoint(checkpoint)["run"]
    dataset, seed = trained["dataset"], trained["seed"]
    run = resolve_run(load_config(args.config), dataset, args.method, seed) if args.method else None
    default_dir = run_dir(dataset, args.method, seed) if args.method else directory
    out = Path(args.out) if args.out else default_dir / EMBEDDINGS_FILE
    manifest = Path(args.manifest) if args.manifest else manifest_path(dataset)
    print(f"embedded {embed_run(checkpoint, manifest, out, run=run)}")


#: ``dmlbench evaluate``'s K-means options → the :class:`~dmlbench.settings.KMeansSettings` field each sets.
KMEANS_OPTIONS = {"kmeans_seed": "seed", "kmeans_niter": "niter", "kmeans_nredo": "nredo"}


def _evaluation_settings(args: argparse.Namespace) -> tuple[list[int], EvaluationSettings]:
    """Recall@K list and the evaluation settings (kNN chunk size, K-means): the options given on the command
    line, else (with ``--dataset``) ``datasets.D.recall_ks`` and the ``evaluation`` params section, else the
    defaults of :mod:`dmlbench.settings`. Reading them from the params at run time keeps a DVC stage's fixed
    command right after ``dvc exp run -S evaluation.…``."""
    from dmlbench.settings import DEFAULT_RECALL_KS, EvaluationSettings, parse_dataclass

    recall_ks, settings = list(DEFAULT_RECALL_KS), EvaluationSettings()
    if args.dataset is not None:
        config = load_config(args.config)
        recall_ks = list(section(config, "datasets", args.dataset, "recall_ks"))
        settings = parse_dataclass(EvaluationSettings, section(config, "evaluation"), "evaluation")
    kmeans = {key: getattr(args, option) for option, key in KMEANS_OPTIONS.items() if getattr(args, option) is not None}
    settings = dataclasses.replace(
        settings,
        kmeans=dataclasses.replace(settings.kmeans, **kmeans),
        chunk_size=settings.chunk_size if args.chunk_size is None else args.chunk_size,
    )
    return (recall_ks if args.recall_ks is None else args.recall_ks), settings


def cmd_evaluate(args: argparse.Namespace) -> None:
    from dmlbench.evaluation import evaluate_file

    recall_ks, settings = _evaluation_settings(args)
    per_query = Path(args.per_query) if args.per_query else Path(args.out).parent / PER_QUERY_FILE
    metrics = evaluate_file(
        args.embeddings,
        args.out,
        recall_ks,
        kmeans=settings.kmeans,
        chunk_size=settings.chunk_size,
        per_query_path=per_query,
    )
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if "/" not in k and k[:2] in ("R@", "NM", "MA"))
    print(f"evaluated {args.embeddings}: {shown}")


def cmd_ensemble(args: argparse.Namespace) -> None:
    from dmlbench.evaluation.ensemble import ensemble_files

    print(f"wrote ensemble {ensemble_files(args.members, args.out)}")


def cmd_report(args: argparse.Namespace) -> None:
    from dmlbench.report import render_text
    from dmlbench.report.pipeline import report_table

    config = load_config(args.config)
    report = report_table(config, args.table, RUNS_DIR, Path(args.tables_dir), Path(args.plots_dir))
    print(render_text(report.cells), end="")
    for (dataset, method), failures in report.dead.items():
        for failure in failures:
            print(
                f"dmlbench report {args.table}: warning: {method} on {dataset}: mechanism did not engage: {failure}",
                file=sys.stderr,
            )


def cmd_summary(args: argparse.Namespace) -> None:
    """Print a built table from its CSV (no runs are read; rerun ``report`` to recompute)."""
    from dmlbench.report import read_cells_csv, render_text

    print(render_text(read_cells_csv(Path(args.tables_dir) / f"{args.table}.csv")), end="")


def cmd_claims(args: argparse.Namespace) -> None:
    from dmlbench.report.claims import VERDICTS, claim_methods, claims_of, write_claims
    from dmlbench.report.pipeline import health_checks

    config = load_config(args.config)
    dataset, _ = claims_of(config)
    checks = {m: health_checks(config, dataset, m, config["seeds"][0]) for m in claim_methods(config)}
    table = write_claims(config, RUNS_DIR, Path(args.tables_dir), checks)
    counts = table["verdict"].value_counts()
    print(
        f"claims: {', '.join(f'{counts.get(v, 0)} {v}' for v in VERDICTS)} "
        f"of {len(table)}; wrote {Path(args.tables_dir) / 'claims.tex'} (.md, .csv)"
    )


def cmd_figure(args: argparse.Namespace) -> None:
    from dmlbench.report.figures import render_figure

    config = load_config(args.config)
    out = Path(args.out) if args.out else contained(PLOTS_DIR, f"{args.figure}.png")
    print(f"wrote {render_figure(config, args.figure, out)}")


def cmd_list(args: argparse.Namespace) -> None:
    """One line per name: the name, then what it is (label, recipe and loss; title; kind)."""
    config = load_config(args.config) if args.kind not in ("losses", "backbones") else {}
    entries = catalog(config, args.kind)
    width = max((len(name) for name in entries), default=0)
    for name, line in entries.items():
        print(f"{name:<{width}}  {line}")


def cmd_show(args: argparse.Namespace) -> None:
    from dmlbench.show import show

    print(show(args), end="")


def cmd_info(args: argparse.Namespace) -> None:
    from dmlbench.models.backbones import BACKBONES

    for name, build in BACKBONES.items():
        backbone = build()
        print(f"{name} (input 3×{args.image_size}×{args.image_size})")
        for stage, shape in backbone.stage_shapes(args.image_size).items():
            print(f"  {stage:<12} {'×'.join(str(s) for s in shape)}")


def add_run_arguments(
    parser: argparse.ArgumentParser, method_help: str = "a key of the 'methods' params section (dmlbench list methods)"
) -> None:
    """The required ``--dataset`` and ``--method`` of a command about one (dataset, method), names checked."""
    parser.add_argument(
        "--dataset",
        type=name_argument("dataset name"),
        required=True,
        help="a key of the 'datasets' params section (dmlbench list datasets)",
    )
    parser.add_argument("--method", type=name_argument("method name"), required=True, help=method_help)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dmlbench", description=plain_text(__doc__.split("\n\n")[0]))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config", action="append", metavar="YAML", help="params file; repeat for overlays (default: params.yaml)"
        )
        p.add_argument("--threads", type=_parse_threads, default=None, help="CPU threads for torch and faiss")

    p = sub.add_parser("prepare", help="turn a dataset into the canonical manifest")
    p.add_argument("dataset", type=name_argument("dataset name"), help="a key of the 'datasets' params section")
    p.add_argument("--out", help="output directory (default data/prepared/DATASET)")
    with_config(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("download", help="fetch and extract a real dataset's official archives (checksummed)")
    p.add_argument(
        "kind",
        type=name_argument("dataset kind"),
        help="cub200, cars196, sop (In-Shop and VehicleID are distributed by request)",
    )
    p.add_argument("--raw-dir", default="data/raw", help="where archives and extracted files go")
    p.add_argument(
        "--archive",
        metavar="FILENAME",
        help="fetch only this archive of the kind to RAW_DIR/KIND/FILENAME, without extracting it",
    )
    p.add_argument(
        "--allow-unverified",
        action="store_true",
        help="accept an archive whose checksum is not pinned (its sha256 is printed)",
    )
    p.set_defaults(func=cmd_download)

    p = sub.add_parser(
        "download-weights", help="fetch a backbone's published ImageNet weights (checksummed) into the torch hub cache"
    )
    p.add_argument("backbone", help="googlenet, bninception, resnet50")
    p.add_argument("--weights", default="imagenet", help="imagenet or imagenet:VARIANT (default imagenet)")
    p.add_argument("--dir", help="target folder (default $TORCH_HOME/hub/checkpoints)")
    p.set_defaults(func=cmd_download_weights)

    p = sub.add_parser("train", help="train one run (dataset, method, seed); resumes when interrupted")
    add_run_arguments(p)
    p.add_argument(
        "--seed",
        type=_integer_at_least(0, "a run seed"),
        required=True,
        help="the run's seed (fixes every random draw: a CPU run is bit-for-bit repeatable)",
    )
    p.add_argument("--manifest", help="default data/prepared/DATASET/manifest.csv")
    p.add_argument("--out", help="default results/runs/DATASET/METHOD/seedSEED")
    p.add_argument("--scratch-dir", help="resume checkpoints (default .scratch/<out>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    with_config(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "tune",
        help="equal-budget tuning of one method on one dataset (tuning.tables): its Optuna "
        "study on class-disjoint folds of the training classes; resumes when "
        "interrupted",
    )
    add_run_arguments(
        p, method_help="a trained method of a table listed under tuning.tables (its entry's tuning.space)"
    )
    p.add_argument("--manifest", help="default data/prepared/DATASET/manifest.csv (only its train rows are read)")
    p.add_argument("--out", help="default results/tuning/DATASET/METHOD")
    p.add_argument("--scratch-dir", help="the trials' resume checkpoints (default .scratch/<out>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    with_config(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "pretrain",
        help="train a backbone by classification on a dataset's pretraining classes "
        "(params 'pretraining'); resumes when interrupted",
    )
    p.add_argument(
        "--dataset", type=name_argument("dataset name"), required=True, help="a key of the 'pretraining' params section"
    )
    p.add_argument("--prepared", help="the prepared dataset folder with pretrain.csv (default data/prepared/DATASET)")
    p.add_argument("--out", help="output folder (default data/pretrained/DATASET, where pretrained: DATASET looks)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    with_config(p)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("embed", help="write a trained run's test embeddings")
    p.add_argument("run_dir", help="directory with checkpoint.pt")
    p.add_argument("--manifest", help="default: the run's dataset under data/prepared")
    p.add_argument("--out", help="default RUN_DIR/embeddings.npz, with --method results/runs/D/METHOD/seedS/...")
    p.add_argument(
        "--method",
        type=name_argument("method name"),
        help="embed with this method's test-time options: one that re-embeds RUN_DIR's "
        "checkpoint (checkpoint_of); default: the method it was trained as",
    )
    p.add_argument(
        "--config",
        action="append",
        metavar="YAML",
        help="with --method: params file; repeat for overlays (default: params.yaml)",
    )
    p.add_argument("--threads", type=_parse_threads, default=None, help="CPU threads for torch and faiss")
    p.set_defaults(func=cmd_embed)

    from dmlbench.settings import DEFAULT_RECALL_KS, EvaluationSettings

    evaluation = EvaluationSettings()  # the defaults the help names
    p = sub.add_parser("evaluate", help="Recall@K, NMI, MAP@R, R-precision of an embeddings .npz")
    p.add_argument("embeddings", help=".npz with embeddings, labels[, split, learner_slices]")
    p.add_argument("--out", required=True, help="metrics JSON")
    p.add_argument("--per-query", help="per-query results .npz (default: per_query.npz beside --out)")
    p.add_argument(
        "--dataset",
        type=name_argument("dataset name"),
        help="read the settings below from the params: datasets.DATASET.recall_ks and the "
        "'evaluation' section (an option given here still wins)",
    )
    p.add_argument(
        "--recall-ks", type=_parse_ks, help=f"e.g. 1,2,4,8 (default {','.join(map(str, DEFAULT_RECALL_KS))})"
    )
    p.add_argument(
        "--kmeans-seed",
        type=_integer_at_least(0, "a K-means seed"),
        help=f"seed of the K-means clustering behind NMI (default {evaluation.kmeans.seed})",
    )
    p.add_argument(
        "--kmeans-niter",
        type=_integer_at_least(1, "K-means iterations"),
        help=f"K-means iterations (default {evaluation.kmeans.niter})",
    )
    p.add_argument(
        "--kmeans-nredo",
        type=_integer_at_least(1, "K-means restarts"),
        help=f"K-means restarts; the best objective is kept (default {evaluation.kmeans.nredo})",
    )
    p.add_argument(
        "--chunk-size",
        type=_integer_at_least(1, "queries per chunk"),
        help=f"queries per kNN search chunk (default {evaluation.chunk_size})",
    )
    with_config(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("ensemble", help="concatenate the L2-normalised test embeddings of several runs")
    p.add_argument("members", nargs="+", help="each member run's embeddings.npz (same test rows)")
    p.add_argument("--out", required=True, help="the ensemble's embeddings.npz")
    p.set_defaults(func=cmd_ensemble)

    p = sub.add_parser(
        "report", help="LaTeX, CSV and Markdown table and plots of a table spec (tables.TABLE); prints the table"
    )
    p.add_argument(
        "table",
        type=name_argument("table name"),
        help="a key of the 'tables' params section, e.g. table1 (dmlbench list tables)",
    )
    p.add_argument("--tables-dir", default="results/tables", help="where TABLE.tex, .csv and .md go")
    p.add_argument("--plots-dir", default="results/plots", help="where the table's plots go")
    with_config(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("summary", help="print a built table (results/tables/TABLE.csv) as text")
    p.add_argument("table", type=name_argument("table name"), help="a table name, e.g. table1")
    p.add_argument("--tables-dir", default="results/tables", help="where TABLE.csv lies")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("claims", help="the papers' claims re-measured on finished runs (params 'claims')")
    p.add_argument("--tables-dir", default="results/tables", help="where claims.tex, .md and .csv go")
    with_config(p)
    p.set_defaults(func=cmd_claims)

    p = sub.add_parser("figure", help="draw a figure of an experiment (figures.FIGURE) from finished runs")
    p.add_argument(
        "figure",
        type=name_argument("figure name"),
        help="a key of the 'figures' params section, e.g. abe_fig5 (dmlbench list figures)",
    )
    p.add_argument("--out", help="default results/plots/FIGURE.png")
    with_config(p)
    p.set_defaults(func=cmd_figure)

    p = sub.add_parser(
        "list", help="what exists: methods, tables, figures, datasets, losses or backbones, one line each"
    )
    p.add_argument("kind", choices=KINDS, help="what to list")
    with_config(p)
    p.set_defaults(func=cmd_list)

    config_help = (
        "params file, repeat for overlays (default: params.yaml); KEY=VALUE overrides a parameter, "
        "merged last (dotted KEY, YAML VALUE: --config training.epochs=3)"
    )
    p = sub.add_parser(
        "show", help="a run's effective settings or a method's base chain, each with the file and line that set it"
    )
    show = p.add_subparsers(dest="what", required=True, metavar="WHAT", help="run or method")
    p = show.add_parser("run", help="every effective setting of one run (dataset, method, seed) and its source")
    add_run_arguments(p)
    p.add_argument(
        "--seed", type=_integer_at_least(0, "a run seed"), help="the run's seed (default: the first of 'seeds')"
    )
    p.add_argument("--config", action="append", metavar="YAML|KEY=VALUE", help=config_help)
    p.set_defaults(func=cmd_show)
    p = show.add_parser("method", help="a method's base: chain and its resolved section, with sources")
    p.add_argument("method", type=name_argument("method name"), help="a key of the 'methods' params section")
    p.add_argument(
        "--dataset", type=name_argument("dataset name"), help="resolve with the entries' per_dataset.DATASET too"
    )
    p.add_argument("--config", action="append", metavar="YAML|KEY=VALUE", help=config_help)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("info", help="describe registered components: stages and output shapes of every backbone")
    p.add_argument("what", choices=["backbones"], help="what to describe")
    p.add_argument(
        "--image-size",
        type=_integer_at_least(8, "pixels"),
        default=224,
        help="input side in pixels for the stage shapes (default 224)",
    )
    p.set_defaults(func=cmd_info)
    return parser


def _check_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Stop with a suggestion when the first argument is not a command (argparse lists them all, unsorted)."""
    commands = next(action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        parser.error(f"unknown command {argv[0]!r}{did_you_mean(argv[0], commands)}; commands: {', '.join(commands)}")


def _input_files(args: argparse.Namespace | None) -> list[str]:
    """The files named by a command's :data:`INPUT_ARGUMENTS` (each may be one path or a list of paths)."""
    values = [getattr(args, name, None) for name in INPUT_ARGUMENTS]
    return [
        str(path) for value in values if value is not None for path in (value if isinstance(value, list) else [value])
    ] or ["none given"]


def error_line(err: Exception, args: argparse.Namespace | None) -> str:
    """The one line that reports ``err`` to the user.

    The project's errors (an unknown registry name too), ``ValueError`` and ``OSError`` say what is wrong
    themselves. Another ``KeyError`` names only the key, so the line names the files the command read. Any other type is unexpected: the line
    says how to see its traceback.
    """
    if isinstance(err, KeyError) and not isinstance(err, DmlbenchError):
        key = err.args[0] if err.args else None
        return (
            f"missing entry {key!r} in one of this command's inputs ({', '.join(_input_files(args))}): a file "
            f"written by an older or another program? re-create it with the dmlbench command that writes it "
            f"(or add the entry to the params)"
        )
    if isinstance(err, DmlbenchError | ValueError | OSError):
        return str(err)
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return f"{what} (unexpected; if the inputs look right, rerun with {TRACEBACK_ENV}=1 and report the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit status (0, :data:`EXIT_ERROR`, :data:`EXIT_INTERRUPTED`)."""
    args: argparse.Namespace | None = None
    try:
        parser = build_parser()
        argv = sys.argv[1:] if argv is None else list(argv)
        _check_command(parser, argv)
        args = parser.parse_args(argv)
        if getattr(args, "config", "absent") is None:
            args.config = ["params.yaml"]
        _set_threads(getattr(args, "threads", None))
        args.func(args)
    except (KeyboardInterrupt, Exception) as err:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        prefix = f"dmlbench {args.command}" if args else "dmlbench"
        if isinstance(err, KeyboardInterrupt):
            print(f"{prefix}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"{prefix}: error: {error_line(err, args)}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
