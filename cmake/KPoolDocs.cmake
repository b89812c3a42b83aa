# The `docs` target: the API reference rendered by Doxygen from the public
# headers' documentation comments and docs/*.md (docs/api.md). Optional: it
# exists when CMake finds Doxygen, and only in a top-level build, where the
# name cannot clash with a parent project's target. Any Doxygen warning (an
# undocumented public symbol or parameter, a broken reference) fails it; the
# test `api_reference` (label `docs`, not `unit`) runs it.
find_package(Doxygen QUIET)
if(NOT DOXYGEN_FOUND)
  message(STATUS "KPool: Doxygen not found, no 'docs' target")
  return()
endif()

# The public headers: src/*.hpp and each wing's src/<wing>/*.hpp (never
# detail/).
file(GLOB kpool_public_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/*.hpp
     ${PROJECT_SOURCE_DIR}/src/*/*.hpp)
file(GLOB kpool_doc_pages CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/docs/*.md)
set(KPOOL_DOCS_INPUT)
foreach(input IN LISTS kpool_public_headers kpool_doc_pages
                       ITEMS ${PROJECT_SOURCE_DIR}/README.md)
  string(APPEND KPOOL_DOCS_INPUT " \"${input}\"")
endforeach()
string(APPEND KPOOL_DOCS_INPUT " \"${PROJECT_BINARY_DIR}/include/KPool_Config.hpp\"")
set(KPOOL_DOCS_OUTPUT ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${KPOOL_DOCS_OUTPUT}/Doxyfile @ONLY)

add_custom_target(docs
  COMMAND Doxygen::doxygen ${KPOOL_DOCS_OUTPUT}/Doxyfile
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
  COMMENT "KPool API reference: ${KPOOL_DOCS_OUTPUT}/html/index.html"
  VERBATIM)
if(KPool_ENABLE_TESTS)
  add_test(NAME api_reference
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target docs)
  set_tests_properties(api_reference PROPERTIES LABELS docs)
endif()
