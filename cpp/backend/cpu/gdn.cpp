// Gated DeltaNet kernels (qwen35-architecture.md section 4). gdn_recurrent is the token-by-token transcription of the
// section 4.5 pseudo-code and is the reference; gdn_chunked computes the same result chunk by chunk with a few small
// matrix products per chunk (the WY / UT-transform form), which keeps the state out of the per-token inner loop.
#include "backend/cpu/gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/gdn_gemm.h"

namespace ninfer::cpu {
namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// Per-head views of the [T, H, D] inputs: row t of head h starts at base + (t * heads + h) * dim.
struct HeadRows {
  const float* base;
  int64_t stride;  // heads * dim
  const float* row(int64_t t) const { return base + t * stride; }
};

// dst[cols, rows] = src[rows, cols]^T, in 8 x 8 blocks so that both sides are read and written a cache line at a time.
void transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kBlock = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t i1 = std::min(rows, i0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t i = i0; i < i1; ++i) dst[c * rows + i] = src[i * cols + c];
    }
}

// Solves u_i += sum_{m<i} A[i, m] u_m in order (A [L, L] strictly lower, u [L, width] rows in place). Blocks of rows
// first take the contributions of all finished rows with one matrix product, then resolve among themselves.
void forward_substitute(const float* A, int64_t L, float* u, int64_t width) {
  constexpr int64_t kBlock = 16;
  for (int64_t i0 = 0; i0 < L; i0 += kBlock) {
    const int64_t i1 = std::min(L, i0 + kBlock);
    gemm(i1 - i0, width, i0, A + i0 * L, L, u, width, u + i0 * width, width, GemmMode::kAccumulate);
    for (int64_t i = i0 + 1; i < i1; ++i) {
      float* ui = u + i * width;
      for (int64_t m = i0; m < i; ++m) {
        const float a = A[i * L + m];
        const float* um = u + m * width;
        for (int64_t c = 0; c < width; ++c) ui[c] += a * um[c];
      }
    }
  }
}

}  // namespace

void gdn_causal_conv(const float* mixed, int64_t T, int64_t C, const float* weight, int32_t K, float* state,
                     float* out) {
  const int64_t hist = K - 1;
  // Input at time t (negative t reads the carried history, oldest first).
  auto input = [&](int64_t t, int64_t c) { return t >= 0 ? mixed[t * C + c] : state[c * hist + (hist + t)]; };
  constexpr int64_t kBlock = 64;  // channels per task; the inner channel loop is the vectorised one
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kBlock, c1 = std::min(C, c0 + kBlock), n = c1 - c0;
    // The block's taps transposed to [K, n], so that the channel loop reads them contiguously.
    std::vector<float> taps(K * n);
    for (int64_t c = 0; c < n; ++c)
      for (int32_t j = 0; j < K; ++j) taps[j * n + c] = weight[(c0 + c) * K + j];
    for (int64_t t = 0; t < T; ++t) {
      float* o = out + t * C + c0;
      std::fill(o, o + n, 0.0f);
      if (t >= hist) {  // the window lies inside `mixed`: contiguous rows
        for (int32_t j = 0; j < K; ++j) {
          const float* x = mixed + (t - hist + j) * C + c0;
          const float* w = &taps[j * n];
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) o[c] += w[c] * x[c];
        }
      } else {  // the first K-1 tokens also read the history
        for (int32_t j = 0; j < K; ++j)
          for (int64_t c = 0; c < n; ++c) o[c] += taps[j * n + c] * input(t - hist + j, c0 + c);
      }
      for (int64_t c = 0; c < n; ++c) o[c] = silu(o[c]);
    }
    // New history: the last K-1 entries of [old history | mixed]. Entry i comes from position i + T of that
    // concatenation, which is never an entry already overwritten (i + T > i), so the update is in place.
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t i = 0; i < hist; ++i) {
        const int64_t s = i + T;
        state[c * hist + i] = s < hist ? state[c * hist + s] : mixed[(s - hist) * C + c];
      }
  }
}

void gdn_recurrent(const GdnDims& d, int64_t T, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* out) {
  const int64_t Hk = d.num_key_heads, Hv = d.num_value_heads, Dk = d.key_head_dim, Dv = d.value_head_dim;
  const int64_t group = Hv / Hk;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < Hv; ++j) {
    const int64_t h = j / group;
    float* S = state + j * Dk * Dv;  // [Dk, Dv]
    std::vector<float> p(Dv), delta(Dv);
    for (int64_t t = 0; t < T; ++t) {
      const float* qt = q + (t * Hk + h) * Dk;
      const float* kt = k + (t * Hk + h) * Dk;
      const float* vt = v + (t * Hv + j) * Dv;
      float* ot = out + (t * Hv + j) * Dv;
      const float decay = std::exp(g[t * Hv + j]), b = beta[t * Hv + j];
      // S = exp(g) S; p = S^T k  (one pass over the rows of S)
      std::fill(p.begin(), p.end(), 0.0f);
      for (int64_t r = 0; r < Dk; ++r) {
        float* s = S + r * Dv;
        for (int64_t c = 0; c < Dv; ++c) {
          s[c] *= decay;
          p[c] += s[c] * kt[r];
        }
      }
      for (int64_t c = 0; c < Dv; ++c) delta[c] = b * (vt[c] - p[c]);
      // S += k delta^T; o = S^T q  (read after the update)
      std::fill(ot, ot + Dv, 0.0f);
      for (int64_t r = 0; r < Dk; ++r) {
        float* s = S + r * Dv;
        for (int64_t c = 0; c < Dv; ++c) {
          s[c] += kt[r] * delta[c];
          ot[c] += s[c] * qt[r];
        }
      }
    }
  }
}

// Per value head and chunk of L tokens (positions i, m in [0, L)), with S0 the state entering the chunk,
// G_i = g_0 + ... + g_i (cumulative log decay inside the chunk) and u_i the delta actually written at token i:
//   u_i   = beta_i (v_i - e^{G_i} S0^T k_i) - sum_{m<i} beta_i e^{G_i - G_m} (k_i . k_m) u_m   (forward substitution)
//   o_i   = e^{G_i} S0^T q_i + sum_{m<=i} e^{G_i - G_m} (q_i . k_m) u_m
//   S_new = e^{G_{L-1}} S0 + sum_i e^{G_{L-1} - G_i} k_i u_i^T
// which is the recurrence of section 4.5 unrolled (S_i = e^{g_i}(I - beta_i k_i k_i^T) S_{i-1} + beta_i k_i v_i^T).
void gdn_chunked(const GdnDims& d, int64_t T, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* state, float* out, int32_t chunk) {
  const int64_t Hk = d.num_key_heads, Hv = d.num_value_heads, Dk = d.key_head_dim, Dv = d.value_head_dim;
  const int64_t group = Hv / Hk, C = std::max<int32_t>(chunk, 1);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < Hv; ++j) {
    const int64_t h = j / group;
    const HeadRows qrows{q + h * Dk, Hk * Dk}, krows{k + h * Dk, Hk * Dk}, vrows{v + j * Dv, Hv * Dv};
    float* S = state + j * Dk * Dv;  // [Dk, Dv]
    // Scratch, reused by every chunk of this head.
    std::vector<float> kq(2 * C * Dk);     // [k rows; q rows] of the chunk, [2L, Dk]
    std::vector<float> kt(Dk * C);         // k rows transposed, [Dk, L]
    std::vector<float> dots(2 * C * C);    // [k.k; q.k], then the coefficients A and P below, [2L, L]
    std::vector<float> reads(2 * C * Dv);  // [S0^T k; S0^T q], [2L, Dv]; the k half becomes u
    std::vector<double> cum(C);            // G_i
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t L = std::min(C, T - t0);
      for (int64_t i = 0; i < L; ++i) {
        std::copy_n(krows.row(t0 + i), Dk, &kq[i * Dk]);
        std::copy_n(qrows.row(t0 + i), Dk, &kq[(L + i) * Dk]);
      }
      transpose(kq.data(), L, Dk, kt.data());
      // Cumulative decay in double: only differences G_i - G_m are exponentiated, and those must not lose the
      // small terms to the large running sum.
      double acc = 0.0;
      for (int64_t i = 0; i < L; ++i) cum[i] = acc += g[(t0 + i) * Hv + j];

      // k.k and q.k are only needed on and below the diagonal (causal), so the upper halves are skipped.
      gemm(L, L, Dk, kq.data(), Dk, kt.data(), L, dots.data(), L, GemmMode::kOverwrite, Triangle::kLowerOutput);
      gemm(L, L, Dk, kq.data() + L * Dk, Dk, kt.data(), L, dots.data() + L * L, L, GemmMode::kOverwrite,
           Triangle::kLowerOutput);
      gemm(2 * L, Dv, Dk, kq.data(), Dk, S, Dv, reads.data(), Dv, GemmMode::kOverwrite);

      float* A = dots.data();          // A[i, m] = -beta_i e^{G_i - G_m} (k_i . k_m) for m < i, else 0
      float* P = dots.data() + L * L;  // P[i, m] = e^{G_i - G_m} (q_i . k_m) for m <= i, else 0
      float* U = reads.data();         // rows 0..L-1: u
      const float* QS = reads.data() + L * Dv;
      for (int64_t i = 0; i < L; ++i) {
        const float b = beta[(t0 + i) * Hv + j];
        float* Ai = A + i * L;
        float* Pi = P + i * L;
        for (int64_t m = 0; m <= i; ++m) {
          const float decay = std::exp(static_cast<float>(cum[i] - cum[m]));
          Ai[m] = -b * decay * Ai[m];
          Pi[m] *= decay;
        }
        Ai[i] = 0.0f;
        std::fill(Ai + i + 1, Ai + L, 0.0f);  // above the diagonal: never computed
        std::fill(Pi + i + 1, Pi + L, 0.0f);
        // u starts as beta_i (v_i - e^{G_i} S0^T k_i); inter-chunk part of the output, the rest is added below.
        const float gi = std::exp(static_cast<float>(cum[i]));
        const float* vi = vrows.row(t0 + i);
        float* ui = U + i * Dv;
        for (int64_t c = 0; c < Dv; ++c) ui[c] = b * (vi[c] - gi * ui[c]);
        float* oi = out + ((t0 + i) * Hv + j) * Dv;
        for (int64_t c = 0; c < Dv; ++c) oi[c] = gi * QS[i * Dv + c];
      }
      forward_substitute(A, L, U, Dv);
      gemm(L, Dv, L, P, L, U, Dv, out + (t0 * Hv + j) * Dv, Hv * Dv, GemmMode::kAccumulate, Triangle::kLowerA);

      // S = e^{G_{L-1}} S0 + sum_i (e^{G_{L-1} - G_i} k_i) u_i^T, the scaled k rows overwriting the k half of kq.
      const double last = cum[L - 1];
      for (int64_t i = 0; i < L; ++i) {
        const float to_end = std::exp(static_cast<float>(last - cum[i]));
        for (int64_t r = 0; r < Dk; ++r) kq[i * Dk + r] *= to_end;
      }
      const float chunk_decay = std::exp(static_cast<float>(last));
      for (int64_t e = 0; e < Dk * Dv; ++e) S[e] *= chunk_decay;
      gemm_at(Dk, Dv, L, kq.data(), Dk, U, Dv, S, Dv, GemmMode::kAccumulate);
    }
  }
}

}  // namespace ninfer::cpu
