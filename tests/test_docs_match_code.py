"""Docs that are generated from the code, or name it, still say what the code does."""

from __future__ import annotations

from pathlib import Path

from vidserve.config import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_setting_as_settings_declares_it():
    readme = README.read_text()
    assert settings_table() in readme, (
        "README's Settings table differs from the Settings class: paste the output of `python -m vidserve.config`")
