// The worker protocol's task spec, as a worker reads it from its socket: decoded or refused.
#include <string>

#include "freeride/worker_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<freeride::WorkerSpec> spec = freeride::DecodeWorkerSpec(text);
  // What decodes must encode and decode again to the same task.
  if (spec.ok()) {
    absl::StatusOr<freeride::WorkerSpec> again =
        freeride::DecodeWorkerSpec(freeride::EncodeWorkerSpec(*spec));
    if (!again.ok() || again->task.name != spec->task.name) __builtin_trap();
  }
  return 0;
}
