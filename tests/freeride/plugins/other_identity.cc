// A plugin of this side-task ABI version built with another abseil and compiler than freeride:
// loading it must fail naming both builds.
#include "freeride/side_task.h"

extern "C" int freeride_side_task_abi_version() { return freeride::kSideTaskAbiVersion; }
extern "C" const char* freeride_side_task_build_identity() {
  return "abseil 20240116.2 (namespace absl::lts_20240116), clang 17 with libc++ 170000";
}
extern "C" void* freeride_create_side_task(const char*) { return nullptr; }
