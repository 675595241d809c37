/* Mapping bounds (src/mapping_bounds.h): where the program's mappings begin
 * and end, as mmap, munmap and mremap leave them. */
#include "mapping_bounds.h"

#include <criterion/criterion.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PAGE ((uintptr_t)4096)
#define A(pages) ((uintptr_t)0x7e0000000000 + (uintptr_t)(pages)*PAGE)

static struct mapping_bounds bounds;

static void teardown(void)
{
    mapping_bounds_destroy(&bounds);
}

TestSuite(mapping_bounds, .fini = teardown);

/* Whether the marks between pages first..last (each boundary A(p)) are
 * exactly those listed. */
static void expect_splits(uintptr_t first, uintptr_t last, const uintptr_t *splits, size_t count)
{
    for (uintptr_t page = first; page <= last; page++) {
        bool expected = false;
        for (size_t i = 0; i < count; i++)
            expected = expected || splits[i] == page;
        cr_assert_eq(mapping_bounds_split_at(&bounds, A(page)), expected, "at page %lu: %s",
                     (unsigned long)page, expected ? "no bound" : "a bound");
    }
}

Test(mapping_bounds, side_by_side_mappings_stay_apart)
{
    cr_assert_not(mapping_bounds_split_at(&bounds, A(0)), "nothing noted yet");
    cr_assert_not(mapping_bounds_split_at(NULL, A(0)));
    /* Consecutive mmap calls, placed downwards as the kernel does. */
    mapping_bounds_note_mapped(&bounds, A(8), A(16));
    mapping_bounds_note_mapped(&bounds, A(0), A(8));
    mapping_bounds_note_mapped(&bounds, A(16), A(20));
    uintptr_t splits[] = {0, 8, 16, 20};
    expect_splits(0, 24, splits, 4);
    /* Unmapping the middle one keeps its neighbours' bounds. */
    mapping_bounds_note_unmapped(&bounds, A(8), A(16));
    expect_splits(0, 24, splits, 4);
    /* A new mapping over two old ones clears the bounds inside it. */
    mapping_bounds_note_mapped(&bounds, A(4), A(18));
    uintptr_t covered[] = {0, 4, 18, 20};
    expect_splits(0, 24, covered, 4);
    /* Unmapping all of them: nothing left. */
    mapping_bounds_note_unmapped(&bounds, A(0), A(20));
    expect_splits(0, 24, NULL, 0);
}

Test(mapping_bounds, mremap_moves_and_resizes)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(10));
    /* In place: only the end moves (a mapping grown over pages not its own
     * before keeps no bound inside). */
    mapping_bounds_note_remapped(&bounds, A(0), 10 * PAGE, 14 * PAGE, 0, A(0), PAGE);
    uintptr_t grown[] = {0, 14};
    expect_splits(0, 20, grown, 2);
    mapping_bounds_note_remapped(&bounds, A(0), 14 * PAGE, 6 * PAGE, 0, A(0), PAGE);
    uintptr_t shrunk[] = {0, 6};
    expect_splits(0, 20, shrunk, 2);
    /* A tail part remapped in place: the mapping still starts at 0. */
    mapping_bounds_note_remapped(&bounds, A(2), 4 * PAGE, 8 * PAGE, 0, A(2), PAGE);
    uintptr_t tail[] = {0, 10};
    expect_splits(0, 20, tail, 2);
    /* Moved: the old place goes, the new one is a mapping of its own. */
    mapping_bounds_note_remapped(&bounds, A(0), 10 * PAGE, 10 * PAGE, 1 | 2, A(40), PAGE);
    expect_splits(0, 20, NULL, 0);
    uintptr_t moved[] = {40, 50};
    expect_splits(36, 54, moved, 2);
    /* MREMAP_DONTUNMAP keeps the old place mapped, and its bounds. */
    mapping_bounds_note_mapped(&bounds, A(60), A(64));
    mapping_bounds_note_remapped(&bounds, A(60), 4 * PAGE, 4 * PAGE, 1 | 2 | 4, A(70), PAGE);
    uintptr_t both[] = {60, 64, 70, 74};
    expect_splits(58, 76, both, 4);
}

/* The lock word holds the holder's pid: a fork child finds the parent's
 * there when another of its threads held it at fork, and takes it. */
Test(mapping_bounds, a_fork_child_takes_a_lock_its_parent_held)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(4));
    int parent = (int)syscall(SYS_getpid) + 1; /* a pid that is not this process */
    __atomic_store_n(&bounds.lock, parent, __ATOMIC_RELAXED);
    mapping_bounds_note_mapped(&bounds, A(8), A(12)); /* would wait forever otherwise */
    cr_assert_eq(__atomic_load_n(&bounds.lock, __ATOMIC_RELAXED), 0);
    cr_assert(mapping_bounds_split_at(&bounds, A(8)));
}
