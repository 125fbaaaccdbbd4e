// Which shapes a GPU suite runs in the emulation build (FREERIDE_CUDA=EMULATE, where the CUDA
// sources run on the CPU with every CUDA thread a fiber: models/cuda/emulation/device.h).
// There, a GPT-2-sized shape takes minutes per test, so the suites run their small shapes only
// (still every kernel path: each head size, partial tiles and vectors, both precisions); real
// GPUs run every shape. Each test prints which shapes it ran and which it left to real GPUs.
#pragma once

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace freeride::testing {

#ifdef FREERIDE_CUDA_EMULATED
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

// Prints one line: "emulated build: ran shapes A; B, left to real GPUs: C" (on a GPU, "ran
// shapes A; B; C").
inline void PrintShapes(const std::vector<std::string>& ran,
                        const std::vector<std::string>& left_to_gpus = {}) {
  auto join = [](const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : "; ") + n;
    return s.empty() ? std::string("none") : s;
  };
  if (kEmulated) {
    std::cout << "emulated build: ran shapes " << join(ran) << ", left to real GPUs: "
              << join(left_to_gpus) << std::endl;
  } else {
    std::cout << "ran shapes " << join(ran) << std::endl;
  }
}

// The elements of `all` to run: every one on a GPU, those `small` accepts under emulation.
// Prints the line above, naming each with `name`.
template <typename Shape, typename Small, typename Name>
std::vector<Shape> ShapesToRun(const std::vector<Shape>& all, Small small, Name name) {
  std::vector<Shape> run;
  std::vector<std::string> ran, left;
  for (const Shape& s : all) {
    if (!kEmulated || small(s)) {
      run.push_back(s);
      ran.push_back(name(s));
    } else {
      left.push_back(name(s));
    }
  }
  PrintShapes(ran, left);
  return run;
}

// For a test whose every shape is too big to emulate: `on_gpu` on a GPU, under emulation the
// smaller `emulated` ones of the same kind instead. Prints the line above.
template <typename Shape, typename Name>
std::vector<Shape> EmulatedInstead(const std::vector<Shape>& on_gpu,
                                   const std::vector<Shape>& emulated, Name name) {
  std::vector<std::string> gpu_names, emulated_names, left;
  for (const Shape& s : on_gpu) gpu_names.push_back(name(s));
  for (const Shape& s : emulated) emulated_names.push_back(name(s));
  if (!kEmulated) {
    PrintShapes(gpu_names);
    return on_gpu;
  }
  for (const std::string& n : gpu_names) {
    if (std::find(emulated_names.begin(), emulated_names.end(), n) == emulated_names.end()) {
      left.push_back(n);
    }
  }
  PrintShapes(emulated_names, left);
  return emulated;
}

// How many optimizer steps a trajectory test takes: `on_gpu` on a GPU, `emulated` under
// emulation, where one step of even the tiny models takes seconds. Every step after the second
// runs the kernels the first two did (the first with AdamW's moments at zero, the next with
// them set), so the shorter trajectory keeps every kernel path and each step's comparison;
// real GPUs keep the longer one. Prints which ran.
inline int StepsToRun(int on_gpu, int emulated) {
  if (!kEmulated) {
    std::cout << "ran " << on_gpu << " steps" << std::endl;
    return on_gpu;
  }
  std::cout << "emulated build: ran " << emulated << " of the " << on_gpu
            << " steps, the rest left to real GPUs" << std::endl;
  return emulated;
}

}  // namespace freeride::testing
