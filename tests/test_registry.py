"""The registry helper (src/dmlbench/registry.py): lazy entries resolved once, one unknown-name message, and the
registries built on it (recipes, losses, backbones, dataset kinds, figure kinds)."""

from __future__ import annotations

import sys

import pytest

from dmlbench.config import ConfigError
from dmlbench.errors import DmlbenchError
from dmlbench.registry import Registry, UnknownNameError

MODULE = "dmlbench_registry_test_module"


@pytest.fixture
def counted_module(tmp_path, monkeypatch):
    """A module ``MODULE`` with ``VALUE = 7`` that appends a line to the returned file each time it is imported."""
    count = tmp_path / "imports.txt"
    count.touch()
    (tmp_path / f"{MODULE}.py").write_text(
        f"with open({str(count)!r}, 'a') as log:\n    log.write('imported\\n')\nVALUE = 7\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield count
    sys.modules.pop(MODULE, None)


def test_a_lazy_entry_is_imported_on_first_use_and_then_kept(counted_module):
    registry = Registry("thing", {"seven": f"{MODULE}:VALUE", "len": len})
    assert "seven" in registry and registry.check("seven") == "seven" and registry.module_of("seven") == MODULE
    assert counted_module.read_text() == ""  # checking and naming its module import nothing
    assert registry["seven"] == 7 and registry.lookup("seven") == 7
    del sys.modules[MODULE]  # a second resolution would import it again
    assert registry["seven"] == 7
    assert counted_module.read_text() == "imported\n"
    assert registry["len"] is len and registry.module_of("len") == "builtins"  # an object: kept as given


def test_a_reference_without_attribute_is_the_module():
    assert Registry("kind", {"json": "json"})["json"] is sys.modules["json"]


def test_unknown_name_message_names_key_value_hint_and_sorted_known_names():
    registry = Registry("loss name", {"triplet": 1, "margin": 2, "contrastive": 3}, alternative="'pml:<Loss>'")
    with pytest.raises(UnknownNameError) as err:
        registry.lookup("tripplet", key="methods.m.loss.name")
    assert str(err.value) == (
        "methods.m.loss.name = 'tripplet' is unknown (did you mean 'triplet'?); "
        "known: ['contrastive', 'margin', 'triplet'], or 'pml:<Loss>'"
    )
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert isinstance(err.value, DmlbenchError)
    with pytest.raises(UnknownNameError, match=r"^unknown loss name 'zzz'; known: \['contrastive'"):
        registry.check("zzz")  # no key: says what a name is; nothing close: no hint
    with pytest.raises(ConfigError, match=r"^f = None is unknown; known"):
        registry.check(None, key="f", error=ConfigError)  # a caller's own error class


def test_names_are_sorted_and_iteration_keeps_the_registration_order():
    registry = Registry("thing", {"b": 1, "c": 2, "a": 3})
    assert registry.names() == ("a", "b", "c")
    assert list(registry) == ["b", "c", "a"] and len(registry) == 3


def test_a_registered_stand_in_replaces_the_resolved_entry_and_can_be_removed():
    registry = Registry("thing", {"path": "os.path:join"})
    assert registry["path"] is sys.modules["os.path"].join
    registry["path"] = "os.path:basename"
    assert registry["path"] is sys.modules["os.path"].basename
    del registry["path"]
    assert "path" not in registry and registry.get("path") is None
    assert registry.get(["unhashable"]) is None and ["unhashable"] not in registry


def test_the_project_registries_raise_the_shared_message():
    from dmlbench.data.kinds import PREPARER_MODULES
    from dmlbench.losses.registry import LOSS_CLASSES
    from dmlbench.methods import RECIPES
    from dmlbench.models.backbones import BACKBONES
    from dmlbench.report.figures import FIGURE_KINDS

    assert RECIPES.names() == ("abe", "baseline", "deml", "diablo", "dnc", "mpn", "reference")
    assert RECIPES.module_of("dnc") == "dmlbench.methods.dnc"
    assert LOSS_CLASSES.module_of("triplet") == "dmlbench.losses.triplet"
    assert BACKBONES.module_of("resnet50") == "dmlbench.models.backbones.resnet"
    assert PREPARER_MODULES.module_of("folder") == PREPARER_MODULES.module_of("manifest") == "dmlbench.data.byo"
    with pytest.raises(KeyError, match=r"^training\.backbone\.name = 'resnet5' is unknown \(did you mean 'resnet50'"):
        BACKBONES.check("resnet5", key="training.backbone.name")
    with pytest.raises(
        ValueError, match=r"^unknown loss name 'marginn' \(did you mean 'margin'\?\).*'pml:<LossClass>'"
    ):
        LOSS_CLASSES.check("marginn")
    with pytest.raises(KeyError, match=r"x = 'retrieval' is unknown \(did you mean 'retrieval_grid'\?\)"):
        FIGURE_KINDS.check("retrieval", key="x")


def test_the_command_line_prints_the_unknown_name_message_itself():
    from dmlbench.cli import error_line

    message = Registry("recipe", {"abe": 1}).unknown("ab", key="methods.m.recipe")
    assert error_line(UnknownNameError(message), None) == message
    assert error_line(KeyError("recall_ks"), None).startswith("missing entry 'recall_ks' in one of this command's")
