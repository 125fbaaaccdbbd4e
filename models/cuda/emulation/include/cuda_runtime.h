// What nvcc puts in front of every .cu file, for the emulation build: the runtime API and the
// device-side model (thread indices, barriers, shuffles, launches). Force-included into the
// kernels' translation units; host .cc files include cuda_runtime_api.h as on real CUDA.
#pragma once

#include "models/cuda/emulation/device.h"
#include "models/cuda/emulation/include/cuda_runtime_api.h"
