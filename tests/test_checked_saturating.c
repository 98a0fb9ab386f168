/* base/checked.h's saturating forms: a result that does not fit becomes UINT64_MAX, one that
 * fits is exact, so a size compared with a limit afterwards is refused rather than wrapped. */
#include <stdint.h>

#include "base/checked.h"
#include "tests/harness.h"

TG_TEST(test_checked_saturating_add_and_mul) {
    CHECK(tg_add_sat_u64(UINT64_MAX, 1) == UINT64_MAX, "UINT64_MAX + 1 saturates");
    CHECK(tg_add_sat_u64(UINT64_MAX - 5, 9) == UINT64_MAX, "UINT64_MAX - 5 + 9 saturates");
    CHECK(tg_add_sat_u64(UINT64_MAX - 5, 5) == UINT64_MAX, "UINT64_MAX - 5 + 5 is exact");
    CHECK(tg_add_sat_u64(40, 2) == 42, "40 + 2");
    CHECK(tg_mul_sat_u64(UINT64_C(1) << 32, UINT64_C(1) << 32) == UINT64_MAX, "2^32 * 2^32 saturates");
    CHECK(tg_mul_sat_u64(UINT64_C(1) << 31, UINT64_C(1) << 32) == UINT64_C(1) << 63, "2^31 * 2^32 is exact");
}
