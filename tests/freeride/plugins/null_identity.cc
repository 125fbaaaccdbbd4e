// A plugin of this side-task ABI version whose build identity is null: loading it must fail
// with one clear error, in process and in a worker, instead of constructing a string from null.
#include "freeride/side_task.h"

extern "C" int freeride_side_task_abi_version() { return freeride::kSideTaskAbiVersion; }
extern "C" const char* freeride_side_task_build_identity() { return nullptr; }
extern "C" void* freeride_create_side_task(const char*) { return nullptr; }
