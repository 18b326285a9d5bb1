// Rotary position embedding of the CPU backend: the first rotary_dim values of a head, NeoX half pairing
// (j with j + R/2) or interleaved pairing ((2j, 2j+1), GGUF llama layout). With several position streams (M-RoPE,
// the vision tower's 2-D rotary) each frequency takes its angle from its own stream; text-only M-RoPE is plain RoPE.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "errors.h"

namespace ninfer::cpu {

namespace {
constexpr int kMaxFrequencies = 256;
}

void CpuBackend::rope(float* x, int64_t rows, int32_t heads, int64_t head_stride, int64_t row_stride,
                      const int64_t* positions, const RopeSpec& rope) {
  const int32_t half = rope.rotary_dim / 2;
  if (half > kMaxFrequencies) throw EngineError("rotary_dim above " + std::to_string(2 * kMaxFrequencies));
  if (rope.streams < 1 || (rope.streams > 1 && !rope.freq_stream))
    throw EngineError("rope: streams must be >= 1, with a stream per frequency when > 1");
#pragma omp parallel for if (rows > 8)
  for (int64_t r = 0; r < rows; ++r) {
    float cos_[kMaxFrequencies], sin_[kMaxFrequencies];
    for (int32_t i = 0; i < half; ++i) {
      // The angle is formed in f32 as the reference does (position * inv_freq), then its cos/sin.
      const int64_t position =
          rope.streams == 1 ? positions[r] : positions[r * rope.streams + rope.freq_stream[i]];
      const float angle = float(position) * rope.inv_freq[i];
      cos_[i] = float(std::cos(double(angle)));
      sin_[i] = float(std::sin(double(angle)));
    }
    for (int32_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + h * head_stride;
      for (int32_t i = 0; i < half; ++i) {
        float* a = rope.pairing == RopePairing::Half ? v + i : v + 2 * i;
        float* b = rope.pairing == RopePairing::Half ? v + i + half : v + 2 * i + 1;
        const float x1 = *a, x2 = *b;
        *a = x1 * cos_[i] - x2 * sin_[i];
        *b = x2 * cos_[i] + x1 * sin_[i];
      }
    }
  }
}

}  // namespace ninfer::cpu
