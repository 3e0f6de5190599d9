"""Podman for the deployment test: the engine's settings, a local base image, the image builds
and the compose fleet of deploy/, each container found by its compose project and service.

Nothing comes from a registry: the base image is Debian bookworm with Python, made by mmdebstrap
from Debian's packages (as the official python:3.11-slim-bookworm is, and a stand-in for it), and
the Python packages come from wherever this machine's pip takes them (PyPI, or the wheel folders
and local indexes its configuration names, mounted into the build)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
BASE = "localhost/vidserve-test-base:bookworm"
BASE_PACKAGES = "python3,python3-venv,ca-certificates"
IMAGES = {"cpu": "localhost/vidserve-test:cpu", "redis": "localhost/vidserve-test-redis",
          "seaweedfs": "localhost/vidserve-test-seaweedfs"}

# Settings for a machine like CI's (root, cgroups v1 in hybrid mode, no CAP_SYS_RESOURCE, no
# systemd), used unless CONTAINERS_CONF names others: crun fails there on the cgroup layout, the
# default ulimits are more than root may set, and events go to a file instead of the journal.
ENGINE_SETTINGS = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def engine_settings(workdir: Path) -> dict[str, str]:
    """The environment podman runs with: CONTAINERS_CONF as given, or the settings above."""
    if "CONTAINERS_CONF" in os.environ:
        return {}
    conf = workdir / "containers.conf"
    conf.write_text(ENGINE_SETTINGS)
    return {"CONTAINERS_CONF": str(conf)}


def engine_problem() -> str | None:
    """Why the deployment cannot be built and run here, in one line; None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/run installs podman, runc and mmdebstrap)"
    if shutil.which("podman-compose", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}") is None:
        return "podman-compose is not installed (pip install -e '.[dev]')"
    if "VIDSERVE_TEST_BASE" not in os.environ and shutil.which("mmdebstrap") is None:
        return "no base image: set VIDSERVE_TEST_BASE, or install mmdebstrap to make one"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"podman does not work here: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def base_image() -> str:
    """VIDSERVE_TEST_BASE, or the local Debian base, made once with the host's CA certificates
    (HTTPS may pass a proxy with a CA of its own)."""
    if "VIDSERVE_TEST_BASE" in os.environ:
        return os.environ["VIDSERVE_TEST_BASE"]
    if podman("image", "exists", BASE, check=False).returncode == 0:
        return BASE
    make = subprocess.Popen(
        ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={BASE_PACKAGES}",
         "--customize-hook=copy-in /usr/local/share/ca-certificates /usr/local/share",
         '--customize-hook=chroot "$1" update-ca-certificates', "bookworm", "-", debian_mirror()],
        stdout=subprocess.PIPE)
    podman_import = subprocess.run(
        ["podman", "import", "--change", "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
         "--change", "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt", "--change", 'CMD ["/bin/bash"]', "-", BASE],
        stdin=make.stdout, capture_output=True, text=True, timeout=900)
    make.stdout.close()
    if make.wait(timeout=900) != 0 or podman_import.returncode != 0:
        raise RuntimeError(f"making {BASE} failed: mmdebstrap exited {make.returncode}; "
                           f"podman import: {podman_import.stderr[-2000:]}")
    return BASE


def debian_mirror() -> str:
    """The Debian mirror apt uses here for bookworm."""
    for sources in Path("/etc/apt/sources.list.d").glob("*.sources"):
        for stanza in sources.read_text().split("\n\n"):
            uris, suites = re.search(r"^URIs:\s*(\S+)", stanza, re.M), re.search(r"^Suites:.*", stanza, re.M)
            if uris and suites and re.search(r"\bbookworm\b", suites.group()):
                return uris.group(1)
    one_line = Path("/etc/apt/sources.list")
    if one_line.exists() and (match := re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", one_line.read_text(),
                                                 re.M)):
        return match.group(1)
    return "http://deb.debian.org/debian"


def package_sources() -> list[str]:
    """`podman build` arguments that give the build this machine's pip sources: its find-links
    folders and indexes as /etc/uv/uv.toml, each local folder mounted read-only where it is here,
    and torch resolved from them as pip resolves it here. No arguments where pip has no sources
    of its own: the Containerfile's defaults then."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    config: dict[str, list[str]] = {}
    for key, value in re.findall(r"^[^.\n]*\.([\w-]+)='(.*)'$", listed, re.M):
        if key in ("find-links", "index-url", "extra-index-url"):
            config.setdefault(key, value.split())  # the environment's come first, and win as in pip
    if not config:
        return []
    mounts = set()
    for key, values in config.items():
        for value in values:
            path = Path(value.removeprefix("file://"))
            if value.startswith(("/", "file://")) and path.exists():
                mounts.add(path if key == "find-links" else path.parent)  # an index's files sit beside it
    lines = ['index-strategy = "unsafe-best-match"']  # pip's choice: the best version on any of them
    lines += [f"{key} = {json.dumps(values if key != 'index-url' else values[0])}" for key, values in config.items()]
    uv_toml = Path(tempfile.gettempdir()) / "vidserve-deploy-test-uv.toml"  # one path: the build cache keeps
    uv_toml.write_text("\n".join(lines) + "\n")
    args = ["--volume", f"{uv_toml}:/etc/uv/uv.toml:ro", "--build-arg", "TORCH_INDEX_URL="]
    for mount in sorted(mounts):
        args += ["--volume", f"{mount}:{mount}:ro"]
    return args


def build_images(base: str, sources: list[str], workdir: Path) -> None:
    """Every image of IMAGES, built side by side: Redis's and SeaweedFS's fetch their packages
    while vidserve's installs its own."""
    builds = {}
    for target, tag in IMAGES.items():
        with (workdir / f"build-{target}.log").open("w") as log:
            builds[target] = subprocess.Popen(
                ["podman", "build", "--format", "docker", "--network", "host", "--target", target, "--tag", tag,
                 "--build-arg", f"BASE={base}", *sources, "--file", str(ROOT / "deploy" / "Containerfile"),
                 str(ROOT)], stdout=log, stderr=subprocess.STDOUT)
    failed = [target for target, build in builds.items() if build.wait(timeout=1200) != 0]
    if failed:
        logs = "\n".join((workdir / f"build-{target}.log").read_text()[-3000:] for target in failed)
        raise RuntimeError(f"building {', '.join(failed)} failed:\n{logs}")


def crash(state: dict) -> None:
    """SIGKILL to the main process of the container `state` (podman inspect's) describes, as an
    OOM kill or a crash does it; `podman kill` would be an operator's stop, which
    `restart: unless-stopped` honours."""
    os.kill(state["State"]["Pid"], signal.SIGKILL)


class Fleet:
    """deploy/compose.yaml brought up under its own project name, with the test's images, .env
    and ports, through podman-compose."""

    def __init__(self, project: str, env_file: Path, api_ports: tuple[int, int], api_key: str):
        self.project, self.api_key = project, api_key
        self.env = {**os.environ, "VIDSERVE_ENV_FILE": str(env_file), "VIDSERVE_IMAGE": IMAGES["cpu"],
                    "VIDSERVE_REDIS_IMAGE": IMAGES["redis"], "VIDSERVE_S3_IMAGE": IMAGES["seaweedfs"],
                    "VIDSERVE_API_1_PORT": str(api_ports[0]), "VIDSERVE_API_2_PORT": str(api_ports[1])}
        self.urls = [f"http://127.0.0.1:{port}" for port in api_ports]

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).with_name("podman-compose")), "--file", str(COMPOSE_FILE),
                   "--project-name", self.project, *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"podman-compose {' '.join(args)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        return done

    def up(self) -> None:
        # --no-build: the images are built already. --no-deps: podman-compose turns depends_on
        # into podman's --requires, and Podman 4.3 then neither restarts a crashed service while
        # a dependency is down or a one-shot has exited, nor starts one whose dependency has
        # dependencies; it ignores health conditions anyway. The services wait for each other
        # themselves (the bucket for the store; APIs and workers for Redis, restarting until it answers).
        self.compose("up", "--detach", "--no-build", "--no-deps")

    def containers(self) -> list[str]:
        listed = podman("ps", "--all", "--quiet", "--filter", f"label=io.podman.compose.project={self.project}")
        return listed.stdout.split()

    def container(self, service: str) -> str:
        listed = podman("ps", "--all", "--quiet", "--filter", f"label=io.podman.compose.project={self.project}",
                        "--filter", f"label=io.podman.compose.service={service}")
        ids = listed.stdout.split()
        assert len(ids) == 1, f"service {service}: containers {ids}"
        return ids[0]

    def state(self, service: str) -> dict:
        return json.loads(podman("inspect", self.container(service)).stdout)[0]

    def healthy(self, service: str) -> bool:
        return podman("healthcheck", "run", self.container(service), check=False).returncode == 0

    def logs(self, service: str) -> str:
        done = podman("logs", "--tail", "40", self.container(service), check=False)
        return done.stdout + done.stderr

    def down(self) -> None:
        """Every container, network and volume of the project, gone; the images stay for the next run."""
        try:
            self.compose("down", "--volumes", "--timeout", "5")
        finally:
            if ids := self.containers():  # whatever down left behind
                podman("rm", "--force", "--volumes", *ids, check=False)
