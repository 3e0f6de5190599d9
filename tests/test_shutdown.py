"""Stopping `vidserve serve` (Ctrl-C, SIGTERM) mid-job: one line naming the job it finishes, no
new job started, a second Ctrl-C stops at once, no traceback, and the job given back goes on from
its last finished chunk on the next start, its attempts counted."""

from __future__ import annotations

import signal
import subprocess

import httpx
from polling import eventually
from servers import Server
from test_crash_safety import denoise_steps

from vidserve.jobs import Job, JobStatus
from vidserve.jobs.store_sqlite import SQLiteJobStore

# Four chunks (33 + 3 x 32 frames): long enough to be stopped between its first and last.
STEPS = 10
CHAINED = {"model": "wan-tiny", "size": "64x64", "num_frames": 129, "num_inference_steps": STEPS}
CHUNKS = 4
TINY = {"model": "wan-tiny", "size": "64x64", "num_frames": 33, "num_inference_steps": 4}
# Bounds on a broken test, not claims about speed: a machine busy with other work stretches them.
JOBS_TIMEOUT = 600
EXIT_TIMEOUT = 60
NO_CHAT = ["--chat-model", ""]  # no chat model to load: these servers only run video jobs


def submit(url: str, **body) -> str:
    response = httpx.post(f"{url}/v1/videos", json={"prompt": "a fox", **body}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def video(url: str, video_id: str) -> dict:
    return httpx.get(f"{url}/v1/videos/{video_id}", timeout=10).json()


def chunks_made(url: str, video_id: str, at_least: int) -> dict | None:
    v = video(url, video_id)
    assert v["status"] == "in_progress", f"the job is {v['status']} before the signal"
    return v if len(v["chunks"]) >= at_least else None


def stored(server: Server, video_id: str) -> Job:
    store = SQLiteJobStore(server.data_dir / "jobs.sqlite")
    try:
        return store.get(video_id)
    finally:
        store.close()


def lines_naming(server: Server, video_id: str) -> list[str]:
    return [line for line in server.log.read_text(errors="replace").splitlines() if video_id in line]


def exit_code(server: Server) -> int:
    try:
        return server.proc.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError(f"the server did not exit; its log:\n{server.logs()}") from None


def test_ctrl_c_twice_mid_job_gives_it_back_and_it_goes_on_from_its_last_chunk_on_restart(tmp_path):
    data = tmp_path / "data"
    server = Server(data, extra=NO_CHAT).start()
    try:
        video_id = submit(server.url, **CHAINED)
        waiting_id = submit(server.url, **TINY)
        eventually(lambda: chunks_made(server.url, video_id, 1), timeout=JOBS_TIMEOUT, what="its first chunk")

        server.proc.send_signal(signal.SIGINT)
        server.wait_for_log(f"stopping: finishing {video_id} (")
        [line] = lines_naming(server, video_id)  # one line, saying what is left
        assert f"of {STEPS * CHUNKS} denoising steps left" in line, line

        server.proc.send_signal(signal.SIGINT)
        assert exit_code(server) == 0, server.logs()
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log

        given_back, waiting = stored(server, video_id), stored(server, waiting_id)
        made = len(given_back.chunks)
        assert (given_back.status, given_back.attempts) == (JobStatus.in_progress, 1)
        assert 1 <= made < CHUNKS, f"stopped after {made} of {CHUNKS} chunks"
        assert (waiting.status, waiting.attempts) == (JobStatus.queued, 0)  # no job started after the signal

        server = Server(data, extra=NO_CHAT).start()
        final = eventually(lambda: (v := video(server.url, video_id))["status"] in ("completed", "failed") and v,
                           timeout=JOBS_TIMEOUT, what="the job to end after the restart")
        assert (final["status"], final["attempts"]) == ("completed", 2), final
        assert len(final["chunks"]) == CHUNKS
        eventually(lambda: video(server.url, waiting_id)["status"] == "completed", timeout=JOBS_TIMEOUT,
                   what="the job that waited")
        # Both jobs done, so the count is settled: the chunks it had not finished, and the waiting job's one.
        assert denoise_steps(server.url) == STEPS * (CHUNKS - made) + TINY["num_inference_steps"]
    finally:
        server.stop()


def test_sigterm_past_the_grace_period_gives_the_job_back_and_exits(tmp_path):
    server = Server(tmp_path / "data", env={"VIDSERVE_SHUTDOWN_GRACE_SECONDS": "0"}, extra=NO_CHAT).start()
    try:
        video_id = submit(server.url, **CHAINED)
        eventually(lambda: chunks_made(server.url, video_id, 1), timeout=JOBS_TIMEOUT, what="its first chunk")
        server.proc.send_signal(signal.SIGTERM)
        assert exit_code(server) == 0, server.logs()  # one signal is enough: no grace to wait out
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log, log
        given_back = stored(server, video_id)
        assert (given_back.status, given_back.attempts) == (JobStatus.in_progress, 1)
        assert given_back.worker_id is None and given_back.lease_expires_at is not None  # anyone's to run again
        assert lines_naming(server, video_id)[-1].startswith(
            f"stopped {video_id} after {len(given_back.chunks)} of {CHUNKS} chunks"), log
    finally:
        server.stop()


def test_ctrl_c_on_an_idle_server_exits_quietly(tmp_path):
    server = Server(tmp_path / "data", extra=NO_CHAT).start()
    try:
        server.proc.send_signal(signal.SIGINT)
        assert exit_code(server) == 0, server.logs()
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log and "stopping" not in log, log
    finally:
        server.stop()
