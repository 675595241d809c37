/* Huge pages for memory that is about to be locked (issue 36).
 *
 * Pinning runs faster on transparent huge pages: mlock faults a 2 MiB page
 * in one go, and the GPU driver pins one page where it would pin 512. Where
 * the kernel gives huge pages only on request (THP "madvise"), the shim
 * makes the PMD-aligned chunks of a range the program is about to lock huge
 * itself, just before the real lock, and only chunks that have no page yet
 * (memory with pages is left as it is: making it huge would copy it):
 * MADV_POPULATE_WRITE faults in one small page of each chunk (as a write
 * would, changing no byte) and MADV_COLLAPSE turns the chunk into one huge
 * page, which the lock then finds resident.
 *
 * Why not MADV_HUGEPAGE: it sets VM_HUGEPAGE on the mapping, and no madvise
 * clears it again. The flag would outlive the lock, splitting the mapping in
 * the kernel's list, so that a later mremap of the whole mapping fails with
 * EFAULT where it worked without the shim, and memory the program no longer
 * locks would keep getting huge pages. MADV_COLLAPSE changes no flag (Linux
 * 6.1; MADV_POPULATE_WRITE 5.14). Only private, writable, anonymous memory
 * is made huge: populating a shared file mapping would dirty the file.
 *
 * Under THP "always" the kernel's own faults give huge pages and the shim
 * asks nothing; under "never", with no THP in the kernel, with
 * PR_SET_THP_DISABLE, or before Linux 6.1, nothing changes.
 *
 * Two risks are bounded. Direct compaction: MADV_COLLAPSE may compact, so no
 * more chunks are made huge than /proc/buddyinfo has free blocks of the
 * PMD's order or above. Memory a VM's hypervisor has not backed yet (free
 * page reporting hands free huge blocks back to the host, and the first
 * touch of them is slow): chunks are made huge in batches of
 * HUGE_PAGES_BATCH_BYTES, and a batch of at least HUGE_PAGES_MEASURED_BYTES
 * that ran below HUGE_PAGES_SLOWEST_BYTES_PER_SECOND stops it for the rest of
 * the lock and of the process.
 *
 * Each lock that faults its pages in is counted by the page size it got:
 * huge (PMD-mapped, learned with the PAGEMAP_SCAN ioctl, Linux 6.7), small,
 * or unknown where the kernel cannot say. No allocation. */
#ifndef PINSHIM_HUGE_PAGES_H
#define PINSHIM_HUGE_PAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the kernel does with transparent huge pages for this process. */
enum huge_pages_kernel {
    HUGE_PAGES_KERNEL_ABSENT = 0, /* no THP sysfs (no THP in the kernel, gVisor) */
    HUGE_PAGES_KERNEL_NEVER,
    HUGE_PAGES_KERNEL_MADVISE,
    HUGE_PAGES_KERNEL_ALWAYS,
    HUGE_PAGES_KERNEL_DISABLED, /* prctl(PR_SET_THP_DISABLE) in this process */
    HUGE_PAGES_KERNEL_TOO_OLD,  /* madvise, but no MADV_COLLAPSE (before Linux 6.1) */
};

/* Chunks are made huge this many bytes at a time (at least one chunk): a
 * slow batch costs the lock at most this much slow work. */
#define HUGE_PAGES_BATCH_BYTES ((uint64_t)16 << 20)
/* Batches at least this large are timed for the back-off. */
#define HUGE_PAGES_MEASURED_BYTES ((uint64_t)16 << 20)
/* Below this rate a batch stops the shim's huge pages: on the development
 * VM, huge pages the hypervisor had backed were made at 7.5 GiB/s and small
 * pages locked at 2.8-3.0 GiB/s; huge blocks it had taken back at 0.74 GiB/s
 * (bench/results/2026-12-07-vm-huge-pages.md). */
#define HUGE_PAGES_SLOWEST_BYTES_PER_SECOND ((uint64_t)1 << 30)

struct huge_pages {
    bool wanted; /* PINSHIM_HUGEPAGES=auto and registration on */
    enum huge_pages_kernel kernel;
    size_t page_size, pmd_size;
    unsigned pmd_order; /* log2(pmd_size / page_size) */
    char buddyinfo_path[128];
    int backed_off;   /* atomic: a slow batch stopped the shim's huge pages */
    int scan_missing; /* atomic: the kernel has no PAGEMAP_SCAN */
};

/* Reads the kernel's THP settings from sysfs_dir (its
 * transparent_hugepage folder: enabled, hpage_pmd_size) and its release
 * (release: uname's, "6.18.4-..."; NULL: this kernel's); wanted is the
 * option. Tests pass their own. */
void huge_pages_init(struct huge_pages *huge, bool wanted, const char *sysfs_dir,
                     const char *buddyinfo_path, const char *release, size_t page_size);

const char *huge_pages_kernel_name(enum huge_pages_kernel kernel);

/* Whether the shim makes chunks huge before locks (and aligns large aligned
 * allocations): wanted, THP "madvise" with MADV_COLLAPSE, not backed off. */
bool huge_pages_making(const struct huge_pages *huge);

/* The alignment a large aligned allocation gets so that as much of it as
 * possible is PMD-aligned: pmd_size for a size of at least pmd_size while
 * making huge pages, else alignment unchanged. Under THP "always" nothing is
 * aligned: the kernel would then put memory the program never locks on huge
 * pages it did not get before. */
size_t huge_pages_allocation_alignment(const struct huge_pages *huge, size_t alignment,
                                       size_t size);

/* What the shim did before one lock, in bytes of the lock's PMD-aligned
 * chunks. */
struct huge_pages_plan {
    uint64_t made;      /* empty chunks made huge */
    uint64_t had_pages; /* chunks with a page already: left alone */
    uint64_t no_block;  /* empty chunks beyond the free huge blocks: left small */
    uint64_t refused;   /* chunks whose collapse the kernel refused (or not private
                           anonymous memory): left to the lock */
    uint64_t stopped;   /* empty chunks after a slow batch: left small */
    bool slow;          /* a slow batch stopped it */
    uint64_t slow_bytes_per_second;
};

/* The calls the rule makes; tests replace them to drive it with any page
 * size. */
struct huge_pages_memory {
    bool (*empty)(void *context, uintptr_t start, size_t length); /* no resident page */
    /* Makes the chunks of [start, end) huge: 0 or an errno. */
    int (*make_huge)(void *context, uintptr_t start, uintptr_t end, size_t pmd_size);
    uint64_t (*now_ns)(void *context);
    void *context;
};

/* The rule: the PMD-aligned chunks inside [start, end) that are empty, at
 * most free_chunks of them, made huge in batches of batch_bytes (rounded to
 * whole chunks, at least one); a measured batch below the slowest rate stops
 * the rest. */
void huge_pages_plan(uintptr_t start, uintptr_t end, size_t pmd_size, uint64_t free_chunks,
                     uint64_t batch_bytes, const struct huge_pages_memory *memory,
                     struct huge_pages_plan *out);

/* Free blocks of order at least `order` in /proc/buddyinfo's text, counted
 * in blocks of that order; 0 when the text has no such column. */
uint64_t huge_pages_free_blocks(const char *buddyinfo, unsigned order);

/* Whether a kernel release ("6.1.0-13-amd64") is at least major.minor. */
bool huge_pages_release_at_least(const char *release, unsigned major, unsigned minor);

/* One lock, from before the real call to after it. */
struct huge_pages_lock {
    uintptr_t start, end; /* the lock's pages */
    bool faults_in;       /* a plain lock (not MLOCK_ONFAULT) */
    bool has_chunk;       /* [start, end) holds a PMD-aligned chunk */
    struct huge_pages_plan plan;
};

/* Before the real lock of [addr, addr + length): makes chunks huge as the
 * rule says. Keeps errno. */
void huge_pages_before_lock(struct huge_pages *huge, uintptr_t addr, size_t length, bool faults_in,
                            struct huge_pages_lock *lock);

/* The page sizes a lock got. */
struct huge_pages_outcome {
    uint64_t huge_bytes, small_bytes, unknown_bytes;
    bool backed_off_now; /* this lock stopped the shim's huge pages */
};

/* After the real lock (locked: it succeeded): counts the page sizes the
 * lock's range is on, and applies a slow batch's back-off. Keeps errno. */
void huge_pages_after_lock(struct huge_pages *huge, const struct huge_pages_lock *lock, bool locked,
                           struct huge_pages_outcome *out);

/* Bytes of [start, end) mapped by huge pages (PAGEMAP_SCAN); false where the
 * kernel cannot say. */
bool huge_pages_count_huge(uintptr_t start, uintptr_t end, uint64_t *huge_bytes);

#endif
