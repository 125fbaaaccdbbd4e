// A plugin built for another side-task ABI: loading it must fail with a clear message.
extern "C" int freeride_side_task_abi_version() { return 999; }
extern "C" void* freeride_create_side_task(const char*) { return nullptr; }
