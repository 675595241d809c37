#include "huge_pages.h"

#include "io.h"
#include "memory_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/* PAGEMAP_SCAN (Linux 6.7, include/uapi/linux/fs.h): older headers lack it;
 * the ABI is fixed, and an older kernel answers ENOTTY or EINVAL. */
struct huge_pages_page_region {
    uint64_t start, end, categories;
};
struct huge_pages_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define HUGE_PAGES_PAGEMAP_SCAN _IOWR('f', 16, struct huge_pages_scan_arg)
#define HUGE_PAGES_PAGE_IS_HUGE ((uint64_t)1 << 6)

/* The word in brackets of a sysfs choice ("always [madvise] never"). */
static bool chosen_word(const char *text, char *word, size_t size)
{
    const char *open_bracket = strchr(text, '[');
    const char *close_bracket = open_bracket != NULL ? strchr(open_bracket, ']') : NULL;
    if (close_bracket == NULL || (size_t)(close_bracket - open_bracket - 1) >= size)
        return false;
    size_t length = (size_t)(close_bracket - open_bracket - 1);
    memcpy(word, open_bracket + 1, length);
    word[length] = '\0';
    return true;
}

bool huge_pages_release_at_least(const char *release, unsigned major, unsigned minor)
{
    char *rest;
    unsigned long got_major = strtoul(release, &rest, 10);
    if (rest == release)
        return false;
    unsigned long got_minor = *rest == '.' ? strtoul(rest + 1, NULL, 10) : 0;
    return got_major > major || (got_major == major && got_minor >= minor);
}

void huge_pages_init(struct huge_pages *huge, bool wanted, const char *sysfs_dir,
                     const char *buddyinfo_path, const char *release, size_t page_size)
{
    memset(huge, 0, sizeof(*huge));
    huge->wanted = wanted;
    huge->page_size = page_size;
    snprintf(huge->buddyinfo_path, sizeof(huge->buddyinfo_path), "%s", buddyinfo_path);
    int saved_errno = errno;
    char path[256], text[256], word[32];
    snprintf(path, sizeof(path), "%s/enabled", sysfs_dir);
    if (!read_small_file(path, text, sizeof(text)) || !chosen_word(text, word, sizeof(word)))
        huge->kernel = HUGE_PAGES_KERNEL_ABSENT;
    else if (strcmp(word, "always") == 0)
        huge->kernel = HUGE_PAGES_KERNEL_ALWAYS;
    else if (strcmp(word, "madvise") == 0)
        huge->kernel = HUGE_PAGES_KERNEL_MADVISE;
    else
        huge->kernel = HUGE_PAGES_KERNEL_NEVER;
    snprintf(path, sizeof(path), "%s/hpage_pmd_size", sysfs_dir);
    unsigned long long pmd = 0;
    if (read_small_file(path, text, sizeof(text)))
        pmd = strtoull(text, NULL, 10);
    /* A PMD size that is not a power-of-two multiple of the page is no THP
     * the shim knows. */
    if (page_size == 0 || pmd < 2 * page_size || (pmd & (pmd - 1)) != 0) {
        huge->kernel = HUGE_PAGES_KERNEL_ABSENT;
        pmd = 0;
    }
    huge->pmd_size = (size_t)pmd;
    for (size_t pages = pmd != 0 ? pmd / page_size : 0; pages > 1; pages >>= 1)
        huge->pmd_order++;
    struct utsname name;
    if (release == NULL && uname(&name) == 0)
        release = name.release;
    if (huge->kernel == HUGE_PAGES_KERNEL_MADVISE &&
        (release == NULL || !huge_pages_release_at_least(release, 6, 1)))
        huge->kernel = HUGE_PAGES_KERNEL_TOO_OLD;
    /* PR_SET_THP_DISABLE: the kernel gives this process no huge page. */
    if (huge->kernel != HUGE_PAGES_KERNEL_ABSENT && prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1)
        huge->kernel = HUGE_PAGES_KERNEL_DISABLED;
    errno = saved_errno;
}

const char *huge_pages_kernel_name(enum huge_pages_kernel kernel)
{
    switch (kernel) {
    case HUGE_PAGES_KERNEL_NEVER:
        return "never";
    case HUGE_PAGES_KERNEL_MADVISE:
        return "madvise";
    case HUGE_PAGES_KERNEL_ALWAYS:
        return "always";
    case HUGE_PAGES_KERNEL_DISABLED:
        return "disabled";
    case HUGE_PAGES_KERNEL_TOO_OLD:
        return "madvise-without-collapse";
    case HUGE_PAGES_KERNEL_ABSENT:
        break;
    }
    return "absent";
}

bool huge_pages_making(const struct huge_pages *huge)
{
    return huge->wanted && huge->kernel == HUGE_PAGES_KERNEL_MADVISE &&
           !__atomic_load_n(&huge->backed_off, __ATOMIC_RELAXED);
}

size_t huge_pages_allocation_alignment(const struct huge_pages *huge, size_t alignment, size_t size)
{
    if (!huge_pages_making(huge) || size < huge->pmd_size || alignment >= huge->pmd_size)
        return alignment;
    return huge->pmd_size;
}

/* Makes the batch [start, end) of empty chunks huge and times it. */
static void make_batch(uintptr_t start, uintptr_t end, size_t pmd_size,
                       const struct huge_pages_memory *memory, struct huge_pages_plan *out)
{
    uint64_t began = memory->now_ns(memory->context);
    int error = memory->make_huge(memory->context, start, end, pmd_size);
    uint64_t elapsed = memory->now_ns(memory->context) - began;
    uint64_t bytes = end - start;
    if (error != 0) {
        out->refused += bytes;
        return;
    }
    out->made += bytes;
    if (bytes < HUGE_PAGES_MEASURED_BYTES)
        return;
    double rate = elapsed == 0 ? 1e30 : (double)bytes * 1e9 / (double)elapsed;
    if (rate < (double)HUGE_PAGES_SLOWEST_BYTES_PER_SECOND) {
        out->slow = true;
        out->slow_bytes_per_second = (uint64_t)rate;
    }
}

void huge_pages_plan(uintptr_t start, uintptr_t end, size_t pmd_size, uint64_t free_chunks,
                     uint64_t batch_bytes, const struct huge_pages_memory *memory,
                     struct huge_pages_plan *out)
{
    memset(out, 0, sizeof(*out));
    uintptr_t mask = (uintptr_t)pmd_size - 1;
    if (pmd_size == 0 || start > UINTPTR_MAX - mask)
        return;
    uint64_t batch_chunks = batch_bytes / pmd_size > 0 ? batch_bytes / pmd_size : 1;
    uintptr_t first = (start + mask) & ~mask, last = end & ~mask;
    uintptr_t batch_start = 0, batch_end = 0;
    for (uintptr_t chunk = first; chunk < last && chunk >= first; chunk += pmd_size) {
        bool empty = memory->empty(memory->context, chunk, pmd_size);
        if (!empty) {
            out->had_pages += pmd_size;
        } else if (out->slow) {
            out->stopped += pmd_size;
        } else if (free_chunks == 0) {
            out->no_block += pmd_size;
        } else {
            free_chunks--;
            if (batch_end != chunk)
                batch_start = chunk; /* a batch is one run of neighbours */
            batch_end = chunk + pmd_size;
            if ((batch_end - batch_start) / pmd_size < batch_chunks)
                continue;
        }
        if (batch_end > batch_start) {
            make_batch(batch_start, batch_end, pmd_size, memory, out);
            batch_start = batch_end = 0;
        }
    }
    if (batch_end > batch_start)
        make_batch(batch_start, batch_end, pmd_size, memory, out);
}

uint64_t huge_pages_free_blocks(const char *buddyinfo, unsigned order)
{
    /* "Node 0, zone   Normal   15638 14290 ... 234": counts by order from 0. */
    uint64_t blocks = 0;
    for (const char *line = buddyinfo; line != NULL && *line != '\0';) {
        const char *zone = strstr(line, "zone");
        const char *line_end = strchr(line, '\n');
        if (zone != NULL && (line_end == NULL || zone < line_end)) {
            const char *cursor = zone + 4;
            while (*cursor == ' ')
                cursor++;
            while (*cursor != '\0' && *cursor != ' ' && *cursor != '\n')
                cursor++; /* the zone's name */
            for (unsigned column = 0;; column++) {
                char *number_end;
                unsigned long long count = strtoull(cursor, &number_end, 10);
                if (number_end == cursor || (line_end != NULL && number_end > line_end))
                    break;
                if (column >= order && column - order < 63) {
                    uint64_t scaled = (uint64_t)count << (column - order);
                    blocks = blocks > UINT64_MAX - scaled ? UINT64_MAX : blocks + scaled;
                }
                cursor = number_end;
            }
        }
        line = line_end != NULL ? line_end + 1 : NULL;
    }
    return blocks;
}

/* mincore in batches that fit on the stack: a 512 MiB chunk of 64 KiB pages
 * is 8,192 pages. */
static bool range_is_empty(void *context, uintptr_t start, size_t length)
{
    const struct huge_pages *huge = context;
    unsigned char residency[1024];
    size_t batch_bytes = sizeof(residency) * huge->page_size;
    for (uintptr_t at = start; at < start + length; at += batch_bytes) {
        size_t part = start + length - at < batch_bytes ? start + length - at : batch_bytes;
        if (mincore((void *)at, part, residency) != 0)
            return false; /* not all mapped: the real lock will say so */
        for (size_t page = 0; page < (part + huge->page_size - 1) / huge->page_size; page++)
            if (residency[page] & 1)
                return false;
    }
    return true;
}

/* One small page per chunk, faulted in as a write would (no byte changes,
 * and a thread writing there meanwhile keeps what it wrote), then the
 * collapse: without a page in it the kernel refuses to collapse a chunk. */
static int make_huge(void *context, uintptr_t start, uintptr_t end, size_t pmd_size)
{
    const struct huge_pages *huge = context;
    for (uintptr_t chunk = start; chunk < end; chunk += pmd_size)
        if (madvise((void *)chunk, huge->page_size, MADV_POPULATE_WRITE) != 0)
            return errno;
    return madvise((void *)start, end - start, MADV_COLLAPSE) == 0 ? 0 : errno;
}

static uint64_t now_nanoseconds(void *context)
{
    (void)context;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* Whether RLIMIT_MEMLOCK leaves room to lock length more bytes: where it
 * does not, the lock fails, and pages made huge would stay resident. */
static bool lock_fits_limit(size_t length)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
        return true;
    /* CAP_IPC_LOCK lifts the limit (capability 14, in the first word). */
    struct {
        uint32_t version;
        int pid;
    } header = {0x20080522 /* _LINUX_CAPABILITY_VERSION_3 */, 0};
    struct {
        uint32_t effective, permitted, inheritable;
    } data[2];
    if (syscall(SYS_capget, &header, data) == 0 && (data[0].effective & (1u << 14)))
        return true;
    char status[4096];
    uint64_t locked_kib = 0;
    if (read_small_file("/proc/self/status", status, sizeof(status))) {
        const char *line = strstr(status, "VmLck:");
        if (line != NULL)
            locked_kib = strtoull(line + 6, NULL, 10);
    }
    return locked_kib * 1024 + length <= limit.rlim_cur;
}

struct private_parts {
    struct huge_pages *huge;
    uint64_t free_chunks;
    struct huge_pages_plan *total;
};

/* Each run of private, writable, anonymous memory in the lock's range. */
static void plan_part(void *context, uintptr_t start, uintptr_t end)
{
    struct private_parts *parts = context;
    size_t pmd = parts->huge->pmd_size;
    if (parts->total->slow) {
        uintptr_t first = (start + pmd - 1) & ~(uintptr_t)(pmd - 1),
                  last = end & ~(uintptr_t)(pmd - 1);
        parts->total->stopped += last > first ? last - first : 0;
        return;
    }
    struct huge_pages_memory memory = {range_is_empty, make_huge, now_nanoseconds, parts->huge};
    struct huge_pages_plan plan;
    huge_pages_plan(start, end, parts->huge->pmd_size, parts->free_chunks, HUGE_PAGES_BATCH_BYTES,
                    &memory, &plan);
    uint64_t used = (plan.made + plan.refused) / parts->huge->pmd_size;
    parts->free_chunks = used < parts->free_chunks ? parts->free_chunks - used : 0;
    struct huge_pages_plan *total = parts->total;
    total->made += plan.made;
    total->had_pages += plan.had_pages;
    total->no_block += plan.no_block;
    total->refused += plan.refused;
    total->stopped += plan.stopped;
    if (plan.slow && !total->slow) {
        total->slow = true;
        total->slow_bytes_per_second = plan.slow_bytes_per_second;
        parts->free_chunks = 0; /* the rest stays small */
    }
}

void huge_pages_before_lock(struct huge_pages *huge, uintptr_t addr, size_t length, bool faults_in,
                            struct huge_pages_lock *lock)
{
    memset(lock, 0, sizeof(*lock));
    size_t page = huge->page_size;
    if (page == 0 || length == 0 || addr > UINTPTR_MAX - length - page)
        return;
    lock->start = addr & ~(uintptr_t)(page - 1);
    lock->end = (addr + length + page - 1) & ~(uintptr_t)(page - 1);
    lock->faults_in = faults_in;
    if (huge->pmd_size != 0) {
        uintptr_t mask = (uintptr_t)huge->pmd_size - 1;
        lock->has_chunk = lock->start <= UINTPTR_MAX - mask &&
                          ((lock->start + mask) & ~mask) + huge->pmd_size <= lock->end;
    }
    if (!faults_in || !lock->has_chunk || !huge_pages_making(huge))
        return;
    int saved_errno = errno;
    if (lock_fits_limit(lock->end - lock->start)) {
        char buddyinfo[8192];
        /* MADV_COLLAPSE allocates as a fault in an advised range would, with
         * direct compaction: only as many chunks as there are free blocks. */
        uint64_t free_chunks = read_small_file(huge->buddyinfo_path, buddyinfo, sizeof(buddyinfo))
                                   ? huge_pages_free_blocks(buddyinfo, huge->pmd_order)
                                   : 0;
        struct private_parts parts = {huge, free_chunks, &lock->plan};
        memory_map_private_anonymous_parts(lock->start, lock->end, plan_part, &parts);
    }
    errno = saved_errno;
}

bool huge_pages_count_huge(uintptr_t start, uintptr_t end, uint64_t *huge_bytes)
{
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    /* Zeroed: tools that do not know the ioctl (valgrind) see it written. */
    struct huge_pages_page_region regions[32];
    memset(regions, 0, sizeof(regions));
    uint64_t total = 0;
    bool known = true;
    for (uintptr_t at = start; at < end;) {
        struct huge_pages_scan_arg scan = {
            .size = sizeof(scan),
            .start = at,
            .end = end,
            .vec = (uintptr_t)regions,
            .vec_len = sizeof(regions) / sizeof(regions[0]),
            .category_mask = HUGE_PAGES_PAGE_IS_HUGE,
            .return_mask = HUGE_PAGES_PAGE_IS_HUGE,
        };
        long found = ioctl(fd, HUGE_PAGES_PAGEMAP_SCAN, &scan);
        if (found < 0) {
            known = false;
            break;
        }
        for (long i = 0; i < found; i++)
            total += regions[i].end - regions[i].start;
        if (scan.walk_end <= at)
            break;
        at = (uintptr_t)scan.walk_end;
    }
    close(fd);
    *huge_bytes = total;
    return known;
}

void huge_pages_after_lock(struct huge_pages *huge, const struct huge_pages_lock *lock, bool locked,
                           struct huge_pages_outcome *out)
{
    memset(out, 0, sizeof(*out));
    if (lock->plan.slow && __atomic_exchange_n(&huge->backed_off, 1, __ATOMIC_RELAXED) == 0)
        out->backed_off_now = true;
    if (!locked || !lock->faults_in || lock->end <= lock->start)
        return;
    int saved_errno = errno;
    uint64_t bytes = lock->end - lock->start, huge_bytes = 0;
    if (!lock->has_chunk) {
        out->small_bytes = bytes; /* no PMD-aligned chunk: no huge page fits */
    } else if (!__atomic_load_n(&huge->scan_missing, __ATOMIC_RELAXED) &&
               huge_pages_count_huge(lock->start, lock->end, &huge_bytes)) {
        out->huge_bytes = huge_bytes < bytes ? huge_bytes : bytes;
        out->small_bytes = bytes - out->huge_bytes;
    } else {
        __atomic_store_n(&huge->scan_missing, 1, __ATOMIC_RELAXED);
        out->unknown_bytes = bytes;
    }
    errno = saved_errno;
}
