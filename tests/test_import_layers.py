"""The layers of docs/architecture.md hold: `lint-imports` (import-linter) keeps the contracts in
pyproject.toml's `[tool.importlinter]`: imports point one way (cli > api > workers > pipelines >
kernels > core), only pipelines and kernels import torch, diffusers or transformers, and no import
circle.

import-linter reads a top-level package from one folder, while vidserve installs from five
(`[tool.setuptools.package-dir]`), so it runs here over a copy of the sources joined into one
`vidserve` folder. What it cannot tell apart, an import inside a function from one at module level,
is checked by importing: `import vidserve.cli` loads no other layer.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def join_sources(into: Path) -> Path:
    """The package's .py files as one `vidserve` folder under `into`, each source folder where it installs."""
    package_dir = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(package_dir.items()):  # a package before its subpackages, which it contains
        target = into.joinpath(*package.split("."))
        if not target.exists():
            shutil.copytree(ROOT / folder, target, ignore=_not_source)
    return into / "vidserve"


def _not_source(folder: str, names: list[str]) -> set[str]:
    return {name for name in names
            if name == "__pycache__" or (Path(folder, name).is_file() and not name.endswith(".py"))}


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    # Run in the joined tree's folder: import-linter finds `vidserve` there before the editable install.
    return subprocess.run([str(LINT_IMPORTS), str(PYPROJECT), "--no-cache"], cwd=tree, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("joined")
    join_sources(tree)
    return tree


def test_the_import_contracts_are_kept(sources):
    result = lint_imports(sources)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_source_file_is_checked(sources):
    joined = {p.relative_to(sources / "vidserve") for p in (sources / "vidserve").rglob("*.py")}
    assert Path("cli.py") in joined and Path("kernels/dense.py") in joined
    assert {Path("pipelines/chain.py"), Path("workers/runner.py"), Path("api/app.py")} <= joined


# Each mistake, made in a copy of the sources, and what `lint-imports` says of it: a pass above is no vacuous one.
@pytest.mark.parametrize(("module", "added", "said"), [
    ("errors.py", "def _later():\n    from vidserve.workers import runner\n",
     "vidserve.errors -> vidserve.workers"),
    ("kernels/tiles.py", "from vidserve.pipelines import chain\n",
     "vidserve.kernels.tiles -> vidserve.pipelines.chain"),
    ("workers/resume.py", "from vidserve.api import services\n",
     "vidserve.workers.resume -> vidserve.api.services"),
    ("params.py", "import torch\n", "vidserve.params -> torch"),
    ("api/content.py", "from transformers import AutoModel\n", "vidserve.api.content -> transformers"),
    ("pipelines/llm/kv_cache.py", "from . import model\n", "No cycles are allowed in vidserve.pipelines.llm"),
    ("a_new_module.py", "", "vidserve.a_new_module"),  # in no layer: the contract lists every core module
])
def test_a_broken_rule_fails_with_the_import_named(tmp_path, module, added, said):
    package = join_sources(tmp_path)
    path = package / module
    path.write_text((path.read_text() if path.exists() else "") + added)
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert said in " ".join(result.stdout.split()), result.stdout


def test_importing_the_cli_loads_no_other_layer_and_no_torch():
    """The CLI wires every layer together, importing them only inside its commands, so `vidserve
    --help` and a refused argument stay quick."""
    code = ("import sys, vidserve.cli\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')\n"
            "             or m.startswith(('vidserve.api', 'vidserve.workers', 'vidserve.pipelines', "
            "'vidserve.kernels'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", "imported by vidserve.cli: " + result.stdout
