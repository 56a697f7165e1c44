// paramd::reference — the step rules of DESIGN.md §2 (finiteness, FP64 sums of squares in the fixed
// pairwise order, the clip factor), modelled independently of kernels/step_rules.h: the tree is
// written as its recursive definition over a vector, on gradients the caller forms with
// SumSlotsFp32/SumSlotsBf16 and grad_scale. Like adamw_reference.h it must NOT link or include
// kernels/.
#pragma once

#include <cstdint>
#include <vector>

namespace paramd::reference {

// gs is finite and gs * gs (FP32) does not overflow.
bool GradFiniteRef(float gs);

// The pairwise tree of DESIGN.md §2 over values zero-padded to a power of two: the upper half is
// added onto the lower half element by element, then the same over the lower half, down to one.
double PairwiseTreeRef(std::vector<double> values);

// Sums of squares per block of 128 rows of a [rows, cols] tensor of gradients gs (row-major):
// per 128-element chunk of the block the tree over (double)gs^2, then the tree over chunk sums.
std::vector<double> BlockSumsOfSquaresRef(const float* gs, int64_t rows, int64_t cols);

// min(1, max_norm / (sqrt(total) + 1e-6)) in double, rounded once to FP32.
float ClipFactorRef(double total, double max_norm);

}  // namespace paramd::reference
