// Asynchronous global -> shared copies (cp.async, sm_80+) shared by the kernels that stage tiles through shared
// memory while they compute on the tiles before (gdn_prefill.cu's tensor-core scan, flash_prefill.cu,
// segment_attention.cu, streamed_gemm.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ninfer::cuda {

// 16 bytes from src to dst (both 16-byte aligned), bypassing L1 (.cg); zeros instead when !valid (no bytes are read
// then, but src must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes from src to dst (both 4-byte aligned), through L1 (.ca: the only form that copies fewer than 16 bytes).
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}
// Closes the group of this thread's cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most `Pending` of this thread's committed groups are still in flight (the newest ones). Other
// threads' copies are visible only after a barrier that follows their own wait.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

}  // namespace ninfer::cuda
