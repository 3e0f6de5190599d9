"""Prompts a model cannot read are not passed over in silence: the shapes-world models say in
`/v1/models` which prompts they understand, and a video whose prompt names none of wan-shapes'
colours, shapes or motions, or is written in another script, carries a `prompt_not_understood`
warning from the moment it is queued."""

from __future__ import annotations

import json

import pytest
from apps import app_client, idle_services

from training import shapes_world as world
from vidserve import jobs
from vidserve.registry import CHAT_MODELS, MODELS, SHAPES_CAPTIONS, WEIGHTS

CAPTION = "a red circle moving left on a black background"
SPANISH = "un círculo rojo moviéndose a la izquierda sobre un fondo negro"
CHINESE = "一个红色的圆圈在黑色背景上向左移动"


def test_the_declared_words_are_those_wan_shapes_was_trained_on():
    assert MODELS["wan-shapes"].understands == SHAPES_CAPTIONS
    assert set(SHAPES_CAPTIONS.colours) == set(world.COLOURS)
    assert set(SHAPES_CAPTIONS.shapes) == set(world.SHAPES)
    assert set(SHAPES_CAPTIONS.motions) == set(world.MOTIONS + world.EXTRA_MOTIONS)
    assert set(SHAPES_CAPTIONS.backgrounds) == set(world.BACKGROUNDS)
    for example in SHAPES_CAPTIONS.examples:
        assert world.parse_prompt(example)["shape"] is not None, example
    # Every word its tokenizer knows is declared, a synonym, or a filler of the caption pattern.
    tokenizer = json.loads((WEIGHTS / "wan-shapes" / "tokenizer" / "tokenizer.json").read_text())
    known = set(tokenizer["model"]["vocab"]) - {"<pad>", "</s>", "<unk>"}
    declared = {*SHAPES_CAPTIONS.colours, *SHAPES_CAPTIONS.shapes, *SHAPES_CAPTIONS.motions,
                *SHAPES_CAPTIONS.backgrounds, *dict(SHAPES_CAPTIONS.synonyms)}
    assert declared <= known, declared - known
    assert known - declared == {"a", "an", "and", "background", "going", "in", "is", "moving", "object", "of", "on",
                                "shape", "standing", "the", "to", "video", "with"}
    assert set(CHAT_MODELS["vlm-shapes"].understands.colours) == set(world.COLOURS) | set(world.PAINT_COLOURS)


def test_the_model_cards_say_which_prompts_they_understand():
    for name in ("wan-shapes", "vlm-shapes"):
        card = (WEIGHTS / name / "README.md").read_text()
        assert "## Prompts it understands" in card, name
        assert "English" in card, name


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The API on a queue that runs nothing: what a submission says is all these tests look at."""
    tmp_path = tmp_path_factory.mktemp("prompts")
    with app_client(tmp_path, idle_services(tmp_path)) as (client, services):
        yield client, services


@pytest.fixture
def client(served):
    return served[0]


def submitted_warnings(client, **body) -> list[dict]:
    response = client.post("/v1/videos", json={"model": "wan-shapes", **body})
    assert response.status_code == 200, response.text
    video = response.json()
    stored = client.get(f"/v1/videos/{video['id']}").json()
    assert stored["warnings"] == video["warnings"]  # on the job itself, not only in the answer
    return video["warnings"]


def test_a_caption_of_the_shapes_world_carries_no_warning(client):
    assert submitted_warnings(client, prompt=CAPTION) == []
    assert submitted_warnings(client, prompt="A Grey disc going upward") == []  # synonyms, any case


@pytest.mark.parametrize(("prompt", "why"), [
    (SPANISH, "prompt names none of the colours, shapes or motions wan-shapes knows"),
    ("a dog running through a park", "prompt names none of the colours, shapes or motions wan-shapes knows"),
    (CHINESE, "prompt is written in another script (CJK), which wan-shapes cannot read"),
    ("a red circle движется влево", "prompt is written in another script (CYRILLIC), which wan-shapes cannot read"),
])
def test_a_prompt_the_model_cannot_read_is_queued_with_a_warning(client, prompt, why):
    [warning] = submitted_warnings(client, prompt=prompt)
    assert warning["code"] == "prompt_not_understood" and warning["chunk"] is None
    assert warning["message"].startswith(f"{why}, so the video will not follow it; wan-shapes understands "
                                         f"English only, like \"{CAPTION}\"")
    assert "colours red, green, blue, yellow; shapes circle, square, triangle" in warning["message"]


def test_each_chunk_prompt_of_a_storyboard_is_read_too(client):
    # 2 s at 16 fps: two chunks of wan-shapes' 17 frames; the second's prompt is not one it reads.
    warnings = submitted_warnings(client, prompt=CAPTION, seconds="2", prompts=[CAPTION, "un perro en el parque"])
    assert [(w["code"], w["message"].split(",")[0]) for w in warnings] == [
        ("prompt_not_understood", "prompts[1] (chunk 2) names none of the colours")]


def test_a_remix_with_a_prompt_the_model_cannot_read_carries_the_warning(served):
    client, services = served
    source = client.post("/v1/videos", json={"model": "wan-shapes", "prompt": CAPTION}).json()["id"]
    # Completed as a worker would leave it: a remix is of a finished video.
    services.store.update(source, jobs.start("w1", 60))
    services.store.update(source, jobs.complete("w1", {"video": f"{source}/video.mp4"}, {}))
    remix = client.post(f"/v1/videos/{source}/remix", json={"prompt": CHINESE})
    assert remix.status_code == 200, remix.text
    assert [w["code"] for w in remix.json()["warnings"]] == ["prompt_not_understood"]
    assert client.post(f"/v1/videos/{source}/remix", json={"prompt": "a blue square"}).json()["warnings"] == []


def test_a_model_without_a_declared_vocabulary_reads_anything(client):
    response = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": SPANISH})
    assert response.status_code == 200 and response.json()["warnings"] == []


def test_models_say_which_prompts_they_understand(tmp_path):
    with app_client(tmp_path, chat_model="vlm-shapes") as (client, _):
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    understands = models["wan-shapes"]["understands"]
    assert understands["language"] == "English" and understands["examples"][0] == CAPTION
    assert understands["colours"] == ["red", "green", "blue", "yellow"]
    assert understands["motions"] == ["left", "right", "up", "down", "bouncing", "still"]
    assert understands["synonyms"]["grey"] == "gray"
    assert models["wan-tiny"]["understands"] is None
    chat = models["vlm-shapes"]["understands"]
    assert chat["language"] == "English" and "Describe the image." in chat["examples"]
    assert "magenta" in chat["colours"] and chat["motions"] == []
