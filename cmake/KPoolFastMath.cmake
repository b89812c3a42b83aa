# KPool refuses fast-math builds (docs/api.md, "Building"): the pool
# cache's byte-exact contract and the selection's NaN rules need IEEE
# arithmetic. GCC's and Clang's -ffast-math and -ffinite-math-only are
# refused by the headers themselves (#error on __FAST_MATH__ and
# __FINITE_MATH_ONLY__); nvcc's --use_fast_math defines no macro the
# headers could test (CUDA 13.0), so the compile flags are checked here,
# when KPool is configured and when a project finds it.
#
# kpool_refuse_fast_math(FLAGS...): a fatal error if any of FLAGS holds
# nvcc's fast-math option (--use_fast_math, -use_fast_math,
# --use-fast-math). Also runs as a script: cmake "-DFLAGS=..." -P this file.

function(kpool_refuse_fast_math)
  foreach(flags IN LISTS ARGN)
    if(flags MATCHES "(^|[ ;=])(-?-use[_-]fast[_-]math)")
      message(FATAL_ERROR
        "KPool refuses fast-math builds: '${CMAKE_MATCH_2}' in the compile "
        "flags ('${flags}') lets nvcc flush subnormals and approximate "
        "division and square roots, which breaks the pool cache's "
        "byte-exact contract. Compile the code that includes KPool without "
        "it (docs/api.md, \"Building\").")
    endif()
  endforeach()
endfunction()

# The flags every C++ and CUDA translation unit of this project gets.
macro(kpool_refuse_fast_math_in_project)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" _kpool_config)
  kpool_refuse_fast_math("${CMAKE_CXX_FLAGS}" "${CMAKE_CXX_FLAGS_${_kpool_config}}"
                         "${CMAKE_CUDA_FLAGS}" "${CMAKE_CUDA_FLAGS_${_kpool_config}}")
  unset(_kpool_config)
endmacro()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  kpool_refuse_fast_math("${FLAGS}")
  message(STATUS "KPool: no fast-math option in '${FLAGS}'")
endif()
