# Flags every target that does paramd arithmetic links (DESIGN.md §3): IEEE FP32 operation by
# operation, no contraction into FMAs the source did not write, no fast-math.
add_library(paramd_numerics INTERFACE)
target_compile_options(paramd_numerics INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off -fno-fast-math>
  $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -ftz=false -prec-div=true -prec-sqrt=true>)

# Warnings for the project's own targets.
add_library(paramd_warnings INTERFACE)
target_compile_options(paramd_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)

if(PARAMD_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
