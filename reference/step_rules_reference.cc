#include "reference/step_rules_reference.h"

#include <algorithm>
#include <cmath>

namespace paramd::reference {

bool GradFiniteRef(float gs) { return std::isfinite(gs) && std::isfinite(gs * gs); }

double PairwiseTreeRef(std::vector<double> values) {
  if (values.empty()) return 0.0;
  size_t size = 1;
  while (size < values.size()) size *= 2;
  values.resize(size, 0.0);
  while (values.size() > 1) {
    const size_t half = values.size() / 2;
    for (size_t i = 0; i < half; ++i) values[i] = values[i] + values[i + half];
    values.resize(half);
  }
  return values[0];
}

std::vector<double> BlockSumsOfSquaresRef(const float* gs, int64_t rows, int64_t cols) {
  std::vector<double> sums;
  for (int64_t row = 0; row < rows; row += 128) {
    const int64_t begin = row * cols;
    const int64_t end = std::min(rows, row + 128) * cols;
    std::vector<double> chunk_sums;
    for (int64_t c = begin; c < end; c += 128) {
      std::vector<double> squares;
      for (int64_t i = c; i < std::min(end, c + 128); ++i) {
        squares.push_back(static_cast<double>(gs[i]) * static_cast<double>(gs[i]));
      }
      squares.resize(128, 0.0);
      chunk_sums.push_back(PairwiseTreeRef(squares));
    }
    sums.push_back(PairwiseTreeRef(chunk_sums));
  }
  return sums;
}

float ClipFactorRef(double total, double max_norm) {
  const double clip = max_norm / (std::sqrt(total) + 1e-6);
  return static_cast<float>(clip < 1.0 ? clip : 1.0);
}

}  // namespace paramd::reference
