# ctest script: how KPool's configuration reacts to a Kokkos with a device
# backend and no Kokkos Kernels. It writes stand-in Kokkos packages (a
# package config that names its backends the way Kokkos' own does, with
# Kokkos_DEVICES and Kokkos_ENABLE_<backend>, and an empty Kokkos::kokkos
# target), then configures this source tree against each, with no Kokkos
# Kernels to be found. The selection stage is KPool's own code, so every
# one configures (a CUDA, a HIP and a host Kokkos, and CUDA with
# -DKPool_ENABLE_KOKKOSKERNELS=OFF), saying that the two engines that need
# Kokkos Kernels (blas, team_gemm) are off; none says the selection is.
# Variables: SOURCE_DIR, WORK_DIR, CXX_COMPILER.
file(REMOVE_RECURSE "${WORK_DIR}")

function(fake_kokkos name devices)
  set(dir "${WORK_DIR}/${name}/lib/cmake/Kokkos")
  file(WRITE "${dir}/KokkosConfigVersion.cmake"
    "set(PACKAGE_VERSION 4.6.0)\n"
    "set(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
  file(WRITE "${dir}/KokkosConfig.cmake"
    "set(Kokkos_DEVICES ${devices})\n"
    "foreach(dev \${Kokkos_DEVICES})\n"
    "  set(Kokkos_ENABLE_\${dev} ON)\n"
    "endforeach()\n"
    "if(NOT TARGET Kokkos::kokkos)\n"
    "  add_library(Kokkos::kokkos INTERFACE IMPORTED)\n"
    "endif()\n")
endfunction()

# Configures the source tree against the stand-in `name`; rc and output.
function(configure name rc_var out_var)
  string(MD5 args "${ARGN}")
  string(SUBSTRING "${args}" 0 8 args)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=KokkosKernels_ROOT --unset=Kokkos_ROOT
            --unset=CMAKE_PREFIX_PATH
            ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/build-${name}-${args}"
            -DKokkos_DIR=${WORK_DIR}/${name}/lib/cmake/Kokkos
            -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
            -DKPool_ENABLE_TESTS=OFF -DKPool_ENABLE_PERF_TESTS=OFF
            -DKPool_ENABLE_EXAMPLES=OFF ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect_engines_off name)
  configure(${name} rc out ${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "a ${name} Kokkos ${ARGN} without Kokkos Kernels did not configure:\n${out}")
  endif()
  string(FIND "${out}" "the blas and team_gemm engines are off" at)
  if(at LESS 0)
    message(FATAL_ERROR "a ${name} Kokkos ${ARGN} configured without saying the blas and team_gemm engines are off:\n${out}")
  endif()
  string(FIND "${out}" "selection stage" at)
  if(NOT at LESS 0)
    message(FATAL_ERROR "a ${name} Kokkos ${ARGN} configured saying something of the selection stage, which needs no Kokkos Kernels:\n${out}")
  endif()
endfunction()

fake_kokkos(cuda "SERIAL;CUDA")
fake_kokkos(hip "SERIAL;HIP")
fake_kokkos(openmp "OPENMP;SERIAL")

expect_engines_off(cuda)
expect_engines_off(hip)
expect_engines_off(cuda -DKPool_ENABLE_KOKKOSKERNELS=OFF)
expect_engines_off(openmp)
message(STATUS "a device or host Kokkos without Kokkos Kernels configures, with the blas and team_gemm engines off")
