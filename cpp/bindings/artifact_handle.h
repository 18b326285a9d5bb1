// The Python object behind `_engine.Artifact`: a reference to an open artifact that close() drops. Engines and
// models opened from it hold their own reference, so the mapping lives until the last user lets go.
#pragma once

#include <memory>
#include <string>

#include "artifact/artifact.h"

namespace ninfer::bindings {

struct ArtifactHandle {
  std::shared_ptr<Artifact> artifact;  // null once closed
  std::string path;                    // kept after close, for messages and repr

  // The open artifact; an ArtifactError naming the file once closed.
  const std::shared_ptr<Artifact>& get() const {
    if (!artifact) throw ArtifactError(path + ": artifact is closed");
    return artifact;
  }
};

}  // namespace ninfer::bindings
