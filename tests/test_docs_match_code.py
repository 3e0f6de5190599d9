"""Docs that are generated from the code, or name it, still say what the code does."""

from __future__ import annotations

from pathlib import Path

from vidserve.config import settings_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_setting_as_settings_declares_it():
    readme = README.read_text()
    assert settings_table() in readme, (
        "README's Settings table differs from the Settings class: paste the output of `python -m vidserve.config`")


def test_the_served_schema_names_the_response_models(tmp_path):
    from apps import settings_for

    from vidserve.api.app import create_app

    schema = create_app(settings_for(tmp_path)).openapi()

    def success(path: str, method: str, media_type: str = "application/json") -> dict:
        return schema["paths"][path][method]["responses"]["200"]["content"][media_type]["schema"]

    assert success("/v1/videos/{video_id}", "get") == {"$ref": "#/components/schemas/VideoObject"}
    assert success("/v1/videos", "get") == {"$ref": "#/components/schemas/VideoList"}
    assert success("/v1/chat/completions", "post") == {"$ref": "#/components/schemas/ChatCompletion"}
    event = success("/v1/chat/completions", "post", "text/event-stream")["properties"]["data"]["anyOf"][1]
    assert {"$ref": "#/components/schemas/ChatCompletionChunk"} in event["contentSchema"]["oneOf"]
    error = schema["paths"]["/v1/videos/{video_id}"]["get"]["responses"]["404"]["content"]["application/json"]
    assert error["schema"]["$ref"] == "#/components/schemas/ErrorResponse"
    video = schema["components"]["schemas"]["VideoObject"]
    assert {"id", "status", "progress", "chunks", "outputs"} <= set(video["required"])


ARCHITECTURE = README.parent / "docs" / "architecture.md"
SOURCE_FOLDERS = ("", "vidserve", "vidserve/jobs", "vidserve/media", "vidserve/storage", "vidserve/kernels", "pipelines",
                  "pipelines/llm", "workers", "api", "api/routers", "tests", "benchmarks", "training", "examples")


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
