"""Sweeps (dmlbench.sweeps): a `sweeps:` entry expands into ordinary method entries with generated names."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from dmlbench.config import ConfigError, deep_merge, defines, load_yaml, method_chain, resolve_run
from dmlbench.generated import origin_keys
from dmlbench.params import load_config, merge_params, params_sources
from dmlbench.sweeps import (
    expand_sweeps,
    point_names,
    sweep_keys,
    sweep_points,
    value_token,
)

BASE = {
    "label": "A",
    "recipe": "abe",
    "loss": {"name": "contrastive", "margin": 1.0},
    "options": {"learners": 8, "divergence_weight": 1.0},
}


def config_with(sweep: dict, **methods: dict) -> dict:
    """A minimal parameter mapping: method `a` (plus `methods`), the `training` defaults and one sweep `s`."""
    return {"training": {"embedding_dim": 64}, "methods": {"a": copy.deepcopy(BASE), **methods}, "sweeps": {"s": sweep}}


GRID = {
    "base": "a",
    "name": "a_m{m}_w{w}",
    "label": "A {m}/{w}",
    "axes": {
        "m": {"key": "options.learners", "values": [2, 4]},
        "w": {"key": "options.divergence_weight", "values": [0.1, 3.0]},
    },
    "skip": [{"m": 4, "w": 3.0}],
}


def test_a_grid_expands_into_entries_named_by_the_template_with_the_values_at_their_keys():
    methods = expand_sweeps(config_with(GRID))["methods"]
    assert list(methods) == ["a", "a_m2_w01", "a_m2_w3", "a_m4_w01"]  # first axis outermost, the skipped point gone
    assert methods["a_m2_w3"] == {"base": "a", "label": "A 2/3", "options": {"learners": 2, "divergence_weight": 3.0}}
    assert methods["a_m4_w01"] == {
        "base": "a",
        "label": "A 4/0.1",
        "options": {"learners": 4, "divergence_weight": 0.1},
    }


def test_value_tokens_and_default_names_and_labels():
    assert [value_token(v) for v in (0.01, 0.3, 3.0, 1024, 1e-05, False)] == [
        "001",
        "03",
        "3",
        "1024",
        "1em05",
        "false",
    ]
    sweep = {"base": "a", "axes": {"m": {"key": "options.learners", "values": [2]}}}
    assert expand_sweeps(config_with(sweep))["methods"]["s_m2"] == {
        "base": "a",
        "label": "A (m = 2)",
        "options": {"learners": 2},
    }


def test_a_list_sweep_keeps_its_points_in_order_with_axis_labels_and_common_settings():
    sweep = {
        "base": "a",
        "name": "h{m}",
        "label": "{m} ({t})",
        "set": {"options": {"divergence_weight": 0.0}},
        "axes": {
            "m": {"key": "options.learners", "values": [4, 1], "label": ["4-heads", "1-head"]},
            "t": {"key": "training.embedding_dim", "values": [32, 64]},
        },
        "points": [{"m": 1, "t": 64}, {"m": 4, "t": 32}],
    }
    methods = expand_sweeps(config_with(sweep))["methods"]
    assert list(methods) == ["a", "h1", "h4"]
    assert methods["h1"] == {
        "base": "a",
        "label": "1-head (64)",
        "options": {"divergence_weight": 0.0, "learners": 1},
        "training": {"embedding_dim": 64},
    }


def test_a_sweep_point_resolves_like_any_entry_and_is_tracked_by_its_sweeps_keys():
    config = expand_sweeps(config_with(GRID))
    assert method_chain(config, "a_m2_w01") == ["a_m2_w01", "a"]
    keys = sweep_keys(config, "a_m2_w01", exclude=["label"])
    assert keys == [
        "sweeps.s.base",
        "sweeps.s.name",
        "sweeps.s.skip",
        "sweeps.s.axes.m.key",
        "sweeps.s.axes.m.values",
        "sweeps.s.axes.w.key",
        "sweeps.s.axes.w.values",
    ]
    assert origin_keys(config, "methods", "a_m2_w01", ["label"]) == keys
    assert origin_keys(config, "methods", "a", ["label"]) == ["methods.a.recipe", "methods.a.loss", "methods.a.options"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"axes": {"m": {"key": "options.lerners", "values": [2]}}}, "sweeps.s.axes.m.key = 'options.lerners'"),
        ({"axes": {"m": {"key": "recipe.x", "values": [2]}}}, "sweeps.s.axes.m.key"),
        ({"name": "a_{k}"}, "names ['k'], which are not axes"),
        ({"name": "A{m}"}, "is not a valid method name"),
        ({"name": "a_{m}}"}, "braces only surround an axis name"),
        ({"skip": [{"m": 2}, {"m": 4}]}, "removes every point"),
        ({"skip": [{"m": 3}]}, "m = 3 is not one of axes.m.values"),
        ({"skip": [{"q": 2}]}, "give one value of each axis"),
        ({"points": [{"m": 2}], "skip": [{"m": 4}]}, "sweeps.s"),
        ({"base": "b"}, "sweeps.s.base = 'b' is not defined"),
        ({"axes": {"m": {"key": "options.learners", "values": [2, 4], "label": ["two"]}}}, "1 texts for 2 values"),
        ({"axes": {"m": {"key": "options.learners", "values": []}}}, "sweeps.s.axes.m.values"),
    ],
)
def test_a_malformed_sweep_is_an_error_naming_the_key_and_the_sweep(change, message):
    sweep = {"base": "a", "name": "a_{m}", "axes": {"m": {"key": "options.learners", "values": [2, 4]}}, **change}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        expand_sweeps(config_with(sweep))


def test_the_unknown_key_error_lists_what_the_base_has_and_suggests_the_closest():
    sweep = {"base": "a", "axes": {"m": {"key": "options.lerners", "values": [2]}}}
    with pytest.raises(ConfigError, match=r"did you mean 'learners'\?.*\['divergence_weight', 'learners'\]"):
        expand_sweeps(config_with(sweep))


def test_two_sweeps_that_generate_one_name_are_an_error():
    config = config_with({"base": "a", "name": "p{m}", "axes": {"m": {"key": "options.learners", "values": [2]}}})
    config["sweeps"]["t"] = {"base": "a", "name": "p{w}", "axes": {"w": {"key": "options.learners", "values": [2]}}}
    with pytest.raises(ConfigError, match="generates 'p2' twice"):
        sweep_points(config)


def write_project(root: Path, params: dict, experiments: dict) -> Path:
    """params.yaml listing one experiments file; returns params.yaml's path."""
    (root / "exp.yaml").write_text(yaml.safe_dump(experiments))
    (root / "params.yaml").write_text(yaml.safe_dump({"experiments": ["exp.yaml"], **params}))
    return root / "params.yaml"


def test_a_method_written_under_the_name_of_a_point_is_an_error_naming_both_files(tmp_path: Path):
    sweep = {"base": "a", "name": "a{m}", "axes": {"m": {"key": "options.learners", "values": [2]}}}
    params = write_project(tmp_path, {"methods": {"a": BASE, "a2": {"base": "a"}}}, {"sweeps": {"s": sweep}})
    with pytest.raises(ConfigError, match=r"exp\.yaml: sweeps\.s generates method 'a2', which .*params\.yaml writes"):
        params_sources(params)


def test_an_overlay_overrides_a_point_like_any_entry(tmp_path: Path):
    params = REPO / "params.yaml"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"methods": {"dnc_k8": {"options": {"finetune_epoch": 5}}}}))
    run = resolve_run(load_config([params, overlay]), "synthetic", "dnc_k8", 0)
    assert run["method_config"]["options"]["num_clusters"] == 8  # the sweep's value
    assert run["method_config"]["options"]["finetune_epoch"] == 5  # the overlay's


# The entries the project's sweeps replaced, as they were written (so that existing runs stay valid).
HANDWRITTEN = """
abe4: {base: abe8, label: ABE-4, options: {learners: 4}}
abe2: {base: abe8, label: ABE-2, options: {learners: 2}}
heads4: {base: heads8, label: 4-heads, options: {learners: 4}}
heads2: {base: heads8, label: 2-heads, options: {learners: 2}}
heads1: {base: heads8, label: 1-head, options: {learners: 1}}
abe8_nodiv: {base: abe8, label: ABE-8 w/o L_div, options: {divergence_weight: 0.0}}
abe4_nodiv: {base: abe4, label: ABE-4 w/o L_div, options: {divergence_weight: 0.0}}
abe2_nodiv: {base: abe2, label: ABE-2 w/o L_div, options: {divergence_weight: 0.0}}
abe8_lambda001: {base: abe8, label: ABE-8 λ 0.01, options: {divergence_weight: 0.01}}
abe8_lambda01: {base: abe8, label: ABE-8 λ 0.1, options: {divergence_weight: 0.1}}
abe8_lambda03: {base: abe8, label: ABE-8 λ 0.3, options: {divergence_weight: 0.3}}
abe8_lambda3: {base: abe8, label: ABE-8 λ 3, options: {divergence_weight: 3.0}}
deml_i1j1: {base: deml, label: "DeML (I=1, J=1)", options: {num_scales: 1, num_cams: 1}}
deml_i1j4: {base: deml, label: "DeML (I=1, J=4)", options: {num_scales: 1, num_cams: 4}}
deml_i2j1: {base: deml, label: "DeML (I=2, J=1)", options: {num_scales: 2, num_cams: 1}}
deml_i2j4: {base: deml, label: "DeML (I=2, J=4)", options: {num_scales: 2, num_cams: 4}}
deml_i3j1: {base: deml, label: "DeML (I=3, J=1)", options: {num_scales: 3, num_cams: 1}}
deml_u384_act: {base: deml_u512_act, label: "U384 + L_act", training: {embedding_dim: 384, log_train_recall: false, log_test_recall: false}}
deml_u384: {base: deml_u512, label: "U384", training: {embedding_dim: 384, log_train_recall: false, log_test_recall: false}}
deml_u192_act: {base: deml_u512_act, label: "U192 + L_act", training: {embedding_dim: 192, log_train_recall: false, log_test_recall: false}}
deml_u192: {base: deml_u512, label: "U192", training: {embedding_dim: 192, log_train_recall: false, log_test_recall: false}}
deml_u64_act: {base: deml_u512_act, label: "U64 + L_act", training: {embedding_dim: 64, log_train_recall: false, log_test_recall: false}}
deml_u64: {base: deml_u512, label: "U64", training: {embedding_dim: 64, log_train_recall: false, log_test_recall: false}}
diablo_abl_dpre2: {base: diablo_abl_dpre8, label: "Dimension-wise, pre-attention (N = 2)", options: {dictionary_size: 2}}
diablo_abl_dpre4: {base: diablo_abl_dpre8, label: "Dimension-wise, pre-attention (N = 4)", options: {dictionary_size: 4}}
diablo_abl_dpre16: {base: diablo_abl_dpre8, label: "Dimension-wise, pre-attention (N = 16)", options: {dictionary_size: 16}}
diablo_abl_fpost2: {base: diablo_abl_fpost8, label: "Feature-wise, post-attention (N = 2)", options: {dictionary_size: 2}}
diablo_abl_fpost4: {base: diablo_abl_fpost8, label: "Feature-wise, post-attention (N = 4)", options: {dictionary_size: 4}}
diablo_abl_fpost16: {base: diablo_abl_fpost8, label: "Feature-wise, post-attention (N = 16)", options: {dictionary_size: 16}}
diablo_alpha1: {base: diablo, label: "Binomial + DIABLO (N = 8, alpha = 1)", options: {hardness: 1.0}}
diablo_alpha10: {base: diablo, label: "Binomial + DIABLO (N = 8, alpha = 10)", options: {hardness: 10.0}}
diablo_alpha30: {base: diablo, label: "Binomial + DIABLO (N = 8, alpha = 30)", options: {hardness: 30.0}}
dnc_k2: {base: dnc, label: D&C K=2, options: {num_clusters: 2}}
dnc_k8: {base: dnc, label: D&C K=8, options: {num_clusters: 8}}
dnc_k16: {base: dnc, label: D&C K=16, options: {num_clusters: 16}}
dnc_t1: {base: dnc, label: D&C T=1, options: {recluster_every: 1}}
dnc_t8: {base: dnc, label: D&C T=8, options: {recluster_every: 8}}
mpn_d64: {base: mpn, label: MPN d = 64, training: {embedding_dim: 64}}
mpn_d128: {base: mpn, label: MPN d = 128, training: {embedding_dim: 128}}
mpn_d256: {base: mpn, label: MPN d = 256, training: {embedding_dim: 256}}
mpn_d512: {base: mpn, label: MPN d = 512, training: {embedding_dim: 512}}
mpn_d1024: {base: mpn, label: MPN d = 1024, training: {embedding_dim: 1024}}
""" + "".join(
    f"mpn_l{steps}_h{heads}: {{base: mpn, label: MPN {steps} step{'s' if steps > 1 else ''} x {heads} "
    f"head{'s' if heads > 1 else ''}, options: {{steps: {steps}, heads: {heads}}}}}\n"
    for steps in (1, 2, 3, 4)
    for heads in (1, 2, 4, 8, 16)
    if (steps, heads) != (1, 2)
)


@pytest.mark.parametrize("overlays", [[], ["workflow/overlays/paper.yaml"]])
def test_the_projects_sweeps_resolve_every_run_exactly_as_the_entries_they_replaced(overlays):
    config = load_config([REPO / "params.yaml", *(REPO / overlay for overlay in overlays)])
    overridden = [load_yaml(REPO / overlay).get("methods", {}) for overlay in overlays]
    written = yaml.safe_load(HANDWRITTEN)
    assert set(written) == set(sweep_points(config))  # every converted entry is generated, and nothing else
    for name, entry in written.items():
        before = copy.deepcopy(config)
        for methods in overridden:  # as the overlay merged over the written entry
            entry = deep_merge(entry, methods.get(name, {}))
        before["methods"][name] = entry
        for dataset in config["datasets"]:
            assert resolve_run(config, dataset, name, 0) == resolve_run(before, dataset, name, 0), (name, dataset)


def test_every_key_that_tracks_a_point_is_set_by_the_experiments_file_of_its_sweep():
    """DVC declares a run's params per file: a point's keys must exist in the file that holds its sweep."""
    config = load_config([REPO / "params.yaml"])
    sources = params_sources(REPO / "params.yaml")
    for name in sweep_points(config):
        for key in sweep_keys(config, name):
            assert any(defines(data, key) for _, data in sources), key
    assert point_names("abe8_lambda", config["sweeps"]["abe8_lambda"]) == [
        "abe8_lambda001",
        "abe8_lambda01",
        "abe8_lambda03",
        "abe8_lambda3",
    ]


def test_a_dump_of_the_merged_parameters_reads_back_unchanged(tmp_path):
    """A self-contained file of merged parameters (sweeps, their points and the tuned twins all written out,
    keys sorted by the YAML dump) is accepted and means the same parameters."""
    merged = merge_params([REPO / "params.yaml"])
    dump = tmp_path / "merged.yaml"
    dump.write_text(yaml.safe_dump(merged))
    assert merge_params([dump]) == merged
