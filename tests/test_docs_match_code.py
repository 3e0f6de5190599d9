"""Docs that are generated from the code, or name it, still say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from vidserve.config import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"
SETTINGS_PAGE = README.parent / "docs" / "settings.md"
# The README and the docs site's pages: where prose names settings and figures.
PROSE = [README, *sorted((README.parent / "docs").glob("*.md"))]


def test_the_settings_page_lists_every_setting_as_settings_declares_it():
    assert settings_table() in SETTINGS_PAGE.read_text(), (
        "docs/settings.md's table differs from the Settings class: paste the output of `python -m vidserve.config`")


# "`VIDSERVE_LORA_CACHE` (8)", "`VIDSERVE_SHUTDOWN_GRACE_SECONDS` (30 s)", "`VIDSERVE_OUTPUT_TTL` seconds (default
# 604800", "`VIDSERVE_CONTENT_URL_SECONDS`, default 3600": a setting's default, quoted in prose.
QUOTED_DEFAULT = re.compile(r"`VIDSERVE_(?P<name>[A-Z0-9_]+)`(?: seconds)?,? \(?(?:default\s+)?(?P<value>\d[\d.]*)\b")


def test_defaults_quoted_in_prose_are_the_settings_defaults():
    from vidserve.config import Settings

    quoted = [(path.name, m["name"], m["value"]) for path in PROSE for m in QUOTED_DEFAULT.finditer(path.read_text())]
    wrong = [(page, name, value, Settings.model_fields[name.lower()].default) for page, name, value in quoted
             if float(value) != Settings.model_fields[name.lower()].default]
    assert len(quoted) >= 10 and not wrong, f"(page, setting, quoted, default): {wrong}"


def test_figures_in_prose_are_the_measured_ones():
    """A ratio ("2.6x faster") or a share ("90% of held-out clips") in the README or a guide is one
    that benchmarks/RESULTS.md or a model card records (a share as the fraction its tables give)."""
    measured = "".join(path.read_text() for path in [README.parent / "benchmarks" / "RESULTS.md",
                                                    *(README.parent / "vidserve" / "weights").glob("*/README.md")])
    guides = [path for path in PROSE if path.name != "architecture.md"]
    ratios = [(path.name, m[0]) for path in guides for m in re.finditer(r"(?<![\w.])\d+\.\d+x\b", path.read_text())]
    shares = [(path.name, m[0], f"{int(m[1]) / 100:.2f}") for path in guides
              for m in re.finditer(r"(?<![\w.])(\d{1,3})%", path.read_text())]
    def recorded(figure: str) -> bool:  # as a whole number: "1.5x" is not recorded by "11.5x"
        return re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", measured) is not None

    unmeasured = [(page, ratio) for page, ratio in ratios if not recorded(ratio)]
    unmeasured += [(page, share) for page, share, fraction in shares if not recorded(fraction)]
    assert len(ratios) + len(shares) >= 10 and not unmeasured, f"figures no result records: {unmeasured}"


def test_the_guides_name_files_that_exist():
    """A module, script or page the README or a guide names by its path (`vidserve/storage/base.py`) is there."""
    named = {(path.name, m[1]) for path in PROSE if path.name != "architecture.md"
             for m in re.finditer(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|sh|md|png))`", path.read_text())}
    missing = sorted((page, name) for page, name in named if not (README.parent / name).exists())
    assert len(named) >= 10 and not missing, f"(page, path) of files that do not exist: {missing}"


def test_the_kv_cache_block_size_in_prose_is_the_engines():
    from vidserve.pipelines.llm import engine

    chat = (README.parent / "docs" / "chat.md").read_text()
    assert re.findall(r"one pool of (\d+)-token blocks", chat) == [str(engine.BLOCK_SIZE)]


def test_the_served_schema_names_the_response_models(tmp_path):
    from apps import settings_for

    from vidserve.api.app import create_app

    schema = create_app(settings_for(tmp_path)).openapi()

    def success(path: str, method: str, media_type: str = "application/json") -> dict:
        return schema["paths"][path][method]["responses"]["200"]["content"][media_type]["schema"]

    assert success("/v1/videos/{video_id}", "get") == {"$ref": "#/components/schemas/VideoObject"}
    assert success("/v1/videos", "get") == {"$ref": "#/components/schemas/VideoList"}
    assert success("/v1/chat/completions", "post") == {"$ref": "#/components/schemas/ChatCompletion"}
    assert success("/v1/models", "get") == {"$ref": "#/components/schemas/ModelList"}
    assert success("/v1/loras", "get") == {"$ref": "#/components/schemas/LoraList"}
    event = success("/v1/chat/completions", "post", "text/event-stream")["properties"]["data"]["anyOf"][1]
    assert {"$ref": "#/components/schemas/ChatCompletionChunk"} in event["contentSchema"]["oneOf"]
    error = schema["paths"]["/v1/videos/{video_id}"]["get"]["responses"]["404"]["content"]["application/json"]
    assert error["schema"]["$ref"] == "#/components/schemas/ErrorResponse"
    video = schema["components"]["schemas"]["VideoObject"]
    assert {"id", "status", "progress", "chunks", "outputs"} <= set(video["required"])


ARCHITECTURE = README.parent / "docs" / "architecture.md"
SOURCE_FOLDERS = ("", "vidserve", "vidserve/jobs", "vidserve/media", "vidserve/storage", "vidserve/kernels", "pipelines",
                  "pipelines/llm", "workers", "api", "api/routers", "api/protocol", "tests", "benchmarks", "training", "examples")


def test_the_architecture_page_names_modules_that_exist_and_every_core_module():
    import re

    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"`((?:[\w.-]+/)*[\w-]+\.py)`", text))
    missing = sorted(name for name in named
                     if not any((README.parent / folder / name).is_file() for folder in SOURCE_FOLDERS))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
    core = [path for folder in ("vidserve", "vidserve/jobs", "vidserve/media", "vidserve/storage")
            for path in sorted((README.parent / folder).glob("*.py")) if path.name != "__init__.py"]
    unnamed = [str(path.relative_to(README.parent)) for path in core if f"`{path.name}`" not in text]
    assert not unnamed, f"docs/architecture.md does not name these core modules: {unnamed}"
