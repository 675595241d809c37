/* Range registry: hash table by base plus page index for overlap queries. */
#include "range_registry.h"

#include <criterion/criterion.h>

#define PAGE ((uintptr_t)4096)

static struct range_registry registry;

static void setup(void)
{
    cr_assert(range_registry_init(&registry));
}

static void teardown(void)
{
    range_registry_destroy(&registry);
}

TestSuite(range_registry, .init = setup, .fini = teardown);

static bool insert_range(uintptr_t base, uintptr_t end, enum range_state state)
{
    struct range_record record = {
        .base = base, .end = end, .place = {.device = -1}, .state = (uint8_t)state};
    return range_registry_insert(&registry, &record) != NULL;
}

Test(range_registry, insert_find_remove)
{
    uintptr_t base = 0x7f1234560000;
    cr_assert(insert_range(base, base + 16 * PAGE, RANGE_REGISTERED));
    struct range_record *record = range_registry_find(&registry, base);
    cr_assert_not_null(record);
    cr_assert_eq(record->end, base + 16 * PAGE);
    cr_assert_eq(record->state, RANGE_REGISTERED);
    cr_assert_null(range_registry_find(&registry, base + PAGE));
    range_registry_remove(&registry, base);
    cr_assert_null(range_registry_find(&registry, base));
    cr_assert_eq(registry.count, 0);
    cr_assert_not(page_index_any_used(&registry.index, base, base + 16 * PAGE));
}

Test(range_registry, containing_and_first_overlap)
{
    uintptr_t a = 0x40000000, b = a + 10 * PAGE, c = b + 4 * PAGE;
    cr_assert(insert_range(a, a + 4 * PAGE, RANGE_REGISTERED));
    cr_assert(insert_range(b, c, RANGE_REGISTERED));
    cr_assert_eq(range_registry_containing(&registry, a + 3 * PAGE + 7)->base, a);
    cr_assert_null(range_registry_containing(&registry, a + 4 * PAGE));
    cr_assert_eq(range_registry_containing(&registry, c - 1)->base, b);
    /* A query starting in the gap finds the next range; one inside finds its own. */
    cr_assert_eq(range_registry_first_overlap(&registry, a + 5 * PAGE, c)->base, b);
    cr_assert_eq(range_registry_first_overlap(&registry, a + PAGE, c)->base, a);
    cr_assert_null(range_registry_first_overlap(&registry, a + 4 * PAGE, b));
    cr_assert_null(range_registry_first_overlap(&registry, c, c + 100 * PAGE));
}

Test(range_registry, adjacent_ranges_do_not_merge)
{
    uintptr_t a = 0x50000000;
    cr_assert(insert_range(a, a + PAGE, RANGE_REGISTERED));
    cr_assert(insert_range(a + PAGE, a + 2 * PAGE, RANGE_REGISTERING));
    cr_assert_eq(range_registry_containing(&registry, a + PAGE)->base, a + PAGE);
    cr_assert_eq(range_registry_containing(&registry, a)->end, a + PAGE);
    range_registry_remove(&registry, a);
    cr_assert_eq(range_registry_first_overlap(&registry, a, a + 2 * PAGE)->base, a + PAGE);
}

/* Colliding keys removed in every order must leave the rest findable
 * (backward-shift deletion). */
Test(range_registry, removal_keeps_probe_chains)
{
    enum { COUNT = 5000 };
    uintptr_t base = 0x100000000;
    for (uintptr_t i = 0; i < COUNT; i++)
        cr_assert(insert_range(base + i * 2 * PAGE, base + i * 2 * PAGE + PAGE, RANGE_REGISTERED));
    for (uintptr_t i = 0; i < COUNT; i += 3)
        range_registry_remove(&registry, base + i * 2 * PAGE);
    for (uintptr_t i = 0; i < COUNT; i++) {
        struct range_record *record = range_registry_find(&registry, base + i * 2 * PAGE);
        if (i % 3 == 0)
            cr_assert_null(record, "range %lu should be gone", (unsigned long)i);
        else
            cr_assert_not_null(record, "range %lu lost", (unsigned long)i);
    }
}

Test(range_registry, a_million_ranges, .timeout = 120)
{
    enum { COUNT = 1000000 };
    uintptr_t base = 0x200000000;
    for (uintptr_t i = 0; i < COUNT; i++)
        cr_assert(insert_range(base + i * 2 * PAGE, base + i * 2 * PAGE + PAGE, RANGE_REGISTERED));
    cr_assert_eq(registry.count, COUNT);
    for (uintptr_t i = 0; i < COUNT; i += 997) {
        uintptr_t b = base + i * 2 * PAGE;
        cr_assert_eq(range_registry_containing(&registry, b + 100)->base, b);
        cr_assert_null(range_registry_containing(&registry, b + PAGE));
        cr_assert_eq(range_registry_first_overlap(&registry, b + PAGE, b + 3 * PAGE)->base,
                     b + 2 * PAGE);
    }
    for (uintptr_t i = 0; i < COUNT; i++)
        range_registry_remove(&registry, base + i * 2 * PAGE);
    cr_assert_eq(registry.count, 0);
    cr_assert_not(page_index_any_used(&registry.index, 0, PAGE_INDEX_LIMIT));
}

/* A split keeps every page marked (lock-free readers see no gap), marks the
 * new base, and copies the record's fields to the right part. */
Test(range_registry, split_keeps_pages_marked)
{
    uintptr_t a = 0x60000000;
    cr_assert(insert_range(a, a + 8 * PAGE, RANGE_REGISTERED));
    struct range_record *left = range_registry_find(&registry, a);
    left->kept_start = a + 100;
    left->place.device = 3;
    struct range_record *right = range_registry_split(&registry, a, a + 3 * PAGE);
    cr_assert_not_null(right);
    cr_assert_eq(right->base, a + 3 * PAGE);
    cr_assert_eq(right->end, a + 8 * PAGE);
    cr_assert_eq(right->kept_start, a + 100);
    cr_assert_eq(right->place.device, 3);
    cr_assert_eq(right->state, RANGE_REGISTERED);
    cr_assert_eq(range_registry_find(&registry, a)->end, a + 3 * PAGE);
    cr_assert_eq(registry.count, 2);
    for (uintptr_t page = a; page < a + 8 * PAGE; page += PAGE)
        cr_assert(page_index_any_used(&registry.index, page, page + 1), "page %#lx unmarked",
                  (unsigned long)page);
    cr_assert_eq(range_registry_containing(&registry, a + 3 * PAGE + 5)->base, a + 3 * PAGE);
    cr_assert_eq(range_registry_containing(&registry, a + 2 * PAGE + 5)->base, a);
    /* Splitting outside the record, or at its ends, changes nothing. */
    cr_assert_null(range_registry_split(&registry, a, a));
    cr_assert_null(range_registry_split(&registry, a, a + 3 * PAGE));
    cr_assert_null(range_registry_split(&registry, a + PAGE, a + 2 * PAGE));
    cr_assert_eq(registry.count, 2);
    range_registry_remove(&registry, a + 3 * PAGE);
    cr_assert(page_index_any_used(&registry.index, a, a + 3 * PAGE));
    cr_assert_not(page_index_any_used(&registry.index, a + 3 * PAGE, a + 8 * PAGE));
}

/* A join keeps every page marked throughout (lock-free readers see no gap),
 * drops the right part's base and slot, and keeps the left one's fields. */
Test(range_registry, join_keeps_pages_marked)
{
    uintptr_t a = 0x61000000;
    cr_assert(insert_range(a, a + 3 * PAGE, RANGE_REGISTERED));
    cr_assert(insert_range(a + 3 * PAGE, a + 8 * PAGE, RANGE_HELD));
    range_registry_find(&registry, a)->place.device = 2;
    cr_assert_eq(registry.count, 2);
    struct range_record *joined = range_registry_join(&registry, a);
    cr_assert_not_null(joined);
    cr_assert_eq(joined->base, a);
    cr_assert_eq(joined->end, a + 8 * PAGE);
    cr_assert_eq(joined->place.device, 2);
    cr_assert_eq(joined->state, RANGE_REGISTERED);
    cr_assert_eq(registry.count, 1);
    cr_assert_null(range_registry_find(&registry, a + 3 * PAGE));
    for (uintptr_t page = a; page < a + 8 * PAGE; page += PAGE)
        cr_assert_eq(range_registry_containing(&registry, page + 9)->base, a);
    /* Nothing to join with: nothing changes. */
    cr_assert_null(range_registry_join(&registry, a));
    cr_assert_null(range_registry_join(&registry, a + PAGE));
    cr_assert_eq(registry.count, 1);
    range_registry_remove(&registry, a);
    cr_assert_not(page_index_any_used(&registry.index, a, a + 8 * PAGE));
}
