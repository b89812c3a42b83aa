// What the fuzzers share (fuzz/README.md): the input read front to back
// (Bytes), deterministic float data (Values), and caller buffers that are
// allocations of exactly their size, the writable ones canary-filled and
// snapshotted (Arena).

#ifndef KPOOL_FUZZ_SUPPORT_HPP
#define KPOOL_FUZZ_SUPPORT_HPP

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace KPoolFuzz {

constexpr unsigned char canary = 0xA5;

// The harness's name, in its defect reports.
extern char const* const harness_name;

[[noreturn]] inline void defect(std::string const& what) {
  std::fprintf(stderr, "%s: DEFECT: %s\n", harness_name, what.c_str());
  std::abort();
}

// The input, read front to back.
class Bytes {
 public:
  Bytes(std::uint8_t const* p, std::size_t n) : p_(p), n_(n) {}
  std::uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  bool empty() const { return i_ >= n_; }
  int pick(int n) { return u8() % n; }
  std::uint32_t raw32() {
    std::uint32_t v = 0;
    for (int b = 0; b < 4; ++b) v |= static_cast<std::uint32_t>(u8()) << (8 * b);
    return v;
  }
  // An index: mostly small, sometimes any 32-bit value or an extreme.
  std::uint32_t u32() {
    std::uint8_t const b = u8();
    if (b < 0xE0) return b % 24u;
    if (b < 0xF0) return raw32();
    std::uint32_t const extreme[8] = {0xFFFFFFFFu, 0x7FFFFFFFu, 0x80000000u, 0x7FFFFFFEu,
                                      0xFFFFFFF0u, 0x40000000u, 0x10000u,    0x7FFFFFF0u};
    return extreme[b & 7];
  }
  std::int32_t i32() {
    std::uint8_t const b = u8();
    if (b < 0xE0) return static_cast<std::int32_t>(b % 26) - 2;
    if (b < 0xF0) return static_cast<std::int32_t>(raw32());
    std::int32_t const extreme[8] = {-1, std::numeric_limits<std::int32_t>::max(),
                                     std::numeric_limits<std::int32_t>::min(), -2,
                                     std::numeric_limits<std::int32_t>::max() - 1, 1 << 30,
                                     1 << 16, -(1 << 16)};
    return extreme[b & 7];
  }

 private:
  std::uint8_t const* p_;
  std::size_t n_;
  std::size_t i_ = 0;
};

// Float data: deterministic from a seed byte, in [-2, 2), exact in f32.
class Values {
 public:
  explicit Values(std::uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((s_ >> 40) & 0xFFFFFFu) / 16777216.0f * 4.0f - 2.0f;
  }

 private:
  std::uint64_t s_;
};

// Caller buffers, each its own allocation of exactly its bytes, and every
// byte range the call may write (snapshot() before and after a refusal).
class Arena {
 public:
  template <class V, class... N>
  V input(N... n) {
    std::size_t const count = (std::size_t(1) * ... * static_cast<std::size_t>(n));
    blocks_.emplace_back(new unsigned char[count * sizeof(typename V::value_type)]);
    return V(reinterpret_cast<typename V::pointer_type>(blocks_.back().get()),
             static_cast<std::size_t>(n)...);
  }
  template <class V, class... N>
  V output(N... n) {
    V v = input<V>(n...);
    watch(v);
    return v;
  }
  template <class V>
  void watch(V const& v) {
    std::size_t const bytes = v.span() * sizeof(typename V::value_type);
    std::memset(static_cast<void*>(v.data()), canary, bytes);
    ranges_.emplace_back(reinterpret_cast<unsigned char const*>(v.data()), bytes);
  }
  std::vector<unsigned char> snapshot() const {
    std::vector<unsigned char> s;
    for (auto const& r : ranges_) s.insert(s.end(), r.first, r.first + r.second);
    return s;
  }

 private:
  std::vector<std::unique_ptr<unsigned char[]>> blocks_;
  std::vector<std::pair<unsigned char const*, std::size_t>> ranges_;
};

}  // namespace KPoolFuzz

#endif
