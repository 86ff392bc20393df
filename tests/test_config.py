"""Parameters: merging, schema validation with named keys, run resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dmlbench.config import ConfigError, deep_merge, resolve_run
from dmlbench.params import load_config

from conftest import REPO


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_deep_merge_nested_and_replaces_lists():
    base = {"a": {"x": 1, "y": {"z": 2}}, "l": [1, 2]}
    merged = deep_merge(base, {"a": {"y": {"z": 3}}, "l": [9]})
    assert merged == {"a": {"x": 1, "y": {"z": 3}}, "l": [9]}
    assert base["a"]["y"]["z"] == 2  # the base is not mutated


def test_overlay_overrides_default(tmp_path: Path):
    overlay = write(tmp_path / "o.yaml", {"training": {"epochs": 2}, "seeds": [5]})
    config = load_config([REPO / "params.yaml", overlay])
    assert config["training"]["epochs"] == 2 and config["seeds"] == [5]
    assert config["training"]["optimizer"]["name"] == "adam"  # untouched siblings survive


def test_schema_error_names_the_key_path(tmp_path: Path):
    overlay = write(tmp_path / "o.yaml", {"training": {"optimizer": {"lr": -1}}})
    with pytest.raises(ConfigError, match=r"training\.optimizer\.lr"):
        load_config([REPO / "params.yaml", overlay])


def test_unknown_section_is_rejected(tmp_path: Path):
    overlay = write(tmp_path / "o.yaml", {"trainin": {"epochs": 2}})
    with pytest.raises(ConfigError, match="trainin"):
        load_config([REPO / "params.yaml", overlay])


def test_table_naming_an_undefined_method(tmp_path: Path):
    overlay = write(tmp_path / "o.yaml", {"tables": {"table1": {"datasets": ["synthetic"], "methods": ["nope"]}}})
    with pytest.raises(ConfigError, match=r"tables\.table1\.methods names \['nope'\]"):
        load_config([REPO / "params.yaml", overlay])


def test_missing_file_and_bad_yaml(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config([tmp_path / "absent.yaml"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config([bad])


def test_resolve_run_precedence(params):
    params["datasets"]["synthetic"]["training"] = {"epochs": 7, "embedding_dim": 32}
    params["methods"]["triplet"]["training"] = {"epochs": 9}
    run = resolve_run(params, "synthetic", "triplet", 3)
    assert run["training"]["epochs"] == 9  # method wins over dataset
    assert run["training"]["embedding_dim"] == 32  # dataset wins over defaults
    assert run["seed"] == 3 and run["method_config"]["loss"]["name"] == "triplet"
    assert "training" not in run["method_config"] and "training" not in run["dataset_config"]
    with pytest.raises(ConfigError, match="methods.absent"):
        resolve_run(params, "synthetic", "absent", 0)
