# The C++ blocks of the documentation, compiled and run as unit tests, so an
# example cannot drift from the library (docs/README.md, "Code in these
# pages").
#
# A block is a fence that opens with exactly ```cpp at the start of a line.
# It is either
#   - a whole program (it defines `int main`): its own executable; or
#   - a fragment whose first line reads `// fragment: NAME`: pasted into the
#     wrapper WRAPPER_DIR/NAME.in at its `@SNIPPET@` line. A page's
#     fragments become one program, each fragment in a function of its own;
#     their #include lines move to the top of that program.
# Anything else stops the configuration, naming the page and line. #line
# directives make compiler errors point at the Markdown line. Generated
# programs undefine NDEBUG, so a fragment's assert()s are checked in every
# build type.
#
# kpool_add_snippet_tests(PAGES <md files> WRAPPER_DIR <dir> SUPPORT_DIR <dir>)
# adds the executables, a target `kpool_snippets` building them all, a test
# `snippets_build` that builds that target (so a ctest run compiles the
# current pages), and one test `snippets.<page>` per executable.

function(_kpool_snippet_fail page line message)
  file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${page}")
  message(FATAL_ERROR "${rel}:${line}: ${message} (see docs/README.md, \"Code in these pages\")")
endfunction()

function(_kpool_count_newlines text out_var)
  string(REGEX MATCHALL "\n" nl "${text}")
  list(LENGTH nl n)
  set(${out_var} ${n} PARENT_SCOPE)
endfunction()

# Writes `content` to `path` only when it differs, so a reconfigure does not
# rebuild unchanged snippets.
function(_kpool_write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}" "${content}")
endfunction()

function(kpool_add_snippet_tests)
  cmake_parse_arguments(ARG "" "WRAPPER_DIR;SUPPORT_DIR" "PAGES" ${ARGN})
  set(out_dir "${CMAKE_CURRENT_BINARY_DIR}/snippets")
  file(MAKE_DIRECTORY "${out_dir}")
  add_custom_target(kpool_snippets ALL)
  set(executables)

  foreach(page IN LISTS ARG_PAGES)
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${page}")
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${page}")
    string(REGEX REPLACE "\\.md$" "" stem "${rel}")
    string(REGEX REPLACE "[^A-Za-z0-9]" "_" stem "${stem}")
    file(READ "${page}" text)

    # Every fence that claims C++ must be one this function extracts.
    string(REGEX MATCHALL "```[ \t]*([cC]\\+\\+|[cC][pP][pP]|[cC][xX][xX])" claims "${text}")
    list(LENGTH claims n_claims)

    set(rest "\n${text}")
    set(line_base 1)  # the line that starts after rest's leading newline
    set(n_blocks 0)
    set(include_list)
    set(functions "")
    set(table "")
    while(TRUE)
      string(FIND "${rest}" "\n```cpp\n" open)
      if(open EQUAL -1)
        break()
      endif()
      math(EXPR n_blocks "${n_blocks} + 1")
      math(EXPR upto "${open} + 1")
      string(SUBSTRING "${rest}" 0 ${upto} before)
      _kpool_count_newlines("${before}" nl_before)
      math(EXPR fence_line "${line_base} + ${nl_before} - 1")
      math(EXPR body_line "${fence_line} + 1")
      math(EXPR body_at "${open} + 7")
      string(SUBSTRING "${rest}" ${body_at} -1 after)  # starts with the fence's newline
      string(FIND "${after}" "\n```" close)
      if(close EQUAL -1)
        _kpool_snippet_fail("${page}" ${fence_line} "this cpp block is never closed")
      endif()
      if(close EQUAL 0)
        _kpool_snippet_fail("${page}" ${fence_line} "this cpp block is empty")
      endif()
      math(EXPR body_len "${close} - 1")
      string(SUBSTRING "${after}" 1 ${body_len} body)
      _kpool_count_newlines("${body}" nl_body)
      math(EXPR close_line "${body_line} + ${nl_body} + 1")
      # Continue after the closing fence's line.
      math(EXPR past_close "${close} + 4")
      string(SUBSTRING "${after}" ${past_close} -1 rest)
      string(FIND "${rest}" "\n" eol)
      if(eol EQUAL -1)
        set(rest "")
      else()
        string(SUBSTRING "${rest}" ${eol} -1 rest)
      endif()
      math(EXPR line_base "${close_line} + 1")

      file(RELATIVE_PATH rel_page "${PROJECT_SOURCE_DIR}" "${page}")
      if(body MATCHES "^// fragment: ([A-Za-z0-9_]+)")
        set(wrapper_name "${CMAKE_MATCH_1}")
        set(wrapper "${ARG_WRAPPER_DIR}/${wrapper_name}.in")
        if(NOT EXISTS "${wrapper}")
          _kpool_snippet_fail("${page}" ${body_line}
            "no wrapper '${wrapper_name}': expected ${wrapper}")
        endif()
        set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${wrapper}")
        file(READ "${wrapper}" wrap)
        string(FIND "${wrap}" "@SNIPPET@" mark)
        if(mark EQUAL -1)
          message(FATAL_ERROR "${wrapper} has no @SNIPPET@ line")
        endif()
        string(SUBSTRING "${wrap}" 0 ${mark} prologue)
        string(REGEX REPLACE "[ \t]+$" "" prologue "${prologue}")
        string(SUBSTRING "${wrap}" ${mark} -1 epilogue)
        string(FIND "${epilogue}" "\n" eol)
        if(eol EQUAL -1)
          set(epilogue "")
        else()
          string(SUBSTRING "${epilogue}" ${eol} -1 epilogue)
        endif()
        _kpool_count_newlines("${prologue}" nl_pro)
        math(EXPR epilogue_line "${nl_pro} + 1")

        # Hoist the fragment's includes, keeping its line numbers.
        string(REGEX MATCHALL "(^|\n)[ \t]*#[ \t]*include[^\n]*" incs "${body}")
        foreach(inc IN LISTS incs)
          string(STRIP "${inc}" inc)
          list(APPEND include_list "${inc}")
        endforeach()
        string(REGEX REPLACE "(^|\n)[ \t]*#[ \t]*include[^\n]*" "\\1" body "${body}")

        set(fn "kpool_snippet_${body_line}")
        string(APPEND functions
          "namespace ${fn} {\n"
          "void run() {\n"
          "#line 1 \"${wrapper}\"\n"
          "${prologue}"
          "#line ${body_line} \"${page}\"\n"
          "${body}\n"
          "#line ${epilogue_line} \"${wrapper}\"\n"
          "${epilogue}"
          "\n}\n"
          "}  // namespace ${fn}\n\n")
        string(APPEND table "      {\"${rel_page}:${body_line}\", &${fn}::run},\n")
      elseif(body MATCHES "int[ \t\n]+main[ \t]*\\(")
        set(name "snippet_${stem}_L${body_line}")
        string(CONCAT src
          "// Generated from ${rel_page}:${body_line} by cmake/KPoolSnippets.cmake.\n"
          "#line ${body_line} \"${page}\"\n${body}\n")
        _kpool_write_if_changed("${out_dir}/${name}.cpp" "${src}")
        add_executable(${name} "${out_dir}/${name}.cpp")
        list(APPEND executables ${name})
      else()
        _kpool_snippet_fail("${page}" ${body_line}
          "a cpp block must be a whole program (with int main) or start with '// fragment: NAME'")
      endif()
    endwhile()

    if(NOT n_blocks EQUAL n_claims)
      _kpool_snippet_fail("${page}" 1
        "${n_claims} fences look like C++ but ${n_blocks} open with exactly ```cpp at the start of a line")
    endif()

    if(NOT table STREQUAL "")
      set(name "snippets_${stem}")
      set(includes "")
      if(include_list)
        list(REMOVE_DUPLICATES include_list)
        string(REPLACE ";" "\n" includes "${include_list}")
      endif()
      string(CONCAT src
        "// Generated from ${rel_page} by cmake/KPoolSnippets.cmake: edit the page.\n"
        "#undef NDEBUG\n"
        "#include <cassert>\n"
        "#include <KPool.hpp>\n"
        "#include <KPoolSnippetSupport.hpp>\n"
        "${includes}\n"
        "${functions}"
        "int main(int argc, char* argv[]) {\n"
        "  Kokkos::ScopeGuard guard(argc, argv);\n"
        "  kpool_snippets::Snippet const all[] = {\n"
        "${table}"
        "  };\n"
        "  return kpool_snippets::run_all(all);\n"
        "}\n")
      _kpool_write_if_changed("${out_dir}/${name}.cpp" "${src}")
      add_executable(${name} "${out_dir}/${name}.cpp")
      target_include_directories(${name} PRIVATE "${ARG_SUPPORT_DIR}")
      list(APPEND executables ${name})
    endif()
  endforeach()

  foreach(exe IN LISTS executables)
    target_link_libraries(${exe} PRIVATE KPool::kpool)
    add_dependencies(kpool_snippets ${exe})
    string(REGEX REPLACE "^snippets?_" "" test_name "${exe}")
    add_test(NAME snippets.${test_name} COMMAND ${exe})
    set_tests_properties(snippets.${test_name} PROPERTIES LABELS unit
      FIXTURES_REQUIRED kpool_snippets
      ENVIRONMENT "OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive")
  endforeach()

  # Compiling is the first half of the test: a ctest run after editing a
  # page rebuilds (and re-extracts) before running anything.
  set(config)
  get_property(multi_config GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(multi_config)
    set(config --config $<CONFIG>)
  endif()
  add_test(NAME snippets_build
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target kpool_snippets ${config})
  set_tests_properties(snippets_build PROPERTIES LABELS unit TIMEOUT 600
    FIXTURES_SETUP kpool_snippets)
endfunction()
