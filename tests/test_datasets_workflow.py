"""Real datasets inside the DAG: archives fetched as files, extracted into a cache, prepared.

A local HTTP server (127.0.0.1, a thread) serves a fake CUB-200-2011 archive
(a tgz of the fake copy of ``datasets_fakes.make_cub``) whose real sha256 is
pinned into ``cub200.ARCHIVES`` for the test.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from datasets_fakes import make_cub
from dmlbench.cli import main as cli_main
from dmlbench.data import cub200
from dmlbench.data.download import Archive, DownloadError, download, extract_archives, fetch_archive
from dmlbench.data.manifest import read_manifest
from dmlbench.data.official import DatasetConfigError, DatasetNotFoundError
from dmlbench.params import merge_params

FILENAME = cub200.ARCHIVES[0].filename  # CUB_200_2011.tgz


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.server.requests.append(self.path)
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.requests = {}, []
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _tgz_of(folder: Path) -> bytes:
    """A gzipped tar of ``folder`` with ``folder.name`` as its top-level entry (like the release)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        tf.add(folder, arcname=folder.name)
    return buffer.getvalue()


def _serve_fake_cub(server, monkeypatch, tmp_path: Path, per_class: int = 3, name: str = "fake") -> tuple[bytes, dict]:
    """Serve a fake CUB archive and pin its sha256 in cub200.ARCHIVES; (archive bytes, expected_counts)."""
    fake = make_cub(tmp_path / name, per_class=per_class)
    blob = _tgz_of(fake.root)
    server.files[f"/{name}/{FILENAME}"] = blob
    archive = Archive(FILENAME, hashlib.sha256(blob).hexdigest(), [f"{server.url}/{name}/{FILENAME}"])
    monkeypatch.setattr(cub200, "ARCHIVES", [archive])
    return blob, fake.expected_counts


def _marker(raw: Path) -> dict:
    return json.loads((raw / "cub200" / "extracted" / f".{FILENAME}.done").read_text())


def test_fetch_then_prepare_with_download_true_extracts_and_writes_the_manifest(server, monkeypatch, tmp_path):
    blob, counts = _serve_fake_cub(server, monkeypatch, tmp_path)
    raw = tmp_path / "raw"
    path = fetch_archive("cub200", FILENAME, raw / "cub200" / FILENAME)
    assert path.read_bytes() == blob
    assert not (raw / "cub200" / "extracted").exists()  # fetching does not extract

    config = {"kind": "cub200", "download": True, "raw_dir": str(raw), "expected_counts": counts}
    manifest = read_manifest(cub200.prepare(config, tmp_path / "out"))  # extracts, as the workflow's prepare
    root = raw / "cub200" / "extracted" / "CUB_200_2011"
    assert (root / "images.txt").is_file()
    assert _marker(raw)["sha256"] == hashlib.sha256(blob).hexdigest()
    assert manifest.groupby("split").size().to_dict() == {"train": 9, "test": 9}
    assert all(str(p).startswith(f"{root}/images/") for p in manifest["path"])
    assert extract_archives("cub200", raw) == root
    assert server.requests == [f"/fake/{FILENAME}"]  # prepare fetched nothing


def test_extraction_is_idempotent_and_redone_when_the_archive_changes(server, monkeypatch, tmp_path):
    _serve_fake_cub(server, monkeypatch, tmp_path)
    raw = tmp_path / "raw"
    fetch_archive("cub200", FILENAME, raw / "cub200" / FILENAME)
    root = extract_archives("cub200", raw)
    sentinel = root / "sentinel.txt"  # survives only if nothing is extracted again
    sentinel.write_text("kept")
    images_txt = (root / "images.txt").read_text()

    os.utime(raw / "cub200" / FILENAME)  # new mtime, same bytes: hashed, found unchanged, kept
    assert extract_archives("cub200", raw) == root and sentinel.exists()
    assert _marker(raw)["mtime_ns"] == (raw / "cub200" / FILENAME).stat().st_mtime_ns

    blob, counts = _serve_fake_cub(server, monkeypatch, tmp_path, per_class=2, name="v2")
    (raw / "cub200" / FILENAME).unlink()
    fetch_archive("cub200", FILENAME, raw / "cub200" / FILENAME)
    assert extract_archives("cub200", raw) == root
    assert not sentinel.exists()
    assert (root / "images.txt").read_text() != images_txt
    assert _marker(raw)["sha256"] == hashlib.sha256(blob).hexdigest()
    config = {"kind": "cub200", "download": True, "raw_dir": str(raw), "expected_counts": counts}
    assert len(read_manifest(cub200.prepare(config, tmp_path / "out"))) == 12


def test_interrupted_extraction_never_looks_complete(server, monkeypatch, tmp_path):
    _serve_fake_cub(server, monkeypatch, tmp_path)
    raw = tmp_path / "raw"
    fetch_archive("cub200", FILENAME, raw / "cub200" / FILENAME)
    root = extract_archives("cub200", raw)
    cache = raw / "cub200" / "extracted"
    # a killed extraction: no marker, a half-written temporary folder, a damaged tree
    (cache / f".{FILENAME}.done").unlink()
    (cache / f".extract-{FILENAME}.tmp999999").mkdir()
    (root / "images.txt").unlink()
    assert extract_archives("cub200", raw) == root
    assert (root / "images.txt").is_file()
    assert not list(cache.glob(".*.tmp*"))
    assert (cache / f".{FILENAME}.done").is_file()


def test_download_composes_fetch_and_extract_and_survives_deleting_the_archive(server, monkeypatch, tmp_path):
    _serve_fake_cub(server, monkeypatch, tmp_path)
    raw = tmp_path / "raw"
    root = download("cub200", raw)
    assert root == raw / "cub200" / "extracted" / "CUB_200_2011"
    (raw / "cub200" / FILENAME).unlink()  # archives may be deleted after extraction
    assert download("cub200", raw) == root and extract_archives("cub200", raw) == root
    assert len(server.requests) == 1


def test_missing_archive_names_the_commands_that_fetch_it(monkeypatch, tmp_path):
    with pytest.raises(DownloadError, match=rf"(?s)not found.*dmlbench download cub200 --archive {FILENAME}"):
        extract_archives("cub200", tmp_path / "raw")
    with pytest.raises(DownloadError, match="has no archive 'nope.tgz'"):
        fetch_archive("cub200", "nope.tgz", tmp_path / "nope.tgz")


def test_cli_archive_fetches_one_archive_without_extracting(server, monkeypatch, tmp_path, capsys):
    blob, _ = _serve_fake_cub(server, monkeypatch, tmp_path)
    raw = tmp_path / "raw"
    assert cli_main(["download", "cub200", "--archive", FILENAME, "--raw-dir", str(raw)]) == 0
    assert (raw / "cub200" / FILENAME).read_bytes() == blob
    assert not (raw / "cub200" / "extracted").exists()
    assert f"fetched {raw / 'cub200' / FILENAME}" in capsys.readouterr().out


def test_download_true_with_root_is_an_error(tmp_path):
    config = {"kind": "cub200", "download": True, "root": str(tmp_path)}
    with pytest.raises(DatasetConfigError, match="`download: true` and `root: .*` are both set"):
        cub200.prepare(config, tmp_path / "out")
    with pytest.raises(DatasetConfigError, match="`download` must be true or false"):
        cub200.prepare({"kind": "cub200", "download": "yes"}, tmp_path / "out")


@pytest.mark.parametrize("kind", ["inshop", "vehicleid"])
def test_download_true_for_a_dataset_by_request_explains_the_manual_route(kind, tmp_path):
    from importlib import import_module

    module = import_module(f"dmlbench.data.{kind}")
    with pytest.raises(DatasetNotFoundError, match=f"(?s)cannot be downloaded automatically.*{kind.upper()}_ROOT"):
        module.prepare({"kind": kind, "download": True, "raw_dir": str(tmp_path / "raw")}, tmp_path / "out")


def test_prepare_cli_reports_a_missing_archive_without_a_traceback(tmp_path, capsys):
    params = tmp_path / "params.yaml"
    config = merge_params([REPO / "params.yaml"])  # with its experiments: one self-contained file
    config["datasets"]["cub200"].update(download=True, raw_dir=str(tmp_path / "raw"))
    params.write_text(yaml.safe_dump(config))
    assert cli_main(["prepare", "cub200", "--out", str(tmp_path / "out"), "--config", str(params)]) == 2
    err = capsys.readouterr().err
    assert "dmlbench prepare: error: `download: true`: CUB-200-2011: archive" in err
    assert f"dmlbench download cub200 --archive {FILENAME}" in err


def test_snakemake_dag_downloads_the_archive_before_prepare(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO / "Snakefile", work / "Snakefile")
    shutil.copytree(REPO / "workflow", work / "workflow", ignore=shutil.ignore_patterns("__pycache__"))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["datasets"]["cub_fake"] = {
        "kind": "cub200",
        "label": "fake CUB",
        "recall_ks": [1, 2],
        "root": None,
        "download": True,
    }
    params["tables"]["table1"]["datasets"] = ["cub_fake"]
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "DMLBENCH_CUB200_ROOT"}
    snakemake = Path(sys.executable).parent / "snakemake"
    result = subprocess.run(
        [str(snakemake), "-n", "--cores", "1", "data/prepared/cub_fake"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    text = result.stdout + result.stderr
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        match = re.match(r"(?:local)?rule (\w+):", block)
        if match:
            fields = dict(re.findall(r"^\s+(input|output|log|jobid): (.*)$", block, flags=re.M))
            jobs[match[1]] = fields
    archive = f"data/raw/cub200/{FILENAME}"
    assert set(jobs) == {"download", "prepare"}, text
    assert jobs["download"]["output"] == archive
    assert jobs["download"]["log"] == f"results/logs/download/cub200/{FILENAME}.log"
    assert jobs["prepare"]["input"] == archive
    assert jobs["prepare"]["output"] == "data/prepared/cub_fake"

    params["datasets"]["cub_fake"]["root"] = str(tmp_path)  # both sources: refused before any download
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = subprocess.run(
        [str(snakemake), "-n", "--cores", "1", "data/prepared/cub_fake"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "`download: true` and `root` are both set" in result.stdout + result.stderr
