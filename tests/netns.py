"""Running a test where nothing can leave the machine: a network namespace of its own.

The outbound URL policy's tests point the server at private, link-local and made-up
addresses; were the policy broken, the server would really connect to them. A test marked
`@pytest.mark.own_network_namespace` has its body run by a fresh pytest process under
`unshare --net` (which needs root), where loopback is the only interface and is brought
up. Its fixtures are set up in both processes; the body runs only in the inner one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from functools import lru_cache

import pytest


def isolated() -> bool:
    """Whether this process sees no network interface but loopback."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


@lru_cache(maxsize=1)
def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


def run_isolated(item: pytest.Function) -> None:
    """Run the test `item` in a new pytest process in a new network namespace; fail as it fails."""
    if not _can_unshare():
        pytest.skip("needs `unshare --net` (root, util-linux) and `ip` (iproute2) to run in its own network namespace")
    command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", item.nodeid]
    result = subprocess.run(command, cwd=item.config.rootpath, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"in its own network namespace (exit {result.returncode}):\n{result.stdout[-8000:]}"
                    f"{result.stderr[-2000:]}", pytrace=False)
