# Run by the kpool_perf_smoke test: kpool_perf --quick, then
# perf_table.py --check on its report.
#   -DKPOOL_PERF=<kpool_perf> -DPYTHON=<python3 or empty> -DTABLE=<perf_table.py>
#   -DOUT=<report path>
file(REMOVE ${OUT})
execute_process(COMMAND ${KPOOL_PERF} --quick --out ${OUT}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kpool_perf --quick failed: ${rc}")
endif()
if(NOT EXISTS ${OUT})
  message(FATAL_ERROR "kpool_perf --quick wrote no ${OUT}")
endif()
if(PYTHON)
  execute_process(COMMAND ${PYTHON} ${TABLE} --check ${OUT}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "perf_table.py --check ${OUT} failed: ${rc}")
  endif()
else()
  message(STATUS "No Python 3 interpreter: report schema not checked")
endif()
