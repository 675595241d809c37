/* Page index: the bitmaps behind the registry's overlap queries and free's
 * lock-free check. */
#include "page_index.h"

#include <criterion/criterion.h>

#define PAGE ((uintptr_t)4096)

static struct page_index index_under_test;

static void setup(void)
{
    cr_assert(page_index_init(&index_under_test));
}

static void teardown(void)
{
    page_index_destroy(&index_under_test);
}

TestSuite(page_index, .init = setup, .fini = teardown);

Test(page_index, empty_index_has_nothing)
{
    uintptr_t found;
    cr_assert_not(page_index_any_used(&index_under_test, 0, PAGE_INDEX_LIMIT));
    cr_assert_not(page_index_find_base_at_or_before(&index_under_test, 0x10000, &found));
    cr_assert(
        page_index_find_next(&index_under_test, PAGE_INDEX_USED, false, 0x10000, 0x20000, &found));
    cr_assert_eq(found, 0x10000);
}

Test(page_index, mark_sets_used_pages_and_one_base)
{
    uintptr_t start = 0x7f0000000000, end = start + 10 * PAGE;
    cr_assert(page_index_mark(&index_under_test, start, end));
    cr_assert(page_index_any_used(&index_under_test, start, start + 1));
    cr_assert(page_index_any_used(&index_under_test, end - 1, end));
    cr_assert_not(page_index_any_used(&index_under_test, end, end + PAGE));
    cr_assert_not(page_index_any_used(&index_under_test, start - PAGE, start));
    /* Unaligned queries round outward to pages. */
    cr_assert(page_index_any_used(&index_under_test, start - 10, start - 5 + 6));
    uintptr_t base;
    cr_assert(page_index_find_base_at_or_before(&index_under_test, end - 1, &base));
    cr_assert_eq(base, start);
    uintptr_t next_base;
    cr_assert(
        page_index_find_next(&index_under_test, PAGE_INDEX_BASE, true, start, end, &next_base));
    cr_assert_eq(next_base, start);
    cr_assert_not(page_index_find_next(&index_under_test, PAGE_INDEX_BASE, true, start + PAGE, end,
                                       &next_base));
}

Test(page_index, adjacent_ranges_keep_separate_bases)
{
    uintptr_t a = 0x100000000, b = a + 3 * PAGE, c = b + 5 * PAGE;
    cr_assert(page_index_mark(&index_under_test, a, b));
    cr_assert(page_index_mark(&index_under_test, b, c));
    uintptr_t base;
    cr_assert(page_index_find_base_at_or_before(&index_under_test, b - 1, &base));
    cr_assert_eq(base, a);
    cr_assert(page_index_find_base_at_or_before(&index_under_test, b, &base));
    cr_assert_eq(base, b);
    page_index_clear(&index_under_test, a, b);
    cr_assert_not(page_index_any_used(&index_under_test, a, b));
    cr_assert(page_index_any_used(&index_under_test, b, c));
}

Test(page_index, ranges_crossing_leaf_and_mid_boundaries)
{
    /* 8 MiB leaves and 8 GiB mid nodes: straddle both. */
    uintptr_t mid_span = (uintptr_t)1
                         << (PAGE_INDEX_GRANULE_SHIFT + PAGE_INDEX_LEAF_BITS + PAGE_INDEX_MID_BITS);
    uintptr_t start = 3 * mid_span - 5 * PAGE, end = 3 * mid_span + 20 * PAGE;
    cr_assert(page_index_mark(&index_under_test, start, end));
    uintptr_t base;
    cr_assert(page_index_find_base_at_or_before(&index_under_test, end - PAGE, &base));
    cr_assert_eq(base, start);
    uintptr_t gap;
    cr_assert(
        page_index_find_next(&index_under_test, PAGE_INDEX_USED, false, start, end + PAGE, &gap));
    cr_assert_eq(gap, end);
    page_index_clear(&index_under_test, start + PAGE, end - PAGE);
    cr_assert(page_index_find_next(&index_under_test, PAGE_INDEX_USED, false, start, end, &gap));
    cr_assert_eq(gap, start + PAGE);
}

Test(page_index, base_search_stops_at_a_gap)
{
    uintptr_t a = 0x200000000;
    cr_assert(page_index_mark(&index_under_test, a, a + 2 * PAGE));
    uintptr_t base;
    cr_assert_not(page_index_find_base_at_or_before(&index_under_test, a + 3 * PAGE, &base));
}

Test(page_index, addresses_above_the_limit_are_never_used)
{
    cr_assert_not(page_index_any_used(&index_under_test, PAGE_INDEX_LIMIT, UINTPTR_MAX));
    cr_assert_not(page_index_any_used(&index_under_test, UINTPTR_MAX - 10, UINTPTR_MAX));
}

Test(page_index, large_range_marks_and_clears)
{
    uintptr_t start = 0x10000000000, end = start + ((uintptr_t)64 << 30); /* 64 GiB */
    cr_assert(page_index_mark(&index_under_test, start, end));
    cr_assert(page_index_any_used(&index_under_test, end - PAGE, end));
    uintptr_t base;
    cr_assert(page_index_find_base_at_or_before(&index_under_test, end - PAGE, &base));
    cr_assert_eq(base, start);
    page_index_clear(&index_under_test, start, end);
    cr_assert_not(page_index_any_used(&index_under_test, start, end));
}

/* free's inline check answers like page_index_any_used inside one bitmap word
 * (64 granules) and hands every other range back (-1). */
Test(page_index, one_word_check_agrees_or_hands_back)
{
    uintptr_t word = (uintptr_t)0x7f0000000000; /* 256 KiB aligned: a word's first granule */
    cr_assert(page_index_mark(&index_under_test, word + 10 * PAGE, word + 12 * PAGE));
    cr_assert(page_index_mark(&index_under_test, word + 64 * PAGE, word + 65 * PAGE));
    uint64_t state = 12345;
    for (int i = 0; i < 20000; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uintptr_t start = word - 4 * PAGE + (uintptr_t)((state >> 20) % (80 * PAGE));
        uintptr_t end = start + 1 + (uintptr_t)((state >> 45) % (8 * PAGE));
        int answer = page_index_one_word_used(&index_under_test, start, end);
        bool same_word = (start >> 18) == ((end - 1) >> 18);
        if (!same_word) {
            cr_assert_eq(answer, -1, "[%#lx, %#lx) spans two words", (unsigned long)start,
                         (unsigned long)end);
            continue;
        }
        cr_assert_eq(answer, page_index_any_used(&index_under_test, start, end) ? 1 : 0,
                     "[%#lx, %#lx)", (unsigned long)start, (unsigned long)end);
    }
    cr_assert_eq(page_index_one_word_used(&index_under_test, word + PAGE, word + PAGE), -1,
                 "empty range");
    cr_assert_eq(page_index_one_word_used(&index_under_test, PAGE_INDEX_LIMIT - PAGE,
                                          PAGE_INDEX_LIMIT + PAGE),
                 -1, "past the limit");
    cr_assert_eq(
        page_index_one_word_used(&index_under_test, word + 11 * PAGE + 5, word + 11 * PAGE + 6), 1);
    cr_assert_eq(page_index_one_word_used(&index_under_test, word + 12 * PAGE, word + 63 * PAGE),
                 0);
    cr_assert_eq(
        page_index_one_word_used(&index_under_test, (uintptr_t)0x100000000, (uintptr_t)0x100000010),
        0, "no node at all");
}
