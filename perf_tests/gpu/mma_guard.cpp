// The E4M3 MMA guard (docs/indexer.md, "Which CUDA"), both sides compiled
// with one nvcc by check_mma_guard.sh: with KPOOL_CUDA_COMPILER_VERSION
// below 12040 (CUDA 12.3, whose ptxas lacks the E4M3 mma.sync) the
// instruction is absent from the PTX and mma_device_supported<e4m3> is
// false, bf16 unchanged; at nvcc's own version both are there.
#include <KPool.hpp>
#include <score/detail/KPool_ScoreMmaFragments.hpp>
#ifndef EXPECT_E4M3
#error "define EXPECT_E4M3 0 or 1"
#endif
static_assert(KPool::Details::mma_device_supported<KPool::Details::MmaKind::e4m3>::value == (EXPECT_E4M3 != 0), "guard");
static_assert(KPool::Details::mma_device_supported<KPool::Details::MmaKind::bf16>::value, "bf16 stays");
__global__ void k(float* d, unsigned const* a) {
  float acc[1][4] = {{d[0], d[1], d[2], d[3]}};
  std::uint32_t const A[1][4] = {{a[0], a[1], a[2], a[3]}};
  std::uint32_t const B[1][2] = {{a[4], a[5]}};
  KPool::Details::mma_warp<KPool::Details::MmaKind::bf16, 1>(acc, A, B);
  for (int i = 0; i < 4; ++i) d[i] = acc[0][i];
  if (a[6] == 0) return;
  KPool::Details::mma_warp<KPool::Details::MmaKind::e4m3, 1>(acc, A, B);
  for (int i = 0; i < 4; ++i) d[i] = acc[0][i];
}
int main() { return 0; }  // compiled, never run
