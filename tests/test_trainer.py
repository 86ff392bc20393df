"""Trainer: bit-exact determinism, resume after interruption, model selection, NaN guard."""

from __future__ import annotations

import copy
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_run
from torch.utils.data import DataLoader
import dmlbench.models.embedding as embedding

from dmlbench.evaluation.evaluate import evaluate_embeddings
from dmlbench.evaluation.files import load_embeddings_npz
from dmlbench.evaluation.validation import check_stats
from dmlbench.seeding import configure_determinism
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.embed import embed_run
from dmlbench.training.trainer import NonFiniteLossError, WaitClock, train_run

TIMING_COLUMNS = ["seconds", "images_per_s", "loader_wait_share"]


class Interrupted(Exception):
    pass


def train(run: dict, manifest: Path, root: Path, **kwargs):
    return train_run(run, manifest, root / "out", root / "scratch", progress=False, **kwargs)


def outputs(root: Path) -> tuple[dict, pd.DataFrame]:
    checkpoint = load_checkpoint(root / "out" / "checkpoint.pt")
    log = pd.read_csv(root / "out" / "log.csv").drop(columns=TIMING_COLUMNS)
    return checkpoint, log


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_same_seed_same_bits_and_other_seed_differs(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "margin")
    train(run, tiny_manifest, tmp_path / "a")
    train(run, tiny_manifest, tmp_path / "b")
    (ca, la), (cb, lb) = outputs(tmp_path / "a"), outputs(tmp_path / "b")
    assert_same_weights(ca["model"], cb["model"])
    pd.testing.assert_frame_equal(la, lb)
    train(tiny_run(params, "margin", seed=1), tiny_manifest, tmp_path / "c")
    cc, _ = outputs(tmp_path / "c")
    assert not torch.equal(ca["model"]["head.linear.weight"], cc["model"]["head.linear.weight"])


def test_interrupted_run_resumes_to_identical_result(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "proxy_nca", epochs=4)
    train(run, tiny_manifest, tmp_path / "full")

    def stop_after_two(epoch: int) -> None:
        if epoch == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(run, tiny_manifest, tmp_path / "cut", on_epoch_end=stop_after_two)
    assert not (tmp_path / "cut" / "out" / "checkpoint.pt").exists()  # no half-finished outputs
    assert (tmp_path / "cut" / "scratch" / "last.pt").exists()
    result = train(run, tiny_manifest, tmp_path / "cut")
    assert result.epochs_run_now == 2  # continued at epoch 3
    (cf, lf), (cc, lc) = outputs(tmp_path / "full"), outputs(tmp_path / "cut")
    assert_same_weights(cf["model"], cc["model"])
    assert_same_weights(cf["loss"], cc["loss"])  # the proxies too
    pd.testing.assert_frame_equal(lf, lc)
    assert not (tmp_path / "cut" / "scratch" / "last.pt").exists()


def test_scratch_from_another_configuration_is_not_resumed(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "triplet", epochs=3)
    with pytest.raises(Interrupted):
        train(run, tiny_manifest, tmp_path, on_epoch_end=lambda e: (_ for _ in ()).throw(Interrupted()))
    run["training"]["optimizer"]["lr"] = 0.01
    assert train(run, tiny_manifest, tmp_path).epochs_run_now == 3


def test_selected_checkpoint_is_the_best_validation_epoch(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "binomial", epochs=4)
    train(run, tiny_manifest, tmp_path)
    checkpoint, log = outputs(tmp_path)
    best = int(log["epoch"][log["val_R@1"].idxmax()])
    assert checkpoint["selected_epoch"] == best and checkpoint["selection"] == "val"
    assert checkpoint["selection_score"] == pytest.approx(log["val_R@1"].max())
    assert log["test_R@1"].isna().all()  # the clean protocol never looks at the test set


def test_paper_protocol_selects_on_test(params, tiny_manifest, tmp_path):
    run = tiny_run(params, "contrastive", epochs=3)
    run["training"]["selection"] = "test"
    train(run, tiny_manifest, tmp_path)
    checkpoint, log = outputs(tmp_path)
    assert checkpoint["selected_epoch"] == int(log["epoch"][log["test_R@1"].idxmax()])


def test_the_papers_test_selected_epoch_is_recorded_beside_the_validation_selected_checkpoint(
    params, tiny_manifest, tmp_path
):
    """``log_test_recall`` logs each epoch's test R@1; the run keeps its validation-selected weights and
    records the best test epoch (the papers' protocol) as ``test_selected/*``. The logged test R@1 of
    the selected epoch is what evaluating the kept embedding gives, so the two columns compare like
    with like."""
    run = tiny_run(params, "binomial", epochs=4)
    run["training"]["log_test_recall"] = True
    train(run, tiny_manifest, tmp_path)
    checkpoint, log = outputs(tmp_path)
    assert checkpoint["selection"] == "val"
    assert checkpoint["selected_epoch"] == int(log["epoch"][log["val_R@1"].idxmax()])
    summary = checkpoint["summary"]
    assert summary["test_selected/R@1"] == pytest.approx(log["test_R@1"].max())
    assert summary["test_selected/epoch"] == int(log["epoch"][log["test_R@1"].idxmax()])
    stored = load_embeddings_npz(embed_run(tmp_path / "out" / "checkpoint.pt", tiny_manifest, tmp_path / "e.npz"))
    stats = check_stats(stored["stat_names"], stored["stat_values"])  # what evaluate copies into metrics.json
    assert stats["test_selected/R@1"] == summary["test_selected/R@1"]
    r1 = evaluate_embeddings(stored["embeddings"], stored["labels"], [1], split=stored.get("split"))["R@1"]
    selected = log.set_index("epoch").loc[checkpoint["selected_epoch"], "test_R@1"]
    assert r1 == pytest.approx(selected)
    assert summary["test_selected/R@1"] >= r1


def test_the_clean_protocol_records_no_test_selected_epoch(params, tiny_manifest, tmp_path):
    train(tiny_run(params, "binomial", epochs=2), tiny_manifest, tmp_path)
    assert not any(key.startswith("test_selected/") for key in outputs(tmp_path)[0]["summary"])


def test_nan_loss_stops_with_a_clear_message(params, tiny_manifest, tmp_path, monkeypatch):
    from dmlbench.methods.base import Recipe

    monkeypatch.setattr(Recipe, "training_loss", lambda self, model, loss, x, y, idx: model(x).sum() * float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 1, batch 1.*training.optimizer.lr"):
        train(tiny_run(params, "triplet"), tiny_manifest, tmp_path)


def test_a_nan_loss_in_a_later_batch_is_named_at_the_epoch_end_and_nothing_is_saved(
    params, tiny_manifest, tmp_path, monkeypatch
):
    """The steps do not wait for the GPU to check each loss: the epoch ends, then the first bad batch is named."""
    from dmlbench.methods.base import Recipe

    calls = []

    def loss_nan_from_the_second_batch(self, model, loss, x, y, idx):
        calls.append(1)
        return model(x).sum() * (1.0 if len(calls) == 1 else float("nan"))

    monkeypatch.setattr(Recipe, "training_loss", loss_nan_from_the_second_batch)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 1, batch 2 \(nothing of this epoch was saved"):
        train(tiny_run(params, "triplet"), tiny_manifest, tmp_path)
    assert len(calls) == 2  # the epoch's two batches ran
    assert not (tmp_path / "out" / "checkpoint.pt").exists() and not (tmp_path / "scratch" / "last.pt").exists()


@pytest.mark.parametrize(
    "method",
    [
        "binomial",
        "abe8",
        "heads8",
        "mpn",
        "deml",
        "diablo",
        "dnc",
        "proxy_nca",
        "norm_softmax",
        "margin",
        "triplet",
        "contrastive",
    ],
)
def test_a_training_step_never_reads_a_value_back_from_the_device(params, tiny_manifest, tmp_path, monkeypatch, method):
    """On a GPU every read of a tensor's value (``item``, ``bool``, ``float``) makes the process wait for all
    queued work; an epoch of every table1 method reads values in dmlbench's code only at its end, however many
    batches it has (the recipes log their per-batch terms through :class:`~dmlbench.methods.term_sums.TermSums`).
    (torch's own reads here are of CPU tensors: the pil transforms', and the CPU Adam's step counts, which
    the fused CUDA optimiser keeps on the GPU.)"""
    reads = []
    for name in ("item", "__bool__", "__float__"):
        original = getattr(torch.Tensor, name)

        def counted(self, _original=original, _name=name):
            if f"{os.sep}dmlbench{os.sep}" in sys._getframe(1).f_code.co_filename:
                reads.append(_name)
            return _original(self)

        monkeypatch.setattr(torch.Tensor, name, counted)
    from dmlbench.training.data import load_run_data
    from dmlbench.training.trainer import Trainer

    counts = {}
    for batches in (2, 6):
        run = tiny_run(params, method, epochs=10)  # D&C's fine-tune phase starts after epoch 3
        run["training"]["sampler"]["batches_per_epoch"] = batches
        run["training"]["embedding_dim"] = 72  # divisible by 8 learners and by DeML's 9
        trainer = Trainer(
            run,
            load_run_data(run, tiny_manifest),
            tmp_path / f"o{batches}",
            tmp_path / f"s{batches}",
            torch.device("cpu"),
            progress=False,
        )
        reads.clear()
        trainer.train_epoch(1)
        counts[batches] = len(reads)
    assert counts[6] == counts[2] <= 3, counts


def test_the_decoded_pipeline_keeps_its_loader_workers_across_epochs(params, tiny_manifest, tmp_path):
    """Its items draw nothing random in the workers, so one loader (persistent workers) serves every epoch;
    the pil pipeline's workers draw the crops and start afresh, seeded, every epoch."""
    from dmlbench.training.data import load_run_data
    from dmlbench.training.trainer import Trainer

    loaders = {}
    for pipeline in ("decoded_uint8", "pil"):
        run = tiny_run(params, "binomial")
        run["training"].update(pipeline=pipeline, num_workers=1)
        trainer = Trainer(
            run,
            load_run_data(run, tiny_manifest),
            tmp_path / pipeline,
            tmp_path / f"s{pipeline}",
            torch.device("cpu"),
            progress=False,
        )
        sampler = trainer.recipe.build_sampler(trainer.data.train.labels, torch.Generator().manual_seed(0))
        loaders[pipeline] = (trainer._epoch_loader(sampler, 1), trainer._epoch_loader(sampler, 2))
    first, second = loaders["decoded_uint8"]
    assert first is second and first.persistent_workers
    first, second = loaders["pil"]
    assert first is not second and not first.persistent_workers


def test_selection_val_without_validation_split_is_an_error(params, tiny_manifest, tmp_path):
    run = tiny_run(params)
    run["training"]["val_fraction"] = 0.0
    with pytest.raises(ValueError, match="val_fraction is 0"):
        train(run, tiny_manifest, tmp_path)


def test_paper_protocol_on_a_query_gallery_dataset(params, tiny_manifest, tmp_path):
    frame = pd.read_csv(tiny_manifest)
    test_rows = frame.index[frame["split"] == "test"]
    frame.loc[test_rows, "split"] = ["query" if i % 2 else "gallery" for i in range(len(test_rows))]
    manifest = tiny_manifest.with_name("qg.csv")
    frame.to_csv(manifest, index=False)
    run = tiny_run(params, "contrastive", epochs=2)
    run["training"]["selection"] = "test"
    train(run, manifest, tmp_path)
    _, log = outputs(tmp_path)
    assert log["test_R@1"].between(0, 1).all()


def test_channels_last_lays_out_the_weights_and_trains_to_the_same_result_within_rounding(
    params, tiny_manifest, tmp_path
):
    """training.channels_last changes the memory layout of the convolutions only: same initial values,
    the same trained weights up to float rounding, and the layout is what the model gets."""
    from dmlbench.training.trainer import place_model

    run = tiny_run(params, "triplet", epochs=2)
    fast = copy.deepcopy(run)
    fast["training"]["channels_last"] = True
    conv = place_model(torch.nn.Conv2d(3, 4, 3), True, torch.device("cpu")).weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    results = {}
    for name, config in (("plain", run), ("fast", fast)):
        train_run(config, tiny_manifest, tmp_path / name, tmp_path / f"scratch_{name}", progress=False)
        results[name] = load_checkpoint(tmp_path / name / "checkpoint.pt")["model"]
    for key, value in results["plain"].items():
        torch.testing.assert_close(results["fast"][key], value, rtol=1e-3, atol=1e-4, msg=key)


def test_loader_workers_reach_validation_and_leave_the_result_unchanged(params, tiny_manifest, tmp_path, monkeypatch):
    """training.num_workers used to reach only the training loader: validation (every epoch) and
    the embed step decoded every image in the main process."""
    workers_seen: list[int] = []

    def recording_loader(*args, **kwargs):
        workers_seen.append(kwargs["num_workers"])
        return DataLoader(*args, **kwargs)

    monkeypatch.setattr(embedding, "DataLoader", recording_loader)
    logs = {}
    for workers in (0, 2):
        run = tiny_run(params, epochs=2)
        run["training"]["num_workers"] = workers
        out = tmp_path / f"w{workers}"
        train_run(run, tiny_manifest, out, tmp_path / f"s{workers}", progress=False)
        embed_run(out / "checkpoint.pt", tiny_manifest, out / "embeddings.npz")
        logs[workers] = pd.read_csv(out / "log.csv")["val_R@1"].tolist()
    # init parity (the method and its linear-head reference), 2 validations and the embed step, each
    assert workers_seen.count(2) == 5 and workers_seen.count(0) == 5
    assert logs[2] == logs[0]


def test_the_determinism_setting_switches_gpu_kernels_and_leaves_the_cpu_alone(monkeypatch):
    """training.deterministic on a GPU: deterministic cuDNN/torch kernels or autotuning (set on a
    CUDA device object; no GPU is needed to set the flags). On the CPU nothing changes."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", torch.backends.cudnn.deterministic)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    try:
        configure_determinism(False, torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled() == before
        configure_determinism(False, torch.device("cuda"))
        assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
        assert not torch.are_deterministic_algorithms_enabled()
        configure_determinism(True, torch.device("cuda"))
        assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(before)


def test_metrics_record_whether_training_was_deterministic(params, tiny_manifest, tmp_path):
    run = tiny_run(params, epochs=1)
    run["training"]["deterministic"] = False  # a CPU run is deterministic all the same
    train_run(run, tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    arrays = np.load(embed_run(tmp_path / "run" / "checkpoint.pt", tiny_manifest, tmp_path / "e.npz"))
    stats = dict(zip(arrays["stat_names"].tolist(), arrays["stat_values"].tolist(), strict=True))
    assert stats["deterministic"] == 1.0 and stats["training_gpu"] == -1.0
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["device"] == "cpu"


def test_a_kernel_without_a_deterministic_implementation_is_logged_once_and_clears_the_deterministic_stat(
    params, tiny_manifest, tmp_path, monkeypatch, capsys
):
    """torch's determinism alerts (``warn_only``) reach the run log once, with the epoch, and the run's
    ``deterministic`` stat says it was not deterministic: emulated on the CPU by a recipe step that
    warns as a CUDA kernel does."""
    from dmlbench.methods.base import Recipe

    alert = "upsample_bilinear2d_backward_out_cuda does not have a deterministic implementation, but you set ..."
    original = Recipe.training_loss

    def warning_step(self, *args, **kwargs):
        warnings.warn(alert, UserWarning)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Recipe, "training_loss", warning_step)
    run = tiny_run(params, epochs=2)
    train_run(run, tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    printed = capsys.readouterr().out
    assert printed.count("upsample_bilinear2d_backward_out_cuda") == 1 and "warning in epoch 1" in printed
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert checkpoint["nondeterministic_ops"] == ["upsample_bilinear2d_backward_out_cuda"]
    arrays = np.load(embed_run(tmp_path / "run" / "checkpoint.pt", tiny_manifest, tmp_path / "e.npz"))
    stats = dict(zip(arrays["stat_names"].tolist(), arrays["stat_values"].tolist(), strict=True))
    assert stats["deterministic"] == 0.0


def test_init_parity_is_recorded_with_a_reference_that_depends_on_the_backbone_and_seed_only(
    params, tiny_manifest, tmp_path, capsys
):
    summaries = {}
    for method in ("triplet", "contrastive"):
        out = tmp_path / method
        train_run(
            tiny_run(params, method, epochs=1), tiny_manifest, out, tmp_path / f"scratch_{method}", progress=False
        )
        summaries[method] = load_checkpoint(out / "checkpoint.pt")["summary"]
    summary = summaries["triplet"]
    stored = load_embeddings_npz(embed_run(tmp_path / "triplet" / "checkpoint.pt", tiny_manifest, tmp_path / "e.npz"))
    stats = check_stats(stored["stat_names"], stored["stat_values"])  # the evaluation step's own check of names
    assert {key: stats[key] for key in summary} == summary
    assert 0.0 < summary["health/init_val_r1"] <= 1.0
    assert summary["health/init_gap"] == summary["health/init_val_r1_linear_head"] - summary["health/init_val_r1"]
    assert summary["health/init_shortfall"] == (
        summary["health/init_val_r1_linear_head_lowest"] - summary["health/init_val_r1"]
    )
    assert summary["health/init_val_r1_linear_head_lowest"] <= summary["health/init_val_r1_linear_head"]
    assert summaries["contrastive"] == summary  # same backbone, same head draw, same reference draws
    assert "at init: val R@1" in capsys.readouterr().out


def test_init_parity_measures_a_method_against_the_linear_head_on_the_same_backbone(
    params, tiny_manifest, tmp_path, monkeypatch
):
    """A method whose test-time embedding at init is not the baseline's is measured as such: here a gate
    stuck shut in front of the embedding layer (every image embeds to the same point)."""
    from dmlbench.methods.base import Recipe

    original = Recipe.build_model

    def gated_shut(self):
        model = original(self)
        model.head.linear.weight.data.zero_()
        return model

    monkeypatch.setattr(Recipe, "build_model", gated_shut)
    run = tiny_run(params, "triplet", epochs=1)
    train_run(run, tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    summary = load_checkpoint(tmp_path / "run" / "checkpoint.pt")["summary"]
    gap = summary["health/init_val_r1_linear_head"] - summary["health/init_val_r1"]
    assert summary["health/init_gap"] == pytest.approx(gap) and gap > 0.02
    assert summary["health/init_shortfall"] > 0.02  # below every linear-head draw: the report marks it


def test_wait_clock_counts_only_the_time_spent_waiting_for_items():
    def slow_items():
        for item in range(3):
            time.sleep(0.05)
            yield item

    clock = WaitClock(slow_items())
    seen = []
    for item in clock:
        time.sleep(0.1)  # the consumer's own work is not waiting
        seen.append(item)
    assert seen == [0, 1, 2]
    assert 0.15 <= clock.seconds < 0.15 + 0.25  # three waits; none of the consumer's 0.3 s


def test_log_records_the_share_of_each_epoch_spent_waiting_for_the_loader(params, tiny_manifest, tmp_path):
    train(tiny_run(params, epochs=2), tiny_manifest, tmp_path)
    share = pd.read_csv(tmp_path / "out" / "log.csv")["loader_wait_share"]
    assert len(share) == 2 and ((share > 0) & (share < 1)).all()
