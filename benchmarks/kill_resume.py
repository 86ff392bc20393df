"""Kill training with SIGKILL at random moments, resume it, and check the result is bit-identical.

For each method, one uninterrupted run gives the reference ``checkpoint.pt`` weights and
``metrics.json``. Then each trial starts the same run afresh, sends ``kill -9`` after a random
delay (uniform over the reference run's training phase: from the estimated start of its first
epoch to its end, so that kills land in training, validation and checkpoint writes, not start-up),
runs the same command again until it finishes, embeds and evaluates it, and compares the
selected weights tensor by tensor, and every ``metrics.json`` entry but the wall-clock timings
exactly, with the reference. A trial whose kill came after the run had finished is redrawn.

    python benchmarks/kill_resume.py                       # 10 kills over triplet, dnc, mpn
    python benchmarks/kill_resume.py --kills 4 --methods margin --seed 3

Runs on the CPU with a shrunk configuration of the embedded default (its prepared dataset
is written once to ``--work``). Prints one line per trial and a summary; exits 1 when any
resumed run differs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: seconds-long runs that still cross several epochs, so kills land in training, validation and writes;
#: D&C re-clusters every epoch and fine-tunes its merged head from the last epoch on.
SHRUNK = {
    "training": {
        "epochs": 6,
        "device": "cpu",
        "embedding_dim": 16,
        "eval_batch_size": 64,
        "backbone": {"width": 8, "pretrained": None, "freeze_bn": False},
        "sampler": {"classes_per_batch": 4, "images_per_class": 4, "batches_per_epoch": 60},
    },
    "methods": {"dnc": {"options": {"warmup_epochs": 1, "recluster_every": 1, "finetune_epoch": 5}}},
}


def dmlbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "dmlbench", *args]


def train_command(work: Path, method: str, name: str) -> list[str]:
    out = work / "runs" / name
    return dmlbench(
        "train",
        "--dataset",
        "synthetic",
        "--method",
        method,
        "--seed",
        "0",
        "--manifest",
        str(work / "prepared" / "manifest.csv"),
        "--out",
        str(out),
        "--scratch-dir",
        str(work / "scratch" / name),
        "--no-progress",
        "--threads",
        "1",
        "--config",
        str(ROOT / "params.yaml"),
        "--config",
        str(work / "shrunk.yaml"),
    )


def run_checked(command: list[str]) -> None:
    """Run ``command``; on failure raise with its stderr (the reason), not only the exit code."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command[2:5])} … exited {result.returncode}: {result.stderr.strip()}")


def finish(work: Path, name: str) -> Path:
    """Embed and evaluate a trained run; returns its metrics.json."""
    run = work / "runs" / name
    run_checked(dmlbench("embed", str(run), "--manifest", str(work / "prepared" / "manifest.csv"), "--threads", "1"))
    run_checked(dmlbench("evaluate", str(run / "embeddings.npz"), "--out", str(run / "metrics.json"), "--threads", "1"))
    return run / "metrics.json"


#: metrics.json entries that time the run (wall-clock seconds and shares of it): they differ between any
#: two runs, killed or not, and are left out of the comparison.
WALL_CLOCK_KEYS = ("training_seconds", "clustering_seconds", "clustering_share")


def same_metrics(left: Path, right: Path) -> bool:
    """Every entry but :data:`WALL_CLOCK_KEYS` equal, compared as the JSON text of its value."""
    a, b = (json.loads(path.read_text()) for path in (left, right))
    return a.keys() == b.keys() and all(json.dumps(a[k]) == json.dumps(b[k]) for k in a if k not in WALL_CLOCK_KEYS)


def same_weights(left: Path, right: Path) -> bool:
    a = torch.load(left, map_location="cpu", weights_only=True)["model"]
    b = torch.load(right, map_location="cpu", weights_only=True)["model"]
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def trial(work: Path, method: str, index: int, delay: float) -> tuple[bool, str]:
    """One kill at ``delay`` seconds, resumed to the end; (identical to the reference, what happened)."""
    name = f"{method}-kill{index}"
    for stale in (work / "runs" / name, work / "scratch" / name):
        shutil.rmtree(stale, ignore_errors=True)
    process = subprocess.Popen(train_command(work, method, name), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    if process.poll() is not None:
        return False, "finished before the kill"
    process.send_signal(signal.SIGKILL)
    process.wait()
    scratch = work / "scratch" / name / "last.pt"
    epoch = torch.load(scratch, map_location="cpu", weights_only=True)["epoch"] if scratch.is_file() else 0
    started = time.perf_counter()
    run_checked(train_command(work, method, name))
    resumed = time.perf_counter() - started
    metrics = finish(work, name)
    identical = same_weights(
        work / "runs" / name / "checkpoint.pt", work / "runs" / method / "checkpoint.pt"
    ) and same_metrics(metrics, work / "runs" / method / "metrics.json")
    return identical, f"killed at {delay:5.1f} s after epoch {epoch}, resumed in {resumed:5.1f} s"


def training_window(command: list[str]) -> tuple[float, float]:
    """Run ``command`` uninterrupted; (estimated start of its first epoch, end), seconds from launch.

    The first epoch's start is the end of the first epoch (its ``[dmlbench] epoch 1/`` line) less
    the mean duration of the later epochs.
    """
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    epoch_ends = [time.perf_counter() - started for line in process.stdout if line.startswith("[dmlbench] epoch ")]
    end = time.perf_counter() - started
    if process.wait():
        raise RuntimeError(f"reference run failed: {process.stderr.read().strip()}")
    epoch_seconds = (epoch_ends[-1] - epoch_ends[0]) / max(1, len(epoch_ends) - 1)
    return max(0.0, epoch_ends[0] - epoch_seconds), end


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="number of killed-and-resumed runs")
    parser.add_argument("--methods", default="triplet,dnc,mpn", help="comma-separated; kills cycle over them")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dmlbench-kill-resume"))
    args = parser.parse_args()
    work, methods, rng = args.work, args.methods.split(","), random.Random(args.seed)
    work.mkdir(parents=True, exist_ok=True)
    (work / "shrunk.yaml").write_text(yaml.safe_dump(SHRUNK))
    if not (work / "prepared" / "manifest.csv").is_file():
        run_checked(
            dmlbench("prepare", "synthetic", "--out", str(work / "prepared"), "--config", str(ROOT / "params.yaml"))
        )
    windows = {}
    for method in methods:
        shutil.rmtree(work / "runs" / method, ignore_errors=True)
        shutil.rmtree(work / "scratch" / method, ignore_errors=True)
        windows[method] = training_window(train_command(work, method, method))
        finish(work, method)
        print(
            f"reference {method}: training from {windows[method][0]:.1f} s to {windows[method][1]:.1f} s after launch",
            flush=True,
        )
    identical_count, index = 0, 0
    while index < args.kills:
        method = methods[index % len(methods)]
        identical, what = trial(work, method, index, rng.uniform(*windows[method]))
        if what == "finished before the kill":
            continue
        identical_count += identical
        print(f"kill {index + 1:2d} {method:10s} {what}: {'bit-identical' if identical else 'DIFFERENT'}", flush=True)
        index += 1
    print(f"{identical_count} of {args.kills} killed runs resumed to bit-identical weights and metrics")
    return 0 if identical_count == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
