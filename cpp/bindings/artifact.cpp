#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "backend/cpu/linear.h"
#include "bindings/array_out.h"
#include "bindings/artifact_handle.h"
#include "bindings/bindings.h"

namespace nb = nanobind;

namespace ninfer::bindings {

namespace {

ArtifactHandle open_artifact(const std::filesystem::path& path, bool verify_checksums) {
  return {Artifact::open(path.string(), verify_checksums), path.string()};
}

nb::dict tensor_info(const ArtifactHandle& h, const std::string& name,
                     const std::optional<std::vector<int64_t>>& expected_shape) {
  const TensorView& t = h.get()->tensor(name, expected_shape.value_or(std::vector<int64_t>{}));
  nb::dict info;
  info["encoding"] = encoding_name(t.encoding);
  info["shape"] = nb::tuple(nb::cast(t.shape));
  info["group_size"] = t.group_size ? nb::cast(t.group_size) : nb::none();
  return info;
}

FloatArray dequantize_tensor(const ArtifactHandle& h, const std::string& name) {
  const TensorView& t = h.get()->tensor(name);
  OwnedFloats out = allocate_floats(size_t(t.numel()));
  {
    nb::gil_scoped_release release;
    cpu::dequantize(t, out.data);
  }
  return as_array(out, t.shape);
}

}  // namespace

void bind_artifact(nb::module_& m) {
  nb::class_<ArtifactHandle>(m, "Artifact", "An open .ninfer artifact (read-only mapping).")
      .def_static("open", &open_artifact, nb::arg("path"), nb::arg("verify_checksums") = true,
                  nb::call_guard<nb::gil_scoped_release>(),
                  "Map and validate an artifact; verifies every blob's CRC-32 unless told not to.")
      .def_prop_ro("path", [](const ArtifactHandle& h) { return h.path; })
      .def_prop_ro("closed", [](const ArtifactHandle& h) { return !h.artifact; })
      .def_prop_ro("file_size", [](const ArtifactHandle& h) { return h.get()->file_size(); })
      .def("tensor_names", [](const ArtifactHandle& h) { return h.get()->tensor_names(); })
      .def("manifest_json", [](const ArtifactHandle& h) { return std::string(h.get()->manifest_text()); })
      .def("tensor_info", &tensor_info, nb::arg("name"), nb::arg("expected_shape") = nb::none(),
           "{encoding, shape, group_size}; ArtifactError when missing or not of expected_shape.")
      .def("dequantize", &dequantize_tensor, nb::arg("name"), "The tensor as f32 (reference dequantizer).")
      .def("close", [](ArtifactHandle& h) { h.artifact.reset(); }, nb::call_guard<nb::gil_scoped_release>())
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](ArtifactHandle& h, nb::args) { h.artifact.reset(); })
      .def("__repr__", [](const ArtifactHandle& h) {
        return "<ninfer Artifact " + h.path + (h.artifact ? "" : " (closed)") + ">";
      });
}

}  // namespace ninfer::bindings
