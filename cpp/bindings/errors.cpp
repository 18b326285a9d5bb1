// C++ errors reach Python as the ninfer.errors class of the same name, with the C++ message. The module is
// imported when the first error is translated, not at import of _engine, so the two never import each other.
#include "artifact/json.h"
#include "bindings/bindings.h"
#include "errors.h"

namespace nb = nanobind;

namespace ninfer::bindings {

namespace {

void raise_as(const char* class_name, const char* message) {
  try {
    nb::object cls = nb::module_::import_("ninfer.errors").attr(class_name);
    PyErr_SetString(cls.ptr(), message);
  } catch (const nb::python_error&) {  // ninfer.errors unimportable: keep the message all the same
    PyErr_SetString(PyExc_RuntimeError, message);
  }
}

void translate(const std::exception_ptr& p, void*) {
  // Most derived first: a catch clause also takes every subclass.
  try {
    std::rethrow_exception(p);
  } catch (const EngineBusyError& e) {
    raise_as("EngineBusyError", e.what());
  } catch (const CapacityError& e) {
    raise_as("CapacityError", e.what());
  } catch (const OutOfMemoryError& e) {
    raise_as("OutOfMemoryError", e.what());
  } catch (const EngineError& e) {
    raise_as("EngineError", e.what());
  } catch (const ArtifactError& e) {
    raise_as("ArtifactError", e.what());
  } catch (const NinferError& e) {
    raise_as("NinferError", e.what());
  } catch (const json::ParseError& e) {  // a manifest or config read outside the reader's own checks
    raise_as("ArtifactError", e.what());
  } catch (const json::TypeError& e) {
    raise_as("ArtifactError", e.what());
  }
}

}  // namespace

void bind_errors(nb::module_& m) { nb::register_exception_translator(translate); }

}  // namespace ninfer::bindings
