#!/usr/bin/env bash
# `make bench` on a GPU machine (or one device-tool call): build the extension with the CUDA backend, then run the
# stages named in STAGES (default: all): `tests` (the GPU tests; GPU_TEST_ARGS passes pytest options), `kernels`
# (bench/cuda_kernels.py; BENCH_ARGS passes options), `engine` (bench/cuda_engine.py for each model:recipe in
# ENGINE_RUNS; ENGINE_ARGS passes options). Results and logs land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ninfer-out}
STAGES=${STAGES:-tests kernels engine}
ENGINE_RUNS=${ENGINE_RUNS:-qwen3.5-27b:groupwise-int}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
NB_DIR=$(python3 -m nanobind --cmake_dir)
started=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNINFER_CUDA=ON -DNINFER_CUDA_ARCHS=90a \
  -DPython_EXECUTABLE="$(command -v python3)" -Dnanobind_ROOT="$NB_DIR" > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build/gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -B2 -A10 -m5 "error" "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - started )) s"
cp build/gpu/_engine*.so python/ninfer/
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c "from ninfer import _engine; print('cuda built', _engine.cuda.built, 'devices', _engine.cuda.device_count())"
for stage in $STAGES; do
  started=$(date +%s)
  case $stage in
    tests)
      # shellcheck disable=SC2086
      python3 -X faulthandler -m pytest -q -p no:cacheprovider -m gpu tests/gpu ${GPU_TEST_ARGS:-} 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -40 ;;
    kernels)
      # shellcheck disable=SC2086
      python3 bench/cuda_kernels.py --out "$OUT/cuda_kernels.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/kernels.log" ;;
    engine)
      for run in $ENGINE_RUNS; do
        # shellcheck disable=SC2086
        python3 bench/cuda_engine.py --model "${run%%:*}" --recipe "${run##*:}" \
          --out "$OUT/engine_${run%%:*}_${run##*:}.json" ${ENGINE_ARGS:-} 2>&1 | tee -a "$OUT/engine.log"
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "stage $stage: $(( $(date +%s) - started )) s"
done
