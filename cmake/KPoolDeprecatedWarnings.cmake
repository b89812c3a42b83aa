# The retired forms warn, naming their replacements (docs/api.md,
# "Migrating from the positional forms"): builds TARGET in BUILD_DIR (the
# one test of the retired forms, compiled with its warnings shown), from
# scratch, and checks that
#   - it compiles;
#   - every [[deprecated("...")]] message of the HEADERS appears in a
#     warning: each retired form is called, and its warning says what to
#     write instead;
#   - every deprecation warning names a replacement ("use KPool::" or
#     "use Layer::").
#
# cmake -DBUILD_DIR=... -DTARGET=... -DOBJECT_DIR=... -DHEADERS="a;b" -P KPoolDeprecatedWarnings.cmake

file(GLOB_RECURSE objects "${OBJECT_DIR}/*.o" "${OBJECT_DIR}/*.obj")
if(objects)
  file(REMOVE ${objects})
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}\n${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} does not compile:\n${text}")
endif()

# The messages, each a run of adjacent string literals.
set(messages)
foreach(header IN LISTS HEADERS)
  file(READ "${header}" source)
  string(REGEX MATCHALL "\\[\\[deprecated\\(([ \t\r\n]*\"[^\"]*\")+[ \t\r\n]*\\)\\]\\]" found "${source}")
  foreach(attribute IN LISTS found)
    string(REGEX MATCHALL "\"[^\"]*\"" pieces "${attribute}")
    set(message "")
    foreach(piece IN LISTS pieces)
      string(REGEX REPLACE "^\"(.*)\"$" "\\1" piece "${piece}")
      string(APPEND message "${piece}")
    endforeach()
    list(APPEND messages "${message}")
  endforeach()
endforeach()
list(LENGTH messages n_messages)
if(n_messages EQUAL 0)
  message(FATAL_ERROR "no [[deprecated]] message found in ${HEADERS}")
endif()

# The warnings: one line each from GCC and Clang.
string(REPLACE ";" "\\;" escaped "${text}")
string(REPLACE "\n" ";" lines "${escaped}")
set(warnings)
foreach(line IN LISTS lines)
  if(line MATCHES "warning:.*deprecated")
    list(APPEND warnings "${line}")
    if(NOT line MATCHES "use (KPool|Layer)::")
      message(FATAL_ERROR "a deprecation warning names no replacement:\n  ${line}")
    endif()
  endif()
endforeach()

set(missing)
foreach(message IN LISTS messages)
  string(FIND "${text}" "${message}" at)
  if(at LESS 0)
    list(APPEND missing "${message}")
  endif()
endforeach()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "no warning carries these messages (a retired form not called, or "
                      "not warning):\n  ${missing}\n\n${text}")
endif()
list(LENGTH warnings n_warnings)
message(STATUS "${n_messages} retired forms, each warning with its replacement "
               "(${n_warnings} deprecation warnings)")
