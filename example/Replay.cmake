# kpool_replay (docs/trace.md) and the trace generator the tests drive it with.
add_executable(kpool_replay kpool_replay.cpp)
target_link_libraries(kpool_replay PRIVATE KPool::kpool kpool_internal_flags)
# --ranks (docs/ranks.md) where KPool::mpi exists.
if(TARGET kpool_mpi)
  target_link_libraries(kpool_replay PRIVATE KPool::mpi)
  target_compile_definitions(kpool_replay PRIVATE KPOOL_REPLAY_MPI=1)
endif()

add_executable(kpool_tracegen kpool_tracegen.cpp)
target_link_libraries(kpool_tracegen PRIVATE kpool_internal_flags)
target_compile_features(kpool_tracegen PRIVATE cxx_std_17)

install(TARGETS kpool_replay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
