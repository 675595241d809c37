/* Mapping bounds (src/mapping_bounds.h): where the program's mappings begin
 * and end, as mmap, munmap and mremap leave them. */
#include "mapping_bounds.h"

#include <criterion/criterion.h>
#include <pthread.h>
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

/* mremap as the engine and the interposer make it: the old range's marks
 * go before the call, and after it the new place is a mapping of its own
 * (moved) or the mapping ends at its new end (in place). */
static void remap(uintptr_t old_start, size_t old_size, size_t new_size, int flags, long result)
{
    struct mapping_bounds_remap token;
    mapping_bounds_remap_begin(&bounds, &token, old_start, old_size, PAGE);
    mapping_bounds_remap_end(&bounds, &token, result, new_size, flags, PAGE);
}

Test(mapping_bounds, mremap_moves_and_resizes)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(10));
    /* In place: the start stays, the end moves. */
    remap(A(0), 10 * PAGE, 14 * PAGE, 0, (long)A(0));
    uintptr_t grown[] = {0, 14};
    expect_splits(0, 20, grown, 2);
    remap(A(0), 14 * PAGE, 6 * PAGE, 0, (long)A(0));
    uintptr_t shrunk[] = {0, 6};
    expect_splits(0, 20, shrunk, 2);
    /* A tail part remapped in place: the mapping still starts at 0. */
    remap(A(2), 4 * PAGE, 8 * PAGE, 0, (long)A(2));
    uintptr_t tail[] = {0, 10};
    expect_splits(0, 20, tail, 2);
    /* A failed call puts the marks back. */
    remap(A(0), 10 * PAGE, 30 * PAGE, 1, -1);
    expect_splits(0, 20, tail, 2);
    /* Moved: the old place goes, the new one is a mapping of its own. */
    remap(A(0), 10 * PAGE, 10 * PAGE, 1 | 2, (long)A(40));
    expect_splits(0, 20, NULL, 0);
    uintptr_t moved[] = {40, 50};
    expect_splits(36, 54, moved, 2);
    /* MREMAP_DONTUNMAP keeps the old place mapped, and its bounds. */
    mapping_bounds_note_mapped(&bounds, A(60), A(64));
    remap(A(60), 4 * PAGE, 4 * PAGE, 1 | 2 | 4, (long)A(70));
    uintptr_t both[] = {60, 64, 70, 74};
    expect_splits(58, 76, both, 4);
}

static void *map_at_zero(void *argument)
{
    (void)argument;
    mapping_bounds_note_mapped(&bounds, A(0), A(4));
    return NULL;
}

/* A mapping another thread makes in the range a move freed notes its marks
 * after the move's: the marks' lock is held from before the call to after
 * it, so the move cannot wipe them. */
Test(mapping_bounds, a_mapping_in_the_range_a_move_freed_keeps_its_bounds)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(8));
    struct mapping_bounds_remap token;
    mapping_bounds_remap_begin(&bounds, &token, A(0), 8 * PAGE, PAGE);
    /* The kernel moved it to A(100); another thread's mmap lands at A(0)
     * and notes it while the move still holds the lock. */
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, map_at_zero, NULL), 0);
    mapping_bounds_remap_end(&bounds, &token, (long)A(100), 8 * PAGE, 1, PAGE);
    pthread_join(thread, NULL);
    uintptr_t kept[] = {0, 4};
    expect_splits(0, 10, kept, 2);
    uintptr_t moved[] = {100, 108};
    expect_splits(98, 110, moved, 2);
}

/* munmap of tracked pages, with the marks' lock held around the call: the
 * marks the range owned go when it succeeded, and only then; a mapping
 * another thread places in the freed range keeps its marks. */
Test(mapping_bounds, an_unmapping_clears_its_bounds_with_the_call)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(8));
    mapping_bounds_note_mapped(&bounds, A(8), A(16));
    struct mapping_bounds_unmap token;
    mapping_bounds_unmap_begin(&bounds, &token, A(0), A(8));
    mapping_bounds_unmap_end(&bounds, &token, false); /* the call failed */
    uintptr_t all[] = {0, 8, 16};
    expect_splits(0, 18, all, 3);
    mapping_bounds_unmap_begin(&bounds, &token, A(0), A(8));
    /* The kernel unmapped it; another thread's mmap lands at A(0) and notes
     * it while the unmapping still holds the lock. */
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, map_at_zero, NULL), 0);
    mapping_bounds_unmap_end(&bounds, &token, true);
    pthread_join(thread, NULL);
    uintptr_t kept[] = {0, 4, 8, 16};
    expect_splits(0, 18, kept, 4);
    /* Without the other thread's: the second mapping's start stays. */
    mapping_bounds_unmap_begin(&bounds, &token, A(0), A(4));
    mapping_bounds_unmap_end(&bounds, &token, true);
    uintptr_t left[] = {8, 16};
    expect_splits(0, 18, left, 2);
    cr_assert_eq(__atomic_load_n(&bounds.lock, __ATOMIC_RELAXED), 0);
}

/* A move of several mappings at once (Linux 6.17): the bounds inside come
 * along, at the same offsets. */
Test(mapping_bounds, a_move_of_several_mappings_keeps_the_bounds_inside)
{
    mapping_bounds_note_mapped(&bounds, A(0), A(4));
    mapping_bounds_note_mapped(&bounds, A(4), A(10));
    remap(A(0), 10 * PAGE, 10 * PAGE, 1 | 2, (long)A(50));
    uintptr_t moved[] = {50, 54, 60};
    expect_splits(48, 62, moved, 3);
    expect_splits(0, 12, NULL, 0);
}

/* The next split in a range, as the engine asks when it tracks new pages. */
Test(mapping_bounds, the_next_split_in_a_range)
{
    cr_assert_eq(mapping_bounds_next_split(&bounds, A(0), A(10)), A(10), "nothing noted");
    mapping_bounds_note_mapped(&bounds, A(0), A(4));
    mapping_bounds_note_mapped(&bounds, A(4), A(9));
    cr_assert_eq(mapping_bounds_next_split(&bounds, A(0), A(20)), A(4));
    cr_assert_eq(mapping_bounds_next_split(&bounds, A(4), A(20)), A(9));
    cr_assert_eq(mapping_bounds_next_split(&bounds, A(9), A(20)), A(20));
    cr_assert_eq(mapping_bounds_next_split(NULL, A(0), A(20)), A(20));
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
