// Typed errors of the engine. The binding translates each to the ninfer.errors class of the same name,
// so Python callers see one hierarchy whichever side raised.
#pragma once

#include <stdexcept>

namespace ninfer {

class NinferError : public std::runtime_error {
 public:
  using runtime_error::runtime_error;
};
// Unreadable / corrupt / wrong version / missing tensor.
class ArtifactError : public NinferError {
 public:
  using NinferError::NinferError;
};
// A request or option the engine refuses.
class EngineError : public NinferError {
 public:
  using NinferError::NinferError;
};
// The admission queue is full.
class EngineBusyError : public EngineError {
 public:
  using EngineError::EngineError;
};
// Can never fit: prompt longer than max_context, reservation larger than the pool.
class CapacityError : public EngineError {
 public:
  using EngineError::EngineError;
};
// Weights, caches or workspace do not fit.
class OutOfMemoryError : public EngineError {
 public:
  using EngineError::EngineError;
};

}  // namespace ninfer
