# ctest script: install this build of KPool into a scratch prefix, check the
# install layout, then configure, build and run example/consumer against the
# installed package, as a user would.
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, Kokkos_DIR, CXX_COMPILER,
# BUILD_TYPE, EXAMPLES (whether the build has the installed programs),
# NATIVE (whether KPool was built with KPool_ENABLE_NATIVE_ARCH: the user's
# program must then compile with -march=native unless Kokkos names a host
# arch, docs/building.md, "Compiler flags for the host code").
file(REMOVE_RECURSE "${WORK_DIR}")
function(run out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/install")
run(out ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${prefix}")

# Only KPool/ at the include root: headers, the configured header and the
# internals all beneath it.
file(GLOB top RELATIVE "${prefix}/include" "${prefix}/include/*")
if(NOT top STREQUAL "KPool")
  message(FATAL_ERROR "the include root of the install holds '${top}', not just 'KPool'")
endif()
foreach(header KPool.hpp KPool_Config.hpp pool/KPool_Step.hpp common/detail/KPool_KokkosExt.hpp)
  if(NOT EXISTS "${prefix}/include/KPool/${header}")
    message(FATAL_ERROR "include/KPool/${header} is not installed")
  endif()
endforeach()

# The programs beside each other in bin/; the main example runs from there.
if(EXAMPLES)
  set(programs kpool_replay kpool_serving_example)
  foreach(program ${programs})
    if(NOT EXISTS "${prefix}/bin/${program}${CMAKE_EXECUTABLE_SUFFIX}")
      message(FATAL_ERROR "bin/${program} is not installed")
    endif()
  endforeach()
  run(out "${prefix}/bin/kpool_serving_example")
  if(NOT out MATCHES "\nOK\n$")
    message(FATAL_ERROR "the installed kpool_serving_example did not end with OK:\n${out}")
  endif()
endif()

# A user's project, copied as is: find_package(KPool) and nothing else.
run(out ${CMAKE_COMMAND} -S "${SOURCE_DIR}/example/consumer" -B "${WORK_DIR}/build"
    -DCMAKE_PREFIX_PATH=${prefix} -DKokkos_DIR=${Kokkos_DIR}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
if(NATIVE AND NOT out MATCHES "KPool: host code built with (Kokkos' host arch|[^\n]*-march=native)")
  message(FATAL_ERROR "KPool was built for this machine's SIMD, but the user's configure did not say it passes -march=native:\n${out}")
endif()
set(native_configure "${out}")
run(out ${CMAKE_COMMAND} --build "${WORK_DIR}/build" --verbose)
if(native_configure MATCHES "KPool: host code built with [^\n]*-march=native" AND NOT out MATCHES "-march=native")
  message(FATAL_ERROR "the user's program was not compiled with -march=native:\n${out}")
endif()
run(out "${WORK_DIR}/build/kpool_consumer")
message("${out}")
if(NOT out MATCHES "\nOK\n$")
  message(FATAL_ERROR "kpool_consumer did not end with OK")
endif()
