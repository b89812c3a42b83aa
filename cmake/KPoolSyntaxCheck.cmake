# cmake -P script: a syntax-only pass of a configured build. It reads the
# build's compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS=ON), runs every
# compile command with -fsyntax-only instead of writing an object (with hipcc
# or clang that covers the device side too: the host-only calls from device
# functions are found there), and fails on any error or on any warning
# located in SOURCE_DIR/src. .ci/run uses it for the HIP check.
# Variables: BUILD_DIR, SOURCE_DIR; FILTER (optional) a regular expression
# the source paths to check must match. The sources that are meant to fail
# to compile (the compile-fail and fast-math refusal tests, built only by
# their tests) are skipped.
cmake_minimum_required(VERSION 3.19)  # string(JSON)
file(READ "${BUILD_DIR}/compile_commands.json" db)
string(JSON n LENGTH "${db}")
if(n EQUAL 0)
  message(FATAL_ERROR "${BUILD_DIR}/compile_commands.json lists no compile commands")
endif()
math(EXPR last "${n} - 1")
string(REGEX REPLACE "([][+.*()^$?|\\])" "\\\\\\1" source_re "${SOURCE_DIR}")
set(checked 0)
set(failed "")
set(warned "")
foreach(i RANGE ${last})
  string(JSON dir GET "${db}" ${i} directory)
  string(JSON src GET "${db}" ${i} file)
  if(DEFINED FILTER AND NOT src MATCHES "${FILTER}")
    continue()
  endif()
  if(src MATCHES "/unit_tests/(compile_fail/|fast_math_refused\\.cpp$)")
    continue()
  endif()
  string(JSON cmd GET "${db}" ${i} command)
  separate_arguments(args UNIX_COMMAND "${cmd}")
  # Drop the object file: "-o <file>".
  list(FIND args "-o" o)
  if(o GREATER_EQUAL 0)
    math(EXPR file_at "${o} + 1")
    list(REMOVE_AT args ${o} ${file_at})
  endif()
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND ${args} -fsyntax-only WORKING_DIRECTORY "${dir}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(RELATIVE_PATH name "${SOURCE_DIR}" "${src}")
  if(NOT rc EQUAL 0)
    list(APPEND failed "${name}")
    message("---- ${name}: failed\n${out}${err}")
  elseif("${out}${err}" MATCHES "${source_re}/src/[^:\n]*:[0-9]+:[0-9]+: warning")
    list(APPEND warned "${name}")
    message("---- ${name}: warnings from src/\n${out}${err}")
  else()
    message(STATUS "${name}: ok")
  endif()
endforeach()
if(failed OR warned)
  message(FATAL_ERROR "syntax-only pass: ${checked} sources; failed: ${failed}; warnings from src/: ${warned}")
endif()
message(STATUS "syntax-only pass: ${checked} sources, no errors, no warnings from src/")
