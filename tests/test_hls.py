"""HLS of every video job: the playlist grows as chunks finish and plays before the video is
done; ffmpeg reading it over HTTP gets the video's frames; the segments live in Storage
(S3 included: presigned redirects, expiry); and on a server with keys, stream tokens."""

from __future__ import annotations

import subprocess
import time
import uuid

import httpx
import numpy as np
import pytest
from apps import app_client
from polling import eventually
from servers import Server
from stores import TEST_BUCKET

from vidserve.media import ffmpeg_exe, read_video
from vidserve.storage.s3 import s3_client

TINY = {"model": "wan-tiny", "size": "64x64", "num_inference_steps": 1}
KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"


def decode(source: str, size: int = 64) -> np.ndarray:
    """Every frame ffmpeg reads from `source` (a file, or a playlist URL), as RGB."""
    run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", source, "-f", "rawvideo", "-pix_fmt",
                          "rgb24", "-"], capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    return np.frombuffer(run.stdout, np.uint8).reshape(-1, size, size, 3)


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    mse = ((a.astype(np.float64) - b) ** 2).mean(axis=(1, 2, 3))
    return 10 * np.log10(255 ** 2 / np.maximum(mse, 1e-10))


def finished(http, video_id: str, timeout: float = 300) -> dict:
    def ended() -> dict:
        video = http.get(f"/v1/videos/{video_id}").json()
        assert video["status"] in ("completed", "failed", "cancelled"), video["status"]
        return video

    return eventually(ended, timeout=timeout, what=f"{video_id} to end")


@pytest.fixture(scope="module")
def shapes_server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("hls") / "data", env={"VIDSERVE_CHAT_MODEL": ""}).start()
    yield server
    server.stop()


def test_a_four_chunk_video_plays_while_it_is_made_and_ffmpeg_reads_all_of_it(shapes_server, tmp_path):
    with httpx.Client(base_url=shapes_server.url, timeout=30) as http:
        video = http.post("/v1/videos", json={"model": "wan-shapes", "prompt": "a red circle moves right",
                                              "seconds": 4, "num_inference_steps": 8}).json()
        assert video["num_frames"] == 65 and video["stream_url"] == f"/v1/videos/{video['id']}/stream.m3u8"

        def first_segment_listed() -> str:
            playlist = http.get(video["stream_url"])
            assert playlist.status_code == 200 and playlist.headers["content-type"] == "application/vnd.apple.mpegurl"
            assert "stream/0.m4s" in playlist.text, playlist.text
            return playlist.text

        playlist = eventually(first_segment_listed, interval=0.05, what="the first segment to be listed")
        # The job is in its first half: at most 2 of its 4 chunks are done.
        running = http.get(f"/v1/videos/{video['id']}").json()
        assert running["status"] == "in_progress" and len(running["chunks"]) <= 2, running
        assert "#EXT-X-PLAYLIST-TYPE:EVENT" in playlist and "#EXT-X-ENDLIST" not in playlist
        assert '#EXT-X-MAP:URI="stream/init.mp4"' in playlist and "#EXT-X-VERSION:7" in playlist
        # Playable now: the init and first segments decode to the first chunk's 17 frames.
        first = tmp_path / "first.mp4"
        first.write_bytes(http.get(f"/v1/videos/{video['id']}/stream/init.mp4").content
                          + http.get(f"/v1/videos/{video['id']}/stream/0.m4s").content)
        assert len(decode(str(first))) == 17

        done = finished(http, video["id"])
        assert done["status"] == "completed"
        assert [c["segment"] for c in done["chunks"]] == [f"/v1/videos/{video['id']}/stream/{i}.m4s" for i in range(4)]
        ended = http.get(video["stream_url"]).text
        assert ended.rstrip().endswith("#EXT-X-ENDLIST") and ended.count("#EXTINF:") == 4
        (tmp_path / "video.mp4").write_bytes(http.get(f"/v1/videos/{video['id']}/content").content)
    streamed = decode(shapes_server.url + video["stream_url"])
    downloaded = read_video(tmp_path / "video.mp4")[0]
    assert len(streamed) == len(downloaded) == 65
    assert psnr(streamed, downloaded).min() >= 40
    metrics = httpx.get(f"{shapes_server.url}/metrics").text
    assert 'vidserve_time_to_first_segment_seconds_count{model="wan-shapes"}' in metrics


def test_an_extension_streams_its_source_first(shapes_server):
    with httpx.Client(base_url=shapes_server.url, timeout=30) as http:
        source = finished(http, http.post("/v1/videos", json={**TINY, "prompt": "a fox", "seconds": 1}).json()["id"])
        extension = http.post("/v1/videos/extensions", json={"prompt": "it runs", "seconds": 1,
                                                             "video": {"id": source["id"]}}).json()
        done = finished(http, extension["id"])
        playlist = http.get(done["stream_url"]).text
    assert done["status"] == "completed"
    assert playlist.index("stream/source.m4s") < playlist.index("stream/0.m4s")
    assert len(decode(shapes_server.url + done["stream_url"])) == done["num_frames"] == 17 + 16


def test_a_failed_or_cancelled_video_ends_its_playlist(shapes_server):
    with httpx.Client(base_url=shapes_server.url, timeout=30) as http:
        video = http.post("/v1/videos", json={**TINY, "prompt": "stopped", "seconds": 6,
                                              "num_inference_steps": 100}).json()
        eventually(lambda: "stream/0.m4s" in http.get(video["stream_url"]).text, what="the first segment")
        http.post(f"/v1/videos/{video['id']}/cancel")
        assert finished(http, video["id"])["status"] == "cancelled"
        playlist = http.get(video["stream_url"]).text
        assert playlist.rstrip().endswith("#EXT-X-ENDLIST") and "stream/0.m4s" in playlist
        # What was made stays playable.
        assert http.get(f"/v1/videos/{video['id']}/stream/0.m4s").status_code == 200
        missing = http.get(f"/v1/videos/{video['id']}/stream/9.m4s")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "segment_not_ready"


def test_stream_tokens_stand_in_for_the_key(tmp_path):
    with app_client(tmp_path, api_keys=f"{KEY_A},{KEY_B}") as (client, services):
        a, b = {"Authorization": f"Bearer {KEY_A}"}, {"Authorization": f"Bearer {KEY_B}"}
        video = client.post("/v1/videos", json={**TINY, "prompt": "mine", "seconds": 4}, headers=a).json()
        other = client.post("/v1/videos", json={**TINY, "prompt": "theirs"}, headers=b).json()
        video = _wait(client, video, a)
        _wait(client, other, b)
        url = video["stream_url"]
        assert url.startswith(f"/v1/videos/{video['id']}/stream.m3u8?token=")
        # A player, no header: the token is enough, and the playlist hands its segments one.
        playlist = client.get(url)
        assert playlist.status_code == 200
        uris = [line for line in playlist.text.splitlines() if line.startswith("stream/")]
        token = url.partition("token=")[2]
        assert len(uris) == 2 and all(uri.endswith(f"?token={token}") for uri in uris)
        assert client.get(f"/v1/videos/{video['id']}/{uris[0]}").status_code == 200
        # The token names the video's key: A's here, B's on B's video.
        tokens = services.stream_tokens
        key_name = tokens.check(video["id"], token)
        other_name = tokens.check(other["id"], other["stream_url"].partition("token=")[2])
        assert {key_name, other_name} == {key.name for key in services.keyring.keys}
        expired = tokens.sign(video["id"], key_name, now=time.time() - 2 * tokens.seconds)
        tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
        renamed = token.replace(f".{key_name}.", f".{other_name}.")
        for bad in (expired, tampered, renamed, tokens.sign(other["id"], key_name), "garbage",
                    "99999999999.", f"99999999999..{token.rpartition('.')[2]}"):
            refused = client.get(f"/v1/videos/{video['id']}/stream.m3u8", params={"token": bad})
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "invalid_stream_token", bad
            assert client.get(f"/v1/videos/{video['id']}/stream/0.m4s", params={"token": bad}).status_code == 403
        # Without a token, the key decides: another key's video is absent, no key is 401.
        assert client.get(f"/v1/videos/{video['id']}/stream.m3u8", headers=a).status_code == 200
        assert client.get(f"/v1/videos/{video['id']}/stream.m3u8", headers=b).status_code == 404
        assert client.get(f"/v1/videos/{video['id']}/stream/0.m4s", headers=b).status_code == 404
        assert client.get(f"/v1/videos/{video['id']}/stream.m3u8").status_code == 401


def _wait(client, video: dict, headers: dict) -> dict:
    def ended() -> dict:
        current = client.get(f"/v1/videos/{video['id']}", headers=headers).json()
        assert current["status"] in ("completed", "failed", "cancelled"), current["status"]
        return current

    done = eventually(ended, what=f"{video['id']} to end")
    assert done["status"] == "completed", done
    return done


def test_segments_in_s3_redirect_to_presigned_urls_and_expire(tmp_path, s3_url):
    prefix = f"test-{uuid.uuid4().hex[:16]}/files"
    with app_client(tmp_path, storage=f"s3://{TEST_BUCKET}/{prefix}", s3_endpoint_url=s3_url, content_redirect=True,
                    output_ttl=3, expiry_sweep_seconds=0.2) as (client, _):
        video = _wait(client, client.post("/v1/videos", json={**TINY, "prompt": "kept a while", "seconds": 4}).json(),
                      {})
        keys = [item["Key"] for item in s3_client(s3_url).list_objects_v2(
            Bucket=TEST_BUCKET, Prefix=f"{prefix}/{video['id']}/stream/").get("Contents", [])]
        assert sorted(k.rsplit("/", 1)[1] for k in keys) == ["0.m4s", "1.m4s", "init.mp4"]
        redirect = client.get(f"/v1/videos/{video['id']}/stream/1.m4s", follow_redirects=False)
        assert redirect.status_code == 307
        presigned = httpx.get(redirect.headers["location"])
        assert presigned.status_code == 200 and presigned.content == s3_client(s3_url).get_object(
            Bucket=TEST_BUCKET, Key=f"{prefix}/{video['id']}/stream/1.m4s")["Body"].read()

        def expired() -> bool:
            playlist = client.get(video["stream_url"])
            assert playlist.status_code == 410, playlist.status_code
            listing = s3_client(s3_url).list_objects_v2(Bucket=TEST_BUCKET, Prefix=f"{prefix}/{video['id']}/")
            assert not listing.get("Contents"), "its files are still in the bucket"
            return True

        eventually(expired, timeout=60, what=f"{video['id']} to expire")
