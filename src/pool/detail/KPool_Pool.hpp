#ifndef KPOOL_POOL_DETAIL_POOL_HPP
#define KPOOL_POOL_DETAIL_POOL_HPP

// The per-channel softmax pooling every writer calls (docs/pools.md, "The
// pooled key"). One team thread computes one pool with its vector lanes over
// the channels; compress, ring_close, tail_update and the fused step differ
// only in where the K members come from, which PoolSource describes, so the
// writers cannot drift apart: a pool has the same bits whichever writer
// closed it.

#include <common/KPool_Types.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Lanes.hpp>
#include <common/detail/KPool_Views.hpp>
#include <pool/detail/KPool_Exp.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace KPool {
namespace Details {

// Where the K members of one pool live: members [0, have) at ring indices
// [0, have) of one slot, members [have, K) in consecutive input rows.
template <class T>
struct PoolSource {
  T const* ring_key;
  T const* ring_gate;
  std::ptrdiff_t ring_m;  // stride between ring indices
  std::ptrdiff_t ring_c;  // stride between channels in the ring
  T const* row_key;       // row of member `have`
  T const* row_gate;
  std::ptrdiff_t key_r, key_c;
  std::ptrdiff_t gate_r, gate_c;
  int have;

  KOKKOS_INLINE_FUNCTION T const* key_ptr(int m) const {
    return m < have ? ring_key + m * ring_m : row_key + (m - have) * key_r;
  }
  KOKKOS_INLINE_FUNCTION T const* gate_ptr(int m) const {
    return m < have ? ring_gate + m * ring_m : row_gate + (m - have) * gate_r;
  }
  KOKKOS_INLINE_FUNCTION std::ptrdiff_t key_stride(int m) const {
    return m < have ? ring_c : key_c;
  }
  KOKKOS_INLINE_FUNCTION std::ptrdiff_t gate_stride(int m) const {
    return m < have ? ring_c : gate_c;
  }
};

// ape is [K, D], f32.
struct ApeSource {
  float const* data;
  std::ptrdiff_t m;
  std::ptrdiff_t c;
};

// Softmax of K logits weighting K keys, one channel, in the accumulator
// type. The order of operations is fixed (max from member 0 up, then sums
// from member 0 up, starting from member 0's terms rather than from zero),
// so every path below rounds identically.
template <int KS, class A>
KOKKOS_FORCEINLINE_FUNCTION A softmax_pool(A const (&logit)[KS],
                                           A const (&key)[KS]) {
  A mx = logit[0];
  KPOOL_IMPL_UNROLL
  for (int m = 1; m < KS; ++m) mx = logit[m] > mx ? logit[m] : mx;
  A const e0 = pool_exp(logit[0] - mx);
  A sum = e0, acc = e0 * key[0];
  KPOOL_IMPL_UNROLL
  for (int m = 1; m < KS; ++m) {
    A const e = pool_exp(logit[m] - mx);
    sum += e;
    acc = KokkosExt::fmadd(e, key[m], acc);
  }
  return acc / sum;
}

/// One pool, computed by the calling team thread's vector lanes, written
/// to out[c * out_c] for c in [0, D), each value handed to stage(c, v), and
/// then stage.finish(member, out, out_c).
/// Lanes own channel packets [p * Width, (p + 1) * Width), the same mapping
/// thread_vector_copy uses, so a lane only ever reads ring entries it wrote
/// itself.
template <class ExecutionSpace, class P, class T, class Member,
          class Stage = NoStage>
KOKKOS_INLINE_FUNCTION void thread_vector_pool(Member const& member, int K,
                                               int D, ApeSource const& ape,
                                               PoolSource<T> const& src,
                                               T* out, std::ptrdiff_t out_c,
                                               Stage const& stage = Stage()) {
  using A = accumulator_t<T>;
  constexpr int W = P::width;
  int const head_dim = P::head_dim > 0 ? P::head_dim : D;
  if constexpr (P::kpool > 0) {
    static_assert(P::contiguous, "the fixed-K path reads unit strides");
    constexpr int KS = P::kpool;
    T const* kp[KS];
    T const* gp[KS];
    KPOOL_IMPL_UNROLL
    for (int m = 0; m < KS; ++m) {
      kp[m] = src.key_ptr(m);
      gp[m] = src.gate_ptr(m);
    }
    KokkosExt::vector_for<ExecutionSpace>(member, head_dim / W, [&](int p) {
      int const c0 = p * W;
      A logit[W][KS], key[W][KS];
      KPOOL_IMPL_UNROLL
      for (int m = 0; m < KS; ++m) {
        auto const g = load_packet<W>(gp[m] + c0);
        auto const k = load_packet<W>(kp[m] + c0);
        auto const a = load_packet<W>(ape.data + m * ape.m + c0);
        KPOOL_IMPL_UNROLL
        for (int w = 0; w < W; ++w) {
          logit[w][m] = to_accumulator(g.v[w]) + a.v[w];
          key[w][m] = to_accumulator(k.v[w]);
        }
      }
      Packet<T, W> o;
      KPOOL_IMPL_UNROLL
      for (int w = 0; w < W; ++w) {
        o.v[w] = from_accumulator<T>(softmax_pool<KS>(logit[w], key[w]));
        stage(c0 + w, o.v[w]);
      }
      store_packet<W>(out + c0, o);
    });
    stage.finish(member, out, std::ptrdiff_t(1));
  } else if constexpr (P::contiguous) {
    KokkosExt::vector_for<ExecutionSpace>(member, head_dim / W, [&](int p) {
      int const c0 = p * W;
      for (int w = 0; w < W; ++w) {
        int const c = c0 + w;
        A mx = 0;
        for (int m = 0; m < K; ++m) {
          A const l = to_accumulator(src.gate_ptr(m)[c]) + ape.data[m * ape.m + c];
          mx = (m == 0 || l > mx) ? l : mx;
        }
        A sum = 0, acc = 0;
        for (int m = 0; m < K; ++m) {
          A const l = to_accumulator(src.gate_ptr(m)[c]) + ape.data[m * ape.m + c];
          A const e = pool_exp(l - mx);
          A const k = to_accumulator(src.key_ptr(m)[c]);
          sum = m == 0 ? e : sum + e;
          acc = m == 0 ? e * k : KokkosExt::fmadd(e, k, acc);
        }
        T const v = from_accumulator<T>(acc / sum);
        out[c] = v;
        stage(c, v);
      }
    });
    stage.finish(member, out, std::ptrdiff_t(1));
  } else {
    static_assert(W == 1, "strided views are read one channel a lane");
    KokkosExt::vector_for<ExecutionSpace>(member, head_dim, [&](int c) {
      A mx = 0;
      for (int m = 0; m < K; ++m) {
        A const l = to_accumulator(src.gate_ptr(m)[c * src.gate_stride(m)]) +
                    ape.data[m * ape.m + c * ape.c];
        mx = (m == 0 || l > mx) ? l : mx;
      }
      A sum = 0, acc = 0;
      for (int m = 0; m < K; ++m) {
        A const l = to_accumulator(src.gate_ptr(m)[c * src.gate_stride(m)]) +
                    ape.data[m * ape.m + c * ape.c];
        A const e = pool_exp(l - mx);
        A const k = to_accumulator(src.key_ptr(m)[c * src.key_stride(m)]);
        sum = m == 0 ? e : sum + e;
        acc = m == 0 ? e * k : KokkosExt::fmadd(e, k, acc);
      }
      T const v = from_accumulator<T>(acc / sum);
      out[c * out_c] = v;
      stage(c, v);
    });
    stage.finish(member, out, out_c);
  }
}

// Where pool j of the request is built from.
template <class T>
KOKKOS_INLINE_FUNCTION PoolSource<T> rows_source(Strided<const T, 2> const& key,
                                                 Strided<const T, 2> const& gate,
                                                 std::uint64_t row) {
  PoolSource<T> s;
  s.ring_key = s.ring_gate = nullptr;
  s.ring_m = s.ring_c = 0;
  s.row_key = key.data() + row * key.stride(0);
  s.row_gate = gate.data() + row * gate.stride(0);
  s.key_r = key.stride(0);
  s.key_c = key.stride(1);
  s.gate_r = gate.stride(0);
  s.gate_c = gate.stride(1);
  s.have = 0;
  return s;
}

// Members [0, have) of the pool starting at position `first` come from the
// ring (its K members are consecutive there, see ring_index).
template <class T, class TailView>
KOKKOS_INLINE_FUNCTION void attach_ring(PoolSource<T>& s, TailView const& tail,
                                        int slot, int have,
                                        std::uint64_t first, int ring_length) {
  s.ring_key = tail.data() + slot * tail.stride(0) +
               ring_index(first, ring_length) * tail.stride(2);
  s.ring_gate = s.ring_key + tail.stride(1);
  s.ring_m = tail.stride(2);
  s.ring_c = tail.stride(3);
  s.have = have;
}

template <class MemorySpace>
KOKKOS_INLINE_FUNCTION ApeSource
ape_source(View2<const float, MemorySpace> const& ape) {
  return ApeSource{ape.data(), static_cast<std::ptrdiff_t>(ape.stride(0)),
                   static_cast<std::ptrdiff_t>(ape.stride(1))};
}

}  // namespace Details
}  // namespace KPool

#endif
