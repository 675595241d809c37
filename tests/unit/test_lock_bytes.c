/* Lock bytes (src/lock_bytes.h) against a plain bitmap of the same bytes:
 * random additions and removals over a small window, every query compared
 * after every step, and the edge cases by hand (touching ranges join, a cut
 * keeps both ends, counts stop at their limit). */
#include "lock_bytes.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define WINDOW 4096
#define BASE ((uintptr_t)0x7f0000000000)

static struct lock_bytes set;
static unsigned char held[WINDOW];

static void setup(void)
{
    lock_bytes_init(&set);
    memset(held, 0, sizeof(held));
}

static void teardown(void)
{
    lock_bytes_destroy(&set);
}

TestSuite(lock_bytes, .init = setup, .fini = teardown);

static void add(uintptr_t start, uintptr_t end)
{
    cr_assert(lock_bytes_add(&set, BASE + start, BASE + end));
    for (uintptr_t i = start; i < end; i++)
        held[i] = 1;
}

static void take(uintptr_t start, uintptr_t end)
{
    cr_assert(lock_bytes_remove(&set, BASE + start, BASE + end));
    for (uintptr_t i = start; i < end; i++)
        held[i] = 0;
}

/* The set holds exactly the bitmap's bytes, as disjoint ranges that never
 * touch (touching ones join), and every query agrees. */
static void expect_same(void)
{
    size_t ranges = 0;
    uintptr_t cursor = BASE, start, end, last_end = 0;
    while (lock_bytes_next(&set, cursor, &start, &end)) {
        cr_assert_lt(start, end);
        cr_assert(start > last_end || ranges == 0, "ranges touch or overlap at %#lx",
                  (unsigned long)start);
        cr_assert_geq(start, BASE);
        cr_assert_leq(end, BASE + WINDOW);
        for (uintptr_t i = start - BASE; i < end - BASE; i++)
            cr_assert(held[i], "byte %lu held by the set, not by the bitmap", (unsigned long)i);
        last_end = end;
        cursor = end;
        ranges++;
    }
    cr_assert_eq(ranges, set.count);
    size_t bitmap_ranges = 0;
    for (size_t i = 0; i < WINDOW; i++) {
        if (held[i] && (i == 0 || !held[i - 1]))
            bitmap_ranges++;
        cr_assert_eq(lock_bytes_any(&set, BASE + i, BASE + i + 1), held[i] != 0, "byte %zu", i);
    }
    cr_assert_eq(ranges, bitmap_ranges);
}

Test(lock_bytes, by_hand)
{
    add(100, 200);
    add(200, 300); /* touches: one range */
    cr_assert_eq(set.count, 1);
    add(400, 500);
    add(250, 450); /* joins both */
    cr_assert_eq(set.count, 1);
    take(300, 350); /* a cut keeps both ends */
    cr_assert_eq(set.count, 2);
    expect_same();
    cr_assert_eq(lock_bytes_count(&set, BASE, BASE + WINDOW, UINT64_MAX), 350);
    cr_assert_eq(lock_bytes_count(&set, BASE + 150, BASE + 320, UINT64_MAX), 150);
    cr_assert_geq(lock_bytes_count(&set, BASE, BASE + WINDOW, 10), 10, "stops at its limit");
    cr_assert_not(lock_bytes_any(&set, BASE + 300, BASE + 350));
    cr_assert(lock_bytes_any(&set, BASE + 299, BASE + 351));
    uintptr_t start, end;
    cr_assert(lock_bytes_next(&set, BASE + 320, &start, &end));
    cr_assert_eq(start, BASE + 350);
    cr_assert(lock_bytes_next(&set, BASE + 120, &start, &end), "a range that began before");
    cr_assert_eq(start, BASE + 100);
    cr_assert_not(lock_bytes_next(&set, BASE + 500, &start, &end));
    take(0, WINDOW);
    cr_assert_eq(set.count, 0);
    expect_same();
}

Test(lock_bytes, random_steps_agree_with_a_bitmap, .timeout = 60)
{
    uint64_t state = 88172645463325252ull;
    for (int step = 0; step < 3000; step++) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        uintptr_t start = (uintptr_t)(state % WINDOW);
        uintptr_t length = (uintptr_t)((state >> 20) % 300);
        uintptr_t end = start + length > WINDOW ? WINDOW : start + length;
        if ((state >> 40) % 3 == 0)
            take(start, end);
        else
            add(start, end);
        if (step % 50 == 0)
            expect_same();
    }
    expect_same();
}
