"""The docs site builds: `mkdocs build --strict` turns every broken link, missing anchor, page
left out of the nav or nav entry without a page into a failure. And the README stays a front page."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_builds_the_site_without_a_warning(tmp_path):
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs' future, printed at every build.
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0 and "WARNING" not in built.stderr, built.stdout + built.stderr
    assert (tmp_path / "site" / "settings" / "index.html").is_file()


def test_the_readme_is_a_front_page_over_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {page.name for page in (ROOT / "docs").glob("*.md") if f"(docs/{page.name})" in readme}
    assert linked == {page.name for page in (ROOT / "docs").glob("*.md")}, "pages the README does not link to"
