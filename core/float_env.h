// Subnormal floats flushed to zero on the CPU. An x86 core takes a microcode assist for every
// subnormal operand or result, 10–100× the normal cost: a run whose values drift into that
// range (a diverging step whose softmax underflows, AdamW moments of embedding rows no longer
// seen, decaying by β each step) slows by that factor. Measured: the step that found a
// non-finite loss at lr 1e12 took 14.4 s against 0.28 s for the step before. GPUs flush in
// most of their fast paths; numbers this small carry nothing a float32 training run keeps.
#pragma once

namespace freeride {

// Sets flush-to-zero and denormals-are-zero for the calling thread. Threads created after
// the call (OpenMP's and OpenBLAS's pools) inherit it: call it first thing in main(). A no-op
// where the CPU has no such mode.
void FlushSubnormalsToZero();

// Whether the calling thread flushes subnormal results and operands to zero.
bool FlushesSubnormals();

}  // namespace freeride
