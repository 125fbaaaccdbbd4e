// A shared object that is not a side-task plugin (no freeride symbols).
extern "C" int some_other_function() { return 1; }
