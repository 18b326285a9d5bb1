// The sampler's distribution and draws, the token mask and the KV row codecs as plain functions, checked against
// numpy references.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <span>
#include <string>
#include <vector>

#include "bindings/testing/testing.h"
#include "cache/kv_quant.h"
#include "runtime/sampler.h"

namespace nb = nanobind;

namespace ninfer::bindings {
namespace {

using MaskArray = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

void bind_runtime_hooks(nb::module_& m) {
  m.def("sampler_distribution",
        [](const std::vector<float>& logits, const SamplingParams& p, const std::vector<int32_t>& prompt,
           const std::vector<int32_t>& generated, bool xtc_fires) {
          TokenHistory h;
          h.add_prompt(prompt);
          for (int32_t t : generated) h.add_generated(t);
          return Sampler(p).distribution(logits, h, xtc_fires);
        },
        nb::arg("logits"), nb::arg("params"), nb::arg("prompt"), nb::arg("generated"), nb::arg("xtc_fires") = true);
  m.def("sampler_draw", [](const std::vector<float>& logits, const SamplingParams& p, int32_t n) {
    Sampler s(p);
    std::vector<int32_t> out;
    for (int32_t i = 0; i < n; ++i) out.push_back(s.sample(logits, TokenHistory{}).token);
    return out;
  });
  m.def("apply_token_mask", [](std::vector<float> logits, MaskArray mask) {
    apply_token_mask(logits, std::span<const uint32_t>(mask.data(), mask.shape(0)));
    return logits;
  });
  m.def("kv_quant_roundtrip", [](const std::vector<float>& row, const std::string& dtype) {
    return kv_row_roundtrip(row, parse_kv_dtype(dtype));
  });
}

}  // namespace ninfer::bindings
