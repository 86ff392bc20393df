"""Every command that README.md and docs/**/*.md give works as written (issue 30).

The commands are extracted from the code blocks of the Markdown (indented 4-space blocks and ``` fences;
backslash-continued lines joined, `&&` / `;` chains split, a leading `$ ` and leading environment assignments
such as ``DMLBENCH_CUB200_ROOT=...`` stripped) and checked by what they call:

- ``snakemake ...``: a dry run (``-n --nolock`` put right after ``snakemake``, every other word kept) in a
  temporary copy of ``Snakefile``, ``workflow/`` and ``params.yaml``, which must plan (exit 0). Commands that
  differ only in their targets share one dry run; when it fails, each is dry-run alone. A
  ``DMLBENCH_<KIND>_ROOT`` the command sets points at a miniature fake of the dataset
  (``tests/datasets_fakes.py``). Before that, Snakemake's own argument parser reads the command: every
  ``--configfile`` value must be a parameter file (a target read as one is the bug of issue 30).
- ``dmlbench ...``: the CLI's parser (``dmlbench.cli.build_parser``) accepts the words; the ``--config`` files
  load and validate; the dataset, method, table or figure named exists in them. Nothing is run.
- ``dvc ...``: DVC's parser accepts the words; a ``repro`` target is a stage of ``dvc.yaml``; a
  ``-S [file:]key=value`` names an existing file and key.
- ``python <script>.py``: the script exists and its ``--help`` lists every option the command gives;
  ``python -m <module>``: the module exists.
- ``pip install``: a local path exists and the extras are in ``pyproject.toml``; ``bash <file>``: the file
  exists; ``pytest -m EXPR``: every marker in EXPR is registered.

Overlay files the docs tell the user to write (a name ``my.yaml`` / ``my_*.yaml``, or the placeholder
``<overlay>``) are written into the copy from the doc's own YAML block: the block whose first comment line
names the file, else the last ``yaml`` block before the command in the same section, else
:data:`MINIMAL_OVERLAY`. Any other parameter file a command names must exist in the repository.

Inline code spans (`` `snakemake ...` `` in the prose) are read by Snakemake's parser only (no dry run).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from datasets_fakes import make_cars, make_cub, make_sop

from dmlbench.config import defines

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: Fenced blocks whose every line must be a command this file knows how to check.
SHELL_FENCES = {"sh", "bash", "shell", "console", "zsh"}
#: Placeholders the docs use inside commands, and what the test puts there.
PLACEHOLDERS = {"<overlay>": "my_overlay.yaml", "<target>": "results/tables/table1.tex"}
#: The overlay written for a user's overlay file when the doc gives no YAML block for it.
MINIMAL_OVERLAY = "seeds: [0]\n"
USER_OVERLAY = re.compile(r"my([_.][\w.-]*)?\.ya?ml")
#: The dataset roots a command may set, and the fake copy written for each.
FAKE_ROOTS = {"DMLBENCH_CUB200_ROOT": make_cub, "DMLBENCH_CARS196_ROOT": make_cars, "DMLBENCH_SOP_ROOT": make_sop}
TOOLS = ("snakemake", "dmlbench", "dvc", "python", "pip", "bash", "pytest")


# --- extraction ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    doc: Path
    lang: str  # "indented" for a 4-space block, else the fence's info string ("" when none)
    lines: tuple[tuple[int, str], ...]  # (1-based line number, text without the block's indentation)

    @property
    def start(self) -> int:
        return self.lines[0][0] if self.lines else 0

    @property
    def text(self) -> str:
        return "".join(text + "\n" for _, text in self.lines)


@dataclass(frozen=True)
class Command:
    doc: str  # relative to the repository
    line: int
    source: str  # as written (continuation lines joined)
    argv: tuple[str, ...]  # the command's words, the tool first (``.venv/bin/`` dropped, python3 → python)
    env: tuple[tuple[str, str], ...] = ()
    strict: bool = False  # from a shell fence: an unknown tool is an error
    id: str = field(default="", compare=False)

    @property
    def tool(self) -> str:
        return self.argv[0]


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
HEADING = re.compile(r"^#{1,6} ")


def blocks(doc: Path) -> tuple[list[Block], list[int]]:
    """The code blocks of ``doc`` and the line numbers of its headings (outside code)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found, headings = [], []
    i, after_blank = 0, True
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, marker, lang = fence.groups()
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                text = lines[i]
                body.append((i + 1, text[len(indent) :] if text.startswith(indent) else text.lstrip()))
                i += 1
            found.append(Block(doc, lang.lower(), tuple(body)))
            i, after_blank = i + 1, False
            continue
        if after_blank and line.startswith("    ") and line.strip():
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append((i + 1, lines[i][4:]))
                i += 1
            found.append(Block(doc, "indented", tuple(body)))
            after_blank = False
            continue
        if HEADING.match(line):
            headings.append(i + 1)
        after_blank = not line.strip()
        i += 1
    return found, headings


def logical_lines(block: Block) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each line of ``block``, backslash-continued lines joined."""
    pending, start = [], 0
    for number, text in block.lines:
        if not pending:
            start = number
        stripped = text.strip()
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        yield start, " ".join(part for part in pending if part)
        pending = []
    if pending:
        yield start, " ".join(part for part in pending if part)


def words(text: str) -> list[list[str]]:
    """The shell words of ``text`` split into its commands at ``&&``, ``||``, ``;`` and ``|``; comments dropped."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for word in lexer:
        if word and set(word) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command]


def normalise(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``argv`` without its leading ``$`` and environment assignments (returned apart), tool name plain."""
    if argv and argv[0] == "$":
        argv = argv[1:]
    env = []
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        name, value = argv[0].split("=", 1)
        env.append((name, value))
        argv = argv[1:]
    if argv:
        tool = argv[0].removeprefix(".venv/bin/")
        argv = ["python" if tool == "python3" else tool, *argv[1:]]
    return argv, env


def doc_commands(doc: Path, name: str | None = None) -> list[Command]:
    """The commands of ``doc`` (named ``name``, default its path in the repository) in the order written."""
    found = []
    name = name or str(doc.relative_to(REPO))
    for block in blocks(doc)[0]:
        strict = block.lang in SHELL_FENCES
        if not (strict or block.lang in ("indented", "")):
            continue
        for line, text in logical_lines(block):
            try:
                chain = words(re.sub(r"^\$\s+", "", text))
            except ValueError:  # unbalanced quotes: prose or output, not a command
                continue
            for raw in chain:
                argv, env = normalise(raw)
                if argv and (argv[0] in TOOLS or strict):
                    found.append(Command(name, line, text, tuple(argv), tuple(env), strict))
    # test ids: doc:line:tool, numbered when a line holds the same tool twice
    counts: dict[str, int] = {}
    named = []
    for command in found:
        base = f"{command.doc}:{command.line}:{command.tool}"
        counts[base] = counts.get(base, 0) + 1
        ident = base if counts[base] == 1 else f"{base}#{counts[base]}"
        named.append(Command(**{**command.__dict__, "id": ident}))
    return named


COMMANDS = [command for doc in DOCS for command in doc_commands(doc)]


def test_the_docs_give_commands_of_every_kind():
    """The extraction finds the commands (a parser broken by a Markdown change would silently test nothing)."""
    tools = {command.tool for command in COMMANDS}
    assert {"snakemake", "dmlbench", "dvc", "python", "pip", "pytest"} <= tools, tools
    readme = [command for command in COMMANDS if command.doc == "README.md"]
    assert sum(command.tool == "snakemake" for command in readme) >= 5
    assert any(c.env and c.env[0][0] == "DMLBENCH_CUB200_ROOT" for c in readme)


def test_extraction_joins_continuations_splits_chains_and_strips_the_environment(tmp_path: Path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "Text\n\n    $ A=1 B=x \\\n      snakemake --cores 2 t  # comment\n    output line\n\n"
        "```sh\npip install -e '.[test]' && bash .ci/run; pytest -m \"not slow\"\n```\n"
        "- item\n\n    continued prose of the item\n"
    )
    found = [(c.line, c.argv, c.env) for c in doc_commands(doc, "doc.md")]
    assert found == [
        (3, ("snakemake", "--cores", "2", "t"), (("A", "1"), ("B", "x"))),
        (8, ("pip", "install", "-e", ".[test]"), ()),
        (8, ("bash", ".ci/run"), ()),
        (8, ("pytest", "-m", "not slow"), ()),
    ]


# --- the parameter files a command names, and the project copies ---------------------------------------------


def substitute(argv: tuple[str, ...]) -> list[str]:
    """``argv`` with the docs' placeholders replaced (an unknown ``<...>`` stays, and fails its check)."""
    return [PLACEHOLDERS.get(word, word) for word in argv]


def snakemake_args(argv: list[str]) -> Any:
    """Snakemake's own reading of ``argv`` (without the tool name); raises ValueError on a parse error."""
    from snakemake.cli import get_argument_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return get_argument_parser().parse_args(argv)
    except SystemExit as err:
        raise ValueError(stderr.getvalue().strip() or f"exit {err.code}") from None


def config_files(command: Command) -> list[str]:
    """The parameter files ``command`` names (as written, placeholders substituted)."""
    argv = substitute(command.argv)
    if command.tool == "snakemake":
        try:
            return [str(path) for path in (snakemake_args(argv[1:]).configfile or [])]
        except (ValueError, TypeError):
            return []
    if command.tool in ("dmlbench", "python"):
        return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--config"]
    return []


def yaml_block_for(doc: Path, name: str, line: int) -> str:
    """The YAML a doc gives for the overlay file ``name`` it names at ``line`` (see the module docstring)."""
    found, headings = blocks(doc)
    yamls = [block for block in found if block.lang in ("yaml", "yml")]
    for block in yamls:
        first = block.text.lstrip().splitlines()[0] if block.text.strip() else ""
        if first.startswith("#") and Path(name).name in first:
            return block.text
    section = max([h for h in headings if h < line], default=0)
    before = [block for block in yamls if section < block.start < line]
    return before[-1].text if before else MINIMAL_OVERLAY


def overlays(command: Command) -> tuple[tuple[str, str], ...]:
    """``(path, content)`` of each user's overlay ``command`` names that the test writes into its copy."""
    files = []
    for name in config_files(command):
        if USER_OVERLAY.fullmatch(Path(name).name) and not (REPO / name).exists():
            files.append((name, yaml_block_for(REPO / command.doc, name, command.line)))
    return tuple(sorted(set(files)))


class Projects:
    """Temporary copies of the workflow, one per set of user overlays (most commands share the bare one)."""

    def __init__(self, root: Path):
        self.root = root
        self.copies: dict[tuple[tuple[str, str], ...], Path] = {}
        self.fakes: dict[str, Path] = {}

    def for_command(self, command: Command) -> Path:
        files = overlays(command)
        if files not in self.copies:
            copy = self.root / f"project{len(self.copies)}"
            copy.mkdir()
            for name in ("Snakefile", "workflow", "params.yaml"):
                (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, copy / name)
            for name, content in files:
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                (copy / name).write_text(content)
            self.copies[files] = copy
        return self.copies[files]

    def env(self, command: Command) -> dict[str, str]:
        """The environment of ``command``: ours, plus its assignments (a dataset root → a fake copy)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("DMLBENCH_")}
        env["DMLBENCH_IMAGE_STORE"] = str(self.root / "image_store")
        for name, value in command.env:
            if name in FAKE_ROOTS:
                if name not in self.fakes:
                    self.fakes[name] = FAKE_ROOTS[name](self.root / "fakes" / name).root
                value = str(self.fakes[name])
            env[name] = value
        return env


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> Projects:
    return Projects(tmp_path_factory.mktemp("doc_commands"))


# --- snakemake -------------------------------------------------------------------------------------------------

SNAKEMAKE_COMMANDS = [command for command in COMMANDS if command.tool == "snakemake"]


def static_snakemake_problem(argv: list[str], cwd: Path) -> str | None:
    """Why Snakemake's parser reads ``argv`` wrongly, or None: a parse error, a target taken as a config file."""
    try:
        args = snakemake_args(argv[1:])
    except ValueError as err:
        return f"Snakemake cannot parse it: {err}"
    for path in args.configfile or []:
        if not (cwd / path).is_file():
            what = (
                (
                    "a target read as a config file (--configfile takes several files: end them with `--`, "
                    "or put the targets first)"
                )
                if not str(path).endswith((".yaml", ".yml", ".json"))
                else "a config file that does not exist"
            )
            return f"{path}: {what}"
    unknown = [word for word in argv if re.search(r"<[^>]*>", word)]
    if unknown:
        return f"placeholder {unknown} has no substitute in PLACEHOLDERS"
    return None


#: Runs dry runs as ``python -m snakemake ARGS`` would, each in a process of its own, forked from one process that
#: has imported Snakemake and the modules the workflow imports (torch among them) once instead of once per run.
#: stdin: a JSON list of jobs {argv (without the tool), cwd, env, out}; stdout: a JSON list of exit statuses.
FORK_SERVER = r"""
import importlib, json, os, re, runpy, sys
from pathlib import Path

jobs = json.load(sys.stdin)
import snakemake.cli, snakemake.api  # noqa: E401
for job in jobs[:1]:
    for file in [Path(job["cwd"]) / "Snakefile", *sorted((Path(job["cwd"]) / "workflow").rglob("*.smk"))]:
        for name in re.findall(r"^\s*(?:from|import)\s+([\w.]+)", file.read_text(), re.M):
            try:
                importlib.import_module(name)
            except Exception:
                pass  # the dry run itself reports it
main = str(Path(snakemake.__file__).with_name("__main__.py"))
running, status = {}, [None] * len(jobs)
for index, job in [*enumerate(jobs), *[(None, None)] * int(sys.argv[1])]:
    while running and (index is None or len(running) >= int(sys.argv[1])):
        pid, code = os.wait()
        status[running.pop(pid)] = os.waitstatus_to_exitcode(code)
    if index is None:
        continue
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            out = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1), os.dup2(out, 2)
            os.chdir(job["cwd"])
            os.environ.clear(), os.environ.update(job["env"])
            sys.argv = [main, *job["argv"]]
            runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    running[pid] = index
print(json.dumps(status))
"""


def dry_runs_of(groups: list[Group], folder: Path) -> list[tuple[int, str]]:
    """(exit status, output tail) of ``snakemake -n --nolock ARGS`` for each group, as many at once as there are
    CPU cores."""
    jobs = [
        {
            "argv": ["-n", "--nolock", *group.argv[1:]],
            "cwd": str(group.cwd),
            "env": group.env,
            "out": str(folder / f"dry_run{id(group)}_{i}.log"),
        }
        for i, group in enumerate(groups)
    ]
    if not jobs:
        return []
    result = subprocess.run(
        [sys.executable, "-c", FORK_SERVER, str(os.cpu_count() or 1)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env=groups[0].env,
    )
    assert result.returncode == 0, f"the dry-run process failed:\n{result.stderr[-4000:]}"
    codes = json.loads(result.stdout.strip().splitlines()[-1])
    return [(code, Path(job["out"]).read_text()[-5000:].strip()) for code, job in zip(codes, jobs, strict=True)]


def comparable(args: Any) -> dict[str, Any]:
    """Snakemake's parsed options without the targets, as values that compare by content (some settings
    objects compare by identity)."""
    return {
        key: (type(value), vars(value)) if type(value).__eq__ is object.__eq__ and hasattr(value, "__dict__") else value
        for key, value in vars(args).items()
        if key != "targets"
    }


@dataclass
class Group:
    """Commands planned by one dry run: same copy, environment and options; ``argv`` holds every target."""

    cwd: Path
    env: dict[str, str]
    options: dict[str, Any] | None  # None: never merged (no targets, or Snakemake cannot parse it)
    argv: list[str]
    members: list[Command]

    def add(self, command: Command, argv: list[str], args: Any) -> bool:
        """Plan ``command`` (read by Snakemake as ``args``) in this group too, if only its targets differ."""
        if self.options is None or self.options != comparable(args):
            return False
        targets = set(snakemake_args(self.argv[1:]).targets) | set(args.targets)
        merged = [*self.argv, *dict.fromkeys(t for t in argv[1:] if t in args.targets and t not in self.argv)]
        try:
            check = snakemake_args(merged[1:])
        except ValueError:  # e.g. targets written before the options
            return False
        if set(check.targets) != targets or comparable(check) != self.options:
            return False
        self.argv, self.members = merged, [*self.members, command]
        return True


def grouped(commands: list[Command], projects: Projects) -> list[Group]:
    """``commands`` in as few dry runs as keep each one's meaning."""
    groups: list[Group] = []
    for command in commands:
        argv = substitute(command.argv)
        cwd, env = projects.for_command(command), projects.env(command)
        try:
            args = snakemake_args(argv[1:])
        except ValueError:
            args = None
        mergeable = args is not None and bool(args.targets)
        if not (mergeable and any(g.cwd == cwd and g.env == env and g.add(command, argv, args) for g in groups)):
            groups.append(Group(cwd, env, comparable(args) if mergeable else None, list(argv), [command]))
    return groups


@pytest.fixture(scope="module")
def dry_runs(projects: Projects) -> dict[Command, tuple[int, str]]:
    """Every snakemake command's dry run: (exit status, output tail). Commands that differ only in their targets
    are planned together; the members of a failed group are planned again, in halves, until each failing
    command is planned alone."""
    results: dict[Command, tuple[int, str]] = {}
    groups = grouped(SNAKEMAKE_COMMANDS, projects)
    while groups:
        again = []
        for group, result in zip(groups, dry_runs_of(groups, projects.root), strict=True):
            members = group.members
            if result[0] == 0 or len(members) == 1:
                results.update(dict.fromkeys(members, result))
            else:
                again += [
                    *grouped(members[: len(members) // 2], projects),
                    *grouped(members[len(members) // 2 :], projects),
                ]
        groups = again
    return results


@pytest.mark.parametrize("command", SNAKEMAKE_COMMANDS, ids=[c.id for c in SNAKEMAKE_COMMANDS])
def test_snakemake_command_plans(command: Command, projects: Projects, dry_runs: dict):
    argv = substitute(command.argv)
    problem = static_snakemake_problem(argv, projects.for_command(command))
    assert problem is None, f"{command.id}: `{command.source}`: {problem}"
    rc, output = dry_runs[command]
    assert rc == 0, f"{command.id}: `{command.source}` does not plan (snakemake -n exit {rc}):\n{output}"


def inline_snakemake_spans() -> list[tuple[str, str]]:
    """(id, text) of every `snakemake ...` code span in the docs' prose (code blocks left out)."""
    spans = []
    for doc in DOCS:
        lines = doc.read_text(encoding="utf-8").splitlines()
        inside = {number for block in blocks(doc)[0] for number, _ in block.lines}
        inside |= {i + 1 for i, line in enumerate(lines) if FENCE.match(line)}
        prose = "\n".join("" if i + 1 in inside else line for i, line in enumerate(lines))
        for match in re.finditer(r"`([^`]+)`", prose):
            text = " ".join(match.group(1).split())
            if re.match(r"([A-Za-z_]\w*=\S+ )*(\.venv/bin/)?snakemake( |$)", text):
                line = prose.count("\n", 0, match.start()) + 1
                spans.append((f"{doc.relative_to(REPO)}:{line}", text))
    return spans


INLINE = inline_snakemake_spans()


@pytest.mark.parametrize("text", [text for _, text in INLINE], ids=[ident for ident, _ in INLINE])
def test_inline_snakemake_command_parses(text: str):
    """A command in the prose is read by Snakemake's parser as meant: every `--configfile` value a parameter
    file, every `--resources` value `NAME=N` (a placeholder stands for one word)."""
    argv, _ = normalise(shlex.split(text))
    argv = [PLACEHOLDERS.get(word, re.sub(r"<[^>]*>", "x", word)) for word in argv]
    try:
        args = snakemake_args(argv[1:])
    except ValueError as err:
        pytest.fail(f"`{text}`: Snakemake cannot parse it: {err}")
    wrong = [str(path) for path in args.configfile or [] if not str(path).endswith((".yaml", ".yml", ".json"))]
    assert not wrong, f"`{text}`: {wrong} read as config files (end the --configfile list with `--`)"


def test_the_readme_overlay_form_of_issue_30_is_caught(tmp_path: Path):
    """The command the issue reported: the target after `--configfile FILE` is read as a second config file."""
    (tmp_path / "my_overlay.yaml").write_text(MINIMAL_OVERLAY)
    argv = ["snakemake", "--cores", "8", "--configfile", "my_overlay.yaml", "results/tables/table1.tex"]
    assert "results/tables/table1.tex: a target read as a config file" in static_snakemake_problem(argv, tmp_path)
    assert static_snakemake_problem([*argv[:5], "--", argv[5]], tmp_path) is None
    resources = ["snakemake", "--profile", "workflow/profiles/gpu", "--resources", "gpu=4", "results/x.tex"]
    assert "cannot parse" in static_snakemake_problem(resources, REPO)


# --- dmlbench ---------------------------------------------------------------------------------------------------

DMLBENCH_COMMANDS = [command for command in COMMANDS if command.tool == "dmlbench"]
#: The params section a name-valued argument of a subcommand must be a key of.
NAMED = {"dataset": "datasets", "method": "methods", "table": "tables", "figure": "figures"}


@pytest.mark.parametrize("command", DMLBENCH_COMMANDS, ids=[c.id for c in DMLBENCH_COMMANDS])
def test_dmlbench_command_parses(command: Command, projects: Projects):
    from dmlbench.cli import _check_command, build_parser
    from dmlbench.params import load_config

    argv = substitute(command.argv)[1:]
    parser, stderr = build_parser(), io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _check_command(parser, argv)
            args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{command.id}: `{command.source}`: {stderr.getvalue().strip()}")
    cwd = projects.for_command(command)
    configs = getattr(args, "config", None) or ["params.yaml"]
    # `dmlbench show`'s KEY=VALUE overrides are no files
    configs = [name for name in configs if "=" not in name or (cwd / name).is_file()] or ["params.yaml"]
    missing = [name for name in configs if not (cwd / name).is_file()]
    assert not missing, f"{command.id}: `{command.source}`: no such parameter file {missing}"
    params = load_config([cwd / name for name in configs])
    for attribute, section in NAMED.items():
        name = getattr(args, attribute, None)
        if isinstance(name, str):
            section = "pretraining" if (args.command, attribute) == ("pretrain", "dataset") else section
            assert name in params[section], f"{command.id}: `{command.source}`: {name!r} is not in {section}"


# --- dvc --------------------------------------------------------------------------------------------------------

DVC_COMMANDS = [command for command in COMMANDS if command.tool == "dvc"]


def declared_path(entry: Any) -> str:
    """A regular expression of the paths a ``metrics``/``plots`` entry of dvc.yaml names (``${item.x}`` → any
    one path component)."""
    path = entry if isinstance(entry, str) else next(iter(entry))
    return "".join("[^/]+" if part.startswith("${") else re.escape(part) for part in re.split(r"(\$\{[^}]+\})", path))


@pytest.mark.parametrize("command", DVC_COMMANDS, ids=[c.id for c in DVC_COMMANDS])
def test_dvc_command_parses_and_names_what_exists(command: Command, caplog: pytest.LogCaptureFixture):
    from dvc.cli import DvcParserError
    from dvc.cli.parser import get_main_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = get_main_parser().parse_args(list(command.argv[1:]))
    except (SystemExit, DvcParserError):  # DVC's parser logs its message
        pytest.fail(f"{command.id}: `{command.source}`: {caplog.text.strip()} {stderr.getvalue().strip()}")
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    module = args.func.__module__ if hasattr(args, "func") else ""
    if module in ("dvc.commands.metrics", "dvc.commands.plots"):  # targets are files: a declared metric or plot
        kind = module.rsplit(".", 1)[1]
        declared = [declared_path(entry) for stage in stages.values() for entry in stage.get("do", stage).get(kind, [])]
        for target in getattr(args, "targets", None) or []:
            assert any(re.fullmatch(pattern, target) for pattern in declared), (
                f"{command.id}: {target!r} is no {kind} file of dvc.yaml"
            )
    elif not getattr(args, "glob", False):
        single = getattr(args, "target", None)  # dvc dag takes one
        for target in [*(getattr(args, "targets", None) or []), *([single] if isinstance(single, str) else [])]:
            assert target.split("@")[0] in stages, f"{command.id}: no stage {target!r} in dvc.yaml"
    for setting in getattr(args, "set_param", None) or []:
        file, _, assignment = setting.rpartition(":")
        file = file or "params.yaml"
        key = assignment.split("=", 1)[0]
        assert (REPO / file).is_file(), f"{command.id}: -S names a missing file {file}"
        assert defines(yaml.safe_load((REPO / file).read_text()), key), f"{command.id}: no key {key} in {file}"


# --- python, pip, bash, pytest ----------------------------------------------------------------------------------

OTHER_COMMANDS = [command for command in COMMANDS if command.tool not in ("snakemake", "dmlbench", "dvc")]


@cache
def script_help(script: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, f"{script} --help: exit {result.returncode}\n{result.stderr[-2000:]}"
    return result.stdout


def check_python(command: Command) -> None:
    argv = list(command.argv[1:])
    if argv[:1] == ["-m"]:
        assert importlib.util.find_spec(argv[1]) is not None, f"no module {argv[1]}"
        return
    script = argv[0]
    assert (REPO / script).is_file(), f"no script {script}"
    configs = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--config" and argv[i + 1] != "..."]
    assert all((REPO / config).is_file() for config in configs), f"a --config file of {configs} is missing"
    options = [word.split("=", 1)[0] for word in argv[1:] if word.startswith("--")]
    if options:
        text = script_help(script)
        missing = [option for option in options if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)]
        assert not missing, f"{script} has no option {missing} (its --help:\n{text})"


def check_pip(command: Command) -> None:
    argv = list(command.argv[1:])
    assert argv and argv[0] in ("install", "uninstall"), f"pip {argv[:1]}?"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for word in argv[1:]:
        local = re.fullmatch(r"(\.[\w./-]*)(\[([\w,-]+)\])?", word)
        if local:
            assert (REPO / local.group(1)).exists(), f"no path {local.group(1)}"
            unknown = set((local.group(3) or "").split(",")) - set(extras) - {""}
            assert not unknown, f"no extra {sorted(unknown)} in pyproject.toml (has {sorted(extras)})"


def check_bash(command: Command) -> None:
    assert (REPO / command.argv[1]).is_file(), f"no file {command.argv[1]}"


def check_pytest(command: Command) -> None:
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    registered = {marker.split(":")[0].strip() for marker in markers}
    argv = iter(command.argv[1:])
    for word in argv:
        if word == "-m":
            named = set(re.findall(r"\w+", next(argv, ""))) - {"and", "or", "not"}
            assert named <= registered, f"unregistered marker {sorted(named - registered)}"
        elif not word.startswith("-"):
            assert (REPO / word.split("::")[0]).exists(), f"no test path {word}"


CHECKS = {"python": check_python, "pip": check_pip, "bash": check_bash, "pytest": check_pytest}


@pytest.mark.parametrize("command", OTHER_COMMANDS, ids=[c.id for c in OTHER_COMMANDS])
def test_other_command_names_what_exists(command: Command):
    assert command.tool in CHECKS, f"{command.id}: `{command.source}`: no check for {command.tool!r} commands"
    try:
        CHECKS[command.tool](command)
    except AssertionError as err:
        raise AssertionError(f"{command.id}: `{command.source}`: {err}") from None
