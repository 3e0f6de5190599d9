# Sourced from the repo root by benchmarks/gpu.sh and training/gpu.sh, for a lent CUDA machine
# with no network: picks $PYTHON, unpacks the carried wheels ($WHEELS, default .whl) into a
# temporary folder $site on PYTHONPATH, and, where vidserve is not installed, puts a stand-in
# package of links to this checkout there. Nothing is installed.
#
# The machine's image has torch, triton, transformers, numpy, requests, filelock but not diffusers,
# pydantic or diffusers' own needs: carry them as wheels in $WHEELS, made on a machine with
# network for the image's Python (3.12) with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl diffusers==0.42.1 pydantic==2.14.4 \
#     pydantic-core==2.50.5 annotated-types typing-inspection pillow huggingface-hub safetensors regex
# Without them this stops at once, naming the modules missing.
if [[ -z "${PYTHON:-}" ]]; then  # python, else python3 (the H200 image's torch is under python3)
  for PYTHON in python python3 ""; do
    [[ -n "$PYTHON" ]] && command -v "$PYTHON" >/dev/null && "$PYTHON" -c "import torch" 2>/dev/null && break
  done
  [[ -n "$PYTHON" ]] || { echo "no python with torch on PATH; set PYTHON" >&2; exit 2; }
fi
WHEELS="${WHEELS:-.whl}"  # relative to the repo root
export PYTHONUNBUFFERED=1
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$site/"; done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
missing=$(cd "$site" && "$PYTHON" -c "
import importlib.util as u
print(' '.join(m for m in ('diffusers', 'pydantic', 'pydantic_core', 'annotated_types', 'PIL', 'huggingface_hub',
                           'safetensors', 'regex') if u.find_spec(m) is None))")
if [[ -n "$missing" ]]; then
  echo "missing: $missing; carry their wheels in $WHEELS (the pip download command in benchmarks/gpu_env.sh)" >&2
  exit 2
fi
# Checks run from "$site": from the repo root, ./vidserve (the top package alone) would shadow the stand-in.
if ! (cd "$site" && "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vidserve.kernels') is None)" 2>/dev/null); then
  # pyproject maps vidserve.pipelines -> pipelines/, vidserve.api -> api/, ...
  mkdir "$site/vidserve"
  ln -s "$PWD"/vidserve/*.py "$PWD/vidserve/kernels" "$site/vidserve/"
  for sub in pipelines api workers; do ln -s "$PWD/$sub" "$site/vidserve/$sub"; done
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
