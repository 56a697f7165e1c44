// PARAMD_HD marks the scalar element functions (formats.h, cast.h, philox.h, cpu/state_codec.h)
// as callable from CUDA device code too, so the GPU kernels run the very definitions the CPU
// paths and the tests use instead of a second copy. Empty for the C++ compiler. Device code that
// calls them is compiled with --expt-relaxed-constexpr (the std:: helpers they use, such as
// std::bit_cast and std::min, are constexpr host functions).
#pragma once

#if defined(__CUDACC__)
#define PARAMD_HD __host__ __device__
#else
#define PARAMD_HD
#endif
