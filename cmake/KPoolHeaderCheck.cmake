# The headers' own rules (docs/building.md, "Repository layout"), run by the
# ctest header_rules (label unit):
#   - each wing's detail/ is its own: a header under src/<wing>/ includes no
#     <other>/detail/ header but common/detail/ (a top-level header, only
#     common/detail/); what several wings share lives in common/detail/ or
#     in a public header of its wing;
#   - each header's include guard is its path: src/pool/detail/KPool_StepCall.hpp
#     guards with KPOOL_POOL_DETAIL_STEP_CALL_HPP (the folders, then the
#     name without KPool_, CamelCase split at each capital, upper case), and
#     src/KPool.hpp with KPOOL_HPP.
#
#   cmake -DSRC=<repo>/src -P KPoolHeaderCheck.cmake            # check
#   cmake -DSRC=<repo>/src -DPLANT=ON -DWORK=<dir> -P ...        # the check of the check
#
# With PLANT, the tree is copied to WORK twice, one planted fault in each (a
# cross-wing detail include, a wrong guard), and the check must refuse both.

function(kpool_expected_guard rel out)
  get_filename_component(name "${rel}" NAME_WE)
  get_filename_component(dir "${rel}" DIRECTORY)
  if(name STREQUAL "KPool")
    set(${out} "KPOOL_HPP" PARENT_SCOPE)
    return()
  endif()
  string(REGEX REPLACE "^KPool_" "" name "${name}")
  string(REGEX REPLACE "([a-z0-9])([A-Z])" "\\1_\\2" name "${name}")
  set(parts "")
  if(dir)
    string(REPLACE "/" "_" parts "${dir}_")
  endif()
  string(TOUPPER "KPOOL_${parts}${name}_HPP" guard)
  set(${out} "${guard}" PARENT_SCOPE)
endfunction()

# The problems of the tree under `src`, one a line, into `out`.
function(kpool_header_problems src out)
  set(problems "")
  file(GLOB_RECURSE headers RELATIVE "${src}" "${src}/*.hpp")
  foreach(rel IN LISTS headers)
    file(READ "${src}/${rel}" text)
    # The guard: the first #ifndef and the #define right after it.
    kpool_expected_guard("${rel}" want)
    string(REGEX MATCH "#ifndef ([A-Za-z0-9_]+)\n#define ([A-Za-z0-9_]+)" m "${text}")
    if(NOT m OR NOT CMAKE_MATCH_1 STREQUAL want OR NOT CMAKE_MATCH_2 STREQUAL want)
      list(APPEND problems "src/${rel}: include guard '${CMAKE_MATCH_1}', not ${want}")
    endif()
    # The wing: the first folder (none for a top-level header).
    string(FIND "${rel}" "/" slash)
    if(slash EQUAL -1)
      set(wing "")
    else()
      string(SUBSTRING "${rel}" 0 ${slash} wing)
    endif()
    string(REGEX MATCHALL "#include <([a-z_]+)/detail/[^>]+>" includes "${text}")
    foreach(inc IN LISTS includes)
      string(REGEX REPLACE "#include <([a-z_]+)/detail/.*" "\\1" other "${inc}")
      if(NOT other STREQUAL wing AND NOT other STREQUAL "common")
        list(APPEND problems "src/${rel}: ${inc} reaches into the ${other} wing's detail/")
      endif()
    endforeach()
  endforeach()
  set(${out} "${problems}" PARENT_SCOPE)
endfunction()

if(NOT SRC)
  message(FATAL_ERROR "KPoolHeaderCheck.cmake: give -DSRC=<repo>/src")
endif()

if(NOT PLANT)
  kpool_header_problems("${SRC}" problems)
  if(problems)
    list(LENGTH problems n)
    string(REPLACE ";" "\n  " listed "${problems}")
    message(FATAL_ERROR "${n} header rule(s) broken:\n  ${listed}")
  endif()
  message(STATUS "header rules: every include guard is its path, no wing reaches into another's detail/")
  return()
endif()

# The check of the check: each planted fault must be found.
foreach(fault IN ITEMS include guard)
  set(tree "${WORK}/planted_${fault}")
  file(REMOVE_RECURSE "${tree}")
  file(COPY "${SRC}/" DESTINATION "${tree}")
  set(victim "${tree}/pool/KPool_Ring.hpp")
  file(READ "${victim}" text)
  if(fault STREQUAL "include")
    string(REPLACE "#include <cstdint>" "#include <score/detail/KPool_ScoreLaunch.hpp>\n#include <cstdint>" text "${text}")
  else()
    string(REPLACE "KPOOL_POOL_RING_HPP" "KPOOL_RING_HPP" text "${text}")
  endif()
  file(WRITE "${victim}" "${text}")
  kpool_header_problems("${tree}" problems)
  if(NOT problems)
    message(FATAL_ERROR "the header check missed a planted ${fault} fault in pool/KPool_Ring.hpp")
  endif()
  message(STATUS "planted ${fault} fault found: ${problems}")
endforeach()
