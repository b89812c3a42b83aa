# Trace replay tests: kpool_tracegen -> kpool_replay (--fused, --unfused) ->
# kpool_trace_check against the host reference; fused and unfused output
# byte-identical; every rule of docs/trace.md (versions 1 and 2) broken once
# in trace/bad/.
add_executable(kpool_trace_check kpool_trace_check.cpp)
target_include_directories(kpool_trace_check PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/example)
target_link_libraries(kpool_trace_check PRIVATE kpool_internal_flags)
target_compile_features(kpool_trace_check PRIVATE cxx_std_17)

# The trace reader on the inputs fuzz_trace found (no Kokkos).
add_executable(tst_trace_reader common/tst_trace_reader.cpp)
target_include_directories(tst_trace_reader PRIVATE ${PROJECT_SOURCE_DIR}/example)
target_link_libraries(tst_trace_reader PRIVATE GTest::gtest GTest::gtest_main kpool_internal_flags)
target_compile_features(tst_trace_reader PRIVATE cxx_std_17)
gtest_discover_tests(tst_trace_reader PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60 ${kpool_discovery})

if(NOT TARGET kpool_replay OR NOT TARGET kpool_tracegen)
  message(STATUS "KPool: trace tests need the examples (KPool_ENABLE_EXAMPLES)")
  return()
endif()

set(_kpool_trace_script ${CMAKE_CURRENT_SOURCE_DIR}/trace/replay_check.cmake)
set(_kpool_trace_work ${CMAKE_CURRENT_BINARY_DIR}/trace_work)
set(_kpool_trace_tools
  -DGEN=$<TARGET_FILE:kpool_tracegen>
  -DREPLAY=$<TARGET_FILE:kpool_replay>
  -DCHECK=$<TARGET_FILE:kpool_trace_check>)

# (a5) #45 item 7: a decode-shaped trace (8 requests of 8192 tokens, one
# query row each, the fp8 serving cache rotated; trace/decode_8x8192.trace)
# takes the decode batch form, the path of a serving engine's decode step:
# through the Kokkos Tools log of kpool_replay --launch-log, each such
# select block is one kernel fused and three separate, with no fence, copy
# or KPool allocation, and the output is the reference's either way. A
# build without the examples but with KPool_TEST_DECODE_REPLAY (the
# devshapes preset: the device launch shapes) registers this test alone.
add_test(NAME trace_decode_launches
  COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=launches
    -DWORK=${_kpool_trace_work}/trace_decode_launches
    -DTRACE=${CMAKE_CURRENT_SOURCE_DIR}/trace/decode_8x8192.trace
    "-DDECODE_BLOCKS=0;1;2" -DWARM_BLOCK=1 -P ${_kpool_trace_script})
set_tests_properties(trace_decode_launches PROPERTIES LABELS unit
  ENVIRONMENT "OMP_NUM_THREADS=2;OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive" TIMEOUT 120)

if(NOT KPool_ENABLE_EXAMPLES)
  return()
endif()

# kpool_trace_replay(NAME MODE [GEN_ARGS...] [REPLAY_ARGS args...]): one
# generated trace; REPLAY_ARGS go to every kpool_replay run (--engine E).
# The engines that need Kokkos Kernels (team_gemm, blas) are not
# registered without it.
function(kpool_trace_replay name mode)
  cmake_parse_arguments(ARG "" "" "REPLAY_ARGS" ${ARGN})
  if(NOT KPOOL_HAS_KOKKOSKERNELS AND ("team_gemm" IN_LIST ARG_REPLAY_ARGS OR
                                      "blas" IN_LIST ARG_REPLAY_ARGS))
    return()
  endif()
  string(REPLACE ";" " " gen_args "${ARG_UNPARSED_ARGUMENTS}")
  string(REPLACE ";" " " replay_args "${ARG_REPLAY_ARGS}")
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=${mode}
      -DWORK=${_kpool_trace_work}/${name} "-DGEN_ARGS=${gen_args}"
      "-DREPLAY_ARGS=${replay_args}" -P ${_kpool_trace_script})
  set_tests_properties(${name} PROPERTIES LABELS unit
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive" TIMEOUT 60)
endfunction()

# (a) generate -> replay both ways -> check, every dtype, K in {1,3,4,8},
# D in {1,7,128} (K=4, D=128 is the library's compile-time fast path).
foreach(dtype f32 f64 bf16 f16)
  kpool_trace_replay(trace_replay_${dtype}_k4_d128 check
    --dtype ${dtype} --seed 11 --kpool 4 --head-dim 128 --sequences 16 --calls 40)
  kpool_trace_replay(trace_replay_${dtype}_k3_d7 check
    --dtype ${dtype} --seed 12 --kpool 3 --head-dim 7 --sequences 40 --calls 120)
  kpool_trace_replay(trace_replay_${dtype}_k1_d1 check
    --dtype ${dtype} --seed 13 --kpool 1 --head-dim 1 --sequences 30 --calls 80)
  kpool_trace_replay(trace_replay_${dtype}_k8_d7 check
    --dtype ${dtype} --seed 14 --kpool 8 --head-dim 7 --slots 3 --sequences 30 --calls 120)
endforeach()
kpool_trace_replay(trace_replay_bf16_k8_d128 check
  --dtype bf16 --seed 15 --kpool 8 --head-dim 128 --sequences 16 --calls 40 --max-chunk 40)
kpool_trace_replay(trace_replay_f32_k3_d128 check
  --dtype f32 --seed 16 --kpool 3 --head-dim 128 --sequences 16 --calls 40)
kpool_trace_replay(trace_replay_f16_k4_d1 check
  --dtype f16 --seed 17 --kpool 4 --head-dim 1 --slots 2 --sequences 40 --calls 150)
kpool_trace_replay(trace_replay_f32_k16_d7_one_slot check
  --dtype f32 --seed 18 --kpool 16 --head-dim 7 --slots 1 --sequences 20 --calls 150 --max-chunk 50)

# (a2) version 2, speculative: verify rounds of the next token plus S
# drafts with rejected drafts re-sent (rewinds), the serving ring length
# K * next_pow2(ceil((K + S) / K)) unless --ring says otherwise, every dtype.
foreach(dtype f32 f64 bf16 f16)
  kpool_trace_replay(trace_spec_${dtype}_k4_d16_s3 check
    --dtype ${dtype} --seed 31 --kpool 4 --head-dim 16 --drafts 3 --sequences 16 --calls 60)
endforeach()
kpool_trace_replay(trace_spec_bf16_k4_d128_s3 check
  --dtype bf16 --seed 32 --kpool 4 --head-dim 128 --drafts 3 --sequences 12 --calls 40)
kpool_trace_replay(trace_spec_f32_k3_d7_s1 check
  --dtype f32 --seed 33 --kpool 3 --head-dim 7 --drafts 1 --sequences 30 --calls 100)
kpool_trace_replay(trace_spec_f64_k1_d1_s7 check
  --dtype f64 --seed 34 --kpool 1 --head-dim 1 --drafts 7 --sequences 30 --calls 100)
kpool_trace_replay(trace_spec_f16_k8_d7_s7 check
  --dtype f16 --seed 35 --kpool 8 --head-dim 7 --drafts 7 --slots 3 --sequences 20 --calls 100)
# A ring of K with drafts: only the rewinds the depth rule allows.
kpool_trace_replay(trace_spec_bf16_k4_ring4_s3 check
  --dtype bf16 --seed 36 --kpool 4 --head-dim 8 --drafts 3 --ring 4 --sequences 16 --calls 60)
# Every version 2 header line, and select blocks.
kpool_trace_replay(trace_spec_bf16_k4_d16_headers_selects check
  --dtype bf16 --seed 37 --kpool 4 --head-dim 16 --drafts 2 --ring 12
  --index-heads 4 --index-topk 8 --pool-cache fp8_pow2 --rotate 1 --calls 40)
kpool_trace_replay(trace_v2_no_rewinds_f32_k4_d7 check
  --dtype f32 --seed 38 --kpool 4 --head-dim 7 --version 2 --sequences 16 --calls 60)

# (a3) version 2 with a pool cache: every step and decode step writes it,
# and an fp8 cache's 'cache' lines must be bit for bit the reference's
# Q(R(x)) of the printed pools; amax and pow2 scales, rotated and not,
# with and without rewinds (a native cache is written but prints nothing).
kpool_trace_replay(trace_cache_fp8_rot_bf16_k4_d128_s3 check
  --dtype bf16 --seed 41 --kpool 4 --head-dim 128 --drafts 3 --pool-cache fp8
  --rotate 1 --sequences 12 --calls 40)
kpool_trace_replay(trace_cache_fp8_f32_k3_d7 check
  --dtype f32 --seed 42 --kpool 3 --head-dim 7 --version 2 --pool-cache fp8
  --sequences 30 --calls 100)
kpool_trace_replay(trace_cache_fp8_pow2_f16_k4_d16_s3 check
  --dtype f16 --seed 43 --kpool 4 --head-dim 16 --drafts 3 --pool-cache fp8_pow2
  --sequences 16 --calls 60)
kpool_trace_replay(trace_cache_fp8_pow2_rot_bf16_k1_d8_s7 check
  --dtype bf16 --seed 44 --kpool 1 --head-dim 8 --drafts 7 --pool-cache fp8_pow2
  --rotate 1 --sequences 20 --calls 80)
kpool_trace_replay(trace_cache_native_rot_f64_k4_d16_s3 check
  --dtype f64 --seed 45 --kpool 4 --head-dim 16 --drafts 3 --pool-cache native
  --rotate 1 --sequences 16 --calls 60)

# (a4) select blocks: every query token's pools through KPool::score_select
# over the cache the steps wrote, checked against the selection reference
# (docs/indexer.md's tolerance rule on scores of the exact cache entries):
# fp8 (amax, pow2) and native caches, rotated and not, with rewinds (drafts
# re-sent after a select block saw them) and without, topk below and above
# the visible pools, K in {1, 2, 4, 8}, every dtype; the default engine,
# and tiles, team_gemm and blas on the same kind of traces.
kpool_trace_replay(trace_select_fp8_rot_bf16_k4_d128_h32_s3 check
  --dtype bf16 --seed 61 --kpool 4 --head-dim 128 --drafts 3 --index-heads 32
  --index-topk 4 --pool-cache fp8 --rotate 1 --sequences 10 --calls 40)
kpool_trace_replay(trace_select_fp8_pow2_f16_k2_d16_s3 check
  --dtype f16 --seed 62 --kpool 2 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 5 --pool-cache fp8_pow2 --sequences 16 --calls 60)
kpool_trace_replay(trace_select_native_rot_f32_k4_d32_s2 check
  --dtype f32 --seed 63 --kpool 4 --head-dim 32 --drafts 2 --index-heads 4
  --index-topk 3 --pool-cache native --rotate 1 --sequences 16 --calls 60)
kpool_trace_replay(trace_select_native_f64_k1_d7 check
  --dtype f64 --seed 64 --kpool 1 --head-dim 7 --version 2 --index-heads 3
  --index-topk 6 --sequences 16 --calls 60)
kpool_trace_replay(trace_select_native_bf16_k8_d7_s7 check
  --dtype bf16 --seed 65 --kpool 8 --head-dim 7 --drafts 7 --index-heads 1
  --index-topk 2 --sequences 16 --calls 80 --max-chunk 40)
kpool_trace_replay(trace_select_fp8_rot_f32_k4_d16_team_gemm check
  --dtype f32 --seed 66 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8 --rotate 1 --sequences 16 --calls 60
  REPLAY_ARGS --engine team_gemm)
kpool_trace_replay(trace_select_fp8_rot_f16_k4_d32_tiles check
  --dtype f16 --seed 68 --kpool 4 --head-dim 32 --drafts 3 --index-heads 12
  --index-topk 3 --pool-cache fp8 --rotate 1 --sequences 16 --calls 60
  REPLAY_ARGS --engine tiles)
kpool_trace_replay(trace_select_fp8_rot_bf16_k4_d16_blas check
  --dtype bf16 --seed 67 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8 --rotate 1 --sequences 16 --calls 60
  REPLAY_ARGS --engine blas)

# (a5) the serving profile (pool_cache fp8_serving, docs/indexer.md): cache
# lines bit for bit the reference's serving entries (bf16-rounded R(x),
# floored amax, UE8M0 scales), select lines by the tolerance rule with the
# queries quantized the same way; rotated and not, with rewinds, f32 (whose
# bf16 rounding is not a no-op) and f16, every engine, and the cache in the
# engines' fused byte layout (--cache-layout fused).
kpool_trace_replay(trace_serving_rot_bf16_k4_d128_h32_s3 check
  --dtype bf16 --seed 71 --kpool 4 --head-dim 128 --drafts 3 --index-heads 32
  --index-topk 4 --pool-cache fp8_serving --rotate 1 --sequences 10 --calls 40)
kpool_trace_replay(trace_serving_f32_k3_d7 check
  --dtype f32 --seed 72 --kpool 3 --head-dim 7 --version 2 --index-heads 3
  --index-topk 5 --pool-cache fp8_serving --sequences 30 --calls 100)
kpool_trace_replay(trace_serving_fused_f16_k4_d16_s3 check
  --dtype f16 --seed 73 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8_serving --rotate 1 --sequences 16 --calls 60
  REPLAY_ARGS --cache-layout fused)
kpool_trace_replay(trace_serving_rot_f32_k4_d16_team_gemm check
  --dtype f32 --seed 74 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8_serving --rotate 1 --sequences 16 --calls 60
  REPLAY_ARGS --engine team_gemm)
kpool_trace_replay(trace_serving_bf16_k2_d32_blas check
  --dtype bf16 --seed 75 --kpool 2 --head-dim 32 --drafts 1 --index-heads 4
  --index-topk 6 --pool-cache fp8_serving --sequences 16 --calls 60
  REPLAY_ARGS --engine blas)

# Hand-written traces in trace/good/ (edge cases the generator may miss).
file(GLOB _kpool_good_traces CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/trace/good/*.trace)
foreach(good ${_kpool_good_traces})
  get_filename_component(stem ${good} NAME_WE)
  add_test(NAME trace_good_${stem}
    COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=check
      -DWORK=${_kpool_trace_work}/trace_good_${stem} -DTRACE=${good}
      -P ${_kpool_trace_script})
  set_tests_properties(trace_good_${stem} PROPERTIES LABELS unit
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive"
    TIMEOUT 60)
endforeach()

# (b) --fused and --unfused print the same bytes (and stdin = file).
foreach(dtype f32 f64 bf16 f16)
  kpool_trace_replay(trace_fused_unfused_identical_${dtype} identical
    --dtype ${dtype} --seed 21 --kpool 4 --head-dim 128 --sequences 20 --calls 60)
endforeach()
kpool_trace_replay(trace_fused_unfused_identical_bf16_k3_d7 identical
  --dtype bf16 --seed 22 --kpool 3 --head-dim 7 --sequences 40 --calls 120)
kpool_trace_replay(trace_fused_unfused_identical_spec_bf16_k4_d128_s3 identical
  --dtype bf16 --seed 24 --kpool 4 --head-dim 128 --drafts 3 --sequences 12 --calls 40)
# With selections: the cache's block size (--block-pools) changes no byte
# either (identical mode also replays with 3 pools a block).
kpool_trace_replay(trace_fused_unfused_identical_select_fp8_rot_bf16_k4_d16 identical
  --dtype bf16 --seed 68 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8 --rotate 1 --sequences 12 --calls 40)
kpool_trace_replay(trace_fused_unfused_identical_serving_rot_bf16_k4_d16 identical
  --dtype bf16 --seed 76 --kpool 4 --head-dim 16 --drafts 3 --index-heads 4
  --index-topk 3 --pool-cache fp8_serving --rotate 1 --sequences 12 --calls 40)
kpool_trace_replay(trace_fused_unfused_identical_cache_fp8_rot_bf16_k4_d128 identical
  --dtype bf16 --seed 26 --kpool 4 --head-dim 128 --drafts 3 --pool-cache fp8
  --rotate 1 --sequences 12 --calls 40)

# The checker is not vacuous: a changed value, a lost pool, a duplicated
# pool are each caught (and, in version 2, a wrong 'emitted E' or
# 'selects M', a missing tail line, and a stale emission of a re-sent pool;
# with an fp8 pool cache, changed or missing 'cache' lines).
kpool_trace_replay(trace_check_detects_tampering tamper
  --dtype bf16 --seed 23 --kpool 4 --head-dim 7 --calls 30)
kpool_trace_replay(trace_check_detects_tampering_v2 tamper
  --dtype bf16 --seed 25 --kpool 4 --head-dim 7 --drafts 3 --calls 30)
# ... and a changed scale or cache value, a lost or reordered cache line.
# ... and a selection that is not the best, too few ids, a lost or
# reordered select line.
kpool_trace_replay(trace_check_detects_tampering_select tamper
  --dtype bf16 --seed 28 --kpool 2 --head-dim 8 --drafts 1 --index-heads 4
  --index-topk 2 --pool-cache fp8 --calls 30)
kpool_trace_replay(trace_check_detects_tampering_serving tamper
  --dtype f32 --seed 77 --kpool 2 --head-dim 8 --drafts 1 --index-heads 4
  --index-topk 2 --pool-cache fp8_serving --rotate 1 --calls 30)
kpool_trace_replay(trace_check_detects_tampering_cache tamper
  --dtype bf16 --seed 27 --kpool 4 --head-dim 8 --drafts 3 --pool-cache fp8
  --rotate 1 --calls 30)

# (c) one broken rule per file; the expected line is in the file's first
# line, '# expect trace:LINE:'.
file(GLOB _kpool_bad_traces CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/trace/bad/*.trace)
foreach(bad ${_kpool_bad_traces})
  get_filename_component(stem ${bad} NAME_WE)
  add_test(NAME trace_bad_${stem}
    COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=bad
      -DWORK=${_kpool_trace_work}/trace_bad_${stem} -DTRACE=${bad}
      -P ${_kpool_trace_script})
  # Refusals by KPool itself (the ring's depth rule) come after Kokkos
  # starts: no binding note before the trace line.
  set_tests_properties(trace_bad_${stem} PROPERTIES LABELS unit TIMEOUT 30
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive")
endforeach()

# The command line: --help, an unknown option, a missing file.
add_test(NAME trace_replay_cli
  COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=cli
    -DWORK=${_kpool_trace_work}/trace_replay_cli -P ${_kpool_trace_script})
set_tests_properties(trace_replay_cli PROPERTIES LABELS unit TIMEOUT 30)

# (f) the replay across ranks (docs/ranks.md; label mpi): every trace kind
# with a pool cache replayed on one rank, then under mpiexec with 2, 3 and 4
# ranks and interleaves of 1, 3 and 16 pools (--ranks): rank 0 prints the
# one rank's bytes. Prefill chunks and decode, speculative rewinds, fp8
# (amax, pow2) and serving caches, native caches, select blocks, topk
# above and below the rows' pools, long rows split over segments.
if(KPOOL_HAS_MPI)
  # kpool_trace_ranks(NAME [RANKS "w;..."] GEN_ARGS...): with 2, 3 and 4
  # ranks unless RANKS says otherwise.
  function(kpool_trace_ranks name)
    cmake_parse_arguments(ARG "" "RANKS" "" ${ARGN})
    set(ranks 2 3 4)
    if(ARG_RANKS)
      set(ranks ${ARG_RANKS})
    endif()
    string(REPLACE ";" " " gen_args "${ARG_UNPARSED_ARGUMENTS}")
    add_test(NAME ${name}
      COMMAND ${CMAKE_COMMAND} ${_kpool_trace_tools} -DMODE=ranks
        -DWORK=${_kpool_trace_work}/${name} "-DGEN_ARGS=${gen_args}"
        -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DMPIEXEC_ARGS=${kpool_mpiexec_flags}"
        "-DRANKS=${ranks}" -P ${_kpool_trace_script})
    set_tests_properties(${name} PROPERTIES LABELS mpi TIMEOUT 300
      ENVIRONMENT "OMP_NUM_THREADS=1;OMP_PROC_BIND=false;OMP_WAIT_POLICY=passive;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endfunction()
  kpool_trace_ranks(trace_ranks_select_fp8_rot_bf16_k4_d128_s3
    --dtype bf16 --seed 91 --kpool 4 --head-dim 128 --drafts 3 --index-heads 8
    --index-topk 4 --pool-cache fp8 --rotate 1 --sequences 10 --calls 40)
  kpool_trace_ranks(trace_ranks_select_serving_bf16_k4_d128
    --dtype bf16 --seed 92 --kpool 4 --head-dim 128 --index-heads 8
    --index-topk 6 --pool-cache fp8_serving --rotate 1 --sequences 10 --calls 40)
  kpool_trace_ranks(trace_ranks_select_native_f32_k2_d16_s2
    --dtype f32 --seed 93 --kpool 2 --head-dim 16 --drafts 2 --index-heads 4
    --index-topk 16 --pool-cache native --sequences 16 --calls 60)
  kpool_trace_ranks(trace_ranks_select_fp8_pow2_f16_k1_d8_s7
    --dtype f16 --seed 94 --kpool 1 --head-dim 8 --drafts 7 --index-heads 2
    --index-topk 3 --pool-cache fp8_pow2 --sequences 12 --calls 60)
  # A long context: one sequence of 134118 tokens (K = 1, prefill chunks of
  # up to 60000), six of whose select tokens see more than 131072 pools, so
  # that each of 2 ranks selects them from more than 65536 local pools, in
  # split segments (docs/indexer.md, "Top-k").
  kpool_trace_ranks(trace_ranks_long_rows_f32_k1_d8 RANKS 2
    --dtype f32 --seed 9 --kpool 1 --head-dim 8 --index-heads 2 --index-topk 8
    --pool-cache fp8_pow2 --max-chunk 60000 --sequences 1 --slots 1 --calls 40)
endif()
