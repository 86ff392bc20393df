"""External components (issue 30, item 3): pytorch-metric-learning losses and miners (``pml:<Class>``) and timm
backbones (``timm:<model>``) through adapters, beside the project's paper-exact built-ins."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, copy_workflow, tiny_run
from pytorch_metric_learning import distances, losses, miners

from dmlbench.cli import main
from dmlbench.config import ConfigError, resolve_run
from dmlbench.losses import build_loss
from dmlbench.losses.pml_adapter import PMLLoss
from dmlbench.methods import build_recipe
from dmlbench.methods.validation import check_planned_methods
from dmlbench.models.backbones import build_backbone
from dmlbench.models.backbones.weights import PretrainedWeightsError
from dmlbench.params import load_config
from dmlbench.settings import OptimizerSettings
from dmlbench.training.optim import parameter_groups

#: timm is an optional dependency (the ``test`` extra installs it): without it only the PML tests run.
needs_timm = pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="pip install 'dmlbench[timm]'")

#: a small ResNet every timm 1.x has (4.9 M parameters), for the tests that build one without training it.
SMALL_TIMM = "timm:resnet10t"


def pml_timm_overlay(backbone: str = SMALL_TIMM) -> dict:
    """The overlay of the end-to-end test and the dry run: multi-similarity (PML, with its miner) on a timm
    backbone, from scratch."""
    return {
        "methods": {
            "pml_ms": {
                "label": "Multi-similarity (PML) on a timm backbone",
                "recipe": "baseline",
                "loss": {
                    "name": "pml:MultiSimilarityLoss",
                    "alpha": 2,
                    "beta": 50,
                    "base": 0.5,
                    "miner": {"name": "pml:MultiSimilarityMiner", "epsilon": 0.1},
                },
                "training": {
                    "backbone": {"name": backbone, "width": None, "pretrained": None, "freeze_bn": False},
                    "optimizer": {"lr": 0.002, "head_lr_multiplier": 1.0},
                },
            }
        }
    }


def smallest_timm_resnet() -> str:
    """timm's tiny test ResNet (0.4 M parameters; in timm releases since late 2024), else ResNet-10-T."""
    import timm

    return "timm:test_resnet" if timm.is_model("test_resnet") else SMALL_TIMM


@pytest.fixture
def timm():
    """The timm module (its tests are marked needs_timm)."""
    return pytest.importorskip("timm")


@pytest.fixture
def overlay(tmp_path: Path) -> Path:
    path = tmp_path / "my_pml_timm.yaml"
    path.write_text(yaml.safe_dump(pml_timm_overlay()))
    return path


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A hand-made batch: 4 classes × 2 in 4-D, classes overlapping (every miner finds tuples)."""
    rows = torch.tensor(
        [
            [-0.67, -0.68, -0.15, -0.26],
            [0.35, 0.29, -0.13, -0.88],
            [0.23, -0.91, 0.25, 0.22],
            [0.07, 0.73, 0.66, -0.15],
            [-0.57, -0.71, 0.24, 0.33],
            [0.24, -0.62, -0.14, 0.74],
            [0.76, -0.59, -0.18, 0.19],
            [0.56, 0.64, 0.38, -0.34],
        ]
    )
    return F.normalize(rows, dim=1), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])


# --- PML losses -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {
                "name": "pml:MultiSimilarityLoss",
                "alpha": 2,
                "beta": 50,
                "base": 0.5,
                "miner": {"name": "pml:MultiSimilarityMiner", "epsilon": 0.1},
            },
            lambda e, y: losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5)(
                e, y, miners.MultiSimilarityMiner(0.1)(e, y)
            ),
        ),
        ({"name": "pml:MultiSimilarityLoss"}, lambda e, y: losses.MultiSimilarityLoss()(e, y)),
        (
            {
                "name": "pml:TripletMarginLoss",
                "margin": 0.1,
                "distance": "pml:CosineSimilarity",
                "miner": {
                    "name": "pml:TripletMarginMiner",
                    "margin": 0.1,
                    "type_of_triplets": "semihard",
                    "distance": "pml:CosineSimilarity",
                },
            },
            lambda e, y: losses.TripletMarginLoss(margin=0.1, distance=distances.CosineSimilarity())(
                e,
                y,
                miners.TripletMarginMiner(
                    margin=0.1, type_of_triplets="semihard", distance=distances.CosineSimilarity()
                )(e, y),
            ),
        ),
    ],
)
def test_the_adapter_gives_pmls_own_value(config, expected):
    embeddings, labels = batch()
    loss = build_loss(config, num_classes=4, embedding_dim=4)
    assert isinstance(loss, PMLLoss)
    value = loss(embeddings.clone().requires_grad_(), labels)
    reference = expected(embeddings, labels)
    assert value.ndim == 0 and float(reference) > 0
    torch.testing.assert_close(value, reference)
    value.backward()  # a training loss: it has a graph


def test_proxy_losses_get_the_runs_classes_and_dimension_and_train_their_proxies():
    """pml:ProxyAnchorLoss takes num_classes and embedding_size from the run; its proxies join the optimiser's
    ``loss`` group at ``lr × loss_lr_multiplier`` and match PML's own value given the same proxies."""
    embeddings, labels = batch()
    loss = build_loss({"name": "pml:ProxyAnchorLoss", "margin": 0.1, "alpha": 32}, num_classes=4, embedding_dim=4)
    proxies = loss.loss.proxies
    assert proxies.shape == (4, 4) and proxies.requires_grad
    reference = losses.ProxyAnchorLoss(num_classes=4, embedding_size=4, margin=0.1, alpha=32)
    reference.proxies.data.copy_(proxies.data)
    torch.testing.assert_close(loss(embeddings, labels), reference(embeddings, labels))
    model = torch.nn.Module()
    model.backbone = torch.nn.Linear(2, 2)
    groups = parameter_groups(OptimizerSettings(name="adam", lr=0.01, loss_lr_multiplier=10.0), model, loss)
    loss_group = next(g for g in groups if g["name"] == "loss")
    assert [id(p) for p in loss_group["params"]] == [id(proxies)] and loss_group["lr"] == pytest.approx(0.1)
    assert "loss.proxies" in loss.state_dict()  # saved with the checkpoint
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\]"):
        loss(embeddings, labels + 1)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"name": "pml:MultiSimilartyLoss"},
            r"no loss class 'MultiSimilartyLoss' \(did you mean 'MultiSimilarityLoss'\?\)",
        ),
        ({"name": "pml:Multi"}, r"no loss class 'Multi'; close names: MultiSimilarityLoss"),
        (
            {"name": "pml:MultiSimilarityLoss", "miner": "pml:BatchHard"},
            r"loss.miner = 'pml:BatchHard'.*\(did you mean 'BatchHardMiner'\?\)",
        ),
        ({"name": "pml:BaseMetricLossFunction"}, "no loss class 'BaseMetricLossFunction'"),
        ({"name": "pml:CrossBatchMemory"}, "no loss class 'CrossBatchMemory'"),  # a wrapper, not a loss
        ({"name": "pml:VICRegLoss"}, "not supported: self-supervised"),
        ({"name": "pml:__class__"}, "named 'pml:<ClassName>'"),
        ({"name": "pml:os.system"}, "named 'pml:<ClassName>'"),
        ({"name": "multi_similarity"}, r"unknown loss name 'multi_similarity'.*or 'pml:<LossClass>'"),
    ],
)
def test_a_bad_class_name_is_an_error_with_suggestions(config, message):
    with pytest.raises(ValueError, match=message):
        build_loss(config, num_classes=4, embedding_dim=4)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"name": "pml:ProxyAnchorLoss", "margn": 0.1},
            r"ProxyAnchorLoss has no keyword argument 'margn'; accepted: alpha",
        ),
        (
            {"name": "pml:MultiSimilarityLoss", "miner": {"name": "pml:MultiSimilarityMiner", "eps": 0.1}},
            r"loss.miner: pml:MultiSimilarityMiner has no keyword argument 'eps'; accepted: .*epsilon",
        ),
        (
            {"name": "pml:ProxyAnchorLoss", "num_classes": 10},
            r"'num_classes' of pml:ProxyAnchorLoss comes from the run",
        ),
        ({"name": "pml:MultiSimilarityLoss", "mat_based_loss": True}, "no keyword argument 'mat_based_loss'"),
        ({"name": "pml:TripletMarginLoss", "margin": {"value": 1}}, r"loss.margin = .*must be a number"),
        ({"name": "pml:RankedListLoss"}, r"RankedListLoss needs 'margin', 'Tn'"),
        ({"name": "triplet", "miner": "pml:BatchHardMiner"}, "'miner' applies to pml: losses only"),
    ],
)
def test_an_unknown_or_wrong_keyword_argument_is_an_error_naming_it(config, message):
    with pytest.raises(ValueError, match=message):
        build_loss(config, num_classes=4, embedding_dim=4)


def test_a_batch_without_tuples_gives_zero_with_a_graph():
    embeddings = F.normalize(torch.randn(4, 3), dim=1).requires_grad_()
    value = build_loss({"name": "pml:TripletMarginLoss"}, 2, 3)(embeddings, torch.arange(4))  # no positive pair
    assert value.item() == 0.0 and value.requires_grad


# --- timm backbones ---------------------------------------------------------------------------------------------


@needs_timm
def test_timm_resnet18_has_named_cut_points_and_frozen_batchnorm(timm):
    """Random init (no file), a 32 px batch: the stages are timm's feature stages, the methods' cut points work,
    ``frozen_through`` and ``freeze_bn`` hold in train mode."""
    torch.manual_seed(0)
    run = resolve_run(load_config([REPO / "params.yaml"]), "synthetic", "triplet", 0)
    run["training"]["backbone"] = {
        "name": "timm:resnet18",
        "pretrained": False,
        "freeze_bn": True,
        "frozen_through": "layer1",
    }
    model = build_recipe(run).build_model()
    backbone = model.backbone
    assert backbone.stage_names == ("act1", "layer1", "layer2", "layer3", "layer4", "pool")
    assert backbone.out_channels == {
        "act1": 64,
        "layer1": 64,
        "layer2": 128,
        "layer3": 256,
        "layer4": 512,
        "pool": timm.create_model("resnet18", num_classes=0).num_features,
    }
    images = torch.rand(2, 3, 32, 32)
    assert backbone(images, until="layer2").shape == (2, 128, 4, 4)
    tail = backbone.stages(after="layer2", until="pool")
    assert tail(backbone(images, until="layer2")).shape == (2, 512)
    model.train()
    norms = [m for m in backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.training and not m.weight.requires_grad for m in norms)
    frozen = [p for n in ("act1", "layer1") for p in backbone.body[n].parameters()]
    trained = [
        p
        for n, m in backbone.body.items()
        if n not in ("act1", "layer1")
        for p in m.parameters()
        if not any(p is q for bn in norms for q in bn.parameters())
    ]
    assert all(not p.requires_grad for p in frozen) and all(p.requires_grad for p in trained)
    embeddings = model(images)
    assert embeddings.shape == (2, run["training"]["embedding_dim"])
    torch.testing.assert_close(embeddings.norm(dim=1), torch.ones(2))


@needs_timm
@pytest.mark.parametrize(
    ("model", "last_stages", "pool"),
    [
        ("efficientnet_b0", ("blocks_6", "conv_head", "pool"), 1280),  # conv_head: forward_features after its stages
        ("mobilenetv3_small_050", ("blocks_3", "blocks_5", "pool"), 1024),  # pool: timm's pre-logits projection too
    ],
)
def test_the_staged_timm_model_computes_what_timm_computes(timm, model: str, last_stages: tuple, pool: int):
    torch.manual_seed(0)
    backbone = build_backbone({"name": f"timm:{model}"}).eval()
    torch.manual_seed(0)
    same = timm.create_model(model, num_classes=0).eval()  # same seed: the same random weights
    assert backbone.stage_names[-3:] == last_stages and backbone.out_channels["pool"] == pool
    images = torch.rand(2, 3, 64, 64)
    mean, std = torch.tensor(same.pretrained_cfg["mean"]), torch.tensor(same.pretrained_cfg["std"])
    with torch.no_grad():
        torch.testing.assert_close(backbone(images), same((images - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)))


@needs_timm
def test_a_cut_point_the_timm_model_lacks_is_a_clear_error():
    with pytest.raises(ValueError, match=r"frozen_through: backbone has no stage 'stage2'; stages are \['act1'"):
        build_backbone({"name": "timm:resnet18", "frozen_through": "stage2"})
    # a ViT's forward pass is not a sequence of its modules: two stages, features and pool
    vit = build_backbone({"name": "timm:vit_tiny_patch16_224"})
    assert vit.stage_names == ("features", "pool") and vit.out_channels["pool"] == 192
    with pytest.raises(KeyError, match=r"no stage 'blocks_3'; stages are \['features', 'pool'\]"):
        vit.stages(after="blocks_3", until="pool")
    # a recipe whose cut points the model lacks (DIABLO's defaults name small_cnn's stages)
    run = resolve_run(load_config([REPO / "params.yaml"]), "synthetic", "diablo", 0)
    run["training"]["backbone"] = {"name": "timm:resnet18", "pretrained": None}
    with pytest.raises(ValueError, match=r"methods.diablo.options.*no stage 'stage\d'; stages are \['act1'"):
        build_recipe(run).build_model()


@needs_timm
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("timm:resnt18", r"timm has no model 'resnt18' \(did you mean 'resnet18'\?\)"),
        ("timm:resnet18.bogus", "no pretrained tag 'bogus' for resnet18; known: a1_in1k"),
        ("timm:ResNet18", "named 'timm:<model>'"),
        ("timm:../resnet18", "named 'timm:<model>'"),
    ],
)
def test_a_bad_timm_name_is_an_error(name, message):
    with pytest.raises(ValueError, match=message):
        build_backbone({"name": name})


@needs_timm
def test_a_missing_local_weights_file_is_a_clear_error(tmp_path: Path):
    missing = tmp_path / "resnet18.safetensors"
    with pytest.raises(PretrainedWeightsError, match=f"weights file {re.escape(str(missing))} not found"):
        build_backbone({"name": "timm:resnet18", "pretrained": str(missing)})
    for source in ("imagenet", True):
        with pytest.raises(PretrainedWeightsError, match=f"pretrained: {source!r} is not a source of a timm model"):
            build_backbone({"name": "timm:resnet18", "pretrained": source})


@needs_timm
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_local_weights_load_checksummed_and_a_wrong_model_is_refused(timm, tmp_path: Path, suffix: str):
    from safetensors.torch import save_file

    torch.manual_seed(5)
    source = timm.create_model("resnet10t", num_classes=1000)  # with its classifier, as published files are
    path = tmp_path / f"weights{suffix}"
    save_file(source.state_dict(), str(path)) if suffix == ".safetensors" else torch.save(source.state_dict(), path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    backbone = build_backbone({"name": SMALL_TIMM, "pretrained": {"path": str(path), "sha256": sha}})
    assert torch.equal(backbone.body["act1"].conv1[0].weight, source.conv1[0].weight)
    with pytest.raises(PretrainedWeightsError, match="sha256 mismatch"):
        build_backbone({"name": SMALL_TIMM, "pretrained": str(path), "weights_sha256": "0" * 64})
    with (
        pytest.raises(PretrainedWeightsError, match="does not match the timm resnet18 key layout"),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # no sha256 given: a warning prints it
        build_backbone({"name": "timm:resnet18", "pretrained": str(path)})


@needs_timm
def test_pretrained_timm_reads_timms_cache_and_never_downloads(timm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``pretrained: timm`` finds the file in the Hugging Face hub cache (checked against its blob's sha256);
    an empty cache is an error saying how to fetch it once, and no network is touched."""
    import huggingface_hub.constants
    from safetensors.torch import save_file

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr("socket.socket.connect", lambda *a, **k: pytest.fail("network access"))
    with pytest.raises(
        PretrainedWeightsError,
        match=r"(?s)not in timm's cache.*timm.create_model\('resnet10t.c3_in1k', "
        r"pretrained=True\)",
    ):
        build_backbone({"name": SMALL_TIMM, "pretrained": "timm"})
    torch.manual_seed(7)
    source = timm.create_model("resnet10t", num_classes=1000)
    blob = tmp_path / "blob.safetensors"
    save_file(source.state_dict(), str(blob))
    sha = hashlib.sha256(blob.read_bytes()).hexdigest()
    repo = tmp_path / "hub" / "models--timm--resnet10t.c3_in1k"
    (repo / "blobs").mkdir(parents=True)
    blob.rename(repo / "blobs" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "model.safetensors").symlink_to(repo / "blobs" / sha)
    backbone = build_backbone({"name": "timm:resnet10t.c3_in1k", "pretrained": "timm"})
    assert torch.equal(backbone.body["layer4"].layer4[0].conv1.weight, source.layer4[0].conv1.weight)
    (repo / "blobs" / sha).write_bytes(b"corrupt")
    with pytest.raises(PretrainedWeightsError, match="sha256 mismatch"):
        build_backbone({"name": SMALL_TIMM, "pretrained": "timm"})


# --- configuration, listing, training, planning ----------------------------------------------------------------


@needs_timm
def test_the_schema_and_the_method_checks_take_the_prefixed_names(overlay: Path, tmp_path: Path):
    config = load_config([REPO / "params.yaml", overlay])
    check_planned_methods(config)
    for bad, message in [
        ({"loss": {"name": "pml:Multi Similarity"}}, "methods.pml_ms.loss.name"),
        ({"loss": {"miner": "MultiSimilarityMiner"}}, "methods.pml_ms.loss.miner"),
        ({"training": {"backbone": {"name": "timm:ResNet18"}}}, "training.backbone.name"),
    ]:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump({"methods": {"pml_ms": bad}}))
        with pytest.raises(ConfigError, match=message):
            load_config([REPO / "params.yaml", overlay, path])
    path = tmp_path / "synthetic_weights.yaml"
    path.write_text(yaml.safe_dump({"methods": {"pml_ms": {"training": {"backbone": {"pretrained": "synthetic"}}}}}))
    with pytest.raises(
        ConfigError,
        match="methods.pml_ms on synthetic: .*pretrained: 'synthetic' is not a source of a timm model's weights",
    ):
        check_planned_methods(load_config([REPO / "params.yaml", overlay, path]))


@needs_timm
def test_list_shows_the_built_ins_and_the_prefixed_forms(timm, capsys):
    assert main(["list", "losses"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^triplet +Triplet loss", out, flags=re.MULTILINE)
    assert re.search(
        r"^pml:<LossClass> +a pytorch-metric-learning loss.*\b\d+: .*MultiSimilarityLoss", out, flags=re.MULTILINE
    )
    assert re.search(r"^pml:<MinerClass> +.*MultiSimilarityMiner", out, flags=re.MULTILINE)
    assert main(["list", "backbones"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^resnet50 +ResNet-50", out, flags=re.MULTILINE)
    assert re.search(rf"^timm:<model> +any of timm's {len(timm.list_models())} models", out, flags=re.MULTILINE)


def test_neither_library_is_imported_unless_a_prefixed_component_is_built(overlay: Path):
    """Reading parameters that name them, building the built-ins: neither timm nor PML is imported."""
    code = (
        "import sys\nfrom dmlbench.params import load_config\nfrom dmlbench.losses import build_loss\n"
        "from dmlbench.models.backbones import build_backbone\n"
        f"load_config([{str(REPO / 'params.yaml')!r}, {str(overlay)!r}])\n"
        "build_loss({'name': 'triplet'}, 4, 8)\nbuild_backbone({'name': 'small_cnn', 'width': 4})\n"
        "print(sorted(m for m in ('timm', 'pytorch_metric_learning') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


@needs_timm
def test_pml_multi_similarity_on_a_timm_backbone_trains_one_epoch(tiny_manifest, tmp_path):
    """The done-when of issue 30, item 3: pml:MultiSimilarityLoss with its miner and a timm backbone train one
    epoch on the tiny dataset, through the overlay, the recipe and the trainer."""
    from dmlbench.training.trainer import train_run

    path = tmp_path / "my_pml_timm.yaml"
    path.write_text(yaml.safe_dump(pml_timm_overlay(smallest_timm_resnet())))
    run = tiny_run(load_config([REPO / "params.yaml", path]), "pml_ms", epochs=1)
    run["training"]["backbone"].pop("width")  # tiny_run's small_cnn setting
    result = train_run(run, tiny_manifest, tmp_path / "run", tmp_path / "scratch", progress=False)
    log = (tmp_path / "run" / "log.csv").read_text().splitlines()
    assert len(log) == 2 and result.best_epoch == 1  # header + one epoch
    loss = float(log[1].split(",")[log[0].split(",").index("loss")])
    assert 0 < loss < float("inf")


@needs_timm
def test_snakemake_plans_a_pml_loss_on_a_timm_backbone_from_an_overlay(tmp_path: Path):
    project = copy_workflow(tmp_path)
    (project / "my_pml_timm.yaml").write_text(yaml.safe_dump(pml_timm_overlay()))
    plan = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "-p",
            "--cores",
            "1",
            "--configfile",
            "my_pml_timm.yaml",
            "--",
            "results/runs/synthetic/pml_ms/seed0/metrics.json",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = plan.stdout + plan.stderr
    assert plan.returncode == 0, output[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", output, flags=re.MULTILINE))
    assert {"train", "embed", "evaluate"} <= set(jobs), output[-3000:]
    assert re.search(r"dmlbench train --dataset synthetic --method pml_ms --seed 0", output)
