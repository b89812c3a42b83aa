# ctest script: install this build of KPool into a scratch prefix, then
# configure, build and run unit_tests/consumer against it, as a user would.
# Variables: BUILD_DIR, SOURCE_DIR, WORK_DIR, Kokkos_DIR, CXX_COMPILER, BUILD_TYPE.
file(REMOVE_RECURSE "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/install")
run(${CMAKE_COMMAND} -S "${SOURCE_DIR}/unit_tests/consumer" -B "${WORK_DIR}/build"
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/install -DKokkos_DIR=${Kokkos_DIR}
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
