// Rotary position embedding of the CUDA backend: half (NeoX) or interleaved pairing, angles formed in f32 as
// position * inv_freq and their cos / sin taken in double, as the CPU twin does. With several position streams
// (M-RoPE's t/h/w, the vision tower's row/column) frequency i takes its position from stream freq_stream[i].
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "errors.h"

namespace ninfer::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride,
                            const int64_t* positions, int32_t streams, const uint8_t* freq_stream,
                            const float* inv_freq, int32_t half, bool interleaved) {
  chain_start();
  NINFER_GRID_STRIDE(idx, rows * heads * half) {
    const int64_t r = idx / (int64_t(heads) * half), h = (idx / half) % heads, i = idx % half;
    const int64_t position = streams == 1 ? positions[r] : positions[r * streams + freq_stream[i]];
    const float angle = float(position) * inv_freq[i];
    const float c = float(cos(double(angle))), s = float(sin(double(angle)));
    float* v = x + r * row_stride + h * head_stride;
    float* a = interleaved ? v + 2 * i : v + i;
    float* b = interleaved ? v + 2 * i + 1 : v + i + half;
    const float x1 = *a, x2 = *b;
    *a = x1 * c - x2 * s;
    *b = x2 * c + x1 * s;
  }
}

}  // namespace

void CudaBackend::rope(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride,
                       const int64_t* positions, const RopeSpec& rope) {
  const int32_t half = rope.rotary_dim / 2;
  if (rope.streams < 1 || (rope.streams > 1 && !rope.freq_stream))
    throw EngineError("rope: streams must be >= 1, with a stream per frequency when > 1");
  if (rows <= 0 || half <= 0) return;
  HostTables tables;
  const size_t at_positions = tables.add(positions, size_t(rows * rope.streams));
  const size_t at_freq = tables.add(rope.inv_freq, size_t(half));
  const size_t at_streams = rope.streams > 1 ? tables.add(rope.freq_stream, size_t(half)) : 0;
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  launch_chained(rope_kernel, dim3(blocks_for(rows * heads * half)), dim3(kThreads), 0, stream_, x, rows, heads,
                 head_stride, row_stride, reinterpret_cast<const int64_t*>(base + at_positions), rope.streams,
                 rope.streams > 1 ? base + at_streams : nullptr, reinterpret_cast<const float*>(base + at_freq), half,
                 rope.pairing == RopePairing::Interleaved);
}

}  // namespace ninfer::cuda
