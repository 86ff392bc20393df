"""Start-up: reading the parameters and the commands that need no network library import none.

Every workflow job is a fresh ``dmlbench`` process (about 130 in the README's main job), and the
Snakefile validates the parameters when it is read: importing torch there cost each of them
seconds. These tests check which modules a fresh interpreter has imported (``sys.modules``),
never how long anything took (``benchmarks/bench_startup.py`` prints the times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from dmlbench.evaluation.knn import GPU_DRIVER_FILES
from dmlbench.methods import RECIPES, recipe_class, recipe_test_time_options

#: libraries that only training, embedding or drawing need (each costs from a quarter to two seconds).
HEAVY = ("torch", "torchvision", "pytorch_metric_learning", "sklearn", "scipy", "matplotlib")
NO_GPU_DRIVER = not any(os.path.exists(path) for path in GPU_DRIVER_FILES)


def imported_after(code: str, cwd: Path = REPO) -> dict:
    """Run ``code`` in a fresh interpreter; the HEAVY modules it imported and what it stored in ``out``."""
    script = (
        f"import json, sys\nout = None\n{code}\nprint(json.dumps({{'heavy': [m for m in {HEAVY!r} "
        "if m in sys.modules], 'out': out}))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loading_and_validating_the_parameters_imports_no_heavy_library():
    # params.yaml with its experiments files: every recipe, every figure kind, the claims
    result = imported_after(f"from dmlbench.params import load_config\nload_config([{str(REPO / 'params.yaml')!r}])")
    assert result["heavy"] == []


def test_list_methods_imports_no_heavy_library():
    result = imported_after(
        f"from dmlbench.cli import main\nout = main(['list', 'methods', '--config', {str(REPO / 'params.yaml')!r}])"
    )
    assert result == {"heavy": [], "out": 0}


@pytest.mark.skipif(not NO_GPU_DRIVER, reason="with a GPU driver, evaluate asks torch whether CUDA is there")
def test_evaluate_on_a_cpu_imports_no_torch_and_threads_still_apply(tmp_path: Path):
    labels = np.repeat(np.arange(4), 3)
    embeddings = np.eye(4, dtype=np.float32)[labels] + 0.01 * np.arange(12, dtype=np.float32)[:, None]
    np.savez(tmp_path / "embeddings.npz", embeddings=embeddings, labels=labels)
    result = imported_after(
        "from dmlbench.cli import main\n"
        "out = main(['evaluate', 'embeddings.npz', '--out', 'metrics.json', '--threads', '1', '--recall-ks', '1,2'])",
        cwd=tmp_path,
    )
    assert result["out"] == 0
    assert "torch" not in result["heavy"]
    assert json.loads((tmp_path / "metrics.json").read_text())["R@1"] == 1.0


@pytest.mark.parametrize("torch_first", [False, True])
def test_threads_option_sets_torchs_threads_whenever_torch_is_imported(torch_first):
    # the CLI no longer imports torch to set its threads: they are set when (if) torch is imported
    result = imported_after(
        ("import torch\n" if torch_first else "")
        + "from dmlbench.cli import _set_threads\n_set_threads(1)\nimport torch\nout = torch.get_num_threads()"
    )
    assert result["out"] == 1


def test_recipes_and_the_report_package_import_lazily():
    result = imported_after(
        "import dmlbench.methods, dmlbench.report, dmlbench.losses, dmlbench.evaluation\n"
        "out = sorted(m for m in ('torch', 'matplotlib', 'sklearn') if m in sys.modules)\n"
        "from dmlbench.methods import Recipe\nfrom dmlbench.report import build_report, render_text\n"
        "import dmlbench.report as report\nassert all(getattr(report, name) for name in report.__all__)"
    )
    # dmlbench.losses needs torch itself; pytorch_metric_learning waits for the loss that uses it
    assert result["out"] == ["torch"]
    assert "pytorch_metric_learning" not in result["heavy"]


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_registrys_test_time_options_are_the_recipes(name):
    assert recipe_test_time_options(name) == recipe_class(name).TEST_TIME_OPTIONS


def test_an_unknown_recipe_still_lists_the_known_ones():
    with pytest.raises(KeyError, match=r"unknown recipe 'nope'; known: \['abe'"):
        recipe_test_time_options("nope")
