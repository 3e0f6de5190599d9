"""Every GET route answers while the embedded worker warms up: from the first moment `vidserve
serve` listens until /readyz says ready, none is a 5xx (the worker thread is then importing the
pipelines, torch and diffusers, that some routes report on). A real process, started fresh, so
nothing is imported before its worker imports it."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from polling import eventually
from servers import Server, VidserveProcess

# Routes served outside the schema: the playground page and what its model list asks.
UNLISTED = ["/", "/playground/models"]


@dataclass(frozen=True)
class Answer:
    path: str
    status: int
    code: str | None  # the error's code, for an error answer


def get_routes(client: httpx.Client) -> list[str]:
    """The app's GET routes without path parameters, from its own schema, and the unlisted ones."""
    schema = client.get("/openapi.json").json()
    listed = [path for path, operations in schema["paths"].items() if "get" in operations and "{" not in path]
    return ["/openapi.json", *listed, *UNLISTED]


def answer(client: httpx.Client, path: str) -> Answer:
    response = client.get(path)
    code = None
    if response.status_code >= 400 and response.headers.get("content-type", "").startswith("application/json"):
        code = response.json().get("error", {}).get("code")
    return Answer(path, response.status_code, code)


def listening(client: httpx.Client, server: Server) -> bool:
    server.fail_if_exited()
    try:
        client.get("/healthz")
    except httpx.TransportError:
        return False
    return True


def test_no_get_route_is_a_5xx_while_the_worker_warms_up(tmp_path):
    server = Server(tmp_path / "data", env={"VIDSERVE_WARMUP": "1"}, extra=["--chat-model", ""])
    VidserveProcess.start(server)  # not Server.start: that waits until ready, and the test is what comes before
    answers: list[Answer] = []
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            eventually(lambda: listening(client, server), interval=0.01, what="the server to listen")
            routes = get_routes(client)

            def ready() -> bool:  # one round of every route, until /readyz said ready in it
                server.fail_if_exited()
                round_ = [answer(client, path) for path in routes]
                answers.extend(round_)
                return any(a.path == "/readyz" and a.status == 200 for a in round_)

            eventually(ready, interval=0, what="/readyz to say ready")
    finally:
        server.stop()
    warming = [a for a in answers if a.path == "/readyz" and a.status != 200]
    assert warming and all(a.code == "warming_up" for a in warming), warming  # it was polled while warming up
    assert {"/v1/loras", "/v1/models", "/metrics", "/"} <= {a.path for a in answers}, routes
    failed = [a for a in answers if a.status >= 500 and a.path != "/readyz"]
    assert not failed, f"{len(failed)} of {len(answers)} answers were 5xx: {sorted(set(failed), key=str)}"
