// add_embedding_mix of the CUDA backend: each row adds a weighted sum of a few table rows (the vision tower's
// bilinear position embedding, four taps per patch). The taps are summed first and then added, as the CPU twin
// (and the reference) sums its weighted rows before the add.
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/dequant.cuh"

namespace ninfer::cuda {
namespace {

template <Encoding E>
__global__ void add_embedding_mix_kernel(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                                         WeightRef table, float* inout) {
  chain_start();
  NINFER_GRID_STRIDE(i, rows * table.cols) {
    const int64_t r = i / table.cols, c = i % table.cols;
    float mix = 0.0f;
    for (int32_t j = 0; j < taps; ++j) mix += weights[r * taps + j] * weight_at<E>(table, ids[r * taps + j], c);
    inout[i] += mix;
  }
}

}  // namespace

void CudaBackend::add_embedding_mix(const int32_t* ids, const float* weights, int64_t rows, int32_t taps,
                                    const TensorView& table, float* inout) {
  if (rows <= 0 || taps <= 0) return;
  check_embedding_taps(ids, rows * taps, table.rows());
  HostTables tables;
  const size_t at_ids = tables.add(ids, size_t(rows * taps));
  const size_t at_weights = tables.add(weights, size_t(rows * taps));
  const uint8_t* base = upload(tables);
  if (tables_only()) return;
  const TensorView& dt = resident(table);
  dispatch_encoding(dt.encoding, [&](auto encoding) {
    launch_chained(add_embedding_mix_kernel<decltype(encoding)::value>, dim3(blocks_for(rows * dt.cols())),
                   dim3(kThreads), 0, stream_, reinterpret_cast<const int32_t*>(base + at_ids),
                   reinterpret_cast<const float*>(base + at_weights), rows, taps, weight_ref(dt), inout);
  });
}

}  // namespace ninfer::cuda
