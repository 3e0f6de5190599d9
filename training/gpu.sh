#!/usr/bin/env bash
# Train wan-shapes on a lent CUDA machine (an H200, no network): the same scripts as on a CPU,
# with bigger batches and more steps. On the 15-minute lease it takes two calls, which is how
# the committed weights were made (vlm-shapes trains on the CPU: python -m training.train_vlm);
# the transformer had not converged, and later calls with RESUME=1 go on training it:
#
#   BUDGET=500 OUT=$OUT bash training/gpu.sh                  # 1: the VAE (~8.5 min)
#   STAGE=wan FROM=.gpu/wan-shapes THREADS=4 BUDGET=270 OUT=$OUT bash training/gpu.sh
#                                                             # 2: the transformer on call 1's VAE
#   STAGE=wan RESUME=1 FROM=.gpu/wan-shapes THREADS=4 BUDGET=540 OUT=$OUT bash training/gpu.sh
#                                                             # 3, 4, ...: more transformer training,
#                                                             # shape cells weighted 5x, half at mid sigma,
#                                                             # four in five samples text-to-video
#   SMALL=1 OUT=/tmp/out bash training/gpu.sh                 # a few steps on the CPU: checks this script
#
# Call 1: train_vae; when the VAE's encoder is final, train_wan starts on its latents beside
# the VAE's decoder phase, if more than 2 minutes are left (on the H200, beside the VLM that
# this call then also trained, phases 1-3 took ~410 s, so it was not). Each script stops at the
# run's deadline (BUDGET seconds) and saves what it has; its log then says so. Call 2 carries
# call 1's wan-shapes folder (unpacked from the tar into an ignored folder such as .gpu/).
# What comes back under $OUT: env.log, the scripts' logs and wan-shapes.tar: unpack it over
# vidserve/weights/. Wheels to carry: benchmarks/gpu_env.sh.
set -euo pipefail

if [[ -n "${OUT:-}" ]]; then mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd); fi
if [[ -n "${FROM:-}" ]]; then FROM=$(cd "$FROM" && pwd); fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-training/gpu-out}"
mkdir -p "$OUT"
source benchmarks/gpu_env.sh
ln -s "$PWD/training" "$site/training"  # run from $site, where the stand-in vidserve is found first
work="$site/weights"
mkdir -p "$work"
BUDGET="${BUDGET:-500}"
start=$SECONDS
left() { echo $((BUDGET - (SECONDS - start) - 45)); }  # 45 s for saving, evaluation and tar

if [[ "${SMALL:-0}" == 1 ]]; then
  common=(--device cpu --threads 1)
  vae=(--steps 2 --full-steps 1 1 2 --batches 2 1 1 1 --workers 1)
  wan=(--steps 3 --batch 2 --clips 16 --workers 1)
else
  common=(--device cuda --threads "${THREADS:-2}")  # call 2 ran alone with THREADS=4
  vae=(--steps 400 --full-steps 800 300 1500 --batches 32 32 32 32 --workers 4)
  wan=(--steps 7000 --batch 64 --lr 1e-3 --clips 8000 --workers 8)
fi

{
  echo "== $(date -u +%FT%TZ) $(hostname), $(nproc) CPUs, budget $BUDGET s"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  (cd "$site" && "$PYTHON" -c "import sys, torch, diffusers, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())")
} 2>&1 | tee "$OUT/env.log"

cd "$site"
# FROM's transformer goes on training, with the loss aimed at shape (step 7 of the model card)
if [[ "${RESUME:-0}" == 1 ]]; then wan+=(--resume --warmup 100 --object-weight 5 --mid-sigma 0.5 --image-share 0.2); fi
run_wan() {
  "$PYTHON" -m training.train_wan "${common[@]}" "${wan[@]}" --max-seconds "$(left)" --out "$work/wan-shapes" \
    >"$OUT/wan.log" 2>&1
}
status=0
if [[ "${STAGE:-all}" == wan ]]; then
  cp -r "$FROM" "$work/wan-shapes"
  run_wan || status=$?
  tar -C "$work" -cf "$OUT/wan-shapes.tar" wan-shapes
  echo "training/gpu.sh: done in $((SECONDS - start)) s, exit $status" | tee -a "$OUT/env.log"
  tail -n 3 "$OUT/wan.log"
  exit "$status"
fi
"$PYTHON" -m training.train_vae "${common[@]}" "${vae[@]}" --max-seconds "$(left)" --out "$work/wan-shapes" \
  >"$OUT/vae.log" 2>&1 &
vae_pid=$!
until grep -qs "encoder final" "$OUT/vae.log"; do
  kill -0 "$vae_pid" 2>/dev/null || { echo "train_vae ended before its encoder was final"; tail "$OUT/vae.log"; exit 1; }
  sleep 2
done
echo "encoder final after $((SECONDS - start)) s" | tee -a "$OUT/env.log"
if (( $(left) > 120 )); then
  run_wan || status=$?
else
  echo "too little time left for train_wan: run it in a second call (STAGE=wan)" | tee -a "$OUT/env.log"
fi
wait "$vae_pid" || status=$?
tar -C "$work" -cf "$OUT/wan-shapes.tar" wan-shapes
echo "training/gpu.sh: done in $((SECONDS - start)) s, exit $status" | tee -a "$OUT/env.log"
tail -n 3 "$OUT"/*.log
exit "$status"
