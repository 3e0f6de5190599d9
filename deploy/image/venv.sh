#!/bin/sh
# vidserve's virtualenv /opt/vidserve.
# `venv.sh dependencies`: torch ($TORCH, from $TORCH_INDEX_URL when set), then every dependency
# /tmp/venv/pyproject.toml declares and those of the extra $EXTRA, leaving out the packages in
# $WITHOUT (e.g. triton, which xgrammar requires but only runs on CUDA). uv installs them, and is
# gone again when it is done. Bytecode is compiled here, as the user vidserve cannot write it later.
# `venv.sh vidserve`: the wheel in /tmp/venv/dist, the bundled models in it.
set -eu
cd /tmp/venv
case "$1" in
dependencies)
  python3 -m venv /opt/vidserve
  /opt/vidserve/bin/pip install -q uv==0.13.9
  for name in $(echo "$WITHOUT" | tr ',' ' '); do echo "$name; sys_platform == 'never'"; done >overrides.txt
  export UV_PYTHON=/opt/vidserve/bin/python UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy
  /opt/vidserve/bin/uv pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH"
  /opt/vidserve/bin/uv pip install -q -r pyproject.toml ${EXTRA:+--extra "$EXTRA"} --override overrides.txt
  /opt/vidserve/bin/pip uninstall -q -y uv ;;
vidserve)
  /opt/vidserve/bin/pip install -q --no-deps dist/*.whl
  rm -r /tmp/venv ;;
*)
  echo "usage: venv.sh dependencies|vidserve" >&2
  exit 2 ;;
esac
