"""DIABLO (recipe ``diablo``): selection, merge, placements, the recipe's loss and hooks."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from dmlbench.evaluation import evaluate_file
from dmlbench.losses import build_loss
from dmlbench.methods import OptionsError, build_recipe
from dmlbench.methods.diablo import (
    PROBE_IMAGES,
    DIABLOOptions,
    attention_change,
    attention_entropy_ratio,
    dictionary_usage,
    relative_change,
)
from dmlbench.methods.health import failed_checks
from dmlbench.models.backbones import StagedBackbone, build_small_cnn
from dmlbench.models.diablo import (
    DIABLO,
    DictionarySelection,
    cosine_similarities,
    merge,
    resize_attention,
    select,
)
from dmlbench.settings import OptimizerSettings
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.embed import embed_run
from dmlbench.training.optim import parameter_groups
from dmlbench.training.trainer import train_run

from conftest import parameter_group_ids, tiny_run

#: cut points of the tiny small_cnn per placement (post-attention branches one stage later, as in §4.1).
CUTS = {
    "pre": {"feature_stage": "stage2", "phi_until": "stage3", "psi_until": "stage4"},
    "post": {"feature_stage": "stage3", "phi_until": "stage4", "psi_until": "stage4"},
}


def tiny_model(
    selection: str = "dimension",
    placement: str = "pre",
    n: int = 2,
    dim: int = 8,
    hardness: float = 10.0,
    freeze_bn: bool = False,
) -> DIABLO:
    torch.manual_seed(0)
    return DIABLO(
        build_small_cnn(width=4),
        selection=selection,
        placement=placement,
        num_entries=n,
        hardness=hardness,
        embedding_dim=dim,
        freeze_bn=freeze_bn,
        **CUTS[placement],
    )


def diablo_run(params: dict, epochs: int = 2, **options) -> dict:
    run = tiny_run(params, "binomial", epochs=epochs)
    run["method"] = "diablo_test"
    run["method_config"].update(recipe="diablo", options={"dictionary_size": 2, **options})
    return run


# --- selection block -------------------------------------------------------------------------------
@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_selection_normalises_over_the_dictionary_axis(selection):
    torch.manual_seed(1)
    block = DictionarySelection(selection, in_channels=5, num_entries=4, channels=3, hardness=2.0)
    weights = block(torch.randn(2, 5, 3, 4))
    # feature-wise: one weight per position (channel axis 1); dimension-wise: per position and dimension
    assert weights.shape == ((2, 4, 1, 3, 4) if selection == "feature" else (2, 4, 3, 3, 4))
    torch.testing.assert_close(weights.sum(dim=1), torch.ones_like(weights[:, 0]))  # over the N entries only


@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_large_hardness_gives_the_one_hot_arg_max_of_eq6(selection):
    torch.manual_seed(2)
    block = DictionarySelection(selection, in_channels=6, num_entries=5, channels=3, hardness=1e4)
    phi = torch.randn(2, 6, 3, 3)
    weights = block(phi)
    n, rows, m = block.dictionary.shape
    # cosine similarities computed independently, position by position
    cosines = F.cosine_similarity(
        phi.permute(0, 2, 3, 1)[:, None, None],  # (B, 1, 1, h, w, m)
        block.dictionary[None, :, :, None, None, :],
        dim=-1,
    )  # → (B, N, rows, h, w)
    one_hot = F.one_hot(cosines.argmax(dim=1), n).permute(0, 4, 1, 2, 3).float()
    torch.testing.assert_close(weights, one_hot, rtol=0, atol=1e-12)
    assert torch.equal(weights.argmax(dim=1), cosines.argmax(dim=1))


def test_cosine_similarity_is_scale_free_and_zero_for_a_zero_feature():
    directions = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    features = torch.tensor([[3.0, 0.0], [0.0, 0.0]]).T.reshape(1, 2, 1, 2)  # positions (3, 0) and (0, 0)
    s = cosine_similarities(features, 5 * directions)
    torch.testing.assert_close(s[0, :, 0, 0], torch.tensor([1.0, 1 / math.sqrt(2)]))
    torch.testing.assert_close(s[0, :, 0, 1], torch.zeros(2))


# --- hand-checked 2×2 example ----------------------------------------------------------------------
#: φ(F) on a 2×2 map (m = 2): positions (0,0)=(1,0), (0,1)=(0,2), (1,0)=(1,1), (1,1)=(−1,0).
PHI = torch.tensor([[[1.0, 0.0], [1.0, -1.0]], [[0.0, 2.0], [1.0, 0.0]]]).unsqueeze(0)  # (1, 2, 2, 2)
#: α = ln 3, so a cosine gap of 1 gives weights 3 : 1 → 0.75 / 0.25.
ALPHA = math.log(3.0)


def test_feature_wise_hand_checked_on_a_2x2_map_with_2_entries():
    block = DictionarySelection("feature", in_channels=2, num_entries=2, channels=1, hardness=ALPHA)
    with torch.no_grad():
        block.dictionary.copy_(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    weights = block(PHI)  # cosines: (1,0) (0,1) (1/√2,1/√2) (−1,0)
    expected = torch.tensor(
        [
            [[0.75, 0.25], [0.5, 0.25]],  # entry 1
            [[0.25, 0.75], [0.5, 0.75]],
        ]
    )  # entry 2
    torch.testing.assert_close(weights[0, :, 0], expected)
    features = torch.tensor([[[2.0, 4.0], [6.0, 8.0]], [[1.0, 1.0], [1.0, 1.0]]]).unsqueeze(0)  # c = 2
    merged = merge(features, weights, scale="paper")  # Eq. 8–9 literally
    assert merged.shape == (1, 2, 2, 2, 2)
    torch.testing.assert_close(merged[0, 0, 0], torch.tensor([[1.5, 1.0], [3.0, 2.0]]))
    torch.testing.assert_close(merged[0, 1, 0], torch.tensor([[0.5, 3.0], [3.0, 6.0]]))
    torch.testing.assert_close(merged[0, 1, 1], expected[1])
    for i in range(2):  # Eq. 9: H_ij = A_ij ⊗ f_ij
        for j in range(2):
            torch.testing.assert_close(
                merged[0, :, :, i, j].reshape(-1), torch.kron(weights[0, :, 0, i, j], features[0, :, i, j])
            )
    torch.testing.assert_close(merge(features, weights, scale="identity"), 2 * merged)  # × N = 2


def test_dimension_wise_hand_checked_on_a_2x2_map_with_2_entries():
    block = DictionarySelection("dimension", in_channels=2, num_entries=2, channels=2, hardness=ALPHA)
    with torch.no_grad():  # dimension 1 as in the feature-wise test; dimension 2 with the entries swapped
        block.dictionary.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]))
    weights = block(PHI)
    first = torch.tensor([[[0.75, 0.25], [0.5, 0.25]], [[0.25, 0.75], [0.5, 0.75]]])
    torch.testing.assert_close(weights[0, :, 0], first)
    torch.testing.assert_close(weights[0, :, 1], first.flip(0))
    features = torch.tensor([[[2.0, 4.0], [6.0, 8.0]], [[4.0, 8.0], [12.0, 4.0]]]).unsqueeze(0)
    merged = merge(features, weights, scale="paper")
    # Eq. 13: (F ⊗ 1_N) ⊙ A
    torch.testing.assert_close(merged[0, 0, 1], torch.tensor([[1.0, 6.0], [6.0, 3.0]]))
    torch.testing.assert_close(merged[0, 1, 1], torch.tensor([[3.0, 2.0], [6.0, 1.0]]))
    torch.testing.assert_close(merged, features.repeat(1, 2, 1, 1).reshape(1, 2, 2, 2, 2) * weights)


def test_merge_rejects_maps_that_do_not_fit():
    with pytest.raises(ValueError, match=r"expected \(B, N, 1 or c, h, w\)"):
        merge(torch.ones(1, 3, 2, 2), torch.ones(1, 2, 2, 2, 2), scale="identity")
    with pytest.raises(ValueError, match="scale must be 'identity' or 'paper'"):
        merge(torch.ones(1, 2, 2, 2), torch.ones(1, 2, 2, 2, 2), scale="sum")


# --- merge scale: uniform attention is the identity ------------------------------------------------
@pytest.mark.parametrize("channels", [1, 3], ids=["feature", "dimension"])
def test_uniform_attention_merges_to_the_identity(channels):
    """Uniform = 1/N for every entry at every position (and, dimension-wise, every channel): each of
    the N branches then receives X itself; the paper-literal merge gives X / N."""
    features = torch.randn(2, 3, 4, 5)
    uniform = torch.full((2, 4, channels, 4, 5), 1 / 4)
    for n in range(4):
        torch.testing.assert_close(merge(features, uniform, scale="identity")[:, n], features)
        torch.testing.assert_close(merge(features, uniform, scale="paper")[:, n], features / 4)


def test_identity_merge_keeps_x_as_the_mean_over_the_branches():
    """For any attention (not only uniform), the N merged maps average to X: the merge splits X."""
    torch.manual_seed(4)
    features = torch.randn(2, 3, 4, 4)
    attention = select(torch.randn(2, 5, 3, 4, 4), 3.0)
    torch.testing.assert_close(merge(features, attention, scale="identity").mean(dim=1), features)


#: the embedded default's backbone width and training crop (px): the test sees the default's feature sizes.
DEFAULT_WIDTH, DEFAULT_CROP = 16, 56


def pretrained_like_small_cnn() -> StagedBackbone:
    """The default small_cnn whose BatchNorm running statistics are those of its own activations (as
    in a pretrained network), so that frozen BatchNorm expects features of the backbone's own scale.
    φ is copied when DIABLO is built, so this must happen before."""
    torch.manual_seed(5)
    backbone = build_small_cnn(width=DEFAULT_WIDTH)
    for module in backbone.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # cumulative average over the calibration batches
    backbone.train()
    with torch.no_grad():
        for _ in range(4):
            backbone(torch.rand(16, 3, DEFAULT_CROP, DEFAULT_CROP), until="pool")
    return backbone


def pooled_at_init(
    selection: str, placement: str, hardness: float = 10.0, merge_scale: str = "identity", num_entries: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """(backbone's pooled features (B, C), DIABLO's pooled attended features (B, N, C)), frozen BN."""
    backbone = pretrained_like_small_cnn()
    torch.manual_seed(6)
    model = DIABLO(
        backbone,
        selection=selection,
        placement=placement,
        num_entries=num_entries,
        hardness=hardness,
        embedding_dim=8,
        freeze_bn=True,
        merge_scale=merge_scale,
        **CUTS[placement],
    ).train()
    images = torch.rand(6, 3, DEFAULT_CROP, DEFAULT_CROP)
    with torch.no_grad():
        return backbone(images, until="pool").flatten(1), model._pool(model.attend(images)[1])


@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_pre_attention_at_init_keeps_the_backbones_pooled_features(selection):
    """With frozen BatchNorm, ψ must receive maps of the scale its statistics expect: the branches'
    mean pooled features point where the backbone's do (N = 4, α = 10, a random dictionary). The
    paper-literal merge feeds ψ ≈ F / N: cosine 0.68–0.77 here (0.13 on CUB with EfficientNet)."""
    base, branches = pooled_at_init(selection, "pre")
    assert F.cosine_similarity(branches.mean(dim=1), base).mean() > 0.9
    assert (branches.mean(dim=1).norm(dim=1) / base.norm(dim=1)).min() > 0.5


@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_post_attention_branches_average_to_the_backbones_pooled_features(selection):
    base, branches = pooled_at_init(selection, "post")
    torch.testing.assert_close(branches.mean(dim=1), base)


@pytest.mark.parametrize("placement", ["pre", "post"])
@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_uniform_attention_makes_every_branch_the_backbone(selection, placement):
    """α → 0 makes the attention uniform: every branch then pools exactly the backbone's features;
    the paper-literal merge does not (pre-attention: frozen BN sees F / N)."""
    base, branches = pooled_at_init(selection, placement, hardness=1e-9)
    for n in range(branches.shape[1]):
        torch.testing.assert_close(branches[:, n], base)
    base, paper = pooled_at_init(selection, placement, hardness=1e-9, merge_scale="paper")
    assert not torch.allclose(paper[:, 0], base, rtol=0.05, atol=1e-3)


#: mean cosine of each branch's pooled features to the frozen backbone's that the default keeps at init.
MIN_BRANCH_COSINE_AT_INIT = 0.94


@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_default_block_at_init_keeps_every_branchs_frozen_features(selection):
    """Identity at initialisation for each branch, not only for their mean: with the default hardness the
    random dictionary's attention (logits of std α/√m) perturbs each branch's pooled features by a few
    per cent (N = 8, frozen BatchNorm, m = 64). The old α = 10 multiplied every element by N·A of std
    ≈ 0.9 on CUB: cosine 0.81 (dimension-wise) / 0.84 (feature-wise) here, R@1 at init 0.62 vs 0.77."""
    default = DIABLOOptions().hardness
    base, branches = pooled_at_init(selection, "pre", hardness=default, num_entries=8)
    assert F.cosine_similarity(branches, base[:, None], dim=2).mean() > MIN_BRANCH_COSINE_AT_INIT
    base, old = pooled_at_init(selection, "pre", hardness=10.0, num_entries=8)
    assert F.cosine_similarity(old, base[:, None], dim=2).mean() < MIN_BRANCH_COSINE_AT_INIT


def test_merge_scale_option_is_validated():
    with pytest.raises(ValueError, match="merge_scale must be 'identity' or 'paper'"):
        DIABLO(
            build_small_cnn(width=4),
            selection="feature",
            placement="pre",
            num_entries=2,
            hardness=1.0,
            embedding_dim=8,
            merge_scale="sum",
            **CUTS["pre"],
        )


# --- health numbers -----------------------------------------------------------------------------------
def test_attention_entropy_ratio_hand_checked():
    """H(A) / ln N averaged over positions: uniform 1 (dead), one-hot 0, (½, ½, 0, 0) → ln 2 / ln 4 = ½."""
    uniform = torch.full((2, 4, 3, 2, 2), 0.25)
    one_hot = F.one_hot(torch.randint(0, 4, (2, 3, 2, 2)), 4).permute(0, 4, 1, 2, 3).float()
    halves = torch.tensor([0.5, 0.5, 0.0, 0.0]).reshape(1, 4, 1, 1, 1).expand(2, 4, 1, 3, 3)
    assert float(attention_entropy_ratio(uniform)) == pytest.approx(1.0)
    assert float(attention_entropy_ratio(one_hot)) == pytest.approx(0.0)
    assert float(attention_entropy_ratio(halves)) == pytest.approx(0.5)
    mixed = torch.cat([uniform[:1, :, :1], one_hot[:1, :, :1]])  # one image of each: mean of 1 and 0
    assert float(attention_entropy_ratio(mixed)) == pytest.approx(0.5)


def test_dictionary_usage_hand_checked():
    """Perplexity of the mean assignment / N: all mass on one entry 1/N (dead), even use 1."""
    one_entry = torch.zeros(3, 4, 1, 2, 2)
    one_entry[:, 2] = 1.0
    assert dictionary_usage(one_entry) == pytest.approx(0.25)
    # sharp per position but every entry used equally often: usage 1 (and entropy ratio 0)
    spread = F.one_hot(torch.arange(4).repeat(2), 4).T.reshape(1, 4, 1, 2, 4).float()
    assert dictionary_usage(spread) == pytest.approx(1.0)
    two_of_four = torch.tensor([0.5, 0.5, 0.0, 0.0]).reshape(1, 4, 1, 1, 1)
    assert dictionary_usage(two_of_four) == pytest.approx(0.5)  # perplexity 2 of 4


def test_resized_attention_still_sums_to_one():
    weights = select(torch.randn(2, 3, 4, 5, 5), 4.0)
    resized = resize_attention(weights, (9, 7))
    assert resized.shape == (2, 3, 4, 9, 7)
    torch.testing.assert_close(resized.sum(dim=1), torch.ones(2, 4, 9, 7))
    assert resize_attention(weights, (5, 5)) is weights


# --- the model: placements and shapes ---------------------------------------------------------------
@pytest.mark.parametrize("selection", ["feature", "dimension"])
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_shapes_of_both_strategies_and_placements(selection, placement):
    model = tiny_model(selection, placement, n=4, dim=8)
    images = torch.rand(3, 3, 20, 20)
    attention, attended = model.attend(images)
    # small_cnn width 4 at 20 px: stage2 8×3×3, stage3 (φ of pre) 16×2×2, stage4 32×1×1
    merge_size, channels = ((3, 3), 8) if placement == "pre" else ((1, 1), 32)
    assert attention.shape == (3, 4, 1 if selection == "feature" else channels, *merge_size)
    assert attended.shape == (3, 4, 32, 1, 1)  # after ψ (pre) or merged with ψ(F) (post)
    out = model(images)
    assert out.shape == (3, 8) and model.learner_slices == [(0, 2), (2, 4), (4, 6), (6, 8)]
    torch.testing.assert_close(out.reshape(3, 4, 2).norm(dim=2), torch.ones(3, 4))


def test_one_entry_feature_wise_post_attention_is_plain_pooling():
    """N = 1: the only map is 1 everywhere, so the branch sees exactly ψ(F)."""
    model = tiny_model("feature", "post", n=1, dim=4).eval()
    images = torch.rand(2, 3, 20, 20)
    attention, attended = model.attend(images)
    assert torch.equal(attention, torch.ones_like(attention))
    torch.testing.assert_close(attended[:, 0], model.backbone(images, until="stage4"))


def test_psi_is_the_backbone_and_phi_its_own_copy():
    model = tiny_model("dimension", "pre")
    backbone_ids = {id(p) for p in model.backbone.parameters()}
    assert not backbone_ids & {id(p) for p in model.phi.parameters()}
    torch.testing.assert_close(model.phi.stage3[0].weight, model.backbone.body["stage3"][0].weight)
    head_ids = {id(p) for p in model.parameters()} - backbone_ids
    assert id(model.selection.dictionary) in head_ids


def test_phi_trains_at_the_backbone_lr():
    model = tiny_model()
    groups = parameter_group_ids(model)
    assert {id(p) for p in model.phi.parameters()} <= groups["backbone"]
    assert groups["head/dictionary"] == {id(model.selection.dictionary)}  # its own group, off the head's


@pytest.mark.parametrize("multiplier", [1.0, 10.0])
def test_the_dictionary_gets_its_own_lr_multiplier(params, multiplier):
    """``dictionary_lr_multiplier`` × the head's lr for the dictionary alone; the branch linears keep the
    head's lr (head_lr_multiplier 10 here)."""
    recipe = build_recipe(diablo_run(params, dictionary_lr_multiplier=multiplier))
    model = recipe.build_model()
    settings = OptimizerSettings(name="adam", lr=0.5, head_lr_multiplier=10.0)
    groups = {g["name"]: g for g in parameter_groups(settings, model, torch.nn.Module())}
    assert groups["head/dictionary"]["params"] == [model.selection.dictionary]
    assert groups["head/dictionary"]["lr"] == pytest.approx(0.5 * 10.0 * multiplier)
    assert groups["head"]["lr"] == pytest.approx(5.0)
    assert {id(p) for p in model.embeddings.parameters()} <= {id(p) for p in groups["head"]["params"]}
    with pytest.raises(OptionsError, match="dictionary_lr_multiplier must be > 0"):
        build_recipe(diablo_run(params, dictionary_lr_multiplier=0.0))


def test_unit_and_normal_dictionaries_have_the_same_directions():
    """Only the directions matter to the cosine: 'unit' rows have norm 1, 'normal' rows ≈ √m, and from the
    same RNG state the two give the same attention."""
    torch.manual_seed(7)
    unit = DictionarySelection("dimension", in_channels=64, num_entries=4, channels=3, hardness=3.0, init="unit")
    torch.manual_seed(7)
    normal = DictionarySelection("dimension", in_channels=64, num_entries=4, channels=3, hardness=3.0, init="normal")
    torch.testing.assert_close(unit.dictionary.norm(dim=-1), torch.ones(4, 3))
    assert normal.dictionary.norm(dim=-1).mean().item() == pytest.approx(8.0, rel=0.15)  # √64
    torch.testing.assert_close(unit.dictionary, F.normalize(normal.dictionary, dim=-1))
    phi = torch.randn(2, 64, 3, 3)
    torch.testing.assert_close(unit(phi), normal(phi))
    with pytest.raises(ValueError, match="dictionary init must be one of"):
        DictionarySelection("feature", in_channels=4, num_entries=2, channels=1, hardness=1.0, init="zeros")


def test_freeze_bn_keeps_backbone_and_phi_batchnorm_frozen():
    model = tiny_model(freeze_bn=True).train()
    norms = [m for part in (model.backbone, model.phi) for m in part.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.training and not m.weight.requires_grad for m in norms)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"phi_until": "stage2"}, "must come after the feature stage"),
        ({"psi_until": "pool"}, "before 'pool'"),
        ({"phi_until": "stage9"}, "no stage 'stage9'"),
    ],
)
def test_bad_cut_points_are_clear_errors(kwargs, message):
    cuts = {**CUTS["pre"], **kwargs}
    with pytest.raises((ValueError, KeyError), match=message):
        DIABLO(
            build_small_cnn(width=4),
            selection="feature",
            placement="pre",
            num_entries=2,
            hardness=1.0,
            embedding_dim=8,
            **cuts,
        )


# --- the recipe ----------------------------------------------------------------------------------
def test_recipe_options_and_errors_name_the_params_key(params):
    recipe = build_recipe(diablo_run(params, selection="feature", hardness=3))
    assert recipe.options.selection == "feature" and recipe.options.hardness == 3.0
    with pytest.raises(OptionsError, match="methods.diablo_test.options.selection"):
        build_recipe(diablo_run(params, selection="pixel"))
    with pytest.raises(OptionsError, match="hardness must be > 0"):
        build_recipe(diablo_run(params, hardness=0.0))
    with pytest.raises(
        ValueError,
        match=r"training.embedding_dim = 8 is not divisible by "
        r"methods.diablo_test.options.dictionary_size = 3",
    ):
        build_recipe(diablo_run(params, dictionary_size=3)).build_model()
    with pytest.raises(ValueError, match=r"methods.diablo_test.options.feature_stage.*stage 'nope'"):
        build_recipe(diablo_run(params, feature_stage="nope")).build_model()


def test_loss_on_concatenation_and_on_branches(params):
    torch.manual_seed(3)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    images = torch.rand(6, 3, 20, 20)
    recipe = build_recipe(diablo_run(params, loss_on="concatenation"))
    model, loss = recipe.build_model(), recipe.build_loss(num_classes=3)
    branches = model.branch_embeddings(images)
    reference = build_loss({"name": "binomial", "alpha": 2.0, "beta": 0.5, "neg_weight": 25.0}, 3, 8)
    # the concatenation of the 2 unit branches, scaled back to a unit vector
    expected = reference(branches.flatten(1) / math.sqrt(2), labels)
    torch.testing.assert_close(recipe.training_loss(model, loss, images, labels, labels), expected)

    per_branch = build_recipe(diablo_run(params))  # the default reading
    losses = per_branch.build_loss(num_classes=3)
    assert len(losses) == 2
    expected = (reference(branches[:, 0], labels) + reference(branches[:, 1], labels)) / 2
    torch.testing.assert_close(per_branch.training_loss(model, losses, images, labels, labels), expected)


def test_attention_maps_hook_gives_one_map_per_entry(params):
    images = torch.rand(2, 3, 20, 20)
    recipe = build_recipe(diablo_run(params, selection="feature"))
    model = recipe.build_model().eval()
    maps = recipe.attention_maps(model, images)
    assert list(maps) == ["entry0", "entry1"]
    stacked = torch.stack(list(maps.values()))  # feature-wise: the maps themselves
    assert stacked.shape == (2, 2, 3, 3)
    torch.testing.assert_close(stacked, model.attend(images)[0][:, :, 0].transpose(0, 1))

    recipe = build_recipe(diablo_run(params, selection="dimension"))
    model = recipe.build_model().eval()
    maps = recipe.attention_maps(model, images)
    mean_weight = model.attend(images)[0].mean(dim=2)  # (B, N, h, w)
    for n, scaled in enumerate(maps.values()):  # dimension-wise: mean weight, min-max scaled per image
        assert scaled.shape == (2, 3, 3)
        torch.testing.assert_close(scaled.amin(dim=(1, 2)), torch.zeros(2))
        torch.testing.assert_close(scaled.amax(dim=(1, 2)), torch.ones(2))
        flat, ref = scaled.flatten(1), mean_weight[:, n].flatten(1)
        assert torch.equal(flat.argmax(1), ref.argmax(1)) and torch.equal(flat.argmin(1), ref.argmin(1))


def test_training_is_deterministic_and_reports_per_branch_metrics(params, tiny_manifest, tmp_path):
    run = diablo_run(params, epochs=2, selection="feature", placement="post", **CUTS["post"])
    for name in ("a", "b"):
        train_run(copy.deepcopy(run), tiny_manifest, tmp_path / name, tmp_path / f"scratch_{name}", progress=False)
    first, second = (load_checkpoint(tmp_path / n / "checkpoint.pt")["model"] for n in ("a", "b"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    embed_run(tmp_path / "a" / "checkpoint.pt", tiny_manifest, tmp_path / "emb.npz")
    metrics = evaluate_file(tmp_path / "emb.npz", tmp_path / "metrics.json", [1])
    assert {"learner0/R@1", "learner1/R@1", "learners_mean/R@1", "self_similarity"} <= set(metrics)
    log = pd.read_csv(tmp_path / "a" / "log.csv")
    health = ["health/attention_entropy_ratio", "health/dictionary_usage"]
    assert set(health) <= set(log.columns) and len(log) == 2
    summary = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["summary"]
    assert {key: summary[key] for key in health} == log[health].iloc[-1].to_dict()  # the last epoch's
    assert 0.5 <= summary["health/dictionary_usage"] <= 1.0  # N = 2: perplexity / N lies in [1/N, 1]


def test_health_numbers_are_those_of_the_training_batches(params):
    """epoch_log = the mean entropy ratio of the epoch's batches and the usage of their mean assignment."""
    recipe = build_recipe(diablo_run(params, selection="feature"))
    model, loss = recipe.build_model().train(), recipe.build_loss(num_classes=3)
    recipe.on_epoch_start(1, model, None)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    batches = [torch.rand(6, 3, 20, 20) for _ in range(2)]
    for images in batches:
        recipe.training_loss(model, loss, images, labels, labels)
    with torch.no_grad():
        attention = torch.cat([model.attend(images)[0] for images in batches])
    logged = recipe.epoch_log()
    assert logged["health/attention_entropy_ratio"] == pytest.approx(
        float(attention_entropy_ratio(attention)), rel=1e-5
    )
    assert logged["health/dictionary_usage"] == pytest.approx(dictionary_usage(attention), rel=1e-5)
    restored = build_recipe(diablo_run(params, selection="feature"))
    restored.load_state_dict(recipe.state_dict())  # resumed after the last epoch: the summary survives
    assert restored.summary() == recipe.summary() == logged


def test_relative_change_and_attention_change_hand_checked():
    initial = torch.tensor([[3.0, 4.0]])  # norm 5
    assert relative_change(initial, initial) == 0.0
    assert relative_change(torch.tensor([[3.0, 4.5]]), initial) == pytest.approx(0.1)  # ‖(0, 0.5)‖ / 5
    before = torch.tensor([1.0, 0.0, 0.0, 0.0]).reshape(1, 4, 1, 1, 1).expand(2, 4, 1, 2, 2)
    halves = torch.tensor([0.5, 0.5, 0.0, 0.0]).reshape(1, 4, 1, 1, 1).expand(2, 4, 1, 2, 2)
    moved = torch.tensor([0.0, 0.0, 0.0, 1.0]).reshape(1, 4, 1, 1, 1).expand(2, 4, 1, 2, 2)
    assert attention_change(before, before) == 0.0
    assert attention_change(halves, before) == pytest.approx(0.5)  # ½ (|½ − 1| + |½ − 0|)
    assert attention_change(moved, before) == pytest.approx(1.0)  # all the weight to another entry
    mixed = torch.cat([before[:1], moved[:1]])  # one image unchanged, one moved: mean 0.5
    assert attention_change(mixed, before) == pytest.approx(0.5)


def test_movement_is_zero_at_init_and_that_of_the_step_after_it(params):
    """``diablo/dictionary_relative_change`` and ``diablo/attention_change`` are 0 before the first step
    (the first batch's attention is the reference) and, after a step, ‖D̂ − D̂⁰‖ / ‖D̂⁰‖ of the unit
    directions and the probe images' attention change computed independently; a change of the
    dictionary's lengths alone is no change; they survive a resume."""
    torch.manual_seed(8)
    recipe = build_recipe(diablo_run(params, hardness=3.0))
    model, loss = recipe.build_model().train(), recipe.build_loss(num_classes=3)
    optimizer = torch.optim.SGD([model.selection.dictionary], lr=0.5)  # only the dictionary moves
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 0, 1, 1])
    images = torch.rand(10, 3, 20, 20)
    recipe.on_epoch_start(1, model, None)
    value = recipe.training_loss(model, loss, images, labels, labels)
    logged = recipe.epoch_log()
    assert logged["diablo/dictionary_relative_change"] == 0.0 and logged["diablo/attention_change"] == 0.0

    initial = model.selection.dictionary.detach().clone()
    model.eval()
    with torch.no_grad():
        before = model.selection_maps(images[:PROBE_IMAGES])
    model.train()
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    recipe.on_epoch_start(2, model, None)
    recipe.training_loss(model, loss, images.flip(0), labels, labels)  # a later batch is not the reference
    logged = recipe.epoch_log()
    unit, unit0 = F.normalize(model.selection.dictionary.detach(), dim=-1), F.normalize(initial, dim=-1)
    assert logged["diablo/dictionary_relative_change"] == pytest.approx(
        float((unit - unit0).norm() / unit0.norm()), rel=1e-6
    )
    assert logged["diablo/dictionary_relative_change"] > 0
    model.eval()
    with torch.no_grad():
        after = model.selection_maps(images[:PROBE_IMAGES])
    expected = float(0.5 * (after - before).abs().sum(dim=1).mean())
    assert logged["diablo/attention_change"] == pytest.approx(expected, rel=1e-5) and expected > 0

    restored = build_recipe(diablo_run(params, hardness=3.0))
    restored.load_state_dict(recipe.state_dict())
    restored.on_epoch_start(3, model, None)
    with torch.no_grad():
        model.selection.dictionary.mul_(0.5)  # shorter, same directions: what weight decay alone does
    moved = restored.epoch_log()
    assert moved["diablo/dictionary_relative_change"] == pytest.approx(logged["diablo/dictionary_relative_change"])
    assert moved["diablo/attention_change"] == pytest.approx(logged["diablo/attention_change"])


HEALTHY = {
    "R@1": 0.20,
    "learners_mean/R@1": 0.12,
    "self_similarity": 0.10,
    "health/attention_entropy_ratio": 0.60,
    "health/dictionary_usage": 0.90,
}


@pytest.mark.parametrize(
    ("dead", "failing"),
    [
        ({"health/attention_entropy_ratio": 0.999}, "health/attention_entropy_ratio"),  # uniform attention
        ({"health/dictionary_usage": 1 / 8}, "health/dictionary_usage"),  # every position picks one entry
        ({"self_similarity": 0.97}, "self_similarity"),  # the branches embed the same thing
    ],
)
def test_health_checks_fail_on_a_dead_mechanism(params, dead, failing):
    checks = build_recipe(diablo_run(params, dictionary_size=8)).health_checks()
    assert failed_checks(checks, HEALTHY) == []
    failures = failed_checks(checks, {**HEALTHY, **dead})
    assert len(failures) == 1 and failing in failures[0], failures


def test_one_entry_has_no_mechanism_to_check(params):
    assert build_recipe(diablo_run(params, dictionary_size=1)).health_checks() == []
