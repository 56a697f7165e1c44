// The parameter sets the GPU benchmarks step: 1e9 parameters as one tensor, as a 1B-parameter
// decoder's 291 tensors, and as 10,000 small tensors (bench/gpu/peer_torch_adam.py has the same).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paramd::bench {

struct Shape {
  int64_t rows, cols;
};

inline std::vector<Shape> ShapeSet(const std::string& name) {
  std::vector<Shape> s;
  if (name == "one") {
    s.push_back({245760, 4096});  // 1.007e9
  } else if (name == "llm") {
    // Hidden 1536, FFN 4096, 32 layers, vocabulary 32000.
    const int64_t h = 1536, f = 4096, vocab = 32000;
    s.push_back({vocab, h});
    for (int layer = 0; layer < 32; ++layer) {
      s.push_back({1, h});                              // attention norm
      for (int k = 0; k < 4; ++k) s.push_back({h, h});  // q, k, v, o
      s.push_back({1, h});                              // MLP norm
      s.push_back({f, h});                              // gate
      s.push_back({f, h});                              // up
      s.push_back({h, f});                              // down
    }
    s.push_back({1, h});  // final norm
    s.push_back({vocab, h});
  } else {
    for (int k = 0; k < 10000; ++k) s.push_back({256, 384});  // 0.983e9
  }
  return s;
}

}  // namespace paramd::bench
