"""A fresh clone starts quietly: the package configuration gives setuptools nothing to warn
about, `vidserve serve` (what `make serve` runs) ends its start with one line, the playground's
address, once it is ready, and a port already in use is one line."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from servers import Server, VidserveProcess

ROOT = Path(__file__).resolve().parents[1]


def folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools finds `package`: its own package-dir entry, or its parent's folder and its name."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[cut:])
    return ROOT / Path(*parts)


def test_every_folder_python_could_import_is_in_the_package_configuration():
    """What setuptools checks before it warns "Package 'X' is absent from the `packages` configuration":
    a folder with an importable name inside a listed package."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, package_dir = setuptools["packages"], setuptools["package-dir"]
    absent = [f"{package}.{child.name}" for package in packages for child in folder_of(package, package_dir).iterdir()
              if child.is_dir() and child.name.isidentifier() and child.name != "__pycache__"
              and f"{package}.{child.name}" not in packages]
    assert not absent, f"setuptools would warn that these are absent from the packages configuration: {absent}"
    # The folders of data files ship every file they hold.
    assert setuptools["package-data"]["vidserve.api.static"] == ["*"]
    assert folder_of("vidserve.api.static", package_dir) == ROOT / "api" / "static"


@pytest.fixture(scope="module")
def announced(tmp_path_factory):
    """`vidserve serve` as `make serve` runs it (default log level, warm-up on), started without
    polling it (a poll would log a line), once it has said where the playground is; and that line."""
    server = Server(tmp_path_factory.mktemp("quiet") / "data", env={"VIDSERVE_WARMUP": "1"},
                    extra=["--chat-model", ""])
    server.args.remove("--log-level")
    server.args.remove("warning")
    line = f"playground: http://127.0.0.1:{server.port}/"
    VidserveProcess.start(server)
    try:
        server.wait_for_log(line)
        yield server, line
    finally:
        server.stop()


def test_serve_says_where_the_playground_is_once_ready(announced):
    server, line = announced
    lines = [text for text in server.log.read_text().splitlines() if text.strip()]
    assert lines[-1] == line and lines.count(line) == 1, lines
    noise = [text for text in lines if any(word in text.lower() for word in ("warn", "error", "traceback"))]
    assert not noise, noise
    with urllib.request.urlopen(f"{server.url}/readyz", timeout=10) as response:
        assert response.status == 200  # warmed up before it said so


def test_a_port_in_use_is_one_line(announced, tmp_path):
    server, _ = announced
    taken = subprocess.run([sys.executable, "-m", "vidserve.cli", "serve", "--port", str(server.port),
                            "--data-dir", str(tmp_path / "other")], capture_output=True, text=True, timeout=60)
    assert taken.returncode == 2 and taken.stdout == ""
    assert taken.stderr.splitlines() == [
        f"vidserve: error: port {server.port} on 127.0.0.1 is already in use (another vidserve?): stop that server, "
        f"or choose another port (make serve PORT={server.port + 1}, or vidserve serve --port {server.port + 1})"]
    assert not (tmp_path / "other").exists()  # refused before anything was set up
