# A translation unit that must not compile, and what its compiler errors
# must look like: builds TARGET in BUILD_DIR, expects the build to fail,
# the first error line to contain EXPECT, and at most MAX_ERRORS error lines
# in all (a static_assert that stops the cascade gives one).
#
# cmake -DBUILD_DIR=... -DTARGET=... -DEXPECT=... -DMAX_ERRORS=... -P KPoolCompileFail.cmake

execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}\n${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, and must not:\n${text}")
endif()
string(REPLACE "\n" ";" lines "${text}")
set(errors)
foreach(line IN LISTS lines)
  if(line MATCHES "error( [A-Za-z]*[0-9]+)?:" AND NOT line MATCHES "^(gmake|make|ninja)")
    list(APPEND errors "${line}")
  endif()
endforeach()
list(LENGTH errors n)
if(n EQUAL 0)
  message(FATAL_ERROR "${TARGET} failed without a compiler error:\n${text}")
endif()
list(GET errors 0 first)
string(FIND "${first}" "${EXPECT}" at)
if(at LESS 0)
  message(FATAL_ERROR "the first error does not mention '${EXPECT}':\n  ${first}\n\n${text}")
endif()
if(n GREATER MAX_ERRORS)
  message(FATAL_ERROR "${n} error lines (at most ${MAX_ERRORS} expected):\n${text}")
endif()
message(STATUS "${TARGET}: ${n} error line(s), the first: ${first}")
