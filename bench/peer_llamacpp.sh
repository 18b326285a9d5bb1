#!/usr/bin/env bash
# llama.cpp's own benchmark on this machine, from the pinned llama-cpp-python sdist's vendored llama.cpp (the web
# UI's pin), so that ninfer's figures and the peer's come from the same device call. Run from the repo root:
#
#   bash bench/peer_llamacpp.sh
#
# Needs .gpu/llama.cpp.tar.gz (or the .gpu/llama.cpp tree), written on a machine with the sdist by
# `python bench/peer_prepare.py`; the tree is unpacked here if absent. Steps:
#  1. configure and build only llama-bench (and llama-quantize, for step 2) with the CUDA backend for sm_90, static,
#     no tests / examples / server, into BUILD_DIR (outside the tree, kept on a warm machine: a second call rebuilds
#     nothing). The CPU backend is built for AVX2, not -march=native: ggml's AMX path, which a native build enables
#     on an AMX host, segfaults (bench/NOTES-cpu.md); with -ngl 99 the CPU only looks up token embeddings;
#  2. unless MIX_CHECK=0: tiny qwen35 / qwen35moe files in F32 quantised by that llama-quantize to Q4_K_M, whose
#     per-tensor types must be the ones bench/peer_gguf.py writes (a warning and a summary line if not);
#  3. for each model:mix in MODELS, a random-weight GGUF at the real shape (bench/peer_gguf.py, with the tree's own
#     gguf-py) in GGUF_DIR, `llama-bench $BENCH_ARGS -r $REPS -o json` on it, the file deleted after use.
# Results: $OUT/peer/<model>_<mix>.json (llama-bench's own JSON) and .log, $OUT/peer/summary.txt (one line a model).
# Options (env): MODELS (model:mix ...; empty: build only), REPS (2), BENCH_ARGS ("-ngl 99 -fa 1 -p 512,8192
# -n 128"), SKIP_BUILD=1 (use the binaries in BUILD_DIR), BUILD_DIR (/tmp/ninfer-peer-build), CUDA (ON; OFF for a
# CPU-only build), CPU_ARGS (the CPU backend's -D options), CMAKE_ARGS (more -D options), GGUF_DIR (default /dev/shm
# when it has room for the file, else /tmp/ninfer-peer-gguf), MIX_CHECK (1), PEER_SRC (.gpu/llama.cpp), PYTHON
# (python3; it needs numpy and what bench/synthetic.py imports).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ninfer-out}
PEER_SRC=${PEER_SRC:-.gpu/llama.cpp}
BUILD_DIR=${BUILD_DIR:-/tmp/ninfer-peer-build}
MODELS=${MODELS-qwen3.5-27b:Q4_K_M qwen3.5-27b:Q8_0 qwen3.5-35b-a3b:Q4_K_M qwen3.5-35b-a3b:Q8_0}
REPS=${REPS:-2}
BENCH_ARGS=${BENCH_ARGS:--ngl 99 -fa 1 -p 512,8192 -n 128}
CUDA=${CUDA:-ON}
CPU_ARGS=${CPU_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}
MIX_CHECK=${MIX_CHECK:-1}
PYTHON=${PYTHON:-python3}
RESULTS=$OUT/peer
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

if [ ! -f "$PEER_SRC/CMakeLists.txt" ]; then
  [ -f "$PEER_SRC.tar.gz" ] || { echo "no $PEER_SRC nor $PEER_SRC.tar.gz: run python bench/peer_prepare.py"; exit 1; }
  tar -xzf "$PEER_SRC.tar.gz" -C "$(dirname "$PEER_SRC")" || exit 1
fi
COMMIT=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['llama_cpp_commit'])" "$PEER_SRC/PEER_SOURCE.json")
echo "peer: llama.cpp ${COMMIT:0:9} from $("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['sdist'])" \
  "$PEER_SRC/PEER_SOURCE.json")" | tee "$RESULTS/summary.txt"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | tee -a "$RESULTS/summary.txt"
# gguf-py imports yaml; the tree carries PyYAML's pure-Python package for a machine without it.
PY_PATH="$PWD/$PEER_SRC/gguf-py"
"$PYTHON" -c "import yaml" 2> /dev/null || PY_PATH="$PY_PATH:$PWD/$PEER_SRC/pylib"
peer_py() { PYTHONPATH="$PY_PATH${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" bench/peer_gguf.py "$@"; }

TARGETS="llama-bench"
[ "$MIX_CHECK" = 1 ] && TARGETS="$TARGETS llama-quantize"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  started=$(date +%s)
  GENERATOR=$(command -v ninja > /dev/null && echo "-G Ninja")
  CUDA_ARGS="-DGGML_CUDA=$CUDA"
  [ "$CUDA" = ON ] && CUDA_ARGS="$CUDA_ARGS -DCMAKE_CUDA_ARCHITECTURES=90"
  # shellcheck disable=SC2086
  cmake -S "$PEER_SRC" -B "$BUILD_DIR" $GENERATOR -DCMAKE_BUILD_TYPE=Release $CUDA_ARGS -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMIT="${COMMIT:0:9}" -DLLAMA_BUILD_NUMBER=0 \
    $CPU_ARGS ${CMAKE_ARGS:-} > "$RESULTS/cmake.log" 2>&1 || { tail -30 "$RESULTS/cmake.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" --target $TARGETS -j "$(nproc)" > "$RESULTS/build.log" 2>&1 \
    || { grep -B2 -A10 -m5 "error" "$RESULTS/build.log"; exit 1; }
  echo "peer build: $(( $(date +%s) - started )) s" | tee -a "$RESULTS/summary.txt"
fi
BIN=$BUILD_DIR/bin
[ -x "$BIN/llama-bench" ] || { echo "no $BIN/llama-bench"; exit 1; }

# The directory for a file of $1 bytes: GGUF_DIR if set, else /dev/shm when it has room (2 GiB to spare: it is
# memory, and the model load reads it at memory speed), else /tmp/ninfer-peer-gguf. Fails when that has no room.
room() { local free; free=$(df -B1 --output=avail "$1" 2> /dev/null | tail -1); [ "${free:-0}" -gt $(( $2 + (2 << 30) )) ]; }
gguf_dir() {
  local dir=${GGUF_DIR:-}
  if [ -z "$dir" ]; then
    if [ -w /dev/shm ] && room /dev/shm "$1"; then dir=/dev/shm/ninfer-peer; else dir=/tmp/ninfer-peer-gguf; fi
  fi
  mkdir -p "$dir" && room "$dir" "$1" && echo "$dir"
}
CURRENT=""
trap 'rm -f "$CURRENT" "$CURRENT.partial"' EXIT

if [ "$MIX_CHECK" = 1 ]; then
  for model in tiny-dense tiny-moe; do
    dir=$(gguf_dir $(( 1 << 30 ))) || { echo "no room for the mix check's files"; break; }
    CURRENT=$dir/$model-F32.gguf
    peer_py --model $model --mix F32 --out "$CURRENT" > /dev/null \
      && "$BIN/llama-quantize" "$CURRENT" "$dir/$model-Q4_K_M.gguf" Q4_K_M > "$RESULTS/quantize_$model.log" 2>&1 \
      && peer_py --model $model --mix Q4_K_M --check "$dir/$model-Q4_K_M.gguf" | tee -a "$RESULTS/summary.txt" \
      || echo "WARNING: $model: the Q4_K_M mix check failed (above, or $RESULTS/quantize_$model.log)" \
        | tee -a "$RESULTS/summary.txt"
    rm -f "$CURRENT" "$dir/$model-Q4_K_M.gguf"
  done
fi

for run in $MODELS; do
  model=${run%%:*} mix=${run##*:}
  bytes=$(peer_py --model "$model" --mix "$mix" --size) || exit 1
  dir=$(gguf_dir "$bytes") || { echo "$model $mix: no room for $bytes bytes" | tee -a "$RESULTS/summary.txt"; continue; }
  CURRENT=$dir/$model-$mix.gguf
  started=$(date +%s)
  peer_py --model "$model" --mix "$mix" --out "$CURRENT" || exit 1
  written=$(( $(date +%s) - started ))
  started=$(date +%s)
  # shellcheck disable=SC2086
  "$BIN/llama-bench" -m "$CURRENT" $BENCH_ARGS -r "$REPS" -o json > "$RESULTS/${model}_$mix.json" \
    2> "$RESULTS/${model}_$mix.log" || { echo "llama-bench failed on $model $mix:"; tail -20 "$RESULTS/${model}_$mix.log"; }
  benched=$(( $(date +%s) - started ))
  rm -f "$CURRENT"
  "$PYTHON" - "$RESULTS/${model}_$mix.json" "$model $mix" "$bytes" "$written" "$benched" << 'EOF' | tee -a "$RESULTS/summary.txt"
import json, sys
path, name, size, written, benched = sys.argv[1:]
try:
    rows = json.load(open(path))
except ValueError:
    rows = []
tests = ", ".join(f"{'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']} {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f}"
                  for r in rows)
print(f"{name} ({int(size) / 2**30:.2f} GiB): {tests or 'no results'} tok/s (written in {written} s, benched in {benched} s)")
EOF
done
