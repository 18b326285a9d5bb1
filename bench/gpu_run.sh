#!/usr/bin/env bash
# `make bench` on a GPU machine (or one device-tool call): build the extension with the CUDA backend, then run the
# stages named in STAGES (default: all): `tests` (the GPU tests; GPU_TEST_ARGS passes pytest options), `kernels`
# (bench/cuda_kernels.py; BENCH_ARGS passes options), `engine` (bench/cuda_engine.py for each model:recipe in
# ENGINE_RUNS; ENGINE_ARGS passes options). Results and logs land in $OUT. BUILD_DIR (default build/gpu) can sit
# outside the tree, so that a tree sent afresh to a warm machine rebuilds incrementally.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ninfer-out}
STAGES=${STAGES:-tests kernels engine}
ENGINE_RUNS=${ENGINE_RUNS:-qwen3.5-27b:groupwise-int}
BUILD_DIR=${BUILD_DIR:-build/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
NB_DIR=$(python3 -m nanobind --cmake_dir)
started=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNINFER_CUDA=ON -DNINFER_CUDA_ARCHS=90a -DNINFER_TESTING=ON \
  -DPython_EXECUTABLE="$(command -v python3)" -Dnanobind_ROOT="$NB_DIR" > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build "$BUILD_DIR" -j 16 > "$OUT/build.log" 2>&1 || { grep -B2 -A10 -m5 "error" "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - started )) s"
cp "$BUILD_DIR"/_engine*.so "$BUILD_DIR"/_testing*.so python/ninfer/
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c "from ninfer import _engine; print('cuda built', _engine.cuda.built, 'devices', _engine.cuda.device_count())"
for stage in $STAGES; do
  started=$(date +%s)
  case $stage in
    tests)
      # shellcheck disable=SC2086
      python3 -X faulthandler -m pytest -q -m gpu tests/gpu ${GPU_TEST_ARGS:-} 2>&1 \
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
