/* Block extent: glibc's chunk header as the source of a block's end, and the
 * checks that decide when the shim may use it. */
#include "block_extent.h"

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* The sanitizers bring their own allocator: glibc's header is not there. */
static void skip_unless_glibc_allocator(void)
{
    if (SANITIZED)
        cr_skip_test("the sanitizer's allocator replaces glibc's");
}

static void expect_header_end(void *block, const char *what, size_t size)
{
    cr_assert_not_null(block, "%s %zu", what, size);
    uintptr_t expected = (uintptr_t)block + malloc_usable_size(block);
    cr_assert_eq(block_extent_glibc_end(block), expected,
                 "%s of %zu: header says %#lx, "
                 "malloc_usable_size %#lx",
                 what, size, (unsigned long)block_extent_glibc_end(block), (unsigned long)expected);
}

Test(block_extent, glibc_header_gives_the_usable_end_of_every_kind_of_block)
{
    skip_unless_glibc_allocator();
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 3000; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        /* Mostly small, some past the mmap threshold (128 KiB by default). */
        size_t size = 1 + (size_t)(state % (i % 10 == 0 ? 600000 : 5000));
        void *plain = malloc(size);
        expect_header_end(plain, "malloc", size);
        void *zeroed = calloc(1, size);
        expect_header_end(zeroed, "calloc", size);
        void *aligned = NULL;
        cr_assert_eq(posix_memalign(&aligned, (size_t)64 << (state % 7), size), 0);
        expect_header_end(aligned, "posix_memalign", size);
        void *grown = realloc(plain, size * 2);
        expect_header_end(grown, "realloc", size * 2);
        free(grown);
        free(zeroed);
        free(aligned);
    }
    void *huge = malloc((size_t)40 << 20); /* always mmapped */
    expect_header_end(huge, "malloc", (size_t)40 << 20);
    free(huge);
}

Test(block_extent, this_test_runs_on_glibc_allocator_unless_sanitized)
{
    cr_assert_eq(block_extent_allocator_is_glibc(), !SANITIZED);
}

/* The allocator the checks are handed: glibc's through wrappers, optionally
 * with a usable size that lies or a malloc that fails. */
static size_t usable_lie;
static int malloc_fails_after = -1;
static bool tag_pointers; /* top byte set, as AArch64 memory tagging does */

#define TAG ((uintptr_t)0x5A << 56)

static void *untagged(void *block)
{
    return (void *)((uintptr_t)block & ~((uintptr_t)0xFF << 56));
}

static void *test_malloc(size_t size)
{
    if (malloc_fails_after == 0)
        return NULL;
    if (malloc_fails_after > 0)
        malloc_fails_after--;
    void *block = malloc(size);
    return tag_pointers && block != NULL ? (void *)((uintptr_t)block | TAG) : block;
}
static int test_posix_memalign(void **out, size_t alignment, size_t size)
{
    return posix_memalign(out, alignment, size);
}
static void test_free(void *block)
{
    free(untagged(block));
}
static size_t test_usable_size(void *block)
{
    return malloc_usable_size(untagged(block)) + usable_lie;
}

static const struct block_extent_allocator test_allocator = {
    .malloc = test_malloc,
    .posix_memalign = test_posix_memalign,
    .free = test_free,
    .usable_size = test_usable_size,
};

static void reset_allocator(void)
{
    usable_lie = 0;
    malloc_fails_after = -1;
    tag_pointers = false;
}

TestSuite(block_extent_checks, .init = reset_allocator);

Test(block_extent_checks, header_agrees_with_glibc)
{
    skip_unless_glibc_allocator();
    cr_assert(block_extent_glibc_header_agrees(&test_allocator));
    cr_assert_eq(block_extent_choose(&test_allocator), BLOCK_EXTENT_GLIBC_HEADER);
}

Test(block_extent_checks, a_usable_size_the_header_does_not_give_keeps_the_call)
{
    skip_unless_glibc_allocator();
    usable_lie = 16;
    cr_assert_not(block_extent_glibc_header_agrees(&test_allocator));
    cr_assert_eq(block_extent_choose(&test_allocator), BLOCK_EXTENT_ALLOCATOR_CALL);
}

Test(block_extent_checks, a_failing_allocation_keeps_the_call)
{
    skip_unless_glibc_allocator();
    malloc_fails_after = 3;
    cr_assert_not(block_extent_glibc_header_agrees(&test_allocator));
    cr_assert_eq(block_extent_choose(&test_allocator), BLOCK_EXTENT_ALLOCATOR_CALL);
}

/* On x86-64 a tagged pointer is not even canonical: reading through it would
 * crash, so passing shows the check looks at the tag first. */
Test(block_extent_checks, tagged_pointers_keep_the_call_without_reading_the_header)
{
    skip_unless_glibc_allocator();
    tag_pointers = true;
    cr_assert_not(block_extent_glibc_header_agrees(&test_allocator));
    cr_assert_eq(block_extent_choose(&test_allocator), BLOCK_EXTENT_ALLOCATOR_CALL);
}

Test(block_extent_checks, sanitized_allocators_keep_the_call)
{
    if (!SANITIZED)
        cr_skip_test("glibc's allocator is in use");
    cr_assert_eq(block_extent_choose(&test_allocator), BLOCK_EXTENT_ALLOCATOR_CALL);
}

Test(block_extent, source_names)
{
    cr_assert_str_eq(block_extent_source_name(BLOCK_EXTENT_GLIBC_HEADER), "glibc-header");
    cr_assert_str_eq(block_extent_source_name(BLOCK_EXTENT_ALLOCATOR_CALL), "malloc_usable_size");
    cr_assert_str_eq(block_extent_source_name(BLOCK_EXTENT_NOT_CHOSEN), "unused");
}

static void *return_argument(void *argument)
{
    return argument;
}

/* Issue 37: where the checks run follows what glibc's malloc believes. Once
 * a thread has been started glibc counts the process as threaded for good
 * (the single-threaded answer is the preload scenario single_threaded's,
 * in a process of its own). */
Test(block_extent, a_process_that_started_a_thread_is_threaded)
{
    /* Before glibc 2.32 the shim counts threads instead: one again here. */
    if (dlsym(RTLD_DEFAULT, "__libc_single_threaded") == NULL)
        cr_skip_test("glibc before 2.32 has no __libc_single_threaded");
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, return_argument, NULL), 0);
    cr_assert_eq(pthread_join(thread, NULL), 0);
    cr_assert_not(block_extent_glibc_single_threaded());
}
