/* Huge pages for memory about to be locked (issue 36, src/huge_pages.h).
 *
 * The rule runs against a memory double at the page and PMD sizes of the
 * kernels the shim meets: 4 KiB pages with 2 MiB PMDs (x86-64, most aarch64),
 * 16 KiB with 32 MiB, 64 KiB with 512 MiB (aarch64 kernels of GH200 and
 * GB200 nodes). The kernel's settings come from sysfs folders the tests
 * write. The last tests use this machine's kernel as it is: where it makes
 * huge pages (THP madvise, Linux 6.1 and later) they check what it made and
 * that the mapping's flags stayed as they were; elsewhere, that nothing was
 * made. */
#include "huge_pages.h"
#include "memory_map.h"
#include "smaps.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB ((uintptr_t)1024)
#define MIB (KIB * KIB)

struct geometry {
    size_t page, pmd;
    unsigned order;
};

static const struct geometry geometries[] = {
    {4 * KIB, 2 * MIB, 9},
    {16 * KIB, 32 * MIB, 11},
    {64 * KIB, 512 * MIB, 13},
};

/* ---- the memory double ---- */

#define MAX_CALLS 64

struct memory_double {
    size_t pmd;
    uintptr_t resident[8]; /* chunks that have a page */
    size_t resident_count;
    int refuse;                   /* make_huge answers this errno */
    uint64_t nanoseconds_per_mib; /* what making a MiB huge costs */
    uint64_t slow_calls;          /* the first this many calls cost 20x */
    uint64_t clock;
    struct {
        uintptr_t start, end;
    } calls[MAX_CALLS];
    size_t call_count;
};

static bool double_empty(void *context, uintptr_t start, size_t length)
{
    struct memory_double *memory = context;
    for (size_t i = 0; i < memory->resident_count; i++)
        if (memory->resident[i] >= start && memory->resident[i] < start + length)
            return false;
    return true;
}

static int double_make_huge(void *context, uintptr_t start, uintptr_t end, size_t pmd_size)
{
    struct memory_double *memory = context;
    cr_assert_eq(pmd_size, memory->pmd);
    cr_assert_eq(start % pmd_size, 0, "a batch starts at a chunk");
    cr_assert_eq(end % pmd_size, 0, "a batch ends at a chunk");
    cr_assert_lt(memory->call_count, MAX_CALLS);
    memory->calls[memory->call_count].start = start;
    memory->calls[memory->call_count].end = end;
    uint64_t cost = (end - start) / MIB * memory->nanoseconds_per_mib;
    if (memory->call_count < memory->slow_calls)
        cost *= 20;
    memory->call_count++;
    memory->clock += cost;
    return memory->refuse;
}

static uint64_t double_now(void *context)
{
    return ((struct memory_double *)context)->clock;
}

static void run_plan(struct memory_double *memory, uintptr_t start, uintptr_t end,
                     uint64_t free_chunks, struct huge_pages_plan *plan)
{
    struct huge_pages_memory seam = {double_empty, double_make_huge, double_now, memory};
    huge_pages_plan(start, end, memory->pmd, free_chunks, HUGE_PAGES_BATCH_BYTES, &seam, plan);
}

/* 150 us a MiB: 6.5 GiB/s, above the slowest rate. */
#define FAST_NS_PER_MIB 150000

/* ---- the rule ---- */

Test(huge_pages, only_whole_aligned_chunks_are_made_huge_in_batches)
{
    for (size_t g = 0; g < sizeof(geometries) / sizeof(geometries[0]); g++) {
        const struct geometry *geometry = &geometries[g];
        struct memory_double memory = {.pmd = geometry->pmd,
                                       .nanoseconds_per_mib = FAST_NS_PER_MIB};
        /* A range that starts one page past a chunk and ends one page into the
         * ninth: chunks 1..8 lie inside it whole. */
        uintptr_t base = (uintptr_t)1 << 40;
        uintptr_t start = base + geometry->page, end = base + 9 * geometry->pmd + geometry->page;
        struct huge_pages_plan plan;
        run_plan(&memory, start, end, UINT64_MAX, &plan);
        cr_assert_eq(plan.made, 8 * geometry->pmd, "page %zu", geometry->page);
        cr_assert_eq(plan.had_pages + plan.no_block + plan.refused + plan.stopped, 0);
        cr_assert_not(plan.slow);
        /* Batches of 16 MiB (8 chunks of 2 MiB: one call), or one chunk where
         * a chunk is as large or larger (32 and 512 MiB: eight calls). */
        size_t per_batch = geometry->pmd >= HUGE_PAGES_BATCH_BYTES
                               ? 1
                               : (size_t)(HUGE_PAGES_BATCH_BYTES / geometry->pmd);
        size_t batches = (8 + per_batch - 1) / per_batch;
        cr_assert_eq(memory.call_count, batches, "page %zu: %zu calls", geometry->page,
                     memory.call_count);
        cr_assert_eq(memory.calls[0].start, base + geometry->pmd);
        cr_assert_eq(memory.calls[memory.call_count - 1].end, base + 9 * geometry->pmd);
        for (size_t i = 1; i < memory.call_count; i++)
            cr_assert_eq(memory.calls[i].start, memory.calls[i - 1].end, "batches in order");
    }
}

Test(huge_pages, a_range_without_a_whole_chunk_is_left_alone)
{
    for (size_t g = 0; g < sizeof(geometries) / sizeof(geometries[0]); g++) {
        const struct geometry *geometry = &geometries[g];
        struct memory_double memory = {.pmd = geometry->pmd,
                                       .nanoseconds_per_mib = FAST_NS_PER_MIB};
        uintptr_t base = (uintptr_t)1 << 40;
        struct huge_pages_plan plan;
        /* Almost two chunks, straddling a boundary: no chunk whole. */
        run_plan(&memory, base + geometry->page, base + 2 * geometry->pmd - geometry->page,
                 UINT64_MAX, &plan);
        cr_assert_eq(plan.made + plan.had_pages + plan.no_block, 0);
        cr_assert_eq(memory.call_count, 0);
        /* At the top of the address space: no overflow. */
        run_plan(&memory, UINTPTR_MAX - geometry->page + 1, UINTPTR_MAX, UINT64_MAX, &plan);
        cr_assert_eq(memory.call_count, 0);
    }
}

Test(huge_pages, chunks_with_pages_are_left_alone_and_cut_the_batches)
{
    for (size_t g = 0; g < sizeof(geometries) / sizeof(geometries[0]); g++) {
        const struct geometry *geometry = &geometries[g];
        uintptr_t base = (uintptr_t)1 << 40;
        struct memory_double memory = {.pmd = geometry->pmd,
                                       .nanoseconds_per_mib = FAST_NS_PER_MIB,
                                       /* One page in chunk 2, the last page of chunk 5. */
                                       .resident = {base + 2 * geometry->pmd + 7 * geometry->page,
                                                    base + 6 * geometry->pmd - geometry->page},
                                       .resident_count = 2};
        struct huge_pages_plan plan;
        run_plan(&memory, base, base + 8 * geometry->pmd, UINT64_MAX, &plan);
        cr_assert_eq(plan.had_pages, 2 * geometry->pmd);
        cr_assert_eq(plan.made, 6 * geometry->pmd);
        for (size_t i = 0; i < memory.call_count; i++) {
            bool holds_2 = memory.calls[i].start <= base + 2 * geometry->pmd &&
                           base + 2 * geometry->pmd < memory.calls[i].end;
            bool holds_5 = memory.calls[i].start <= base + 5 * geometry->pmd &&
                           base + 5 * geometry->pmd < memory.calls[i].end;
            cr_assert_not(holds_2 || holds_5, "a chunk with pages was made huge");
        }
    }
}

Test(huge_pages, no_more_chunks_than_free_huge_blocks)
{
    for (size_t g = 0; g < sizeof(geometries) / sizeof(geometries[0]); g++) {
        const struct geometry *geometry = &geometries[g];
        struct memory_double memory = {.pmd = geometry->pmd,
                                       .nanoseconds_per_mib = FAST_NS_PER_MIB};
        uintptr_t base = (uintptr_t)1 << 40;
        struct huge_pages_plan plan;
        run_plan(&memory, base, base + 10 * geometry->pmd, 3, &plan);
        cr_assert_eq(plan.made, 3 * geometry->pmd);
        cr_assert_eq(plan.no_block, 7 * geometry->pmd);
        cr_assert_eq(memory.calls[memory.call_count - 1].end, base + 3 * geometry->pmd);
        memory.call_count = 0;
        run_plan(&memory, base, base + 10 * geometry->pmd, 0, &plan);
        cr_assert_eq(plan.made, 0);
        cr_assert_eq(plan.no_block, 10 * geometry->pmd);
        cr_assert_eq(memory.call_count, 0);
    }
}

Test(huge_pages, chunks_the_kernel_refuses_are_counted_refused)
{
    struct memory_double memory = {.pmd = 2 * MIB, .refuse = EINVAL};
    uintptr_t base = (uintptr_t)1 << 40;
    struct huge_pages_plan plan;
    run_plan(&memory, base, base + 4 * MIB, UINT64_MAX, &plan);
    cr_assert_eq(plan.refused, 4 * MIB);
    cr_assert_eq(plan.made, 0);
}

Test(huge_pages, a_slow_batch_stops_the_rest)
{
    /* The first batch costs 20 x 150 us a MiB: 0.33 GiB/s. */
    struct memory_double memory = {
        .pmd = 2 * MIB, .nanoseconds_per_mib = FAST_NS_PER_MIB, .slow_calls = 1};
    uintptr_t base = (uintptr_t)1 << 40;
    struct huge_pages_plan plan;
    run_plan(&memory, base, base + 256 * MIB, UINT64_MAX, &plan);
    cr_assert(plan.slow);
    cr_assert_eq(memory.call_count, 1);
    cr_assert_eq(plan.made, HUGE_PAGES_BATCH_BYTES);
    cr_assert_eq(plan.stopped, 256 * MIB - HUGE_PAGES_BATCH_BYTES);
    cr_assert_lt(plan.slow_bytes_per_second, HUGE_PAGES_SLOWEST_BYTES_PER_SECOND);
    /* Fast batches go on. */
    memory = (struct memory_double){.pmd = 2 * MIB, .nanoseconds_per_mib = FAST_NS_PER_MIB};
    run_plan(&memory, base, base + 256 * MIB, UINT64_MAX, &plan);
    cr_assert_not(plan.slow);
    cr_assert_eq(plan.made, 256 * MIB);
    cr_assert_eq(memory.call_count, 256 * MIB / HUGE_PAGES_BATCH_BYTES);
}

Test(huge_pages, a_batch_too_small_to_time_never_stops_it)
{
    /* 8 MiB made at 0.33 GiB/s: below HUGE_PAGES_MEASURED_BYTES, not timed. */
    struct memory_double memory = {
        .pmd = 2 * MIB, .nanoseconds_per_mib = FAST_NS_PER_MIB, .slow_calls = 1};
    uintptr_t base = (uintptr_t)1 << 40;
    struct huge_pages_plan plan;
    run_plan(&memory, base, base + 8 * MIB, UINT64_MAX, &plan);
    cr_assert_not(plan.slow);
    cr_assert_eq(plan.made, 8 * MIB);
}

/* ---- the kernel's words ---- */

Test(huge_pages, free_blocks_are_counted_from_buddyinfo)
{
    static const char x86[] = "Node 0, zone      DMA      0      0      0      0      0      0     "
                              " 0      0      1      1      3 \n"
                              "Node 0, zone    DMA32      1      3      2      2      1      2     "
                              " 0      3      3      1    753 \n"
                              "Node 0, zone   Normal  15638  14290   7820   5788   5192   2685   "
                              "1597    971    596    358    234 \n";
    /* Order 9 and up, in order-9 blocks: (1 + 3*2) + (1 + 753*2) + (358 + 234*2). */
    cr_assert_eq(huge_pages_free_blocks(x86, 9), 7 + 1507 + 826);
    cr_assert_eq(huge_pages_free_blocks(x86, 10), 3 + 753 + 234);
    /* A 64 KiB-page kernel: 14 orders, the PMD's is 13. */
    static const char arm64[] = "Node 0, zone   Normal    120     80     40     20     10      8   "
                                "   6      4      3      2      2      1      1      5 \n"
                                "Node 1, zone   Normal      0      0      0      0      0      0   "
                                "   0      0      0      0      0      0      0      2 \n";
    cr_assert_eq(huge_pages_free_blocks(arm64, 13), 7);
    cr_assert_eq(huge_pages_free_blocks(arm64, 12), 1 + 5 * 2 + 2 * 2);
    /* No column of the order asked: none free. */
    cr_assert_eq(huge_pages_free_blocks(x86, 13), 0);
    cr_assert_eq(huge_pages_free_blocks("", 9), 0);
}

Test(huge_pages, kernel_releases_are_compared)
{
    cr_assert(huge_pages_release_at_least("6.1.0-13-amd64", 6, 1));
    cr_assert(huge_pages_release_at_least("6.18.44-fc-v1294", 6, 1));
    cr_assert(huge_pages_release_at_least("7.0", 6, 1));
    cr_assert_not(huge_pages_release_at_least("5.15.0-91-generic", 6, 1));
    cr_assert_not(huge_pages_release_at_least("4.4.0", 6, 1)); /* gVisor's */
    cr_assert_not(huge_pages_release_at_least("6.0.19", 6, 1));
    cr_assert_not(huge_pages_release_at_least("", 6, 1));
}

/* A sysfs folder as the kernel writes it; NULL leaves a file out. */
static char *fake_sysfs(const char *enabled, const char *pmd_size)
{
    char *directory = strdup("/tmp/pinshim-thp-XXXXXX");
    cr_assert_not_null(mkdtemp(directory));
    const char *names[] = {"enabled", "hpage_pmd_size"};
    const char *values[] = {enabled, pmd_size};
    for (int i = 0; i < 2; i++) {
        if (values[i] == NULL)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", directory, names[i]);
        FILE *file = fopen(path, "w");
        cr_assert_not_null(file);
        fprintf(file, "%s\n", values[i]);
        fclose(file);
    }
    return directory;
}

static void remove_sysfs(char *directory)
{
    char path[512];
    snprintf(path, sizeof(path), "rm -rf '%s'", directory);
    cr_assert_eq(system(path), 0);
    free(directory);
}

Test(huge_pages, the_kernel_settings_decide_whether_chunks_are_made)
{
    struct {
        const char *enabled, *pmd, *release;
        size_t page;
        enum huge_pages_kernel kernel;
        bool making;
    } cases[] = {
        {"always [madvise] never", "2097152", "6.18.0", 4096, HUGE_PAGES_KERNEL_MADVISE, true},
        {"always [madvise] never", "536870912", "6.8.0", 65536, HUGE_PAGES_KERNEL_MADVISE, true},
        {"[always] madvise never", "2097152", "6.18.0", 4096, HUGE_PAGES_KERNEL_ALWAYS, false},
        {"always madvise [never]", "2097152", "6.18.0", 4096, HUGE_PAGES_KERNEL_NEVER, false},
        {"always [madvise] never", "2097152", "5.15.0", 4096, HUGE_PAGES_KERNEL_TOO_OLD, false},
        {NULL, "2097152", "6.18.0", 4096, HUGE_PAGES_KERNEL_ABSENT, false},
        {"always [madvise] never", NULL, "6.18.0", 4096, HUGE_PAGES_KERNEL_ABSENT, false},
        {"always [madvise] never", "3000000", "6.18.0", 4096, HUGE_PAGES_KERNEL_ABSENT, false},
        {"nonsense", "2097152", "6.18.0", 4096, HUGE_PAGES_KERNEL_ABSENT, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *directory = fake_sysfs(cases[i].enabled, cases[i].pmd);
        struct huge_pages huge;
        huge_pages_init(&huge, true, directory, "/proc/buddyinfo", cases[i].release, cases[i].page);
        cr_assert_eq(huge.kernel, cases[i].kernel, "case %zu: %s", i,
                     huge_pages_kernel_name(huge.kernel));
        cr_assert_eq(huge_pages_making(&huge), cases[i].making, "case %zu", i);
        /* The option off: never, whatever the kernel. */
        huge_pages_init(&huge, false, directory, "/proc/buddyinfo", cases[i].release,
                        cases[i].page);
        cr_assert_not(huge_pages_making(&huge));
        remove_sysfs(directory);
    }
}

Test(huge_pages, large_aligned_allocations_are_aligned_to_the_pmd)
{
    for (size_t g = 0; g < sizeof(geometries) / sizeof(geometries[0]); g++) {
        const struct geometry *geometry = &geometries[g];
        char pmd[32];
        snprintf(pmd, sizeof(pmd), "%zu", geometry->pmd);
        char *directory = fake_sysfs("always [madvise] never", pmd);
        struct huge_pages huge;
        huge_pages_init(&huge, true, directory, "/proc/buddyinfo", "6.18.0", geometry->page);
        cr_assert_eq(huge.pmd_order, geometry->order);
        cr_assert_eq(huge_pages_allocation_alignment(&huge, geometry->page, geometry->pmd),
                     geometry->pmd);
        cr_assert_eq(huge_pages_allocation_alignment(&huge, 64, 3 * geometry->pmd), geometry->pmd);
        /* Below one chunk, nothing to gain. */
        cr_assert_eq(huge_pages_allocation_alignment(&huge, geometry->page, geometry->pmd - 1),
                     geometry->page);
        /* A larger alignment stays. */
        cr_assert_eq(huge_pages_allocation_alignment(&huge, 2 * geometry->pmd, 4 * geometry->pmd),
                     2 * geometry->pmd);
        /* Backed off: nothing aligned. */
        huge.backed_off = 1;
        cr_assert_eq(huge_pages_allocation_alignment(&huge, geometry->page, geometry->pmd),
                     geometry->page);
        remove_sysfs(directory);
        /* THP always: nothing aligned (the kernel would put unlocked memory
         * on huge pages). */
        directory = fake_sysfs("[always] madvise never", pmd);
        huge_pages_init(&huge, true, directory, "/proc/buddyinfo", "6.18.0", geometry->page);
        cr_assert_eq(huge_pages_allocation_alignment(&huge, geometry->page, geometry->pmd),
                     geometry->page);
        remove_sysfs(directory);
    }
}

/* ---- this machine's kernel ---- */

/* The kernel's THP settings, as the shim reads them. */
static void this_kernel(struct huge_pages *huge)
{
    huge_pages_init(huge, true, "/sys/kernel/mm/transparent_hugepage", "/proc/buddyinfo", NULL,
                    (size_t)sysconf(_SC_PAGESIZE));
}

/* An anonymous mapping of chunks PMD chunks, PMD-aligned. */
static uintptr_t map_chunks(size_t pmd, size_t chunks)
{
    size_t length = (chunks + 1) * pmd;
    void *mapping = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(mapping, MAP_FAILED);
    uintptr_t start = ((uintptr_t)mapping + pmd - 1) & ~(uintptr_t)(pmd - 1);
    if (start > (uintptr_t)mapping)
        munmap(mapping, start - (uintptr_t)mapping);
    munmap((void *)(start + chunks * pmd), (uintptr_t)mapping + length - (start + chunks * pmd));
    return start;
}

/* Whether any mapping of [start, end) carries VmFlags "hg" (MADV_HUGEPAGE). */
static bool flagged_huge(uintptr_t start, uintptr_t end)
{
    unsigned long long huge_bytes;
    bool flagged;
    cr_assert(smaps_huge_pages(start, end, &huge_bytes, &flagged), "/proc/self/smaps");
    return flagged;
}

Test(huge_pages, this_kernel_makes_chunks_huge_without_flagging_the_mapping)
{
    struct huge_pages huge;
    this_kernel(&huge);
    if (huge.pmd_size == 0 || huge.pmd_size > 64 * MIB)
        cr_skip_test("no PMD size this test can map (%s)", huge_pages_kernel_name(huge.kernel));
    size_t chunks = 4;
    uintptr_t start = map_chunks(huge.pmd_size, chunks);
    uintptr_t end = start + chunks * huge.pmd_size;
    struct huge_pages_lock lock;
    huge_pages_before_lock(&huge, start, end - start, true, &lock);
    cr_assert(lock.has_chunk);
    struct huge_pages_plan *plan = &lock.plan;
    /* Every chunk is accounted for once. */
    cr_assert_eq(plan->made + plan->had_pages + plan->no_block + plan->refused + plan->stopped,
                 huge_pages_making(&huge) || plan->slow ? end - start : 0);
    cr_assert_eq(plan->had_pages, 0, "the mapping had no page");
    if (mlock((void *)start, end - start) != 0)
        cr_skip_test("mlock: %s (RLIMIT_MEMLOCK)", strerror(errno));
    struct huge_pages_outcome outcome;
    huge_pages_after_lock(&huge, &lock, true, &outcome);
    cr_assert_eq(outcome.huge_bytes + outcome.small_bytes + outcome.unknown_bytes, end - start);
    if (outcome.unknown_bytes == 0) {
        /* Under THP madvise the lock's own faults are small: every huge page
         * is one the shim made. */
        if (huge.kernel == HUGE_PAGES_KERNEL_MADVISE)
            cr_assert_eq(outcome.huge_bytes, plan->made, "huge %llu, made %llu",
                         (unsigned long long)outcome.huge_bytes, (unsigned long long)plan->made);
        if (huge.kernel == HUGE_PAGES_KERNEL_NEVER || huge.kernel == HUGE_PAGES_KERNEL_ABSENT)
            cr_assert_eq(outcome.huge_bytes, 0);
    }
    cr_assert_not(flagged_huge(start, end), "the shim left MADV_HUGEPAGE's flag on the mapping");
    /* The bytes stayed zero, and the memory is the program's as before. */
    for (uintptr_t at = start; at < end; at += 4096)
        cr_assert_eq(*(volatile char *)at, 0);
    munlock((void *)start, end - start);
    /* One mapping still: mremap of the whole of it works, as without the shim. */
    void *moved = mremap((void *)start, end - start, 2 * (end - start), MREMAP_MAYMOVE);
    cr_assert_neq(moved, MAP_FAILED, "mremap: %s", strerror(errno));
    munmap(moved, 2 * (end - start));
}

Test(huge_pages, memory_with_pages_shared_memory_and_onfault_locks_are_left_alone)
{
    struct huge_pages huge;
    this_kernel(&huge);
    if (huge.pmd_size == 0 || huge.pmd_size > 64 * MIB)
        cr_skip_test("no PMD size this test can map (%s)", huge_pages_kernel_name(huge.kernel));
    size_t length = 2 * huge.pmd_size;
    /* Every chunk has a page. */
    uintptr_t start = map_chunks(huge.pmd_size, 2);
    for (uintptr_t at = start; at < start + length; at += huge.pmd_size)
        *(volatile char *)(at + huge.pmd_size / 2) = 1;
    struct huge_pages_lock lock;
    huge_pages_before_lock(&huge, start, length, true, &lock);
    cr_assert_eq(lock.plan.made, 0);
    if (huge_pages_making(&huge))
        cr_assert_eq(lock.plan.had_pages, length);
    munmap((void *)start, length);
    /* MLOCK_ONFAULT: nothing made, nothing counted. */
    start = map_chunks(huge.pmd_size, 2);
    huge_pages_before_lock(&huge, start, length, false, &lock);
    cr_assert_eq(lock.plan.made + lock.plan.had_pages + lock.plan.no_block, 0);
    struct huge_pages_outcome outcome;
    huge_pages_after_lock(&huge, &lock, true, &outcome);
    cr_assert_eq(outcome.huge_bytes + outcome.small_bytes + outcome.unknown_bytes, 0);
    munmap((void *)start, length);
    /* Shared memory: populating it would write the file; never made. */
    void *shared = mmap(NULL, length + huge.pmd_size, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(shared, MAP_FAILED);
    huge_pages_before_lock(&huge, (uintptr_t)shared, length + huge.pmd_size, true, &lock);
    cr_assert_eq(lock.plan.made + lock.plan.refused, 0);
    munmap(shared, length + huge.pmd_size);
}

struct parts {
    uintptr_t start[4], end[4];
    int count;
};

static void note(void *context, uintptr_t part_start, uintptr_t part_end)
{
    struct parts *found = context;
    cr_assert_lt(found->count, 4);
    found->start[found->count] = part_start;
    found->end[found->count] = part_end;
    found->count++;
}

Test(huge_pages, the_maps_tell_private_anonymous_memory)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *anonymous =
        mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(anonymous, MAP_FAILED);
    /* The middle page read-only: two parts. */
    cr_assert_eq(mprotect(anonymous + page, page, PROT_READ), 0);
    struct parts found = {{0}, {0}, 0};
    cr_assert(memory_map_private_anonymous_parts((uintptr_t)anonymous,
                                                 (uintptr_t)anonymous + 4 * page, note, &found));
    cr_assert_eq(found.count, 2);
    cr_assert_eq(found.start[0], (uintptr_t)anonymous);
    cr_assert_eq(found.end[0], (uintptr_t)anonymous + page);
    cr_assert_eq(found.start[1], (uintptr_t)anonymous + 2 * page);
    cr_assert_eq(found.end[1], (uintptr_t)anonymous + 4 * page);
    munmap(anonymous, 4 * page);
    /* A file's private mapping is not anonymous. */
    int fd = open("/proc/self/exe", O_RDONLY);
    cr_assert_geq(fd, 0);
    void *file = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    cr_assert_neq(file, MAP_FAILED);
    found.count = 0;
    cr_assert(
        memory_map_private_anonymous_parts((uintptr_t)file, (uintptr_t)file + page, note, &found));
    cr_assert_eq(found.count, 0);
    munmap(file, page);
    close(fd);
}
