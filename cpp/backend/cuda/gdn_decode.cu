#include "backend/cuda/gdn_decode.h"

#include <string>

#include "backend/cuda/cuda_check.h"

namespace ninfer::cuda {
namespace {

// Value columns per block: a block's threads each own one column of the state, so a warp reads and writes
// 128 contiguous bytes per state row. Several blocks per head keep more SMs busy.
constexpr int kColumnsPerBlock = 32;

template <int DK>
__global__ void __launch_bounds__(kColumnsPerBlock) gdn_decode_kernel(GdnDecodeArgs a) {
  const int head = blockIdx.x;
  const int column = blockIdx.y * kColumnsPerBlock + threadIdx.x;
  const int seq = blockIdx.z;
  const int Dv = a.value_head_dim;
  const int key_head = head / (a.num_value_heads / a.num_key_heads);

  __shared__ float k_shared[DK], q_shared[DK];
  const float* k = a.k + (int64_t(seq) * a.num_key_heads + key_head) * DK;
  const float* q = a.q + (int64_t(seq) * a.num_key_heads + key_head) * DK;
  for (int i = threadIdx.x; i < DK; i += blockDim.x) {
    k_shared[i] = k[i];
    q_shared[i] = q[i];
  }
  __syncthreads();
  if (column >= Dv) return;

  const int64_t seq_head = int64_t(seq) * a.num_value_heads + head;
  float* state = a.states[seq] + int64_t(head) * DK * Dv + column;
  const float decay = __expf(a.g[seq_head]);
  const float beta = a.beta[seq_head];
  const float v = a.v[seq_head * Dv + column];

  // Two passes over the state column instead of holding DK values in registers: the second pass re-reads the
  // block's 32 columns (DK * 128 bytes) from L1, so device memory still sees one read and one write.
  float prediction = 0.0f;
#pragma unroll 16
  for (int i = 0; i < DK; ++i) prediction = fmaf(state[int64_t(i) * Dv], k_shared[i], prediction);
  const float delta = beta * (v - decay * prediction);
  float o = 0.0f;
#pragma unroll 16
  for (int i = 0; i < DK; ++i) {
    const float s = fmaf(k_shared[i], delta, state[int64_t(i) * Dv] * decay);
    o = fmaf(s, q_shared[i], o);
    state[int64_t(i) * Dv] = s;
  }
  a.out[seq_head * Dv + column] = o;
}

template <int DK>
void launch(const GdnDecodeArgs& a, cudaStream_t stream) {
  const dim3 grid(a.num_value_heads, (a.value_head_dim + kColumnsPerBlock - 1) / kColumnsPerBlock, a.batch);
  gdn_decode_kernel<DK><<<grid, kColumnsPerBlock, 0, stream>>>(a);
  NINFER_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gdn_decode(const GdnDecodeArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return;
  switch (a.key_head_dim) {
    case 16: return launch<16>(a, stream);
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
  }
  throw EngineError("gdn_decode: key head dim " + std::to_string(a.key_head_dim) +
                    " is not one the CUDA kernel is built for (16, 32, 64, 128, 256)");
}

}  // namespace ninfer::cuda
