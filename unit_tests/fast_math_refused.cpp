// Compiled only by the fast_math_refused tests, with -ffast-math or
// -ffinite-math-only: KPool's headers must refuse it with their #error
// (docs/api.md, "Building"). A plain translation unit otherwise.
#include <KPool.hpp>

int main() { return KPool::bfloat16(1.0f).bits == 0x3F80 ? 0 : 1; }
