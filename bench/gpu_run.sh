#!/usr/bin/env bash
# `make bench` on a GPU machine (or one device-tool call): : build the extension with the CUDA backend, run the GPU tests, run the
# kernel benchmarks. Results land in $OUT (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ninfer-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
NB_DIR=$(python3 -m nanobind --cmake_dir)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNINFER_CUDA=ON -DNINFER_CUDA_ARCHS=90a \
  -DPython_EXECUTABLE="$(command -v python3)" -Dnanobind_ROOT="$NB_DIR" > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
cmake --build build/gpu -j 16 > "$OUT/build.log" 2>&1 || { grep -B2 -A10 -m5 "error" "$OUT/build.log"; exit 1; }
cp build/gpu/_engine*.so python/ninfer/
export PYTHONPATH=$PWD/python
python3 -c "from ninfer import _engine; print('cuda built', _engine.cuda.built, 'devices', _engine.cuda.device_count())"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu ${GPU_TEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
python3 bench/cuda_kernels.py --out "$OUT/cuda_kernels.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
