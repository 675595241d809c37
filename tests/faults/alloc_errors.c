/* Allocation calls that must fail, and how: posix_memalign with sizes no
 * allocator can give and with invalid alignments (the result, and whether
 * *memptr was left alone), aligned_alloc, memalign and valloc the same (the
 * pointer or NULL, errno, the alignment asked honoured: the shim rounds and
 * aligns large requests, never changes the answer), realloc/reallocarray that cannot grow a locked
 * block (NULL, errno, the block intact). Prints everything for comparison
 * with and without the shim. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <sys/mman.h>

static void try_posix_memalign(const char *label, size_t alignment, size_t size)
{
    void *sentinel = (void *)(uintptr_t)0x5eed;
    void *memory = sentinel;
    errno = 1234;
    int result = posix_memalign(&memory, alignment, size);
    int error = errno;
    printf("posix_memalign %-26s -> %d (%s), memptr %s, errno %d\n", label, result,
           result ? strerror(result) : "ok",
           memory == sentinel ? "untouched" : (memory == NULL ? "NULL" : "set"), error);
    if (result == 0 && memory != sentinel)
        free(memory);
}

/* Whether the answer honours the alignment asked (rounded up to a power of
 * two, as glibc does): the same with and without the shim, which only ever
 * aligns more. */
static int honours(const void *memory, size_t alignment)
{
    size_t power = 1;
    while (power < alignment)
        power <<= 1;
    return ((uintptr_t)memory & (power - 1)) == 0;
}

static void report_aligned(const char *name, const char *label, void *memory, int error,
                           size_t alignment)
{
    printf("%s %-22s -> %s, errno %d, alignment honoured %d\n", name, label,
           memory == NULL ? "NULL" : "block", memory == NULL ? error : 0,
           memory != NULL && honours(memory, alignment));
    free(memory);
}

static void try_aligned_alloc(const char *label, size_t alignment, size_t size)
{
    errno = 1234;
    void *memory = aligned_alloc(alignment, size);
    report_aligned("aligned_alloc", label, memory, errno, alignment);
}

static void try_memalign(const char *label, size_t alignment, size_t size)
{
    errno = 1234;
    void *memory = memalign(alignment, size);
    report_aligned("memalign", label, memory, errno, alignment);
}

static void try_valloc(const char *label, size_t size)
{
    errno = 1234;
    void *memory = valloc(size);
    report_aligned("valloc", label, memory, errno, 4096);
}

int main(void)
{
    volatile size_t too_large = SIZE_MAX / 2; /* hidden from the compiler's size checks */
    try_aligned_alloc("(64, SIZE_MAX / 2)", 64, too_large);
    try_aligned_alloc("(3, 1 MiB)", 3, (size_t)1 << 20);
    try_aligned_alloc("(4, 1 MiB)", 4, (size_t)1 << 20);
    try_aligned_alloc("(64, 8 MiB)", 64, (size_t)8 << 20);
    try_aligned_alloc("(64, 1 MiB + 1)", 64, ((size_t)1 << 20) + 1);
    try_memalign("(64, SIZE_MAX / 2)", 64, too_large);
    try_memalign("(3, 1 MiB)", 3, (size_t)1 << 20);
    try_memalign("(24, 8 MiB)", 24, (size_t)8 << 20);
    try_memalign("(4096, 8 MiB)", 4096, (size_t)8 << 20);
    try_valloc("(SIZE_MAX / 2)", too_large);
    try_valloc("(1 MiB + 1)", ((size_t)1 << 20) + 1);
    try_valloc("(8 MiB)", (size_t)8 << 20);

    try_posix_memalign("(64, SIZE_MAX)", 64, SIZE_MAX);
    try_posix_memalign("(64, SIZE_MAX / 2)", 64, SIZE_MAX / 2);
    try_posix_memalign("(4096, SIZE_MAX - 4095)", 4096, SIZE_MAX - 4095);
    try_posix_memalign("(4096, 1 << 46)", 4096, (size_t)1 << 46);
    try_posix_memalign("(1 << 40, 1 MiB)", (size_t)1 << 40, (size_t)1 << 20);
    try_posix_memalign("(0, 1 MiB)", 0, (size_t)1 << 20);
    try_posix_memalign("(3, 1 MiB)", 3, (size_t)1 << 20);
    try_posix_memalign("(24, 1 MiB)", 24, (size_t)1 << 20);
    try_posix_memalign("(4, 1 MiB)", 4, (size_t)1 << 20);
    try_posix_memalign("(12288, 1 MiB)", 12288, (size_t)1 << 20);
    try_posix_memalign("(64, 0)", 64, 0);

    /* A locked block that cannot grow stays valid, locked and registered. */
    size_t size = (size_t)1 << 20;
    unsigned char *block = NULL;
    if (posix_memalign((void **)&block, 64, size) != 0)
        return 1;
    memset(block, 0x42, size);
    printf("mlock %d\n", mlock(block, size));
    volatile size_t huge = SIZE_MAX / 2; /* hidden from the compiler's size checks */
    errno = 0;
    void *grown = realloc(block, huge);
    printf("realloc huge -> %s, errno %s\n", grown ? "block" : "NULL",
           errno == ENOMEM ? "ENOMEM" : strerror(errno));
    errno = 0;
    grown = reallocarray(block, huge, 4);
    printf("reallocarray overflow -> %s, errno %s\n", grown ? "block" : "NULL",
           errno == ENOMEM ? "ENOMEM" : strerror(errno));
    size_t intact = 0;
    for (size_t i = 0; i < size; i++)
        intact += block[i] == 0x42;
    printf("block intact %s\n", intact == size ? "yes" : "no");
    printf("munlock %d\n", munlock(block, size));
    free(block);
    return 0;
}
