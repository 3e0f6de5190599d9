#!/bin/sh
# The system a vidserve image runs on, from any Debian or Ubuntu base: Python 3 with venv, the
# CA certificates (the base's, and any the base added under /usr/local/share/ca-certificates),
# and the unprivileged user vidserve with the folders it reads and writes.
set -eu
missing=""
command -v python3 >/dev/null 2>&1 || missing="python3"
# Debian and Ubuntu ship ensurepip's wheels apart (python3-venv): only making a venv tells.
python3 -m venv /tmp/venv-probe >/dev/null 2>&1 || missing="$missing python3-venv"
rm -rf /tmp/venv-probe
command -v update-ca-certificates >/dev/null 2>&1 || missing="$missing ca-certificates"
if [ -n "$missing" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*
fi
update-ca-certificates >/dev/null
useradd --system --uid 10001 --user-group --create-home --home-dir /home/vidserve --shell /usr/sbin/nologin vidserve
mkdir -p /var/lib/vidserve /models /loras
chown vidserve:vidserve /var/lib/vidserve /models /loras
