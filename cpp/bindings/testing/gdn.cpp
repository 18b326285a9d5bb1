// _engine.gdn: the Gated DeltaNet CPU kernels on numpy f32 arrays, for tests and benchmarks. Functional interface:
// the input state is copied, the copy is updated and returned, the caller's array is left alone.
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>

#include "backend/cpu/gdn.h"
#include "bindings/testing/testing.h"

namespace nb = nanobind;

namespace ninfer::bindings {
namespace {

template <size_t N>
using In = nb::ndarray<const float, nb::ndim<N>, nb::c_contig, nb::device::cpu>;
using Out = nb::ndarray<nb::numpy, float>;

// A fresh numpy f32 array of the given shape, owning its buffer. Its contents are `init` if given, else NaN, so an
// element a kernel forgets to write shows up in the tests instead of passing as leftover memory.
Out new_array(std::initializer_list<size_t> shape, const float* init = nullptr) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  float* data = new float[n > 0 ? n : 1];
  if (init != nullptr)
    std::memcpy(data, init, n * sizeof(float));
  else
    std::fill_n(data, n, std::numeric_limits<float>::quiet_NaN());
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return Out(data, shape.size(), shape.begin(), owner);
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("gdn: " + what);
}

std::string shape_of(size_t ndim, const auto& a) {
  std::string s = "(";
  for (size_t i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + ")";
}

// Shapes of one gated-delta-rule call, checked against each other.
cpu::GdnDims delta_rule_dims(const In<3>& q, const In<3>& k, const In<3>& v, const In<2>& g, const In<2>& beta,
                             const In<3>& state) {
  const size_t T = q.shape(0), Hk = q.shape(1), Dk = q.shape(2), Hv = v.shape(1), Dv = v.shape(2);
  require(k.shape(0) == T && k.shape(1) == Hk && k.shape(2) == Dk,
          "k must have q's shape " + shape_of(3, q) + ", got " + shape_of(3, k));
  require(v.shape(0) == T, "v must have T = " + std::to_string(T) + " rows, got " + shape_of(3, v));
  require(Hk > 0 && Hv % Hk == 0, "value heads (" + std::to_string(Hv) + ") must be a multiple of key heads (" +
                                      std::to_string(Hk) + ")");
  require(g.shape(0) == T && g.shape(1) == Hv, "g must be [T, Hv], got " + shape_of(2, g));
  require(beta.shape(0) == T && beta.shape(1) == Hv, "beta must be [T, Hv], got " + shape_of(2, beta));
  require(state.shape(0) == Hv && state.shape(1) == Dk && state.shape(2) == Dv,
          "state must be [Hv, Dk, Dv], got " + shape_of(3, state));
  return {static_cast<int32_t>(Hk), static_cast<int32_t>(Hv), static_cast<int32_t>(Dk), static_cast<int32_t>(Dv)};
}

template <typename Kernel>
std::pair<Out, Out> delta_rule(const In<3>& q, const In<3>& k, const In<3>& v, const In<2>& g, const In<2>& beta,
                               const In<3>& state, Kernel kernel) {
  const cpu::GdnDims d = delta_rule_dims(q, k, v, g, beta, state);
  const size_t T = q.shape(0);
  Out out = new_array({T, v.shape(1), v.shape(2)});
  Out new_state = new_array({state.shape(0), state.shape(1), state.shape(2)}, state.data());
  {
    nb::gil_scoped_release release;
    kernel(d, static_cast<int64_t>(T), q.data(), k.data(), v.data(), g.data(), beta.data(), new_state.data(),
           out.data());
  }
  return {out, new_state};
}

}  // namespace

void bind_gdn(nb::module_& m) {
  nb::module_ gdn = m.def_submodule("gdn", "Gated DeltaNet CPU kernels (qwen35-architecture.md section 4)");

  gdn.def(
      "causal_conv",
      [](const In<2>& mixed, const In<2>& weight, const In<2>& state) {
        const size_t T = mixed.shape(0), C = mixed.shape(1), K = weight.shape(1);
        require(weight.shape(0) == C && K >= 1, "weight must be [C, K] with C = " + std::to_string(C) + ", got " +
                                                    shape_of(2, weight));
        require(state.shape(0) == C && state.shape(1) == K - 1,
                "state must be [C, K-1] = (" + std::to_string(C) + ", " + std::to_string(K - 1) + "), got " +
                    shape_of(2, state));
        Out out = new_array({T, C});
        Out new_state = new_array({C, K - 1}, state.data());
        {
          nb::gil_scoped_release release;
          cpu::gdn_causal_conv(mixed.data(), static_cast<int64_t>(T), static_cast<int64_t>(C), weight.data(),
                               static_cast<int32_t>(K), new_state.data(), out.data());
        }
        return std::make_pair(out, new_state);
      },
      nb::arg("mixed"), nb::arg("weight"), nb::arg("state"),
      "silu(causal depthwise conv) of mixed [T, C] with weight [C, K] and history state [C, K-1] (oldest first). "
      "Returns (out [T, C], new_state [C, K-1]).");

  gdn.def(
      "recurrent",
      [](const In<3>& q, const In<3>& k, const In<3>& v, const In<2>& g, const In<2>& beta, const In<3>& state) {
        return delta_rule(q, k, v, g, beta, state, cpu::gdn_recurrent);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("state"),
      "Token-by-token gated delta rule. q, k [T, Hk, Dk] (normalised, q scaled), v [T, Hv, Dv], g, beta [T, Hv], "
      "state [Hv, Dk, Dv]. Returns (out [T, Hv, Dv], new_state).");

  gdn.def(
      "chunked",
      [](const In<3>& q, const In<3>& k, const In<3>& v, const In<2>& g, const In<2>& beta, const In<3>& state,
         int32_t chunk) {
        require(chunk >= 1, "chunk must be >= 1, got " + std::to_string(chunk));
        return delta_rule(q, k, v, g, beta, state,
                          [chunk](const cpu::GdnDims& d, int64_t T, const float* q, const float* k, const float* v,
                                  const float* g, const float* beta, float* s, float* o) {
                            cpu::gdn_chunked(d, T, q, k, v, g, beta, s, o, chunk);
                          });
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"), nb::arg("state"),
      nb::arg("chunk") = 64, "The same as recurrent, computed `chunk` tokens at a time (WY / UT-transform form).");
}

}  // namespace ninfer::bindings
