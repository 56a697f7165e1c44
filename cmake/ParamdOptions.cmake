# Flags every target that does paramd arithmetic links (DESIGN.md §3): IEEE FP32 operation by
# operation, no contraction into FMAs the source did not write, no fast-math.
add_library(paramd_numerics INTERFACE)
target_compile_options(paramd_numerics INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off -fno-fast-math>
  $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -ftz=false -prec-div=true -prec-sqrt=true>)

# Warnings for the project's own targets. Under clang (scripts/fuzz.sh's build), the locks'
# annotations (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED on absl::Mutex) are checked, and a
# breach stops the build.
add_library(paramd_warnings INTERFACE)
target_compile_options(paramd_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wthread-safety -Werror=thread-safety>)

# Debug information kept out of the executables' bulk: in .dwo files beside the objects
# (-gsplit-dwarf), and what the link still carries (line tables, GCC's name indexes) compressed.
# The default build's ~90 test and benchmark executables each link the server's static libraries;
# with the DWARF inside them each was about 75 MB (2.6 GB in all), now about 14. gdb and addr2line
# read both where the build left them.
option(PARAMD_SPLIT_DWARF "Split and compress C++ debug information (RelWithDebInfo, Debug)" ON)
if(PARAMD_SPLIT_DWARF AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  add_compile_options("$<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:RelWithDebInfo,Debug>>:-gsplit-dwarf>")
  add_link_options("$<$<CONFIG:RelWithDebInfo,Debug>:LINKER:--compress-debug-sections=zlib>")
endif()

if(PARAMD_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# libFuzzer targets (tests/fuzz, scripts/fuzz.sh): clang only. Every target of such a build carries
# the fuzzer's coverage instrumentation and ASan/UBSan; only the fuzz targets link libFuzzer's main.
option(PARAMD_FUZZ "Build the libFuzzer targets of tests/fuzz (clang; ASan and UBSan)" OFF)
if(PARAMD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PARAMD_FUZZ=ON needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with -DCMAKE_CXX_COMPILER=clang++-14 (scripts/fuzz.sh does)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
