"""Stream links on a server with keys, over real HTTP: a link ends at the expiry it was issued
with however often its playlist is reloaded (the playlist hands its segments the link's own token,
the same on every read), it ends when its key is removed from the keys file, and a player started
on a video still in the queue (ffmpeg here) waits for the first segment instead of failing."""

from __future__ import annotations

import subprocess
import threading

import httpx
import numpy as np
import pytest
from polling import eventually
from servers import Server
from test_hls import TINY, finished

from vidserve.keys import KeyRing, key_digest
from vidserve.media import ffmpeg_exe
from vidserve.stream_tokens import StreamTokens

KEYS = {"team-a": "key-a-0123456789", "team-c": "key-c-0123456789", "ops": "key-ops-0123456789"}


def keys_toml(names) -> str:
    return "".join(f'[[keys]]\nname = "{name}"\nsha256 = "{key_digest(KEYS[name])}"\n'
                   f'role = "{"admin" if name == "ops" else "user"}"\n' for name in names)


def as_key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def segment_uris(playlist: str) -> list[str]:
    return [line for line in playlist.splitlines() if line.startswith("stream/")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-links")
    (folder / "keys.toml").write_text(keys_toml(KEYS))
    # A held playlist request waits out a loaded machine's slow first chunk, not the default 30 s.
    server = Server(folder / "data", env={"VIDSERVE_CHAT_MODEL": "", "VIDSERVE_KEYS_FILE": str(folder / "keys.toml"),
                                          "VIDSERVE_STREAM_HOLD_SECONDS": "120"}).start()
    yield server
    server.stop()


def made_by(server: Server, key: str, prompt: str) -> dict:
    """A completed one-chunk video of `key`, as that key reads it now (a fresh stream_url)."""
    with httpx.Client(base_url=server.url, headers=as_key(key), timeout=30) as http:
        video = finished(http, http.post("/v1/videos", json={**TINY, "prompt": prompt, "seconds": 1}).json()["id"])
    assert video["status"] == "completed", video
    return video


def test_a_stream_link_ends_at_its_expiry_however_often_its_playlist_is_reloaded(server):
    video = made_by(server, "team-a", "a link that ends")
    token = video["stream_url"].partition("?token=")[2]
    with httpx.Client(base_url=server.url, timeout=30) as player:  # no key: the token alone
        first, again = player.get(video["stream_url"]), player.get(video["stream_url"])
        assert first.status_code == again.status_code == 200
        # The same URLs on every read (a CDN can cache them), each with the link's own token.
        assert segment_uris(first.text) == segment_uris(again.text) == [f"stream/0.m4s?token={token}"]
        # A link issued a moment ago for 2 s, signed as the server signs (its kept secret).
        secret = (server.data_dir / "stream_secret").read_text().strip()
        short = StreamTokens(secret, seconds=2).sign(video["id"], "team-a")
        playlist_path = f"/v1/videos/{video['id']}/stream.m3u8"
        newest = short

        def refused() -> bool:
            # A player that reloads with the newest token it was handed, as a renewing one would.
            nonlocal newest
            playlist = player.get(playlist_path, params={"token": newest})
            if playlist.status_code == 403:
                assert playlist.json()["error"]["code"] == "invalid_stream_token", playlist.text
                return True
            handed = {uri.partition("?token=")[2] for uri in segment_uris(playlist.text)}
            assert handed == {short}, f"the playlist handed out {handed}, not the link's own token {short}"
            newest = handed.pop()
            return False

        eventually(refused, timeout=60, interval=0.2, what="the 2 s link to expire")
        assert player.get(f"/v1/videos/{video['id']}/stream/0.m4s", params={"token": short}).status_code == 403
        assert player.get(video["stream_url"]).status_code == 200  # the hour-long link still works


def test_ffmpeg_started_on_a_queued_video_waits_for_it_and_reads_all_of_it(server, tmp_path):
    with httpx.Client(base_url=server.url, headers=as_key("team-a"), timeout=30) as http:
        blocker = http.post("/v1/videos", json={**TINY, "prompt": "in the way", "seconds": 6,
                                                "num_inference_steps": 100}).json()
        eventually(lambda: http.get(f"/v1/videos/{blocker['id']}").json()["status"] == "in_progress",
                   what="the first video to start")
        video = http.post("/v1/videos", json={**TINY, "prompt": "waited for", "seconds": 1}).json()
        dropped = http.post("/v1/videos", json={**TINY, "prompt": "never made", "seconds": 1}).json()
        assert video["status"] == dropped["status"] == "queued"
        log, frames = tmp_path / "ffmpeg.log", tmp_path / "frames.raw"
        with log.open("wb") as stderr:
            ffmpeg = subprocess.Popen([ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "debug",
                                       "-i", server.url + video["stream_url"], "-f", "rawvideo", "-pix_fmt", "rgb24",
                                       str(frames)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        held: list[httpx.Response] = []
        # Held too; its video is cancelled before any segment: the ended, empty playlist, long before the hold's end.
        reader = threading.Thread(target=lambda: held.append(httpx.get(server.url + dropped["stream_url"], timeout=60)))
        reader.start()
        try:
            eventually(lambda: f"request: GET {video['stream_url']} " in log.read_text(errors="replace"),
                       what="ffmpeg to ask for the playlist")
            assert http.get(f"/v1/videos/{video['id']}").json()["status"] == "queued"  # asked before it ran
            assert http.post(f"/v1/videos/{dropped['id']}/cancel").json()["status"] == "cancelled"
            reader.join(timeout=90)
            assert held and held[0].status_code == 200, held
            assert held[0].text.rstrip().endswith("#EXT-X-ENDLIST") and not segment_uris(held[0].text)
            http.post(f"/v1/videos/{blocker['id']}/cancel")
            code = ffmpeg.wait(timeout=300)
            assert code == 0, log.read_text(errors="replace")[-3000:]
        finally:
            if ffmpeg.poll() is None:
                ffmpeg.kill()
                ffmpeg.wait()
        done = finished(http, video["id"])
    assert done["status"] == "completed"
    assert len(np.frombuffer(frames.read_bytes(), np.uint8).reshape(-1, 64, 64, 3)) == done["num_frames"] == 17


def test_removing_a_key_from_the_keys_file_ends_its_stream_links(server):
    mine, kept = made_by(server, "team-c", "revoked"), made_by(server, "team-a", "kept")
    keys_file = server.data_dir.parent / "keys.toml"
    with httpx.Client(base_url=server.url, timeout=30) as player:
        assert player.get(mine["stream_url"]).status_code == 200
        # A keys file that no longer reads keeps the keys read before it.
        keys_file.write_text("[[keys]\n")

        def kept_on() -> bool:  # the file is looked at again as requests come
            assert player.get(mine["stream_url"]).status_code == 200
            assert "keeping the 3 keys read before" in server.logs(), server.logs()
            return True

        eventually(kept_on, what="the unreadable keys file to be logged")
        assert player.get(mine["stream_url"]).status_code == 200
        keys_file.write_text(keys_toml(["team-a", "ops"]))

        def revoked() -> bool:
            refused = player.get(mine["stream_url"])
            assert refused.status_code == 403, refused.status_code
            assert "'team-c', which this server no longer has" in refused.json()["error"]["message"]
            return True

        eventually(revoked, what="team-c's stream link to be refused")
        segment = f"/v1/videos/{mine['id']}/stream/0.m4s?{mine['stream_url'].partition('?')[2]}"
        assert player.get(segment).status_code == 403
        assert player.get(f"/v1/videos/{mine['id']}", headers=as_key("team-c")).status_code == 401
        # An admin still sees the video; a link it is handed names the owner's key, gone: refused too.
        relinked = player.get(f"/v1/videos/{mine['id']}", headers=as_key("ops")).json()["stream_url"]
        assert player.get(relinked).status_code == 403
        assert player.get(kept["stream_url"]).status_code == 200


def test_a_keys_file_emptied_later_locks_everyone_out_rather_than_opening_the_server(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(keys_toml(["team-a"]))
    ring = KeyRing.from_settings(frozenset(), path)
    assert ring.enabled and ring.find(KEYS["team-a"].encode()).name == "team-a"
    path.write_text("keys = []\n")
    eventually(lambda: ring.find(KEYS["team-a"].encode()) is None, what="the emptied file to be read")
    assert ring.enabled and ring.named("team-a") is None
