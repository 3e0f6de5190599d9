"""Scheduling: fair share across keys, priorities with aging, and where a waiting job stands.

The policy on its own (workers/fair_share.py), the Lua claim against it on a real Redis, the
estimate's arithmetic; then the embedded server end to end (start order recorded by the
runner itself), and one Celery fleet of two API processes and a worker."""

from __future__ import annotations

import random
import time
import uuid

import httpx
import pytest
from apps import app_client
from polling import eventually
from servers import Server, Worker
from stores import RedisServer

from vidserve import jobs as jobs_
from vidserve.jobs import Job
from vidserve.jobs.standing import Running, Standing, standings
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.keys import key_digest
from vidserve.params import JobParams
from vidserve.priorities import PRIORITIES, level
from vidserve.workers.fair_share import Entry, Fairness, next_entry, start_order
from vidserve.workers.redis_schedule import RedisSchedule
from vidserve.workers.runner import JobRunner

NOW = 1_000_000.0
AGING = 600.0


def entry(job_id: str, key: str = "", priority: str = "normal", age: float = 0.0, **fields) -> Entry:
    return Entry(id=job_id, key=key, level=level(priority), queued_at=NOW - age, **fields)


def ids(entries: list[Entry]) -> list[str]:
    return [e.id for e in entries]


# --- the policy ------------------------------------------------------------------------------


def test_without_keys_the_order_is_oldest_first():
    waiting = [entry(f"j{i}", age=10 - i) for i in range(5)]
    assert ids(start_order(waiting[::-1], Fairness(), NOW, AGING)) == ["j0", "j1", "j2", "j3", "j4"]


def test_a_key_with_one_job_goes_before_a_key_that_already_started_one():
    fairness = Fairness()
    fairness.charge(entry("a0", "a"))  # a's first job is running
    waiting = [entry(f"a{i}", "a", age=10 - i) for i in range(1, 6)] + [entry("b0", "b", age=1)]
    assert ids(start_order(waiting, fairness, NOW, AGING)) == ["b0", "a1", "a2", "a3", "a4", "a5"]


def test_keys_alternate_and_a_share_of_two_starts_twice_as_often():
    waiting = [entry(f"a{i}", "a", age=100 - i) for i in range(6)] + \
              [entry(f"b{i}", "b", age=50 - i, share=2.0) for i in range(6)]
    order = ids(start_order(waiting, Fairness(), NOW, AGING))
    assert order[:9] == ["a0", "b0", "b1", "a1", "b2", "b3", "a2", "b4", "b5"]


def test_a_key_back_from_idle_is_owed_no_backlog():
    fairness = Fairness()
    for i in range(50):  # b alone has been running jobs for a while
        fairness.charge(entry(f"old{i}", "b"))
    fairness.charge(entry("a-long-ago", "a"))  # a's one job, long ago, with b still ahead
    waiting = [entry(f"a{i}", "a", age=10 - i) for i in range(3)] + [entry(f"b{i}", "b", age=9 - i) for i in range(3)]
    order = ids(start_order(waiting, fairness, NOW, AGING))
    assert order[:2] in (["a0", "b0"], ["b0", "a0"]) and order[2:4] in (["a1", "b1"], ["b1", "a1"])


def test_priority_first_then_aging_lifts_a_waiting_job_one_level():
    waiting = [entry("low-old", priority="low", age=AGING + 1), entry("normal", age=5),
               entry("high", priority="high", age=1), entry("low-new", priority="low", age=AGING - 1)]
    # low-old counts as normal, and it is the oldest normal one.
    assert ids(start_order(waiting, Fairness(), NOW, AGING)) == ["high", "low-old", "normal", "low-new"]


def test_a_job_given_back_by_its_worker_goes_first_in_its_priority():
    fairness = Fairness()
    fairness.charge(entry("x", "a"))
    waiting = [entry("b0", "b", age=5), entry("a-again", "a", age=1, retry=True),
               entry("h", "c", priority="high", age=0)]
    assert ids(start_order(waiting, fairness, NOW, AGING)) == ["h", "a-again", "b0"]


def test_estimates_play_the_line_forward_from_the_running_jobs():
    order = [("q1", "m"), ("q2", "m"), ("q3", "other")]
    lines = standings(order, [Running("m", NOW - 4)], {"m": 10.0}, 1, NOW)
    assert lines["q1"] == Standing(1, NOW + 6) and lines["q2"] == Standing(2, NOW + 16)
    assert lines["q3"] == Standing(3, None)  # no duration of `other` yet
    two = standings(order[:2], [Running("m", NOW - 4)], {"m": 10.0}, 2, NOW)
    assert [two[i].estimated_start_at for i in ("q1", "q2")] == [NOW, NOW + 6]  # the idle worker takes q1
    assert standings(order[:1], [Running("m", NOW - 30)], {"m": 10.0}, 1, NOW)["q1"].estimated_start_at == NOW


# --- the Lua claim is the same policy ----------------------------------------------------------


def params(priority: str) -> JobParams:
    return JobParams(width=64, height=64, num_frames=5, fps=16, steps=1, guidance=1.0, seed=1, chunk_frames=(5,),
                     seconds="0.25", priority=priority)


def test_the_redis_claim_picks_what_the_policy_picks(redis_url):
    rng = random.Random(7)
    store = RedisJobStore(redis_url, prefix=f"sched-{uuid.uuid4().hex}")
    schedule = RedisSchedule(store, aging_seconds=AGING)
    now = time.time()
    jobs = []
    for i in range(40):
        # Ages far from the aging boundary: the claim reads the clock a moment after the test.
        age = rng.choice([1.0, 20.0, AGING + 100, AGING + 200]) + i * 1e-3
        job = Job(model="wan-tiny", prompt="p", params=params(rng.choice(PRIORITIES)), created_at=now - age,
                  owner=rng.choice(["a", "b", "c", None]), share=rng.choice([1.0, 0.5, 3.0]),
                  attempts=int(rng.random() < 0.1))
        store.create(job)
        schedule.add(job)
        jobs.append(job)
    cancelled = jobs[5]
    store.update(cancelled.id, jobs_.request_cancel)  # dropped at its turn
    waiting = [Entry.of(job) for job in jobs if job is not cancelled]
    queued = [job.id for job in jobs if job is not cancelled]
    predicted = list(schedule.standings("wan-tiny", queued, [], 1))  # in the order they stand
    fairness, claimed = Fairness(), []
    while (job_id := schedule.claim("wan-tiny")) is not None:
        expected = next_entry(waiting, fairness, now, AGING)
        assert job_id == expected.id, f"claim {len(claimed)}"
        fairness.charge(expected)
        waiting.remove(expected)
        claimed.append(job_id)
    assert waiting == [] and claimed == predicted


# --- the embedded server, end to end ---------------------------------------------------------

KEYS = {"a": "key-a-0123456789", "b": "key-b-0123456789", "boss": "key-boss-0123456789",
        "admin": "key-admin-0123456789"}
# Same size every time, so the recent durations say how long the next one takes.
JOB = {"model": "wan-tiny", "size": "64x64", "num_frames": 17, "num_inference_steps": 4}
# Long enough that the jobs queued behind it are all in line before it ends.
BLOCKER = {**JOB, "num_inference_steps": 40}


def keys_file(folder) -> str:
    path = folder / "keys.toml"
    roles = {"boss": 'max_priority = "high"\n', "admin": 'role = "admin"\n'}
    path.write_text("".join(f'[[keys]]\nname = "{name}"\nsha256 = "{key_digest(key)}"\n{roles.get(name, "")}\n'
                            for name, key in KEYS.items()))
    return str(path)


class Fleet:
    """A client on a running server (in-process or not) and the ids its worker started, in order."""

    def __init__(self, client, started: list[str]):
        self.client, self.started = client, started

    def submit(self, key: str | None = None, body: dict = JOB, **fields) -> str:
        response = self.client.post("/v1/videos", json={"prompt": "a fox", **body, **fields}, headers=auth(key))
        assert response.status_code == 200, response.text
        return response.json()["id"]

    def videos(self) -> dict[str, dict]:
        page = self.client.get("/v1/videos", params={"limit": 100}, headers=auth("admin")).json()["data"]
        return {video["id"]: video for video in page}

    def wait_running(self, video_id: str) -> None:
        eventually(lambda: self.videos()[video_id]["status"] == "in_progress", timeout=300, what=f"{video_id} to run")

    def wait_done(self, ids: list[str]) -> dict[str, dict]:
        def done():
            videos = self.videos()
            waiting = [i for i in ids if videos[i]["status"] != "completed"]
            assert not waiting, f"not completed yet: {[videos[i]['status'] for i in waiting]}"
            return videos

        return eventually(done, timeout=600, interval=0.2, what=f"{len(ids)} jobs to complete")


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"} if key else {}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """An embedded server with keys a, b (users), boss (a user allowed high) and admin, whose
    worker records the order it starts jobs in."""
    folder = tmp_path_factory.mktemp("scheduling")
    started: list[str] = []
    run = JobRunner.run

    def recording(runner, job_id):
        done = run(runner, job_id)
        if done is not None:  # it started (one worker: calls end in the order they began)
            started.append(job_id)
        return done

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(JobRunner, "run", recording)
        with app_client(folder, keys_file=keys_file(folder)) as (client, _):
            yield Fleet(client, started)


def test_a_key_with_one_job_starts_no_later_than_second_behind_a_key_with_six(embedded):
    a = [embedded.submit("a", seed=i) for i in range(6)]
    b = embedded.submit("b")
    embedded.wait_done([*a, b])
    order = [i for i in embedded.started if i in {*a, b}]
    assert order.index(b) <= 2, order  # right after a's first, or after a's second had started first
    metrics = embedded.client.get("/metrics", headers=auth("admin")).text
    for key in ("a", "b"):  # by the key's name, never the key
        assert f'vidserve_queue_wait_seconds_count{{key="{key}",model="wan-tiny",priority="normal"}}' in metrics
    assert KEYS["a"] not in metrics


def test_a_high_job_starts_next_after_the_running_one_and_only_keys_allowed_may_ask(embedded):
    blocker = embedded.submit("a", BLOCKER)
    embedded.wait_running(blocker)
    normal = [embedded.submit(key) for key in ("a", "b", "a")]
    high = embedded.submit("boss", priority="high")
    embedded.wait_done([blocker, *normal, high])
    assert embedded.started[embedded.started.index(blocker) + 1] == high

    before = set(embedded.videos())
    for key in ("a", "b"):
        refused = embedded.client.post("/v1/videos", json={"prompt": "now", **JOB, "priority": "high"},
                                       headers=auth(key))
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["param"] == "priority"
        remix = embedded.client.post(f"/v1/videos/{normal[0]}/remix", json={"prompt": "now", "priority": "high"},
                                     headers=auth("a"))
        assert remix.status_code == 403 and remix.json()["error"]["param"] == "priority"
    assert set(embedded.videos()) == before  # nothing was queued


def test_queue_positions_fall_match_the_start_order_and_the_estimates_hold(embedded):
    warm_up = embedded.submit("a")
    embedded.wait_done([warm_up])  # a duration to estimate from
    blocker = embedded.submit("a")
    embedded.wait_running(blocker)
    asks = [("a", "normal"), ("b", "low"), ("boss", "high"), ("a", "normal"), ("b", "normal"), ("boss", "normal"),
            ("a", "low"), ("b", "normal"), ("boss", "high"), ("a", "normal")]
    ids = [embedded.submit(key, priority=priority, seed=i) for i, (key, priority) in enumerate(asks)]
    seen: dict[str, list[int]] = {i: [] for i in ids}
    snapshot = {}

    def all_started():
        now, videos = time.time(), embedded.videos()
        if not snapshot:
            snapshot.update(at=now, videos=videos)
        for i in ids:
            if videos[i]["status"] == "queued":
                seen[i].append(videos[i]["queue_position"])
        assert all(videos[i]["status"] != "queued" for i in ids), "some are waiting"
        return True

    eventually(all_started, timeout=600, interval=0.1, what="every job to start")
    done = embedded.wait_done(ids)
    for i, positions in seen.items():
        assert None not in positions and positions == sorted(positions, reverse=True), (i, positions)
    waiting = [i for i in ids if snapshot["videos"][i]["status"] == "queued"]
    predicted = sorted(waiting, key=lambda i: snapshot["videos"][i]["queue_position"])
    assert [i for i in embedded.started if i in waiting] == predicted
    for i in waiting:  # +-50% of the wait, and a second for the whole seconds both are given in
        estimate, actual = snapshot["videos"][i]["estimated_start_at"], done[i]["started_at"]
        assert abs(estimate - actual) <= 0.5 * (actual - snapshot["at"]) + 1, (i, estimate, actual, snapshot["at"])
    assert all(done[i]["queue_position"] is None and done[i]["estimated_start_at"] is None for i in ids)


def test_a_low_job_starts_within_the_aging_time_and_one_job_under_a_stream_of_normal_ones(tmp_path):
    aging = 3.0
    with app_client(tmp_path, priority_aging_seconds=aging) as (client, _):
        fleet = Fleet(client, [])
        first = fleet.submit()
        fleet.wait_running(first)
        low = fleet.submit(priority="low")
        normal = [first]

        def low_started():
            videos = {i: client.get(f"/v1/videos/{i}").json() for i in [low, *normal]}
            if videos[low]["status"] != "queued":
                return videos
            if sum(videos[i]["status"] == "queued" for i in normal) < 2:  # keep normal ones waiting, always
                normal.append(fleet.submit())
            assert False, "the low job waits"

        videos = eventually(low_started, timeout=300, interval=0.1, what="the low job to start")
        runs = [v["completed_at"] - v["started_at"] for v in videos.values() if v["status"] == "completed"]
        assert videos[low]["started_at"] - videos[low]["created_at"] <= aging + max(runs) + 1
        # It overtook normal ones that were waiting before it started.
        passed = [v for v in videos.values() if v["status"] == "queued" and v["created_at"] < videos[low]["started_at"]]
        assert passed, videos


# --- Celery: two API processes, one worker ---------------------------------------------------


def test_fair_share_holds_across_two_api_processes_and_a_worker(tmp_path):
    redis = RedisServer(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    redis.start()
    env = {"VIDSERVE_REDIS_URL": redis.url, "VIDSERVE_CHAT_MODEL": "", "VIDSERVE_KEYS_FILE": keys_file(tmp_path)}
    data = tmp_path / "data"
    servers, worker = [], None
    try:
        servers = [Server(data, env=env, extra=["--queue", "celery"]).start() for _ in range(2)]
        worker = Worker(data, "wan-tiny", env, "w").start()
        first, second = (Fleet(httpx.Client(base_url=server.url, timeout=10), []) for server in servers)
        a = [first.submit("a", seed=i) for i in range(6)]
        b = second.submit("b")
        assert second.videos()[a[-1]]["queue_position"] >= 2  # either process sees the one line
        first.wait_done([*a, b])
        store = RedisJobStore(redis.url)
        order = sorted([*a, b], key=lambda i: store.get(i).started_at)
        assert order.index(b) <= 2, order
    finally:
        for process in [worker, *servers]:
            if process is not None:
                process.stop()
        redis.stop()
