// Typed errors of the engine. The binding translates each to the ninfer.errors class of the same name,
// so Python callers see one hierarchy whichever side raised.
#pragma once

#include <stdexcept>

namespace ninfer {

#define NINFER_ERROR(Name, Base)   \
  class Name : public Base {       \
   public:                         \
    using Base::Base;              \
  };

NINFER_ERROR(NinferError, std::runtime_error)
NINFER_ERROR(ArtifactError, NinferError)    // unreadable / corrupt / wrong version / missing tensor
NINFER_ERROR(EngineError, NinferError)      // a request or option the engine refuses
NINFER_ERROR(EngineBusyError, EngineError)  // admission queue full
NINFER_ERROR(CapacityError, EngineError)    // can never fit: prompt > max_context, reservation > pool
NINFER_ERROR(OutOfMemoryError, EngineError) // weights/caches/workspace do not fit

#undef NINFER_ERROR

}  // namespace ninfer
