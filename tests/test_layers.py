"""The layers import one way: api -> workers -> pipelines -> kernels, all on the core `vidserve`.

Every .py file of the five source folders is parsed (never imported) and each import it
makes, at any depth and relative ones resolved, is checked against the rules below.
A failure lists every offending line as `file:line imports X`.

    core (vidserve/)   imports none of api, workers, pipelines, kernels
    kernels            imports none of api, workers, pipelines
    pipelines          imports neither api nor workers
    workers            does not import api
    api                may import anything

vidserve/cli.py is the one core module that may reach every layer, and only from inside a
function, so `import vidserve.cli` (and any core module) stays free of torch and FastAPI.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Source folder -> the package it installs as (pyproject.toml [tool.setuptools.package-dir]).
PACKAGES = {
    "vidserve": "vidserve",  # with vidserve/kernels, vidserve.kernels
    "pipelines": "vidserve.pipelines",
    "workers": "vidserve.workers",
    "api": "vidserve.api",
}
LAYERS = ("api", "workers", "pipelines", "kernels")  # the upper layers, top first; the rest is core
FORBIDDEN = {
    "core": {"api", "workers", "pipelines", "kernels"},
    "kernels": {"api", "workers", "pipelines"},
    "pipelines": {"api", "workers"},
    "workers": {"api"},
    "api": set(),
}
CLI = "vidserve/cli.py"


@dataclass(frozen=True)
class Import:
    line: int
    target: str  # absolute dotted module name, e.g. "vidserve.pipelines.chain"
    in_function: bool


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to; None for anything outside vidserve."""
    parts = module.split(".")
    if parts[0] in LAYERS:  # an absolute `import pipelines...` names the same folder
        return parts[0]
    if parts[0] != "vidserve":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def module_of(path: Path) -> tuple[str, bool]:
    """The dotted name a source file installs as, and whether it is a package's __init__."""
    rel = path.relative_to(ROOT)
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:-1]]
    is_package = path.name == "__init__.py"
    if not is_package:
        parts.append(path.stem)
    return ".".join(parts), is_package


def resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    """`from ..x import y` in `module` as an absolute module name (None name: `from .. import`)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(package) - 1:
        raise ValueError(f"relative import beyond the top package in {module}")
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(source: str, module: str, is_package: bool) -> list[Import]:
    """Every import in the source, absolute, with whether it runs inside a function.

    `from a import b` counts as importing both `a` and `a.b` (b may be a submodule, as in
    `from vidserve import pipelines`); `importlib.import_module("...")` with a literal
    name counts too."""
    tree = ast.parse(source)
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, alias.name, in_function) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (resolve_relative(module, is_package, node.level, node.module) if node.level
                    else node.module or "")
            found.append(Import(node.lineno, base, in_function))
            found.extend(Import(node.lineno, f"{base}.{alias.name}", in_function)
                         for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and _is_import_call(node):
            found.append(Import(node.lineno, node.args[0].value, in_function))
        inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def _is_import_call(node: ast.Call) -> bool:
    func = node.func
    named = (isinstance(func, ast.Name) and func.id in ("__import__", "import_module")) or \
            (isinstance(func, ast.Attribute) and func.attr == "import_module")
    return named and bool(node.args) and isinstance(node.args[0], ast.Constant) \
        and isinstance(node.args[0].value, str)


def violations_in(rel: str, source: str, module: str, is_package: bool) -> list[str]:
    layer = layer_of(module)
    bad: list[str] = []
    seen: set[tuple[int, str]] = set()
    for imp in imports_of(source, module, is_package):
        target = layer_of(imp.target)
        if target is None or target == layer:
            continue
        if rel == CLI:
            broken = not imp.in_function and target != "core"
            why = " at module level (the CLI imports other layers only inside functions)"
        else:
            broken = target in FORBIDDEN[layer]
            why = ""
        # `from a import b` yields a, then a.b: report the line once, by the first name that breaks a rule.
        if broken and (imp.line, target) not in seen:
            seen.add((imp.line, target))
            bad.append(f"{rel}:{imp.line} imports {imp.target}{why}")
    return bad


def source_files() -> list[Path]:
    files = []
    for folder in PACKAGES:
        files += [p for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    return files


def all_violations() -> list[str]:
    bad = []
    for path in source_files():
        module, is_package = module_of(path)
        bad += violations_in(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"), module,
                             is_package)
    return bad


# -- the rule, on the real tree -------------------------------------------------------------


def test_imports_point_one_way():
    bad = all_violations()
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_every_layer_is_scanned():
    layers = {layer_of(module_of(p)[0]) for p in source_files()}
    assert layers == {"core", *LAYERS}
    assert ROOT / CLI in source_files()


def test_package_map_matches_pyproject():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir = config["tool"]["setuptools"]["package-dir"]
    for folder, package in PACKAGES.items():
        assert package_dir[package] == folder


# -- the checker itself, on small sources, so a pass above is not a vacuous one ------------


@pytest.mark.parametrize(("rel", "module", "source", "expected"), [
    ("vidserve/jobs.py", "vidserve.jobs", "from vidserve.pipelines.chain import generate_video\n",
     ["vidserve/jobs.py:1 imports vidserve.pipelines.chain"]),
    ("vidserve/jobs.py", "vidserve.jobs", "import os\n\ndef f():\n    import vidserve.workers.runner\n",
     ["vidserve/jobs.py:4 imports vidserve.workers.runner"]),
    ("vidserve/jobs.py", "vidserve.jobs", "from vidserve import api\n", ["vidserve/jobs.py:1 imports vidserve.api"]),
    ("vidserve/jobs.py", "vidserve.jobs", "from . import kernels\n", ["vidserve/jobs.py:1 imports vidserve.kernels"]),
    ("vidserve/jobs.py", "vidserve.jobs", "import importlib\nimportlib.import_module('vidserve.api.app')\n",
     ["vidserve/jobs.py:2 imports vidserve.api.app"]),
    ("vidserve/jobs.py", "vidserve.jobs", "from vidserve.params import JobParams\nfrom .storage import Storage\n", []),
    ("vidserve/kernels/dense.py", "vidserve.kernels.dense", "from ..pipelines import attention\n",
     ["vidserve/kernels/dense.py:1 imports vidserve.pipelines"]),
    ("vidserve/kernels/dense.py", "vidserve.kernels.dense", "from .tiles import TileLayout\nfrom vidserve.errors import X\n",
     []),
    ("pipelines/llm/engine.py", "vidserve.pipelines.llm.engine", "from ...workers.runner import JobRunner\n",
     ["pipelines/llm/engine.py:1 imports vidserve.workers.runner"]),
    ("pipelines/llm/engine.py", "vidserve.pipelines.llm.engine", "from ..attention import x\n"
     "from vidserve.kernels import sparse_attention\n", []),
    ("workers/runner.py", "vidserve.workers.runner", "from vidserve.api.services import Services\n",
     ["workers/runner.py:1 imports vidserve.api.services"]),
    ("workers/runner.py", "vidserve.workers.runner", "def f():\n    from vidserve.pipelines.chain import g\n", []),
    ("api/routers/videos.py", "vidserve.api.routers.videos", "from ...workers import runner\n", []),
    ("vidserve/cli.py", "vidserve.cli", "from vidserve.api.app import create_app\n",
     ["vidserve/cli.py:1 imports vidserve.api.app at module level (the CLI imports other layers "
      "only inside functions)"]),
    ("vidserve/cli.py", "vidserve.cli", "from vidserve.config import Settings\n\ndef serve():\n"
     "    from vidserve.api.app import create_app\n    from vidserve.workers.celery_app import run_worker\n", []),
])
def test_checker_finds_what_it_should(rel, module, source, expected):
    assert violations_in(rel, source, module, rel.endswith("__init__.py")) == expected


def test_relative_imports_resolve_from_the_package():
    assert resolve_relative("vidserve.api.routers.videos", False, 2, "services") == "vidserve.api.services"
    assert resolve_relative("vidserve.api.routers", True, 1, "chat") == "vidserve.api.routers.chat"
    assert resolve_relative("vidserve.pipelines.llm", True, 2, None) == "vidserve.pipelines"
    assert resolve_relative("vidserve.jobs", False, 1, "kernels") == "vidserve.kernels"
