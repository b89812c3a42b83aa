# ctest script: how KPool's configuration reacts to a Kokkos with a device
# backend and no Kokkos Kernels. It writes stand-in Kokkos packages (a
# package config that names its backends the way Kokkos' own does, with
# Kokkos_DEVICES and Kokkos_ENABLE_<backend>, and an empty Kokkos::kokkos
# target), then configures this source tree against each, with no Kokkos
# Kernels to be found:
#   - a CUDA or HIP Kokkos stops the configuration, naming KokkosKernels_ROOT
#     and -DKPool_ENABLE_KOKKOSKERNELS=OFF;
#   - the same with -DKPool_ENABLE_KOKKOSKERNELS=OFF configures, selection off;
#   - a host Kokkos (OpenMP) configures, selection off, as before.
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

function(expect_stop name)
  configure(${name} rc out)
  if(rc EQUAL 0)
    message(FATAL_ERROR "a ${name} Kokkos without Kokkos Kernels configured:\n${out}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " flat "${out}")
  foreach(needle "no Kokkos Kernels was found" "-DKokkosKernels_ROOT="
                 "-DKPool_ENABLE_KOKKOSKERNELS=OFF")
    string(FIND "${flat}" "${needle}" at)
    if(at LESS 0)
      message(FATAL_ERROR "a ${name} Kokkos stopped without saying '${needle}':\n${out}")
    endif()
  endforeach()
endfunction()

function(expect_selection_off name)
  configure(${name} rc out ${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "a ${name} Kokkos ${ARGN} did not configure:\n${out}")
  endif()
  string(FIND "${out}" "the selection stage (KPool::score_select, KPool::select_tokens) is off" at)
  if(at LESS 0)
    message(FATAL_ERROR "a ${name} Kokkos ${ARGN} configured without saying the selection is off:\n${out}")
  endif()
endfunction()

fake_kokkos(cuda "SERIAL;CUDA")
fake_kokkos(hip "SERIAL;HIP")
fake_kokkos(openmp "OPENMP;SERIAL")

expect_stop(cuda)
expect_stop(hip)
expect_selection_off(cuda -DKPool_ENABLE_KOKKOSKERNELS=OFF)
expect_selection_off(openmp)
message(STATUS "device Kokkos without Kokkos Kernels: stops; with the selection off, or on a host: configures")
