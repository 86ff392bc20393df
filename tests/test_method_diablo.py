"""DIABLO (recipe ``diablo``): selection, merge, placements, the recipe's loss and hooks."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from dmlbench.evaluation import evaluate_file
from dmlbench.losses import build_loss
from dmlbench.methods import OptionsError, build_recipe
from dmlbench.models.backbones import build_small_cnn
from dmlbench.models.diablo import (
    DIABLO,
    DictionarySelection,
    cosine_similarities,
    merge,
    resize_attention,
    select,
)
from dmlbench.training.checkpoint import load_checkpoint
from dmlbench.training.embed import embed_run
from dmlbench.training.trainer import train_run

from conftest import parameter_group_ids, tiny_run

#: cut points of the tiny small_cnn per placement (post-attention branches one stage later, as in §4.1).
CUTS = {"pre": {"feature_stage": "stage2", "phi_until": "stage3", "psi_until": "stage4"},
        "post": {"feature_stage": "stage3", "phi_until": "stage4", "psi_until": "stage4"}}


def tiny_model(selection: str = "dimension", placement: str = "pre", n: int = 2, dim: int = 8,
               hardness: float = 10.0, freeze_bn: bool = False) -> DIABLO:
    torch.manual_seed(0)
    return DIABLO(build_small_cnn(width=4), selection=selection, placement=placement, num_entries=n,
                  hardness=hardness, embedding_dim=dim, freeze_bn=freeze_bn, **CUTS[placement])


def diablo_run(params: dict, epochs: int = 2, **options) -> dict:
    run = tiny_run(params, "binomial", epochs=epochs)
    run["method"] = "diablo_test"
    run["method_config"].update(recipe="diablo", options={"dictionary_size": 2, **options})
    return run


# --- selection block -------------------------------------------------------------------------------
@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_selection_weights_sum_to_one_over_the_dictionary(selection):
    torch.manual_seed(1)
    block = DictionarySelection(selection, in_channels=5, num_entries=4, channels=3, hardness=2.0)
    weights = block(torch.randn(2, 5, 3, 4))
    # feature-wise: one weight per position (channel axis 1); dimension-wise: per position and dimension
    assert weights.shape == ((2, 4, 1, 3, 4) if selection == "feature" else (2, 4, 3, 3, 4))
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(dim=1), torch.ones_like(weights[:, 0]))


@pytest.mark.parametrize("selection", ["feature", "dimension"])
def test_large_hardness_gives_the_one_hot_arg_max_of_eq6(selection):
    torch.manual_seed(2)
    block = DictionarySelection(selection, in_channels=6, num_entries=5, channels=3, hardness=1e4)
    phi = torch.randn(2, 6, 3, 3)
    weights = block(phi)
    n, rows, m = block.dictionary.shape
    # cosine similarities computed independently, position by position
    cosines = F.cosine_similarity(phi.permute(0, 2, 3, 1)[:, None, None],  # (B, 1, 1, h, w, m)
                                  block.dictionary[None, :, :, None, None, :], dim=-1)  # → (B, N, rows, h, w)
    one_hot = F.one_hot(cosines.argmax(dim=1), n).permute(0, 4, 1, 2, 3).float()
    torch.testing.assert_close(weights, one_hot, rtol=0, atol=1e-12)
    assert torch.equal(weights.argmax(dim=1), cosines.argmax(dim=1))
    soft = select(cosines, 1.0)  # a small α keeps every entry: Eq. 7 is a relaxation, not the arg max
    assert (soft > 0.02).all()  # ≥ e^-2 / (e^-2 + 4) ≈ 0.033 for 5 entries and cosines in [-1, 1]


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
    expected = torch.tensor([[[0.75, 0.25], [0.5, 0.25]],    # entry 1
                             [[0.25, 0.75], [0.5, 0.75]]])   # entry 2
    torch.testing.assert_close(weights[0, :, 0], expected)
    features = torch.tensor([[[2.0, 4.0], [6.0, 8.0]], [[1.0, 1.0], [1.0, 1.0]]]).unsqueeze(0)  # c = 2
    merged = merge(features, weights)
    assert merged.shape == (1, 2, 2, 2, 2)
    torch.testing.assert_close(merged[0, 0, 0], torch.tensor([[1.5, 1.0], [3.0, 2.0]]))
    torch.testing.assert_close(merged[0, 1, 0], torch.tensor([[0.5, 3.0], [3.0, 6.0]]))
    torch.testing.assert_close(merged[0, 1, 1], expected[1])
    for i in range(2):  # Eq. 9: H_ij = A_ij ⊗ f_ij
        for j in range(2):
            torch.testing.assert_close(merged[0, :, :, i, j].reshape(-1),
                                       torch.kron(weights[0, :, 0, i, j], features[0, :, i, j]))


def test_dimension_wise_hand_checked_on_a_2x2_map_with_2_entries():
    block = DictionarySelection("dimension", in_channels=2, num_entries=2, channels=2, hardness=ALPHA)
    with torch.no_grad():  # dimension 1 as in the feature-wise test; dimension 2 with the entries swapped
        block.dictionary.copy_(torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]))
    weights = block(PHI)
    first = torch.tensor([[[0.75, 0.25], [0.5, 0.25]], [[0.25, 0.75], [0.5, 0.75]]])
    torch.testing.assert_close(weights[0, :, 0], first)
    torch.testing.assert_close(weights[0, :, 1], first.flip(0))
    features = torch.tensor([[[2.0, 4.0], [6.0, 8.0]], [[4.0, 8.0], [12.0, 4.0]]]).unsqueeze(0)
    merged = merge(features, weights)
    # Eq. 13: (F ⊗ 1_N) ⊙ A
    torch.testing.assert_close(merged[0, 0, 1], torch.tensor([[1.0, 6.0], [6.0, 3.0]]))
    torch.testing.assert_close(merged[0, 1, 1], torch.tensor([[3.0, 2.0], [6.0, 1.0]]))
    torch.testing.assert_close(merged, features.repeat(1, 2, 1, 1).reshape(1, 2, 2, 2, 2) * weights)


def test_merge_rejects_maps_that_do_not_fit():
    with pytest.raises(ValueError, match=r"expected \(B, N, 1 or c, h, w\)"):
        merge(torch.ones(1, 3, 2, 2), torch.ones(1, 2, 2, 2, 2))


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
    assert id(model.selection.dictionary) in groups["head"]


def test_freeze_bn_keeps_backbone_and_phi_batchnorm_frozen():
    model = tiny_model(freeze_bn=True).train()
    norms = [m for part in (model.backbone, model.phi) for m in part.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.training and not m.weight.requires_grad for m in norms)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"phi_until": "stage2"}, "must come after the feature stage"),
    ({"psi_until": "pool"}, "before 'pool'"),
    ({"phi_until": "stage9"}, "no stage 'stage9'"),
])
def test_bad_cut_points_are_clear_errors(kwargs, message):
    cuts = {**CUTS["pre"], **kwargs}
    with pytest.raises((ValueError, KeyError), match=message):
        DIABLO(build_small_cnn(width=4), selection="feature", placement="pre", num_entries=2, hardness=1.0,
               embedding_dim=8, **cuts)


# --- the recipe ----------------------------------------------------------------------------------
def test_recipe_options_and_errors_name_the_params_key(params):
    recipe = build_recipe(diablo_run(params, selection="feature", hardness=3))
    assert recipe.options.selection == "feature" and recipe.options.hardness == 3.0
    with pytest.raises(OptionsError, match="methods.diablo_test.options.selection"):
        build_recipe(diablo_run(params, selection="pixel"))
    with pytest.raises(OptionsError, match="hardness must be > 0"):
        build_recipe(diablo_run(params, hardness=0.0))
    with pytest.raises(ValueError, match=r"training.embedding_dim = 8 is not divisible by "
                                         r"methods.diablo_test.options.dictionary_size = 3"):
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
    torch.testing.assert_close(stacked.sum(0), torch.ones(2, 3, 3))

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
