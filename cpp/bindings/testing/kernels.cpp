// CPU kernel entry points for the tests: each looks a tensor up by name and runs the kernel on it.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/linear_int16.h"
#include "bindings/array_out.h"
#include "bindings/artifact_handle.h"
#include "bindings/testing/testing.h"

namespace nb = nanobind;

namespace ninfer::bindings {

namespace {

using Matrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Vector = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OutMatrix = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The 2-D weight `name`, or matrix `index` of a stacked tensor.
TensorView weight(const ArtifactHandle& h, const std::string& name, std::optional<int64_t> index) {
  const TensorView& t = h.get()->tensor(name);
  return index ? t.matrix(*index) : t;
}

cpu::LinearPath linear_path(const std::string& path) {
  if (path == "fast") return cpu::LinearPath::Fast;
  if (path == "avx2") return cpu::LinearPath::Int16Avx2;
  if (path == "f32") return cpu::LinearPath::F32;
  throw EngineError("linear: path must be \"fast\", \"avx2\" or \"f32\", not \"" + path + "\"");
}

// y = x @ W.T (+ bias), into `out` when given (tests poison it first), else into a fresh array.
nb::object linear(const Matrix& x, const ArtifactHandle& h, const std::string& name, const std::optional<Vector>& bias,
                  std::optional<int64_t> matrix, std::optional<OutMatrix> out, const std::string& path) {
  const cpu::LinearPath kernel_path = linear_path(path);
  const TensorView w = weight(h, name, matrix);
  const int64_t rows = int64_t(x.shape(0));
  if (w.shape.size() != 2 || int64_t(x.shape(1)) != w.cols() || (bias && int64_t(bias->shape(0)) != w.rows()) ||
      (out && (int64_t(out->shape(0)) != rows || int64_t(out->shape(1)) != w.rows())))
    throw EngineError("linear: x [" + std::to_string(rows) + ", " + std::to_string(x.shape(1)) + "]" +
                      (bias ? ", bias [" + std::to_string(bias->shape(0)) + "]" : std::string()) +
                      (out ? ", out [" + std::to_string(out->shape(0)) + ", " + std::to_string(out->shape(1)) + "]"
                           : std::string()) +
                      " do not fit weight " + w.name + " of shape [" + std::to_string(w.rows()) + ", " +
                      std::to_string(w.cols()) + "] (" + std::to_string(w.shape.size()) + "-D)");
  std::optional<OwnedFloats> fresh;
  float* y = out ? out->data() : (fresh = allocate_floats(size_t(rows * w.rows())))->data;
  {
    nb::gil_scoped_release release;
    cpu::linear(x.data(), rows, w, y, bias ? bias->data() : nullptr, kernel_path);
  }
  return out ? nb::cast(*out) : nb::cast(as_array(*fresh, {rows, w.rows()}));
}

// linear_shared_input over the named 2-D weights (all with x's width), into `outs` (one per weight, tests poison
// them first) with `biases` (one per weight, None for none): the outputs.
std::vector<OutMatrix> linear_shared_input(const Matrix& x, const ArtifactHandle& h,
                                           const std::vector<std::string>& names, std::vector<OutMatrix> outs,
                                           std::vector<std::optional<Vector>> biases, const std::string& path) {
  const cpu::LinearPath kernel_path = linear_path(path);
  const int64_t rows = int64_t(x.shape(0));
  if (outs.size() != names.size() || biases.size() != names.size())
    throw EngineError("linear_shared_input: " + std::to_string(names.size()) + " weights, " +
                      std::to_string(outs.size()) + " outputs, " + std::to_string(biases.size()) + " biases");
  std::vector<LinearOut> projections;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorView& w = h.get()->tensor(names[i]);
    if (w.shape.size() != 2 || int64_t(x.shape(1)) != w.cols() || int64_t(outs[i].shape(0)) != rows ||
        int64_t(outs[i].shape(1)) != w.rows() || (biases[i] && int64_t(biases[i]->shape(0)) != w.rows()))
      throw EngineError("linear_shared_input: x, out or bias does not fit weight " + w.name);
    projections.push_back({&w, outs[i].data(), biases[i] ? biases[i]->data() : nullptr});
  }
  {
    nb::gil_scoped_release release;
    cpu::linear_shared_input(x.data(), rows, projections, kernel_path);
  }
  return outs;
}

FloatArray dequantize_row(const ArtifactHandle& h, const std::string& name, int64_t row) {
  const TensorView& w = h.get()->tensor(name);
  const int64_t rows = w.numel() / w.cols();
  if (row < 0 || row >= rows)
    throw EngineError("dequantize_row: row " + std::to_string(row) + " of " + name + " outside [0, " +
                      std::to_string(rows) + ")");
  OwnedFloats out = allocate_floats(size_t(w.cols()));
  cpu::dequantize_row(w, row, out.data);
  return as_array(out, {w.cols()});
}

}  // namespace

void bind_kernels(nb::module_& m) {
  nb::module_ k = m.def_submodule("kernels", "CPU kernels, exposed for tests and benchmarks");
  k.def("linear", &linear, nb::arg("x"), nb::arg("artifact"), nb::arg("name"), nb::arg("bias") = nb::none(),
        nb::arg("matrix") = nb::none(), nb::arg("out") = nb::none(), nb::arg("path") = "fast",
        "x[rows, cols] @ W.T (+ bias) with W consumed in its stored encoding; `matrix` picks one of a stack; "
        "writes into `out` when given and returns it. path \"fast\" is what the engine runs (int16 activations "
        "for int4 / int8 / int4_affine where built; their AVX-512 form where built), \"avx2\" the same with that "
        "kernel's AVX2 form, \"f32\" its f32 twin.");
  k.def("linear_shared_input", &linear_shared_input, nb::arg("x"), nb::arg("artifact"), nb::arg("names"),
        nb::arg("outs"), nb::arg("biases"), nb::arg("path") = "fast",
        "linear() for every named weight on the same x, as the model's q/k/v and gate/up run (x rounded once, one "
        "parallel region per decode step); writes outs[i] = x @ W_i.T (+ biases[i]) and returns outs.");
  k.def("int16_activations", [](const ArtifactHandle& h, const std::string& name) {
        return cpu::linear_int16_applies(h.get()->tensor(name)); }, nb::arg("artifact"), nb::arg("name"),
        "Whether linear(path=\"fast\") rounds the input to int16 blocks for this weight in this build.");
  k.def("int16_avx512", &cpu::linear_int16_avx512_built,
        "Whether this build has the int16 kernel's AVX-512 form (path \"fast\" runs it, \"avx2\" the AVX2 form).");
  k.def("dequantize_row", &dequantize_row, nb::arg("artifact"), nb::arg("name"), nb::arg("row"),
        "Row `row` of the tensor's [R, cols] view, dequantized by the reference decoder.");
}

}  // namespace ninfer::bindings
