/* Block extent: the checks that decide whether glibc's chunk header may stand
 * in for malloc_usable_size (see block_extent.h). */
#include "block_extent.h"

#include "io.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool in_libc(void *symbol, const void **base)
{
    Dl_info info;
    if (symbol == NULL || dladdr(symbol, &info) == 0 || info.dli_fname == NULL)
        return false;
    const char *name = strrchr(info.dli_fname, '/');
    name = name != NULL ? name + 1 : info.dli_fname;
    if (strncmp(name, "libc.so", 7) != 0)
        return false;
    if (*base != NULL && *base != info.dli_fbase)
        return false;
    *base = info.dli_fbase;
    return true;
}

/* valgrind's memcheck, helgrind, drd, massif and dhat replace malloc by
 * redirecting glibc's own entry points, so the symbols still point into libc
 * while the blocks are valgrind's. Each loads its vgpreload_<tool> object;
 * vgpreload_core alone (callgrind, cachegrind) leaves glibc's malloc in place. */
static int find_redirecting_tool(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *tool = info->dlpi_name != NULL ? strstr(info->dlpi_name, "vgpreload_") : NULL;
    if (tool != NULL && strncmp(tool, "vgpreload_core", 14) != 0) {
        *(bool *)found = true;
        return 1;
    }
    return 0;
}

bool block_extent_allocator_is_glibc(void)
{
    /* What hands out the blocks the program frees: first in the global scope
     * (the shim exports none of these). A non-PIE program's canonical PLT entry
     * is not libc's and fails the check: the call stays, nothing breaks. */
    static const char *const allocating[] = {"malloc", "calloc", "malloc_usable_size"};
    /* What the shim forwards to: the next definitions after it. */
    static const char *const forwarded[] = {
        "free",     "realloc", "posix_memalign",    "aligned_alloc",
        "memalign", "valloc",  "malloc_usable_size"};
    const void *base = NULL;
    for (size_t i = 0; i < sizeof(allocating) / sizeof(allocating[0]); i++)
        if (!in_libc(dlsym(RTLD_DEFAULT, allocating[i]), &base))
            return false;
    for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++)
        if (!in_libc(dlsym(RTLD_NEXT, forwarded[i]), &base))
            return false;
    bool tool = false;
    dl_iterate_phdr(find_redirecting_tool, &tool);
    return !tool;
}

bool block_extent_glibc_header_agrees(const struct block_extent_allocator *allocator)
{
    /* Small and large bins, and one mmapped chunk: above glibc's largest dynamic
     * mmap threshold (32 MiB), so freeing it does not move the threshold and
     * the program's heap behaves as it would without the check. */
    static const size_t sizes[] = {1,    8,    24,    25,    100,    1000,
                                   4000, 4096, 10000, 65536, 100000, 40u << 20};
    /* Page-aligned blocks as posix_memalign's rounding makes them
     * (block_extent_round_to_pages): aligned to the process's page (were
     * sysconf to fail, the huge alignment would fail the check, keeping the
     * call). */
    size_t page_alignment = (size_t)sysconf(_SC_PAGESIZE);
    bool agrees = true;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && agrees; i++) {
        /* The mmapped block once, plain: an aligned one would map 40 MiB more. */
        int kinds = sizes[i] < ((size_t)1 << 20) ? 2 : 1;
        for (int aligned = 0; aligned < kinds && agrees; aligned++) {
            void *block = NULL;
            if (aligned) {
                if (allocator->posix_memalign(&block, page_alignment, sizes[i]) != 0)
                    block = NULL;
            } else {
                block = allocator->malloc(sizes[i]);
            }
            if (block == NULL)
                return false;
            /* A tagged pointer (AArch64 memory tagging, glibc.mem.tagging) gives the
             * header a different tag than the block: reading it would fault. */
            if ((uintptr_t)block >> 56 != 0) {
                allocator->free(block);
                return false;
            }
            size_t usable = allocator->usable_size(block);
            agrees =
                usable >= sizes[i] && block_extent_glibc_end(block) == (uintptr_t)block + usable;
            allocator->free(block);
        }
    }
    return agrees;
}

/* The number of threads (field 20 of /proc/self/stat), or 0. */
static long process_thread_count(void)
{
    char stat[1024];
    if (!read_small_file("/proc/self/stat", stat, sizeof(stat)))
        return 0;
    const char *field = proc_stat_field(stat, 20);
    return field != NULL ? strtol(field, NULL, 10) : 0;
}

bool block_extent_glibc_single_threaded(void)
{
    /* dlsym only where the symbol exists: a failed lookup allocates its
     * error message on older glibc. */
    char *rest = NULL;
    long major = strtol(gnu_get_libc_version(), &rest, 10);
    long minor = rest != NULL && *rest == '.' ? strtol(rest + 1, NULL, 10) : 0;
    if (major > 2 || (major == 2 && minor >= 32)) {
        const char *flag = dlsym(RTLD_DEFAULT, "__libc_single_threaded");
        if (flag != NULL)
            return *(const volatile char *)flag != 0;
    }
    return process_thread_count() == 1;
}

enum block_extent_source block_extent_choose(const struct block_extent_allocator *allocator)
{
    if (block_extent_allocator_is_glibc() && block_extent_glibc_header_agrees(allocator))
        return BLOCK_EXTENT_GLIBC_HEADER;
    return BLOCK_EXTENT_ALLOCATOR_CALL;
}

const char *block_extent_source_name(enum block_extent_source source)
{
    switch (source) {
    case BLOCK_EXTENT_GLIBC_HEADER:
        return "glibc-header";
    case BLOCK_EXTENT_ALLOCATOR_CALL:
        return "malloc_usable_size";
    default:
        return "unused";
    }
}

bool block_extent_round_to_pages(size_t page_size, size_t threshold, size_t *alignment,
                                 size_t *size)
{
    bool valid_alignment =
        *alignment != 0 && (*alignment & (*alignment - 1)) == 0 && *alignment % sizeof(void *) == 0;
    if (*size < threshold || !valid_alignment)
        return false;
    size_t rounded = (*size + page_size - 1) & ~(page_size - 1);
    if (rounded < *size)
        return false; /* wrapped */
    if (*alignment < page_size)
        *alignment = page_size;
    *size = rounded;
    return true;
}

int block_extent_chosen_source = BLOCK_EXTENT_NOT_CHOSEN;
int block_extent_choice_state;

void block_extent_after_fork_child(void)
{
    int choosing = 1;
    __atomic_compare_exchange_n(&block_extent_choice_state, &choosing, 0, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
}
