# Drives the trace tests (cmake -P); see ../TraceTests.cmake.
#   -DGEN= -DREPLAY= -DCHECK=   the three programs
#   -DWORK=                     a scratch folder of its own
#   -DMODE=check                generate (GEN_ARGS; or take -DTRACE=), replay
#                               --fused and --unfused, check both against the
#                               reference
#   -DMODE=identical            generate, replay --fused, --unfused and from
#                               stdin: the three outputs must be the same bytes
#   -DMODE=tamper               the checker must reject altered output
#   -DMODE=bad -DTRACE=         exit status 2, 'trace:LINE:' on stderr with
#                               LINE from the file's '# expect trace:LINE:',
#                               empty stdout
#   -DMODE=cli                  --help, an unknown option, a missing file
cmake_minimum_required(VERSION 3.16)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run_replay out_var rc_var err_var)
  execute_process(COMMAND "${REPLAY}" ${ARGN}
    OUTPUT_FILE "${WORK}/${out_var}.out" ERROR_VARIABLE err
    RESULT_VARIABLE rc)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
endfunction()

# The trace: TRACE when given, else what the generator makes of GEN_ARGS.
function(generate)
  if(DEFINED TRACE)
    configure_file("${TRACE}" "${WORK}/trace.txt" COPYONLY)
    return()
  endif()
  separate_arguments(args UNIX_COMMAND "${GEN_ARGS}")
  execute_process(COMMAND "${GEN}" ${args}
    OUTPUT_FILE "${WORK}/trace.txt" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kpool_tracegen ${GEN_ARGS} failed (${rc}): ${err}")
  endif()
endfunction()

function(replay_ok name)
  run_replay(${name} rc err ${ARGN})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kpool_replay ${ARGN} failed (${rc}):\n${err}")
  endif()
endfunction()

function(check_ok name)
  execute_process(COMMAND "${CHECK}" "${WORK}/trace.txt" "${WORK}/${name}.out"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kpool_trace_check (${name}) failed (${rc}):\n${out}${err}")
  endif()
  message(STATUS "${name}: ${out}")
endfunction()

function(check_rejects name why)
  execute_process(COMMAND "${CHECK}" "${WORK}/trace.txt" "${WORK}/${name}.out"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "kpool_trace_check accepted ${why} (${rc}):\n${out}${err}")
  endif()
  message(STATUS "${why}: ${out}")
endfunction()

if(MODE STREQUAL "check")
  generate()
  replay_ok(fused --fused "${WORK}/trace.txt")
  replay_ok(unfused --unfused "${WORK}/trace.txt")
  check_ok(fused)
  check_ok(unfused)

elseif(MODE STREQUAL "identical")
  generate()
  replay_ok(fused --fused "${WORK}/trace.txt")
  replay_ok(unfused --unfused "${WORK}/trace.txt")
  execute_process(COMMAND "${REPLAY}" -
    INPUT_FILE "${WORK}/trace.txt" OUTPUT_FILE "${WORK}/stdin.out"
    ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kpool_replay - < trace failed (${rc}):\n${err}")
  endif()
  file(SHA256 "${WORK}/fused.out" h_fused)
  file(SHA256 "${WORK}/unfused.out" h_unfused)
  file(SHA256 "${WORK}/stdin.out" h_stdin)
  if(NOT h_fused STREQUAL h_unfused)
    message(FATAL_ERROR "--fused and --unfused outputs differ: "
      "${WORK}/fused.out ${WORK}/unfused.out")
  endif()
  if(NOT h_fused STREQUAL h_stdin)
    message(FATAL_ERROR "the trace read from stdin gave other output")
  endif()
  file(STRINGS "${WORK}/fused.out" last REGEX "^pools ")
  message(STATUS "identical: ${last}")

elseif(MODE STREQUAL "tamper")
  generate()
  replay_ok(good "${WORK}/trace.txt")
  check_ok(good)
  file(STRINGS "${WORK}/good.out" lines)
  list(LENGTH lines n)
  math(EXPR pools "${n} - 1")
  if(pools LESS 2)
    message(FATAL_ERROR "the tamper trace made too few pools")
  endif()
  list(GET lines 0 first)
  list(GET lines 1 second)
  math(EXPR after "${pools} - 1")
  list(SUBLIST lines 1 ${after} others)  # the pool lines after the first
  string(JOIN "\n" others ${others})
  # Pooled values are convex combinations of keys in [-2, 2]: 3 is wrong.
  string(REGEX REPLACE "^(pool [0-9]+ [0-9]+ )[^ ]+" "\\13" changed "${first}")
  file(WRITE "${WORK}/changed.out" "${changed}\n${others}\npools ${pools}\n")
  check_rejects(changed "a changed value")
  math(EXPR fewer "${pools} - 1")
  file(WRITE "${WORK}/lost.out" "${others}\npools ${fewer}\n")
  check_rejects(lost "a lost pool")
  math(EXPR more "${pools} + 1")
  file(WRITE "${WORK}/twice.out" "${first}\n${second}\n${others}\npools ${more}\n")
  check_rejects(twice "a pool printed twice")

elseif(MODE STREQUAL "bad")
  file(STRINGS "${TRACE}" head LIMIT_COUNT 1)
  if(NOT head MATCHES "^# expect (trace:[0-9]+:)")
    message(FATAL_ERROR "${TRACE}: the first line must be '# expect trace:LINE:'")
  endif()
  set(want "${CMAKE_MATCH_1}")
  run_replay(bad rc err "${TRACE}")
  file(READ "${WORK}/bad.out" out)
  if(NOT rc EQUAL 2)
    message(FATAL_ERROR "exit status ${rc}, expected 2; stderr:\n${err}")
  endif()
  if(NOT out STREQUAL "")
    message(FATAL_ERROR "stdout is not empty:\n${out}")
  endif()
  string(FIND "${err}" "${want} " at)
  if(NOT at EQUAL 0)
    message(FATAL_ERROR "stderr should start with '${want} ', got:\n${err}")
  endif()
  message(STATUS "rejected: ${err}")

elseif(MODE STREQUAL "cli")
  run_replay(help rc err --help)
  file(READ "${WORK}/help.out" out)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "^usage: kpool_replay")
    message(FATAL_ERROR "--help: status ${rc}, stdout:\n${out}")
  endif()
  run_replay(option rc err --no-such-option)
  file(READ "${WORK}/option.out" out)
  if(NOT rc EQUAL 2 OR NOT out STREQUAL "" OR NOT err MATCHES "usage: kpool_replay")
    message(FATAL_ERROR "unknown option: status ${rc}, stdout '${out}', stderr:\n${err}")
  endif()
  run_replay(missing rc err "${WORK}/no-such-trace")
  file(READ "${WORK}/missing.out" out)
  if(NOT rc EQUAL 2 OR NOT out STREQUAL "" OR err STREQUAL "")
    message(FATAL_ERROR "missing file: status ${rc}, stdout '${out}', stderr:\n${err}")
  endif()

else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
