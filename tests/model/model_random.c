/* model_random: model-based random testing of pinshim.
 *
 * Runs under LD_PRELOAD=libpinshim.so with PINSHIM_CUDART=<fake runtime>. It
 * drives seeded random sequences of allocations, locks, unlocks, mappings,
 * remappings, frees, forks and copies over objects it creates, and keeps a
 * reference model of those objects: for every page, whether the kernel has
 * it locked (yes, no, unknown) and whether the shim tracks it (plain, or
 * held by MLOCK_ONFAULT); for every object, the bytes its lock calls asked
 * for; for the process, where the mappings it made begin and end. From these
 * it computes the registrations the shim must hold, and after every
 * operation compares them with the fake runtime's live registrations as
 * (base, size) pairs, exactly (and page by page, to say where they differ).
 *
 * The model follows the shim's rule (issue 34: one registration per run of
 * locked pages; src/engine_runs.c, src/engine_protocol.c,
 * src/mapping_bounds.h, src/lock_bytes.h):
 *   - Tracking. A successful lock (mlock, mlock2, mmap MAP_LOCKED; not
 *     mlockall), whatever its length, tracks its pages and adds the bytes it
 *     asked for ([addr, addr + len); a mapping's [addr, addr + length)) to
 *     the lock bytes. munlock, munlockall, munmap, MAP_FIXED and the source
 *     of mremap release tracked pages (whole pages) and drop the lock bytes
 *     in them; free/realloc release every page the block touches (heap
 *     objects are modelled by their interior pages and every lock of one
 *     stays inside them, so that is all its locked pages). A failed call
 *     tracks or releases nothing (a munlock that meets a hole releases up to
 *     the hole, where Linux stopped).
 *   - Bounds. Every successful mmap (MAP_FIXED and MAP_FIXED_NOREPLACE
 *     included) marks a mapping start at its first page and a mapping end at
 *     its page-rounded end, and drops the marks strictly inside it; munmap
 *     of [s, e) drops the starts in [s, e) and the ends in (s, e]; an mremap
 *     that moves unmaps the old range (but with MREMAP_DONTUNMAP) and maps
 *     the new one; in place it moves the end mark (the ends between the old
 *     and the new end go, and growth drops the starts it covers: the shim's
 *     mapping_bounds_note_resized). Heap allocations mark nothing.
 *   - Runs. A run is a maximal sequence of contiguous tracked pages with no
 *     mark between two neighbours (pages p - 1 and p are in one run unless a
 *     mapping starts or ends at p). A run is exactly one registration (base
 *     its first page, size its length) when its lock bytes total at least
 *     PINSHIM_MIN_BYTES and it holds no page held by MLOCK_ONFAULT; else it
 *     has none. So adjacent locks in one mapping, a lock that grows over a
 *     neighbour and a small lock beside a registered run all end as one
 *     registration, and two mappings side by side stay two.
 *   - MLOCK_ONFAULT (PINSHIM_ONFAULT=resident, the default): a lock whose
 *     pages are all resident right after the call (mincore) is a plain lock;
 *     otherwise the pages it newly tracked are held, and hold their whole
 *     run. A later plain lock over them makes them plain. PINSHIM_ONFAULT=skip:
 *     every such lock holds; =all: none does.
 *   - mremap carries tracked pages (held ones stay held) and their lock
 *     bytes to the new place, and a grown mapping's new tail is tracked, its
 *     whole pages as lock bytes, when the old last page was tracked;
 *   - with MREMAP_DONTUNMAP, Linux unlocks every VMA the old range touches,
 *     and, depending on VMA merges (that is on the address-space layout),
 *     the moved range and its neighbours too: there the model takes the
 *     kernel's word (/proc/self/smaps): a page stays tracked only if it was
 *     (or its source was) and is still locked, and in the VMAs the old range
 *     touched and at the new place its lock bytes become whole pages, as
 *     the shim reads them back; the layout-independent part of the rule
 *     stays as a check (adopt_kernel_after_dontunmap);
 *   - posix_memalign of at least max(PINSHIM_MIN_BYTES, 64K) returns whole
 *     pages, page aligned;
 *   - a fork child starts with nothing tracked (the mapping bounds stay) and,
 *     when the parent had loaded the runtime, never calls it;
 *   - with threads, no allowance: the shim serialises overlapping operations
 *     and the runs around them, and threads work on objects of their own.
 *
 * Copies (op "copy"): a byte range of locked memory inside one run (or in
 * locked pages the shim does not track) is filled with a pattern, copied to
 * device memory and back into another such range (or the same one, cleared
 * first), synchronously or asynchronously, through the vendor's own API of
 * the fake in use (CUDA: cudaMemcpy(Async) of the fake runtime; HIP:
 * hipMemcpy(Async); Level Zero: zeCommandListAppendMemoryCopy on an
 * immediate list). Every such copy must succeed, move the right bytes, and
 * count as pinned exactly when its range lies in a registered run (the
 * fakes' copy counters). The device buffer is allocated once per process,
 * at the first copy once the runtime is loaded in the process (by the
 * program at start, MODEL_PROGRAM_CONTEXT=1, or by the shim in create
 * mode) and, for Level Zero, initialised (zeInit): the model never loads
 * or initialises a runtime itself, which would change when and how the shim
 * starts one; before that copies are skipped. Once it is loaded, allocating
 * device memory and copying is what a program does (for CUDA it makes
 * device 0's primary context current on the copying thread: the context
 * the shim registers into anyway).
 *
 * Single-threaded runs also build short plans of ordinary ops that reach, on
 * purpose, the layouts where VMA splits and merges decide what stays locked
 * (moves onto the pages right below or above in the same mapping, sources
 * spanning VMAs that partial locks split and joined again, mmaps merged with
 * a neighbour, resizes next to locked pages; see make_plan), and count from
 * the kernel's VMAs which layouts they reached (the coverage line). A probe
 * at start (raw system calls, unseen by the shim) says what the kernel does
 * with them (the summary's kernel_* fields).
 *
 * Heap objects are modelled by their interior pages only (pages wholly inside
 * the requested bytes), and every lock of a heap object stays inside them, so
 * the program never locks a page it shares with memory it does not own.
 *
 * Usage: model_random [--seed S] [--ops N] [--threads T] [--fork-rate R]
 *                     [--barrier-every K] [--kernel-check-every N]
 *                     [--record FILE] [--replay FILE] [--no-shrink]
 *                     [--shrunk-out FILE] [--shrink-budget SECONDS] [--quiet]
 *                     [--trace] [--expose-known-bugs] [--inject-model-bug NAME]
 *                     [--layout-rate R] [--copy-rate R] [--share [--pair-rounds N]
 *                     [--pair-delay-us U] [--pair-pages P]]
 * --threads T (2..8): T threads on their own objects, checking their own
 * pages after every op; every --barrier-every ops all wait while one checks
 * the whole process (and sometimes calls munlockall or forks).
 * --share (with --threads): the threads work in disjoint windows of pages of
 * mappings the main thread locked whole, so one run holds several threads'
 * pages; at every barrier --pair-rounds (default 4) paired releases let two
 * threads release pieces of one registration at the same moment, one of
 * them up to --pair-delay-us (default 0) late, in pieces of P/2 to P pages
 * (--pair-pages, 8..500, default 48; see share_setup). Meant to run also
 * under tests/faults/slow_runtime.c (PINSHIM_CUDART, with
 * SLOW_RUNTIME_UNREGISTER_MS) to widen the window.
 * --layout-rate R: chance per op of starting a layout plan (default 0.03).
 * --copy-rate R: the share of copies among the random ops (default 0.05).
 * MODEL_RANDOM_NO_PROCMAP=1: read VMA bounds from /proc/self/maps instead of
 * PROCMAP_QUERY (what kernels before 6.11 get anyway).
 * --kernel-check-every N: also compare the model's view of the kernel (mapped,
 * locked) with /proc/self/smaps every N ops.
 * --expose-known-bugs: accepted for old command lines; there is no allowance
 * left to turn off. --inject-model-bug NAME (small-locks-register,
 * munlock-keeps, mremap-tail-unregistered, adjacent-locks-apart: two locks
 * that meet in one mapping as two registrations): model a rule wrongly, to
 * see the checks fail. --trace: print every op with its outcome and the
 * objects (with --threads, every thread's, naming the thread).
 * It turns address-space randomisation off (re-executing itself) so that a
 * seed or a recorded sequence replays exactly; MODEL_RANDOM_KEEP_ASLR=1 keeps it.
 * Exit status: 0 agreement, 1 disagreement (model vs runtime or kernel), 2
 * usage, 3 harness error (an operation behaved in a way the harness does not
 * handle). On a disagreement in a single-threaded run it prints the seed, the
 * operation index and the sequence, then shrinks the sequence by re-running
 * candidates in fresh processes and prints the shortest failing one in the
 * --replay format. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAKE_CUDART_NO_CUDA_PROTOTYPES
#include "fake_cuda.h"
#include "fake_cudart.h"
#include "pinshim.h"
#include "procmap_query.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1U
#endif

/* Below 2 MiB: Linux places anonymous mappings of whole multiples of 2 MiB at
 * huge-page boundaries, which with ASLR makes the layout (and so whether a
 * mremap can grow in place) differ from run to run. */
#define MAX_OBJECT_PAGES 500
#define SLOTS_PER_THREAD 64
#define MAX_THREADS 8
#define MAX_SLOTS (SLOTS_PER_THREAD * MAX_THREADS)
#define MAX_RANGES 4096
#define MAX_LEFTOVERS 256
#define REPORT_BYTES 32768

enum exit_code { EXIT_AGREE = 0, EXIT_DISAGREE = 1, EXIT_USAGE = 2, EXIT_HARNESS = 3 };

/* ------------------------------------------------------------------------ */
/* Settings                                                                 */

struct settings {
    uint64_t seed;
    size_t ops;
    int threads;
    double fork_rate;
    size_t barrier_every;
    size_t kernel_check_every; /* 0: only at the end */
    const char *record_path;
    const char *replay_path;
    const char *shrunk_out;
    bool shrink;
    double shrink_budget_seconds;
    bool quiet;
    const char *model_bug;  /* deliberately wrong rule, to prove the checks can fail */
    bool expose_known_bugs; /* accepted for old command lines: no allowance is left */
    bool trace;             /* print every op with its outcome */
    double layout_rate;     /* chance per op of starting a layout plan (see make_plan) */
    double copy_rate;       /* share of copies among the random ops (see exec_copy) */
    bool share;             /* threads work in windows of shared mappings (see share_setup) */
    size_t pair_rounds;     /* with share: paired releases per barrier (see pair_setup) */
    unsigned pair_delay_us; /* with share: one thread of a pair starts up to this much later */
    size_t pair_pages;      /* with share: at most this many pages per piece of a pair region */
};

static struct settings settings = {
    .seed = 1,
    .ops = 1000,
    .threads = 1,
    .fork_rate = 0.0,
    .barrier_every = 50,
    .kernel_check_every = 100,
    .shrink = true,
    .shrink_budget_seconds = 120,
    .layout_rate = 0.03,
    .copy_rate = 0.05,
    .pair_pages = 48,
};

static uintptr_t page_size;
/* What the kernel does, by the probes at start (probe_emulation, probe_kernel). */
static struct {
    bool mlock2; /* the mlock2 system call exists (qemu-user 7.2 answers ENOSYS) */
    /* /proc/self/maps still lists the source of an MREMAP_DONTUNMAP move, which
     * stays mapped (qemu-user 7.2 forgets it: its emulated maps drop it while
     * the kernel keeps it, so neither the shim nor the model can follow) */
    bool dontunmap_source_listed;
    bool dontunmap_merges;   /* a DONTUNMAP move onto the page right below, in a locked
                                mapping never faulted in, unlocks the pages below too */
    bool moves_several_vmas; /* MREMAP_FIXED moves a range that spans several VMAs (6.17) */
} kernel_does;
static uint64_t min_bytes = 65536;
/* PINSHIM_ONFAULT: what an mlock2(MLOCK_ONFAULT) leaves (see the header). */
enum onfault_mode { ONFAULT_RESIDENT, ONFAULT_SKIP, ONFAULT_ALL };
static enum onfault_mode onfault_mode = ONFAULT_RESIDENT;
static size_t rounding_threshold;
static char **saved_argv;
static bool layout_fixed; /* address-space randomisation is off */
static pthread_mutex_t output_mutex = PTHREAD_MUTEX_INITIALIZER;

static bool model_bug(const char *name)
{
    return settings.model_bug != NULL && strcmp(settings.model_bug, name) == 0;
}

static uintptr_t page_floor(uintptr_t address)
{
    return address & ~(page_size - 1);
}

static uintptr_t page_ceil(uintptr_t address)
{
    return (address + page_size - 1) & ~(page_size - 1);
}

/* ------------------------------------------------------------------------ */
/* Random numbers (splitmix64: small, seedable, good enough for choices).    */

static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t *state, uint64_t bound)
{
    return bound == 0 ? 0 : rng_next(state) % bound;
}

/* Uniform in [low, high]. */
static uint64_t rng_between(uint64_t *state, uint64_t low, uint64_t high)
{
    return low + rng_below(state, high - low + 1);
}

static bool rng_chance(uint64_t *state, double probability)
{
    return (double)(rng_next(state) >> 11) * 0x1.0p-53 < probability;
}

/* ------------------------------------------------------------------------ */
/* The shim's and the fake runtime's query APIs, found with dlsym.          */

struct fake_api {
    size_t (*snapshot)(struct fake_cudart_range *, size_t);
    size_t (*violations)(void);
    size_t (*violations_of)(enum fake_cudart_violation);
    uint64_t (*calls)(int);
    int (*peek_last_error)(void);
};
static struct fake_api fake;
static pthread_mutex_t fake_mutex = PTHREAD_MUTEX_INITIALIZER;
static int (*shim_is_registered)(const void *);
static size_t (*shim_get_counters)(struct pinshim_counters *, size_t);
static size_t (*shim_drain)(void);

/* MODEL_VENDOR=hip or ze: the fake HIP runtime or Level Zero loader
 * (tests/fake_hip, tests/fake_ze; MODEL_FAKE names the library) stands where
 * the CUDA runtime stands otherwise, queried through the vendor-neutral
 * fake_gpu_* API (tests/fake_gpu/fake_pins.h). */
enum model_vendor { MODEL_CUDA, MODEL_HIP, MODEL_ZE };
static enum model_vendor vendor = MODEL_CUDA;

/* The call kinds of fake_hip.h and fake_ze.h for a register and an
 * unregister. */
enum { HIP_CALL_REGISTER = 0, HIP_CALL_UNREGISTER = 1, ZE_CALL_IMPORT = 4, ZE_CALL_RELEASE = 5 };

struct fake_gpu_range_copy {
    uintptr_t base;
    size_t size;
};
static size_t (*gpu_snapshot)(struct fake_gpu_range_copy *, size_t);
static uint64_t (*gpu_calls)(int);

/* fake_gpu_snapshot in the CUDA double's layout. */
static size_t vendor_snapshot(struct fake_cudart_range *out, size_t max)
{
    static struct fake_gpu_range_copy ranges[MAX_RANGES];
    static pthread_mutex_t ranges_mutex = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&ranges_mutex);
    size_t count = gpu_snapshot(ranges, max < MAX_RANGES ? max : MAX_RANGES);
    for (size_t i = 0; i < count; i++)
        out[i] = (struct fake_cudart_range){ranges[i].base, ranges[i].size, 0};
    pthread_mutex_unlock(&ranges_mutex);
    return count;
}

static uint64_t vendor_calls(int which)
{
    if (which == FAKE_CALL_REGISTER)
        return gpu_calls(vendor == MODEL_HIP ? HIP_CALL_REGISTER : ZE_CALL_IMPORT);
    if (which == FAKE_CALL_UNREGISTER)
        return gpu_calls(vendor == MODEL_HIP ? HIP_CALL_UNREGISTER : ZE_CALL_RELEASE);
    return 0;
}

/* The library the fake's query API lives in. */
static const char *fake_library(void)
{
    return vendor == MODEL_CUDA ? getenv("PINSHIM_CUDART") : getenv("MODEL_FAKE");
}

/* The shim loads the runtime at the first large lock; find that same copy. */
static bool load_fake(void)
{
    if (__atomic_load_n(&fake.snapshot, __ATOMIC_ACQUIRE) != NULL)
        return true;
    const char *path = fake_library();
    void *handle = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (handle == NULL)
        return false;
    pthread_mutex_lock(&fake_mutex);
    size_t (*snapshot)(struct fake_cudart_range *, size_t) = NULL;
    if (vendor == MODEL_CUDA) {
        fake.violations = (size_t(*)(void))dlsym(handle, "fake_cudart_violation_count");
        fake.violations_of =
            (size_t(*)(enum fake_cudart_violation))dlsym(handle, "fake_cudart_violation_count_of");
        fake.calls = (uint64_t(*)(int))dlsym(handle, "fake_cudart_call_count");
        fake.peek_last_error = (int (*)(void))dlsym(handle, "cudaPeekAtLastError");
        snapshot =
            (size_t(*)(struct fake_cudart_range *, size_t))dlsym(handle, "fake_cudart_snapshot");
    } else {
        /* The same violation numbers as the CUDA double's. */
        fake.violations = (size_t(*)(void))dlsym(handle, "fake_gpu_violation_count");
        fake.violations_of =
            (size_t(*)(enum fake_cudart_violation))dlsym(handle, "fake_gpu_violation_count_of");
        gpu_calls = (uint64_t(*)(int))dlsym(handle, "fake_gpu_call_count");
        fake.calls = vendor_calls;
        /* HIP's last error on this thread: the shim's HIP calls run on a
         * thread of its own and must leave it alone. */
        if (vendor == MODEL_HIP)
            fake.peek_last_error = (int (*)(void))dlsym(handle, "hipPeekAtLastError");
        gpu_snapshot =
            (size_t(*)(struct fake_gpu_range_copy *, size_t))dlsym(handle, "fake_gpu_snapshot");
        if (gpu_snapshot != NULL && gpu_calls != NULL)
            snapshot = vendor_snapshot;
    }
    __atomic_store_n(&fake.snapshot, snapshot, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fake_mutex);
    dlclose(handle); /* drops the reference NOLOAD took; the shim's stays */
    return snapshot != NULL && fake.violations != NULL && fake.calls != NULL;
}

/* Registrations counted where both of the shim's paths meet: the fake
 * driver's cuMemHostRegister(_v2)/cuMemHostUnregister, which the shim calls
 * directly in program mode and the fake runtime calls in create mode. */
static uint64_t (*driver_call_count)(int);

static uint64_t fake_calls(int which)
{
    if (!load_fake())
        return 0;
    if (vendor != MODEL_CUDA)
        return fake.calls(which);
    if (__atomic_load_n(&driver_call_count, __ATOMIC_ACQUIRE) == NULL) {
        void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        uint64_t (*count)(int) =
            driver ? (uint64_t(*)(int))dlsym(driver, "fake_cuda_call_count") : NULL;
        if (driver != NULL)
            dlclose(driver);
        if (count == NULL)
            return fake.calls(which); /* a runtime without the fake driver */
        __atomic_store_n(&driver_call_count, count, __ATOMIC_RELEASE);
    }
    if (which == FAKE_CALL_REGISTER)
        return driver_call_count(FAKE_CU_CALL_MEM_HOST_REGISTER) +
               driver_call_count(FAKE_CU_CALL_MEM_HOST_REGISTER_V2);
    if (which == FAKE_CALL_UNREGISTER)
        return driver_call_count(FAKE_CU_CALL_MEM_HOST_UNREGISTER);
    return fake.calls(which);
}

/* ------------------------------------------------------------------------ */
/* The model.                                                               */

enum object_kind { OBJECT_HEAP, OBJECT_MAP };
enum kernel_lock { KLOCK_NO = 0, KLOCK_YES = 1, KLOCK_UNKNOWN = 2 };
/* What the shim makes of a page: not tracked, tracked, or tracked and held
 * by an MLOCK_ONFAULT lock (which holds its whole run unregistered). */
enum track { TRACK_NONE = 0, TRACK_PLAIN = 1, TRACK_ONFAULT = 2 };

/* Bytes [start, end). */
struct byte_range {
    uintptr_t start, end;
};
#define MAX_LOCK_RANGES 128

/* A heap object is one allocation; its model pages are the interior pages of
 * the requested bytes. A map object is a run of mapped pages this program
 * owns; munmap and mremap split or move map objects so that every page of one
 * is always mapped (a map object may hold several mappings: the mapping
 * bounds are kept apart, see marks). */
struct object {
    bool live;
    enum object_kind kind;
    char *pointer;   /* heap: what the allocator returned; map: == start */
    size_t size;     /* heap: requested bytes */
    uintptr_t start; /* first model page */
    size_t pages;
    uint8_t klock[MAX_OBJECT_PAGES];  /* enum kernel_lock */
    uint8_t track[MAX_OBJECT_PAGES];  /* enum track */
    uint8_t origin[MAX_OBJECT_PAGES]; /* the lock that tracked it (see next_lock_origin) */
    bool remerged; /* a lock or unlock over it joined VMAs that partial locks had split */
    /* The lock bytes in its pages: sorted, disjoint, never touching. */
    size_t byte_ranges;
    struct byte_range bytes[MAX_LOCK_RANGES];
};

static struct object objects[MAX_SLOTS];

static uintptr_t object_end(const struct object *object)
{
    return object->start + object->pages * page_size;
}

/* Pages a freed block covered that may still be locked in the kernel; they
 * are munlocked at quiescent points so RLIMIT_MEMLOCK is not used up. */
struct leftover {
    uintptr_t start, end;
};

enum op_kind {
    OP_MALLOC,
    OP_POSIX_MEMALIGN,
    OP_ALIGNED_ALLOC,
    OP_MMAP,
    OP_MLOCK,
    OP_MLOCK2,
    OP_MUNLOCK,
    OP_MUNMAP,
    OP_MMAP_FIXED,
    OP_MMAP_NOREPLACE,
    OP_MREMAP,
    OP_FREE,
    OP_REALLOC,
    OP_MUNLOCKALL,
    OP_MLOCKALL,
    OP_FORK,
    OP_MLOCK_HOLE,
    OP_MUNLOCK_HOLE,
    OP_MMAP_BESIDE,
    OP_COPY,
    OP_KIND_COUNT
};

/* mremap variants (op.flags). */
enum mremap_mode {
    MREMAP_MODE_IN_PLACE,
    MREMAP_MODE_MAYMOVE,
    MREMAP_MODE_FIXED,
    MREMAP_MODE_DONTUNMAP,
    MREMAP_MODE_UNALIGNED,
    MREMAP_MODE_DONTUNMAP_FIXED,
    MREMAP_MODE_COUNT
};

/* mmap, mmap_fixed and mmap_beside options (op.flags bits). MAP_NORESERVE
 * leaves VM_ACCOUNT off, so the mapping does not merge with an accounted
 * neighbour that was ever faulted in: a VMA with no anon_vma, the kind Linux
 * merges with both neighbours when a range of it moves (see
 * adopt_kernel_after_dontunmap). BELOW: mmap_beside maps right below its
 * target object instead of right above it. */
enum { MMAP_FLAG_LOCKED = 1, MMAP_FLAG_MMAP64 = 2, MMAP_FLAG_NORESERVE = 4, MMAP_FLAG_BELOW = 8 };
typedef void *(*mmap_function)(void *, size_t, int, int, int, off_t);

/* realloc variants (op.flags). */
enum realloc_mode {
    REALLOC_PLAIN,
    REALLOC_TOO_BIG,
    REALLOC_ARRAY,
    REALLOC_ARRAY_OVERFLOW,
    REALLOC_MODE_COUNT
};

/* One operation, replayable: objects by slot, addresses relative to the
 * object's first model page. */
struct op {
    enum op_kind kind;
    int slot;
    int target; /* mremap MREMAP_FIXED: slot of the object moved over */
    uint64_t offset;
    uint64_t length;
    uint64_t size;
    uint64_t align;
    uint64_t flags;
    uint64_t target_offset;
    uint64_t seed; /* fork: the child's seed; flags: its operation count */
};

enum op_field {
    F_SLOT = 1,
    F_OFF = 2,
    F_LEN = 4,
    F_SIZE = 8,
    F_ALIGN = 16,
    F_FLAGS = 32,
    F_TARGET = 64,
    F_TOFF = 128,
    F_SEED = 256,
};

static const struct {
    const char *name;
    unsigned fields;
} op_info[OP_KIND_COUNT] = {
    [OP_MALLOC] = {"malloc", F_SLOT | F_SIZE},
    [OP_POSIX_MEMALIGN] = {"posix_memalign", F_SLOT | F_SIZE | F_ALIGN},
    [OP_ALIGNED_ALLOC] = {"aligned_alloc", F_SLOT | F_SIZE | F_ALIGN},
    [OP_MMAP] = {"mmap", F_SLOT | F_LEN | F_FLAGS},
    [OP_MLOCK] = {"mlock", F_SLOT | F_OFF | F_LEN},
    [OP_MLOCK2] = {"mlock2", F_SLOT | F_OFF | F_LEN | F_FLAGS},
    [OP_MUNLOCK] = {"munlock", F_SLOT | F_OFF | F_LEN},
    [OP_MUNMAP] = {"munmap", F_SLOT | F_OFF | F_LEN},
    [OP_MMAP_FIXED] = {"mmap_fixed", F_SLOT | F_OFF | F_LEN | F_FLAGS},
    [OP_MMAP_NOREPLACE] = {"mmap_noreplace", F_SLOT | F_OFF | F_LEN},
    [OP_MREMAP] = {"mremap", F_SLOT | F_OFF | F_LEN | F_SIZE | F_FLAGS | F_TARGET | F_TOFF},
    [OP_FREE] = {"free", F_SLOT},
    [OP_REALLOC] = {"realloc", F_SLOT | F_SIZE | F_FLAGS},
    [OP_MUNLOCKALL] = {"munlockall", 0},
    [OP_MLOCKALL] = {"mlockall", 0},
    [OP_FORK] = {"fork", F_SEED | F_FLAGS},
    [OP_MLOCK_HOLE] = {"mlock_hole", F_SLOT | F_OFF},
    [OP_MUNLOCK_HOLE] = {"munlock_hole", F_SLOT | F_OFF},
    [OP_MMAP_BESIDE] = {"mmap_beside", F_SLOT | F_LEN | F_FLAGS | F_TARGET},
    [OP_COPY] = {"copy", F_SLOT | F_OFF | F_LEN | F_FLAGS | F_TARGET | F_TOFF},
};

enum exec_result { EXEC_DONE, EXEC_FAILED, EXEC_SKIPPED, EXEC_HARNESS_ERROR };

/* Interesting situations a run reached, so a test can tell it was not vacuous. */
enum coverage {
    COVER_SHARED_RELEASE,         /* with share: a release of part of a registration that also holds
                                     another thread's pages */
    COVER_PAIRED_RELEASE,         /* with share: one side of a paired release */
    COVER_LOCK_REGISTERING,       /* a successful lock whose run is registered after it */
    COVER_LOCK_SMALL,             /* a successful lock of fewer than PINSHIM_MIN_BYTES bytes */
    COVER_LOCK_JOINED,            /* a lock whose run holds pages tracked before it */
    COVER_SMALL_LOCK_REGISTERED,  /* a small lock whose run is registered after it */
    COVER_RUN_HELD_ONFAULT,       /* a lock whose run, large enough, MLOCK_ONFAULT pages hold */
    COVER_REGISTRATIONS_ADJACENT, /* two registrations side by side (a mapping bound between) */
    COVER_RUN_CUT_BY_BOUND,       /* a lock across a mapping bound: tracked pages in two runs */
    COVER_COPY_PINNED,            /* an end of a copy in a registered run: pinned */
    COVER_COPY_PAGEABLE,          /* an end of a copy of locked memory in no registration */
    COVER_MUNLOCK_REGISTERED,     /* munlock over registered pages */
    COVER_MUNMAP_REGISTERED,      /* munmap over registered pages */
    COVER_MAP_FIXED_REGISTERED,   /* MAP_FIXED over registered pages */
    COVER_FREE_REGISTERED,        /* free or realloc of a block with registered pages */
    COVER_MREMAP_MOVED,           /* registered pages moved */
    COVER_MREMAP_GROWN,           /* a registered tail grown */
    COVER_MREMAP_SHRUNK,          /* a mapping shrunk in place */
    COVER_MREMAP_FIXED,           /* moved over another mapping */
    COVER_MREMAP_DONTUNMAP,
    COVER_MREMAP_DONTUNMAP_MERGED,      /* ... whose new range merged into the old, unlocked VMA */
    COVER_DONTUNMAP_NEIGHBOUR_UNLOCKED, /* ... and a locked page beside them lost its lock too */
    COVER_FORK_INHERITED,               /* a child of a process that had loaded the runtime */
    COVER_FORK_FRESH,                   /* a child that may load it itself */
    /* Layouts (whole-process runs; from the kernel's VMA bounds): */
    COVER_DONTUNMAP_TARGET_BELOW, /* DONTUNMAP|FIXED onto the pages right below, in the same VMA */
    COVER_DONTUNMAP_TARGET_ABOVE, /* ... right above, in the same VMA */
    COVER_FIXED_TARGET_ADJACENT,  /* a plain FIXED move right below or above, in the same VMA */
    COVER_TARGET_IN_SOURCE_VMA,   /* a FIXED move whose target overlaps the source's VMAs */
    COVER_SOURCE_SEVERAL_VMAS,    /* a move (or DONTUNMAP) of a range spanning several VMAs */
    COVER_SOURCE_REMERGED,        /* a move out of VMAs that partial locks split and joined again */
    COVER_LOCK_SPLIT_VMA,         /* a lock or unlock that split a VMA */
    COVER_LOCK_MERGED_VMAS,       /* a lock or unlock after which VMAs merged */
    COVER_MMAP_MERGED,          /* mmap_beside whose mapping the kernel merged with its neighbour */
    COVER_GROWN_BESIDE_LOCKED,  /* grown in place next to a locked page */
    COVER_SHRUNK_BESIDE_LOCKED, /* shrunk in place next to a locked page */
    COVER_COUNT
};

static const char *const coverage_names[COVER_COUNT] = {
    "shared_release",
    "paired_release",
    "lock_registering",
    "lock_small",
    "lock_joined",
    "small_lock_registered",
    "run_held_onfault",
    "registrations_adjacent",
    "run_cut_by_bound",
    "copy_pinned",
    "copy_pageable",
    "munlock_registered",
    "munmap_registered",
    "map_fixed_registered",
    "free_registered",
    "mremap_moved",
    "mremap_grown",
    "mremap_shrunk",
    "mremap_fixed",
    "mremap_dontunmap",
    "mremap_dontunmap_merged",
    "dontunmap_neighbour_unlocked",
    "fork_inherited",
    "fork_fresh",
    "dontunmap_target_below",
    "dontunmap_target_above",
    "fixed_target_adjacent",
    "target_in_source_vma",
    "source_several_vmas",
    "source_remerged",
    "lock_split_vma",
    "lock_merged_vmas",
    "mmap_merged",
    "grown_beside_locked",
    "shrunk_beside_locked",
};

/* Outcomes per kind of operation. */
struct op_counts {
    uint64_t done[OP_KIND_COUNT], failed[OP_KIND_COUNT], skipped[OP_KIND_COUNT];
    uint64_t covered[COVER_COUNT];
};

/* A run of tracked pages [start, end) (see the header), its lock bytes, and
 * whether an MLOCK_ONFAULT page holds it; registered: the shim must hold
 * exactly one registration of it. */
struct run {
    uintptr_t start, end;
    uint64_t bytes;
    bool onfault;
    bool registered;
};
#define MAX_RUNS 8192

/* Per thread of operations (or the whole process, for single-threaded runs,
 * barrier duties and fork children). */
struct context {
    int index;      /* thread number; -1 for the whole-process context */
    int slot_first; /* slots this context owns: [slot_first, slot_end) */
    int slot_end;
    size_t object_cap; /* no new object while this many are live */
    bool whole_process;
    uint64_t rng;
    struct op *ops; /* the recorded sequence */
    size_t op_count, op_capacity;
    struct leftover leftovers[MAX_LEFTOVERS];
    size_t leftover_count;
    char report[REPORT_BYTES];
    size_t report_length;
    struct op_counts counts;
    uint64_t checks;
    struct op plan[4]; /* planned ops still to come (see make_plan) */
    struct op pair_op; /* with share: this thread's part of the next paired release */
    bool has_pair_op;
    int pair;               /* which pair */
    unsigned pair_delay_us; /* how long it waits after its partner arrived */
    size_t plan_count, plan_next;
    /* scratch for checks */
    struct fake_cudart_range snapshot[MAX_RANGES];
    struct fake_cudart_range expected[MAX_RANGES];
    struct fake_cudart_range actual[MAX_RANGES];
    struct run runs[MAX_RUNS]; /* compute_runs */
    size_t run_count;
};

static struct context thread_contexts[MAX_THREADS];
static struct context process_context;

/* Fork children: whether this process may register at all, and what the
 * runtime held (inherited from the parent) when it could not. */
static bool in_fork_child;
static bool child_registration_disabled;
static struct fake_cudart_range frozen_snapshot[MAX_RANGES];
static size_t frozen_count;
static uint64_t frozen_register_calls, frozen_unregister_calls;

static void report(struct context *context, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

static void report(struct context *context, const char *format, ...)
{
    if (context->report_length >= REPORT_BYTES - 1)
        return;
    va_list arguments;
    va_start(arguments, format);
    int written = vsnprintf(context->report + context->report_length,
                            REPORT_BYTES - context->report_length, format, arguments);
    va_end(arguments);
    if (written > 0)
        context->report_length += (size_t)written;
    if (context->report_length >= REPORT_BYTES)
        context->report_length = REPORT_BYTES - 1;
}

static bool registration_possible(void)
{
    return !child_registration_disabled;
}

static struct object *slot_object(struct context *context, int slot)
{
    if (slot < context->slot_first || slot >= context->slot_end || !objects[slot].live)
        return NULL;
    return &objects[slot];
}

static int free_slot(struct context *context)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        if (!objects[slot].live)
            return slot;
    return -1;
}

static size_t live_objects(struct context *context)
{
    size_t count = 0;
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        count += objects[slot].live;
    return count;
}

/* The object of this context holding page address, or NULL. */
static struct object *object_at(struct context *context, uintptr_t address)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        if (object->live && address >= object->start && address < object_end(object))
            return object;
    }
    return NULL;
}

/* Whether every page of [start, end) is a model page of this context (of map
 * objects only, when map_only). */
static bool range_owned(struct context *context, uintptr_t start, uintptr_t end, bool map_only)
{
    for (uintptr_t cursor = start; cursor < end;) {
        struct object *object = object_at(context, cursor);
        if (object == NULL || (map_only && object->kind != OBJECT_MAP))
            return false;
        cursor = object_end(object);
    }
    return true;
}

enum { KEEP = -1 };

/* ---- Lock bytes, per object ---- */

/* Set when an object's lock bytes need more ranges than it has room for
 * (reported as a harness error at the next check). */
static int bytes_overflowed;

static void bytes_store(struct object *object, const struct byte_range *ranges, size_t count)
{
    if (count > MAX_LOCK_RANGES) {
        __atomic_store_n(&bytes_overflowed, 1, __ATOMIC_RELAXED);
        count = MAX_LOCK_RANGES;
    }
    memcpy(object->bytes, ranges, count * sizeof(*ranges));
    object->byte_ranges = count;
}

/* Drops the lock bytes of object in [start, end). */
static void bytes_remove(struct object *object, uintptr_t start, uintptr_t end)
{
    struct byte_range kept[MAX_LOCK_RANGES + 2];
    size_t count = 0;
    if (start >= end)
        return;
    for (size_t i = 0; i < object->byte_ranges; i++) {
        struct byte_range range = object->bytes[i];
        if (range.end <= start || range.start >= end) {
            kept[count++] = range;
            continue;
        }
        if (range.start < start)
            kept[count++] = (struct byte_range){range.start, start};
        if (range.end > end)
            kept[count++] = (struct byte_range){end, range.end};
    }
    bytes_store(object, kept, count);
}

/* Adds [start, end), clipped to the object's pages, to its lock bytes. */
static void bytes_add(struct object *object, uintptr_t start, uintptr_t end)
{
    struct byte_range kept[MAX_LOCK_RANGES + 2];
    size_t count = 0;
    bool placed = false;
    if (start < object->start)
        start = object->start;
    if (end > object_end(object))
        end = object_end(object);
    if (start >= end)
        return;
    for (size_t i = 0; i < object->byte_ranges; i++) {
        struct byte_range range = object->bytes[i];
        if (range.end < start) {
            kept[count++] = range;
        } else if (range.start > end) {
            if (!placed)
                kept[count++] = (struct byte_range){start, end};
            placed = true;
            kept[count++] = range;
        } else {
            start = range.start < start ? range.start : start;
            end = range.end > end ? range.end : end;
        }
    }
    if (!placed)
        kept[count++] = (struct byte_range){start, end};
    bytes_store(object, kept, count);
}

/* How many lock bytes object holds in [start, end). */
static uint64_t bytes_count(const struct object *object, uintptr_t start, uintptr_t end)
{
    uint64_t total = 0;
    for (size_t i = 0; i < object->byte_ranges; i++) {
        uintptr_t from = object->bytes[i].start > start ? object->bytes[i].start : start;
        uintptr_t to = object->bytes[i].end < end ? object->bytes[i].end : end;
        if (from < to)
            total += to - from;
    }
    return total;
}

/* Adds (or drops) [start, end) to (from) the lock bytes of the objects of
 * this context it touches. */
static void model_bytes_add(struct context *context, uintptr_t start, uintptr_t end)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        if (objects[slot].live && objects[slot].start < end && object_end(&objects[slot]) > start)
            bytes_add(&objects[slot], start, end);
}

static void model_bytes_remove(struct context *context, uintptr_t start, uintptr_t end)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        if (objects[slot].live && objects[slot].start < end && object_end(&objects[slot]) > start)
            bytes_remove(&objects[slot], start, end);
}

/* ---- Mapping bounds (the shim's mapping_bounds.c, from the model's own
 * mmap, munmap and mremap calls) ----
 * Two kinds of mark per page address: a mapping starts there, and one ends
 * right before it. One set for the process, under a mutex: a thread's calls
 * change only marks at and inside its own mappings. */
enum { MARK_START = 1, MARK_END = 2 };
#define MAX_MARKS 16384
static struct mark {
    uintptr_t address;
    uint8_t kinds;
} marks[MAX_MARKS];
static size_t mark_count;
static bool marks_overflowed;
static pthread_mutex_t marks_mutex = PTHREAD_MUTEX_INITIALIZER;

/* The first mark at or above address (marks_mutex held). */
static size_t marks_from(uintptr_t address)
{
    size_t low = 0, high = mark_count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (marks[middle].address < address)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

static void marks_set(uintptr_t address, uint8_t kind)
{
    size_t at = marks_from(address);
    if (at < mark_count && marks[at].address == address) {
        marks[at].kinds |= kind;
        return;
    }
    if (mark_count == MAX_MARKS) {
        marks_overflowed = true;
        return;
    }
    memmove(marks + at + 1, marks + at, (mark_count - at) * sizeof(*marks));
    marks[at] = (struct mark){address, kind};
    mark_count++;
}

/* Clears the kinds of the marks in [from, to). */
static void marks_clear(uintptr_t from, uintptr_t to, uint8_t kinds)
{
    size_t at = marks_from(from), kept = at;
    for (size_t i = at; i < mark_count; i++) {
        struct mark mark = marks[i];
        if (mark.address < to)
            mark.kinds &= (uint8_t)~kinds;
        if (mark.kinds != 0)
            marks[kept++] = mark;
    }
    mark_count = kept;
}

/* The marks change as the shim's do (mapping_bounds.c), under marks_mutex,
 * in the order of the kernel's own changes to the address space: an unmap
 * before the call (the shim notes it so where no page of it is tracked, and
 * else with the call, its lock held across it, once its operation holds the
 * pages: either way a mapping placed there once it returns keeps its
 * marks), a new mapping after it, and an mremap with the mutex held across
 * the call (a thread that maps what the call freed notes its marks after
 * the call's). */

/* A new mapping covers [start, end): mapping_bounds_note_mapped. */
static void bounds_mapped_locked(uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    marks_clear(start + page_size, end, MARK_START | MARK_END);
    marks_set(start, MARK_START);
    marks_set(end, MARK_END);
}

static void bounds_mapped(uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&marks_mutex);
    bounds_mapped_locked(start, end);
    pthread_mutex_unlock(&marks_mutex);
}

/* [start, end) is unmapped: the starts in [start, end) and the ends in
 * (start, end] go (mapping_bounds_note_unmapped). */
static void bounds_unmapped_locked(uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    marks_clear(start, end, MARK_START);
    marks_clear(start + page_size, end + page_size, MARK_END);
}

static void bounds_unmapped(uintptr_t start, uintptr_t end)
{
    pthread_mutex_lock(&marks_mutex);
    bounds_unmapped_locked(start, end);
    pthread_mutex_unlock(&marks_mutex);
}

/* A mapping resized in place from old_end to new_end (marks_mutex held).
 * Shrunk: the pages given back are unmapped and the mapping ends at
 * new_end; grown: the pages gained hold no bound and it ends at new_end;
 * the same size changes nothing (mapping_bounds_remap_end). */
static void bounds_resized_locked(uintptr_t old_end, uintptr_t new_end)
{
    if (old_end == new_end)
        return;
    if (new_end < old_end) {
        bounds_unmapped_locked(new_end, old_end);
    } else {
        marks_clear(old_end, new_end, MARK_START);
        marks_clear(old_end, new_end + page_size, MARK_END);
    }
    marks_set(new_end, MARK_END);
}

/* A successful mremap of [old_start, old_end) to [new_start, new_end) (page
 * rounded), as mapping_bounds_remap_end notes it (marks_mutex held): in
 * place, resized; moved, a mapping of its own whose bounds inside come
 * along at the same offsets (a move of several mappings), the old range
 * unmapped but with MREMAP_DONTUNMAP. */
static void bounds_remapped_locked(uintptr_t old_start, uintptr_t old_end, uintptr_t new_start,
                                   uintptr_t new_end, bool dontunmap)
{
    if (new_start == old_start) {
        bounds_resized_locked(old_end, new_end);
        return;
    }
    uintptr_t copied_end =
        old_end - old_start < new_end - new_start ? old_end : old_start + (new_end - new_start);
    static struct mark inside[MAX_MARKS];
    size_t count = 0;
    for (size_t i = marks_from(old_start + page_size);
         i < mark_count && marks[i].address < copied_end; i++)
        inside[count++] = marks[i];
    marks_clear(new_start + page_size, new_end, MARK_START | MARK_END);
    for (size_t i = 0; i < count; i++)
        marks_set(new_start + (inside[i].address - old_start), inside[i].kinds);
    marks_set(new_start, MARK_START);
    marks_set(new_end, MARK_END);
    if (!dontunmap) {
        bounds_unmapped_locked(old_start, old_end);
        if (new_start < old_end && old_start < new_end) {
            marks_set(new_start, MARK_START);
            marks_set(new_end, MARK_END);
        }
    }
}

/* Whether a mapping starts or ends at address (marks_mutex held). */
static bool bound_at_locked(uintptr_t address)
{
    size_t at = marks_from(address);
    return at < mark_count && marks[at].address == address;
}

/* Which lock tracked a page (1 to 255; 0 none): only the deliberately wrong
 * rule adjacent-locks-apart looks, and cuts runs where two locks meet. */
static uint32_t lock_serial;

static uint8_t next_lock_origin(void)
{
    return (uint8_t)(__atomic_add_fetch(&lock_serial, 1, __ATOMIC_RELAXED) % 255 + 1);
}

/* ---- Pages ---- */

/* The part of a live object inside [start, end): [*from, *to); false when it
 * holds none of it. */
static bool object_part(const struct object *object, uintptr_t start, uintptr_t end,
                        uintptr_t *from, uintptr_t *to)
{
    if (!object->live || object->start >= end || object_end(object) <= start)
        return false;
    *from = start > object->start ? start : object->start;
    *to = end < object_end(object) ? end : object_end(object);
    return true;
}

/* Sets the kernel lock state of the model pages in [start, end). */
static void model_set_klock(struct context *context, uintptr_t start, uintptr_t end, int klock)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        uintptr_t from, to;
        if (!object_part(object, start, end, &from, &to))
            continue;
        for (size_t page = (from - object->start) / page_size;
             page < (to - object->start) / page_size; page++)
            object->klock[page] = (uint8_t)klock;
    }
}

/* The shim released the model pages in [start, end): not tracked any more,
 * their lock bytes gone; klock (unless KEEP) is their kernel state now. */
static void model_release(struct context *context, uintptr_t start, uintptr_t end, int klock)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        uintptr_t from, to;
        if (!object_part(object, start, end, &from, &to))
            continue;
        for (size_t page = (from - object->start) / page_size;
             page < (to - object->start) / page_size; page++) {
            if (klock != KEEP)
                object->klock[page] = (uint8_t)klock;
            object->track[page] = TRACK_NONE;
            object->origin[page] = 0;
        }
        bytes_remove(object, from, to);
    }
}

/* A lock call succeeded: the pages [start, end) are locked and tracked
 * (those tracked already keep their state, but a plain lock makes held
 * pages plain), and [bytes_start, bytes_end) are lock bytes. */
static void model_lock(struct context *context, uintptr_t start, uintptr_t end,
                       uintptr_t bytes_start, uintptr_t bytes_end, enum track hold)
{
    uint8_t origin = next_lock_origin();
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        uintptr_t from, to;
        if (!object_part(object, start, end, &from, &to))
            continue;
        for (size_t page = (from - object->start) / page_size;
             page < (to - object->start) / page_size; page++) {
            object->klock[page] = KLOCK_YES;
            /* A lock of no bytes (the kernel still locks an unaligned
             * address's page) is not tracked by the shim. */
            if (bytes_start == bytes_end)
                continue;
            if (object->track[page] == TRACK_NONE) {
                object->track[page] = (uint8_t)hold;
                object->origin[page] = origin;
            } else if (hold == TRACK_PLAIN) {
                object->track[page] = TRACK_PLAIN;
            }
        }
    }
    model_bytes_add(context, bytes_start, bytes_end);
}

/* Whether a model page of [start, end) is tracked. */
static bool any_tracked(struct context *context, uintptr_t start, uintptr_t end)
{
    for (uintptr_t page = page_floor(start); page < end; page += page_size) {
        const struct object *holder = object_at(context, page);
        if (holder != NULL && holder->track[(page - holder->start) / page_size] != TRACK_NONE)
            return true;
    }
    return false;
}

/* ---- Runs ---- */

static int compare_object_starts(const void *a, const void *b)
{
    uintptr_t x = objects[*(const int *)a].start, y = objects[*(const int *)b].start;
    return x < y ? -1 : x > y;
}

/* The runs of the tracked pages of the objects in scope, by address, into
 * context->runs (see the header); false when there are more than it holds. */
static bool compute_runs(struct context *context, const struct context *scope)
{
    int order[MAX_SLOTS];
    size_t count = 0;
    for (int slot = scope->slot_first; slot < scope->slot_end; slot++)
        if (objects[slot].live && objects[slot].pages > 0)
            order[count++] = slot;
    qsort(order, count, sizeof(*order), compare_object_starts);
    bool apart = model_bug("adjacent-locks-apart");
    struct run *current = NULL;
    uint8_t last_origin = 0;
    size_t runs = 0;
    pthread_mutex_lock(&marks_mutex);
    for (size_t i = 0; i < count; i++) {
        const struct object *object = &objects[order[i]];
        for (size_t page = 0; page < object->pages; page++) {
            uintptr_t address = object->start + page * page_size;
            if (object->track[page] == TRACK_NONE) {
                current = NULL;
                continue;
            }
            bool continues = current != NULL && current->end == address &&
                             !bound_at_locked(address) &&
                             !(apart && object->origin[page] != last_origin);
            if (!continues) {
                if (runs == MAX_RUNS) {
                    pthread_mutex_unlock(&marks_mutex);
                    context->run_count = 0;
                    return false;
                }
                current = &context->runs[runs++];
                *current = (struct run){.start = address, .end = address};
            }
            current->end = address + page_size;
            current->onfault |= object->track[page] == TRACK_ONFAULT;
            last_origin = object->origin[page];
        }
    }
    pthread_mutex_unlock(&marks_mutex);
    /* Their lock bytes, from the objects they lie in (sorted alike). */
    size_t first = 0;
    for (size_t r = 0; r < runs; r++) {
        struct run *run = &context->runs[r];
        while (first < count && object_end(&objects[order[first]]) <= run->start)
            first++;
        for (size_t i = first; i < count && objects[order[i]].start < run->end; i++)
            run->bytes += bytes_count(&objects[order[i]], run->start, run->end);
        run->registered = registration_possible() && !run->onfault &&
                          (run->bytes >= min_bytes || model_bug("small-locks-register"));
    }
    context->run_count = runs;
    return true;
}

/* The run of context->runs holding page address, or NULL. */
static const struct run *run_at(const struct context *context, uintptr_t address)
{
    size_t low = 0, high = context->run_count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (context->runs[middle].end <= address)
            low = middle + 1;
        else
            high = middle;
    }
    return low < context->run_count && context->runs[low].start <= address ? &context->runs[low]
                                                                           : NULL;
}

/* Whether, as the model stands, a model page of [start, end) of this context
 * is in a registered run. */
static bool any_registered(struct context *context, uintptr_t start, uintptr_t end)
{
    if (!compute_runs(context, context))
        return false;
    for (size_t r = 0; r < context->run_count; r++)
        if (context->runs[r].registered && context->runs[r].start < end &&
            context->runs[r].end > start)
            return true;
    return false;
}

static void cover(struct context *context, enum coverage what)
{
    context->counts.covered[what]++;
}

static struct object *new_object(struct context *context, enum object_kind kind)
{
    int slot = free_slot(context);
    if (slot < 0)
        return NULL;
    struct object *object = &objects[slot];
    memset(object, 0, offsetof(struct object, bytes));
    object->live = true;
    object->kind = kind;
    return object;
}

/* A new map object of pages at start with the given states (track and
 * origin NULL: none), no lock bytes; NULL when there is no room. */
static struct object *model_add_map(struct context *context, uintptr_t start, size_t pages,
                                    const uint8_t *klock, const uint8_t *track,
                                    const uint8_t *origin)
{
    struct object *object = new_object(context, OBJECT_MAP);
    if (object == NULL || pages > MAX_OBJECT_PAGES) {
        if (object != NULL)
            object->live = false;
        report(context, "harness: no room for a map object of %zu pages\n", pages);
        return NULL;
    }
    object->pointer = (char *)start;
    object->start = start;
    object->pages = pages;
    memcpy(object->klock, klock, pages);
    if (track != NULL)
        memcpy(object->track, track, pages);
    if (origin != NULL)
        memcpy(object->origin, origin, pages);
    return object;
}

/* [start, end) was unmapped: cut it out of the map objects it touches (with
 * their lock bytes there). */
static bool model_unmap(struct context *context, uintptr_t start, uintptr_t end)
{
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        if (!object->live || object->kind != OBJECT_MAP || object->start >= end ||
            object_end(object) <= start)
            continue;
        uintptr_t old_end = object_end(object);
        size_t keep_before = start > object->start ? (start - object->start) / page_size : 0;
        size_t after_first = end < old_end ? (end - object->start) / page_size : object->pages;
        size_t keep_after = object->pages - after_first;
        bytes_remove(object, start, end);
        if (keep_after > 0) {
            if (keep_before > 0) {
                struct object *after =
                    model_add_map(context, end, keep_after, object->klock + after_first,
                                  object->track + after_first, object->origin + after_first);
                if (after == NULL)
                    return false;
                for (size_t i = 0; i < object->byte_ranges; i++)
                    bytes_add(after, object->bytes[i].start, object->bytes[i].end);
                bytes_remove(object, end, old_end);
            } else {
                memmove(object->klock, object->klock + after_first, keep_after);
                memmove(object->track, object->track + after_first, keep_after);
                memmove(object->origin, object->origin + after_first, keep_after);
                object->start = end;
                object->pointer = (char *)end;
                object->pages = keep_after;
                continue;
            }
        }
        object->pages = keep_before;
        if (keep_before == 0)
            object->live = false;
    }
    return true;
}

static void add_leftover(struct context *context, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    if (context->leftover_count == MAX_LEFTOVERS) {
        /* Dropping one only costs locked memory until exit. */
        memmove(context->leftovers, context->leftovers + 1,
                (MAX_LEFTOVERS - 1) * sizeof(*context->leftovers));
        context->leftover_count--;
    }
    context->leftovers[context->leftover_count++] = (struct leftover){start, end};
}

/* The pages an allocation touches: [p, p + usable) rounded outward. */
static void heap_outward(const struct object *object, uintptr_t *start, uintptr_t *end)
{
    size_t usable = malloc_usable_size(object->pointer);
    *start = page_floor((uintptr_t)object->pointer);
    *end = page_ceil((uintptr_t)object->pointer + (usable ? usable : 1));
}

/* Where reclaiming must not munlock: live objects (a heap object's whole
 * outward page range). Sets *inside_end past the protected ranges holding
 * address (address itself when none) and *next_start to the first protected
 * start above address. */
static void protected_around(uintptr_t address, uintptr_t *inside_end, uintptr_t *next_start)
{
    *inside_end = address;
    *next_start = UINTPTR_MAX;
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live)
            continue;
        uintptr_t from = object->start, to = object_end(object);
        if (object->kind == OBJECT_HEAP)
            heap_outward(object, &from, &to);
        if (from <= address && to > address && to > *inside_end)
            *inside_end = to;
        else if (from > address && from < *next_start)
            *next_start = from;
    }
}

/* munlocks what freed blocks may have left locked, except pages of live
 * objects. Only at quiescent points: no other thread may own those pages. */
static void reclaim_leftovers(struct context *owner)
{
    for (size_t i = 0; i < owner->leftover_count; i++) {
        uintptr_t cursor = owner->leftovers[i].start, end = owner->leftovers[i].end;
        while (cursor < end) {
            uintptr_t inside_end, next_start;
            protected_around(cursor, &inside_end, &next_start);
            if (inside_end > cursor) {
                cursor = inside_end;
                continue;
            }
            uintptr_t stop = next_start < end ? next_start : end;
            munlock((void *)cursor, stop - cursor); /* may hit unmapped pages: fine */
            cursor = stop;
        }
    }
    owner->leftover_count = 0;
}

static void reclaim_all_leftovers(void)
{
    reclaim_leftovers(&process_context);
    for (int t = 0; t < MAX_THREADS; t++)
        reclaim_leftovers(&thread_contexts[t]);
}

/* ------------------------------------------------------------------------ */
/* Operations as text.                                                      */

static int format_op(const struct op *op, char *out, size_t size)
{
    unsigned fields = op_info[op->kind].fields;
    int length = snprintf(out, size, "%s", op_info[op->kind].name);
#define FIELD(bit, name, format, value)                                                            \
    if ((fields & (bit)) && length >= 0 && (size_t)length < size)                                  \
        length += snprintf(out + length, size - (size_t)length, " " name "=" format, value);
    FIELD(F_SLOT, "slot", "%d", op->slot)
    FIELD(F_OFF, "off", "%" PRIu64, op->offset)
    FIELD(F_LEN, "len", "%" PRIu64, op->length)
    FIELD(F_SIZE, "size", "%" PRIu64, op->size)
    FIELD(F_ALIGN, "align", "%" PRIu64, op->align)
    FIELD(F_FLAGS, "flags", "%" PRIu64, op->flags)
    FIELD(F_TARGET, "target", "%d", op->target)
    FIELD(F_TOFF, "toff", "%" PRIu64, op->target_offset)
    FIELD(F_SEED, "seed", "%" PRIu64, op->seed)
#undef FIELD
    return length;
}

static void print_op(FILE *stream, size_t index, const struct op *op)
{
    char line[256];
    format_op(op, line, sizeof(line));
    fprintf(stream, "%s # %zu\n", line, index);
}

static void print_header(FILE *stream)
{
    fprintf(stream, "# model_random replay v1 seed=%" PRIu64 " min_bytes=%" PRIu64 " page=%lu\n",
            settings.seed, min_bytes, (unsigned long)page_size);
}

static void print_sequence(FILE *stream, const struct op *ops, size_t count)
{
    print_header(stream);
    for (size_t i = 0; i < count; i++)
        print_op(stream, i, &ops[i]);
}

static bool parse_op(const char *line, struct op *op)
{
    char name[32];
    int consumed = 0;
    if (sscanf(line, "%31s%n", name, &consumed) != 1)
        return false;
    memset(op, 0, sizeof(*op));
    op->slot = op->target = -1;
    int kind = -1;
    for (int k = 0; k < OP_KIND_COUNT; k++)
        if (strcmp(name, op_info[k].name) == 0)
            kind = k;
    if (kind < 0)
        return false;
    op->kind = (enum op_kind)kind;
    const char *cursor = line + consumed;
    for (;;) {
        while (*cursor == ' ' || *cursor == '\t')
            cursor++;
        if (*cursor == '\0' || *cursor == '\n' || *cursor == '#')
            return true;
        char key[16];
        long long signed_value = 0;
        unsigned long long value = 0;
        int used = 0;
        if (sscanf(cursor, "%15[a-z]=%lld%n", key, &signed_value, &used) != 2)
            return false;
        sscanf(cursor, "%15[a-z]=%llu", key, &value);
        cursor += used;
        if (strcmp(key, "slot") == 0)
            op->slot = (int)signed_value;
        else if (strcmp(key, "target") == 0)
            op->target = (int)signed_value;
        else if (strcmp(key, "off") == 0)
            op->offset = value;
        else if (strcmp(key, "len") == 0)
            op->length = value;
        else if (strcmp(key, "size") == 0)
            op->size = value;
        else if (strcmp(key, "align") == 0)
            op->align = value;
        else if (strcmp(key, "flags") == 0)
            op->flags = value;
        else if (strcmp(key, "toff") == 0)
            op->target_offset = value;
        else if (strcmp(key, "seed") == 0)
            op->seed = value;
        else
            return false;
    }
}

/* The recorded sequence lives in its own mapping of a fixed size, reserved
 * before any operation: the harness's own memory must not shift the heap or
 * the mappings between a run and its replay, or the replay would differ. */
enum { SEQUENCE_CAPACITY = 1 << 17 };

static bool reserve_ops(struct context *context, size_t capacity)
{
    void *memory = mmap(NULL, capacity * sizeof(struct op), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED)
        return false;
    context->ops = memory;
    context->op_capacity = capacity;
    context->op_count = 0;
    return true;
}

static bool record_op(struct context *context, const struct op *op)
{
    if (context->op_count == context->op_capacity)
        return false;
    context->ops[context->op_count++] = *op;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Comparing the model with the runtime and the kernel.                     */

static int compare_ranges(const void *a, const void *b)
{
    const struct fake_cudart_range *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* Sorts and merges adjacent or overlapping ranges in place; returns the count. */
static size_t merge_ranges(struct fake_cudart_range *ranges, size_t count)
{
    qsort(ranges, count, sizeof(*ranges), compare_ranges);
    size_t merged = 0;
    for (size_t i = 0; i < count; i++) {
        if (merged > 0 && ranges[merged - 1].base + ranges[merged - 1].size >= ranges[i].base) {
            uintptr_t end = ranges[i].base + ranges[i].size;
            uintptr_t previous_end = ranges[merged - 1].base + ranges[merged - 1].size;
            if (end > previous_end)
                ranges[merged - 1].size = end - ranges[merged - 1].base;
        } else {
            ranges[merged++] = ranges[i];
        }
    }
    return merged;
}

static bool in_scope(const struct context *scope, int slot)
{
    return slot >= scope->slot_first && slot < scope->slot_end;
}

/* Describes where address lies in the model, for failure reports. */
static void describe_address(struct context *context, uintptr_t address)
{
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const struct object *object = &objects[slot];
        if (object->live && address >= object->start && address < object_end(object)) {
            size_t page = (address - object->start) / page_size;
            report(context, " (slot %d %s page %zu of %zu, klock=%d track=%d)", slot,
                   object->kind == OBJECT_HEAP ? "heap" : "map", page, object->pages,
                   object->klock[page], object->track[page]);
            return;
        }
    }
    report(context, " (outside every model object)");
}

/* Reports the page runs in a but not in b (both merged and sorted). */
static size_t report_difference(struct context *context, const char *what,
                                const struct fake_cudart_range *a, size_t a_count,
                                const struct fake_cudart_range *b, size_t b_count)
{
    size_t differences = 0, j = 0;
    for (size_t i = 0; i < a_count; i++) {
        uintptr_t cursor = a[i].base, end = a[i].base + a[i].size;
        while (cursor < end) {
            while (j < b_count && b[j].base + b[j].size <= cursor)
                j++;
            uintptr_t covered_from = j < b_count ? b[j].base : UINTPTR_MAX;
            if (covered_from > cursor) {
                uintptr_t stop = covered_from < end ? covered_from : end;
                report(context, "  %s %#lx-%#lx (%lu pages)", what, (unsigned long)cursor,
                       (unsigned long)stop, (unsigned long)((stop - cursor) / page_size));
                describe_address(context, cursor);
                report(context, "\n");
                differences++;
                cursor = stop;
            } else {
                cursor = b[j].base + b[j].size;
            }
        }
    }
    return differences;
}

/* The registrations the model expects (context->runs, as computed for the
 * scope), by base, into context->expected; returns how many. */
static size_t expected_registrations(struct context *context)
{
    size_t count = 0;
    for (size_t r = 0; r < context->run_count && count < MAX_RANGES; r++)
        if (context->runs[r].registered)
            context->expected[count++] =
                (struct fake_cudart_range){.base = context->runs[r].start,
                                           .size = context->runs[r].end - context->runs[r].start};
    return count;
}

/* The pages of the scope's objects that may be registered: tracked and not
 * held (with --share, while other threads run, that is all a thread can say
 * of runs that hold other threads' pages), merged, into context->expected. */
static size_t allowed_pages(struct context *context, const struct context *scope)
{
    size_t count = 0;
    for (int slot = scope->slot_first; slot < scope->slot_end; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live)
            continue;
        for (size_t page = 0; page < object->pages; page++) {
            if (object->track[page] != TRACK_PLAIN)
                continue;
            size_t last = page;
            while (last + 1 < object->pages && object->track[last + 1] == TRACK_PLAIN)
                last++;
            if (count < MAX_RANGES)
                context->expected[count++] =
                    (struct fake_cudart_range){.base = object->start + page * page_size,
                                               .size = (last - page + 1) * page_size};
            page = last;
        }
    }
    return merge_ranges(context->expected, count);
}

static void report_violations(struct context *context)
{
    static const char *const names[FAKE_VIOLATION_KIND_COUNT] = {
        "register_unmapped", "register_not_locked", "page_shared", "unregister_unmapped",
        "unregister_not_locked"};
    for (int kind = 0; kind < FAKE_VIOLATION_KIND_COUNT && fake.violations_of; kind++) {
        size_t count = fake.violations_of((enum fake_cudart_violation)kind);
        if (count)
            report(context, "  fake runtime violation %s: %zu\n", names[kind], count);
    }
}

/* The model itself: a tracked page is one the kernel has locked. */
static bool check_model_consistent(struct context *context, const struct context *scope)
{
    bool ok = true;
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live || !in_scope(scope, slot))
            continue;
        for (size_t page = 0; page < object->pages; page++) {
            if (object->track[page] != TRACK_NONE && object->klock[page] != KLOCK_YES) {
                report(context, "model: slot %d page %zu is tracked but not locked\n", slot, page);
                ok = false;
                break;
            }
        }
    }
    return ok;
}

/* A fork child of a process that used CUDA: the runtime's (inherited) state
 * must not change at all, and the shim must claim nothing. */
static bool check_disabled_child(struct context *context, const struct context *scope)
{
    bool ok = true;
    size_t count = load_fake() ? fake.snapshot(context->snapshot, MAX_RANGES) : 0;
    bool same = count == frozen_count;
    for (size_t i = 0; same && i < count; i++)
        same = context->snapshot[i].base == frozen_snapshot[i].base &&
               context->snapshot[i].size == frozen_snapshot[i].size;
    if (!same) {
        report(context, "fork child: the runtime's registrations changed (%zu, had %zu)\n", count,
               frozen_count);
        ok = false;
    }
    if (fake_calls(FAKE_CALL_REGISTER) != frozen_register_calls ||
        fake_calls(FAKE_CALL_UNREGISTER) != frozen_unregister_calls) {
        report(context,
               "fork child: the shim called the runtime (register %" PRIu64 " -> %" PRIu64
               ", unregister %" PRIu64 " -> %" PRIu64 ")\n",
               frozen_register_calls, fake_calls(FAKE_CALL_REGISTER), frozen_unregister_calls,
               fake_calls(FAKE_CALL_UNREGISTER));
        ok = false;
    }
    for (int slot = 0; slot < MAX_SLOTS && shim_is_registered; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live || !in_scope(scope, slot))
            continue;
        for (size_t page = 0; page < object->pages; page++) {
            if (shim_is_registered((void *)(object->start + page * page_size))) {
                report(context, "fork child: pinshim_is_registered(slot %d page %zu) is 1\n", slot,
                       page);
                return false;
            }
        }
    }
    return ok;
}

/* Whether the registration [base, base + size) touches an object of scope. */
static bool touches_scope(const struct context *scope, uintptr_t base, size_t size)
{
    for (int slot = scope->slot_first; slot < scope->slot_end; slot++) {
        const struct object *object = &objects[slot];
        if (object->live && object->start < base + size && object_end(object) > base)
            return true;
    }
    return false;
}

/* Registrations as (base, size) pairs: each one the runtime holds over the
 * scope (context->actual, sorted) must be one the model expects
 * (context->expected, sorted), and the other way round. */
static size_t compare_registrations(struct context *context, size_t actual, size_t expected)
{
    size_t differences = 0, i = 0, j = 0;
    while (i < actual || j < expected) {
        const struct fake_cudart_range *a = i < actual ? &context->actual[i] : NULL;
        const struct fake_cudart_range *e = j < expected ? &context->expected[j] : NULL;
        if (a != NULL && e != NULL && a->base == e->base && a->size == e->size) {
            i++;
            j++;
            continue;
        }
        differences++;
        if (e == NULL || (a != NULL && a->base <= e->base)) {
            report(context, "  registration %#lx-%#lx (%lu pages) is not one the model expects",
                   (unsigned long)a->base, (unsigned long)(a->base + a->size),
                   (unsigned long)(a->size / page_size));
            describe_address(context, a->base);
            report(context, "\n");
            i++;
        } else {
            report(context, "  should be one registration %#lx-%#lx (%lu pages), is not",
                   (unsigned long)e->base, (unsigned long)(e->base + e->size),
                   (unsigned long)(e->size / page_size));
            describe_address(context, e->base);
            report(context, "\n");
            j++;
        }
    }
    return differences;
}

/* The runtime's registrations against the model. With a whole-process scope
 * every registration must be one the model expects, and the other way round;
 * with a thread's scope those that touch that thread's objects (other
 * threads are running; with --share, see allowed_pages). */
static bool check_runtime(struct context *context, const struct context *scope)
{
    context->checks++;
    /* With the shim's registration thread (PINSHIM_ASYNC=on, MODEL_DRAIN=1),
     * what was locked so far is registered once it has caught up; by default
     * it is registered when the lock call returns, and checked so. */
    if (shim_drain != NULL && !child_registration_disabled)
        shim_drain();
    if (__atomic_load_n(&bytes_overflowed, __ATOMIC_RELAXED)) {
        report(context, "harness: an object's lock bytes need more than %d ranges\n",
               MAX_LOCK_RANGES);
        return false;
    }
    pthread_mutex_lock(&marks_mutex);
    bool marks_full = marks_overflowed;
    pthread_mutex_unlock(&marks_mutex);
    if (marks_full) {
        report(context, "harness: more than %d mapping bounds\n", MAX_MARKS);
        return false;
    }
    bool ok = check_model_consistent(context, scope);
    if (child_registration_disabled)
        return check_disabled_child(context, scope) && ok;

    size_t count = 0;
    if (load_fake()) {
        count = fake.snapshot(context->snapshot, MAX_RANGES);
        if (count == MAX_RANGES) {
            report(context, "harness: more than %d registrations\n", MAX_RANGES);
            return false;
        }
    }
    qsort(context->snapshot, count, sizeof(*context->snapshot), compare_ranges);
    /* Registrations are whole pages and never overlap or share a page. */
    for (size_t i = 0; i < count; i++) {
        const struct fake_cudart_range *range = &context->snapshot[i];
        if (range->base % page_size || range->size % page_size || range->size == 0) {
            report(context, "registration %#lx+%lu is not whole pages\n",
                   (unsigned long)range->base, (unsigned long)range->size);
            ok = false;
        }
        if (i > 0 && context->snapshot[i - 1].base + context->snapshot[i - 1].size >
                         page_floor(range->base)) {
            report(context, "registrations %#lx+%lu and %#lx+%lu overlap or share a page\n",
                   (unsigned long)context->snapshot[i - 1].base,
                   (unsigned long)context->snapshot[i - 1].size, (unsigned long)range->base,
                   (unsigned long)range->size);
            ok = false;
        }
    }
    if (!compute_runs(context, scope)) {
        report(context, "harness: more than %d runs\n", MAX_RUNS);
        return false;
    }
    bool share_thread = settings.share && !scope->whole_process;

    /* Exactly the registrations the model expects: (base, size) pairs. */
    size_t expected = 0, actual = 0, differences = 0;
    if (!share_thread) {
        for (size_t i = 0; i < count; i++)
            if (scope->whole_process ||
                touches_scope(scope, context->snapshot[i].base, context->snapshot[i].size))
                context->actual[actual++] = context->snapshot[i];
        expected = expected_registrations(context);
        for (size_t i = 1; i < expected; i++)
            if (context->expected[i - 1].base + context->expected[i - 1].size ==
                context->expected[i].base)
                cover(context, COVER_REGISTRATIONS_ADJACENT);
        differences += compare_registrations(context, actual, expected);
    }

    /* The same page by page (where they differ, for the report; with
     * --share, a thread's own pages that may not be registered). */
    actual = 0;
    if (scope->whole_process) {
        memcpy(context->actual, context->snapshot, count * sizeof(*context->snapshot));
        actual = count;
    } else {
        /* Clip the registrations to this thread's objects. */
        for (int slot = scope->slot_first; slot < scope->slot_end; slot++) {
            const struct object *object = &objects[slot];
            if (!object->live)
                continue;
            for (size_t i = 0; i < count; i++) {
                uintptr_t from = context->snapshot[i].base;
                uintptr_t to = from + context->snapshot[i].size;
                if (from < object->start)
                    from = object->start;
                if (to > object_end(object))
                    to = object_end(object);
                if (from < to && actual < MAX_RANGES)
                    context->actual[actual++] =
                        (struct fake_cudart_range){.base = from, .size = to - from};
            }
        }
    }
    actual = merge_ranges(context->actual, actual);
    if (share_thread)
        expected = allowed_pages(context, scope);
    else
        expected = merge_ranges(context->expected, expected_registrations(context));
    differences += report_difference(context, "registered, should not be:", context->actual, actual,
                                     context->expected, expected);
    if (!share_thread) /* another thread's release may hold this thread's pages out */
        differences +=
            report_difference(context, "should be registered, is not:", context->expected, expected,
                              context->actual, actual);
    if (differences)
        ok = false;

    if (load_fake()) {
        if (fake.violations() != 0) {
            report(context, "the fake runtime recorded %zu violations\n", fake.violations());
            report_violations(context);
            ok = false;
        }
        if (fake.peek_last_error && fake.peek_last_error() != 0) {
            report(context, "the shim left CUDA error %d for the program\n",
                   fake.peek_last_error());
            ok = false;
        }
    }

    /* The shim's counters agree with the runtime, and no call failed. */
    if (scope->whole_process && shim_get_counters) {
        struct pinshim_counters counters;
        memset(&counters, 0, sizeof(counters));
        shim_get_counters(&counters, sizeof(counters));
        uint64_t bytes = 0;
        for (size_t i = 0; i < count; i++)
            bytes += context->snapshot[i].size;
        if (counters.live_ranges != count || counters.live_bytes != bytes) {
            report(context,
                   "pinshim counters: %" PRIu64 " ranges, %" PRIu64 " bytes live; the runtime "
                   "holds %zu, %" PRIu64 "\n",
                   counters.live_ranges, counters.live_bytes, count, bytes);
            ok = false;
        }
        if (counters.register_failed || counters.unregister_failed ||
            counters.register_already_registered) {
            report(context,
                   "pinshim counters: register_failed %" PRIu64 " unregister_failed %" PRIu64
                   " already_registered %" PRIu64 "\n",
                   counters.register_failed, counters.unregister_failed,
                   counters.register_already_registered);
            ok = false;
        }
    }

    /* The shim's own view agrees at the ends of every registration and just
     * outside (unless another registration lies there). */
    if (ok && scope->whole_process && shim_is_registered) {
        for (size_t r = 0; r < context->run_count; r++) {
            const struct run *run = &context->runs[r];
            if (!run->registered)
                continue;
            uintptr_t first = run->start, last = run->end - page_size;
            if (!shim_is_registered((void *)first) || !shim_is_registered((void *)last)) {
                report(context, "pinshim_is_registered is 0 inside %#lx-%#lx\n",
                       (unsigned long)first, (unsigned long)run->end);
                ok = false;
            }
            const struct run *before = run_at(context, first - page_size);
            if (object_at(&process_context, first - page_size) != NULL &&
                (before == NULL || !before->registered) &&
                shim_is_registered((void *)(first - page_size))) {
                report(context, "pinshim_is_registered is 1 before %#lx\n", (unsigned long)first);
                ok = false;
            }
            const struct run *after = run_at(context, run->end);
            if (object_at(&process_context, run->end) != NULL &&
                (after == NULL || !after->registered) && shim_is_registered((void *)run->end)) {
                report(context, "pinshim_is_registered is 1 after %#lx\n", (unsigned long)run->end);
                ok = false;
            }
        }
    }
    return ok;
}

/* /proc/self/smaps: VmFlags "lo" says whether a VMA is locked. */
struct vma {
    uintptr_t start, end;
    bool locked;
};
static struct vma vmas[16384];
static char smaps_buffer[1 << 16];
static pthread_mutex_t vmas_mutex = PTHREAD_MUTEX_INITIALIZER;

/* Reads /proc/self/smaps (VMAs with their lock flag) or, where only the
 * bounds matter, /proc/self/maps (about 25 times cheaper: no page walk). */
static size_t read_vmas_from(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t count = 0, filled = 0;
    bool at_eof = false;
    while (!at_eof || filled > 0) {
        if (!at_eof && filled < sizeof(smaps_buffer) - 1) {
            ssize_t got = read(fd, smaps_buffer + filled, sizeof(smaps_buffer) - 1 - filled);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                at_eof = true;
            else
                filled += (size_t)got;
        }
        smaps_buffer[filled] = '\0';
        char *newline = strchr(smaps_buffer, '\n');
        if (newline == NULL) {
            if (!at_eof && filled < sizeof(smaps_buffer) - 1)
                continue;
            newline = smaps_buffer + filled; /* last line or an over-long one */
        }
        *newline = '\0';
        unsigned long start, end;
        char after;
        if (sscanf(smaps_buffer, "%lx-%lx%c", &start, &end, &after) == 3 && after == ' ') {
            if (count < sizeof(vmas) / sizeof(*vmas))
                vmas[count++] = (struct vma){start, end, false};
        } else if (strncmp(smaps_buffer, "VmFlags:", 8) == 0 && count > 0) {
            for (const char *at = smaps_buffer + 7; (at = strstr(at, " lo")) != NULL; at += 3)
                if (at[3] == ' ' || at[3] == '\0')
                    vmas[count - 1].locked = true;
        }
        size_t consumed =
            newline < smaps_buffer + filled ? (size_t)(newline - smaps_buffer) + 1 : filled;
        memmove(smaps_buffer, smaps_buffer + consumed, filled - consumed);
        filled -= consumed;
    }
    close(fd);
    return count;
}

static size_t read_vmas(void)
{
    return read_vmas_from("/proc/self/smaps");
}

/* VMA bounds only, without their flags. */
static size_t read_vma_bounds(void)
{
    return read_vmas_from("/proc/self/maps");
}

static const struct vma *vma_containing(size_t count, uintptr_t address)
{
    size_t low = 0, high = count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (vmas[middle].end <= address)
            low = middle + 1;
        else
            high = middle;
    }
    return low < count && vmas[low].start <= address ? &vmas[low] : NULL;
}

/* The model's kernel view (mapped, locked) against /proc/self/smaps. Only at
 * quiescent points. A disagreement here is a wrong model, not a shim bug. */
static bool check_kernel_locked(struct context *context)
{
    size_t count = read_vmas();
    if (count == 0)
        return true; /* cannot tell */
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live)
            continue;
        for (size_t page = 0; page < object->pages; page++) {
            uintptr_t address = object->start + page * page_size;
            const struct vma *vma = vma_containing(count, address);
            if (vma == NULL) {
                report(context, "kernel: slot %d page %zu (%#lx) is not mapped\n", slot, page,
                       (unsigned long)address);
                return false;
            }
            if (object->klock[page] != KLOCK_UNKNOWN &&
                vma->locked != (object->klock[page] == KLOCK_YES)) {
                report(context, "kernel: slot %d %s page %zu (%#lx) locked=%d, model says %d\n",
                       slot, object->kind == OBJECT_HEAP ? "heap" : "map", page,
                       (unsigned long)address, vma->locked, object->klock[page]);
                return false;
            }
        }
    }
    return true;
}

static bool check_kernel(struct context *context)
{
    pthread_mutex_lock(&vmas_mutex);
    bool ok = check_kernel_locked(context);
    pthread_mutex_unlock(&vmas_mutex);
    return ok;
}

/* A few address ranges (a VMA cluster each). */
#define MAX_SPANS 8
struct span_set {
    uintptr_t start[MAX_SPANS], end[MAX_SPANS];
    size_t count;
};

static void span_add(struct span_set *set, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    for (size_t i = 0; i < set->count; i++) {
        if (start <= set->end[i] && end >= set->start[i]) {
            set->start[i] = start < set->start[i] ? start : set->start[i];
            set->end[i] = end > set->end[i] ? end : set->end[i];
            return;
        }
    }
    if (set->count < MAX_SPANS) {
        set->start[set->count] = start;
        set->end[set->count++] = end;
    }
}

static bool span_holds(const struct span_set *set, uintptr_t address)
{
    for (size_t i = 0; i < set->count; i++)
        if (address >= set->start[i] && address < set->end[i])
            return true;
    return false;
}

/* With vmas[0, count) read: the VMAs that [start, end) touches, widened to the
 * VMA right before and right after when they are adjacent (the ones a move
 * can merge with), added to set. */
static void span_add_vma_cluster(struct span_set *set, size_t count, uintptr_t start, uintptr_t end)
{
    size_t first = 0;
    while (first < count && vmas[first].end <= start)
        first++;
    size_t last = first;
    while (last + 1 < count && vmas[last + 1].start < end)
        last++;
    if (first == count || vmas[first].start >= end) {
        span_add(set, start, end);
        return;
    }
    uintptr_t from = vmas[first].start < start ? vmas[first].start : start;
    uintptr_t to = vmas[last].end > end ? vmas[last].end : end;
    if (first > 0 && vmas[first - 1].end == vmas[first].start)
        from = vmas[first - 1].start;
    if (last + 1 < count && vmas[last + 1].start == vmas[last].end)
        to = vmas[last + 1].end;
    span_add(set, from, to);
}

/* ------------------------------------------------------------------------ */
/* Executing operations against the real functions and the model.           */

static bool page_mapped(uintptr_t address)
{
    return msync((void *)address, page_size, MS_ASYNC) == 0;
}

/* Where a lock/unlock of op on object lands: [*address, +length), pages
 * [*start, *end). False when it does not fit the context's objects. */
static bool lock_target(struct context *context, const struct object *object, const struct op *op,
                        uintptr_t *address, uintptr_t *start, uintptr_t *end)
{
    if (op->offset >= object->pages * page_size ||
        op->length > (uint64_t)MAX_SLOTS * MAX_OBJECT_PAGES * page_size)
        return false;
    *address = object->start + op->offset;
    *start = page_floor(*address);
    *end = page_ceil(*address + op->length);
    if (*end == *start && op->length == 0 && *address % page_size != 0)
        *end = *start + page_size; /* Linux rounds a zero length at an unaligned address up */
    if (object->kind == OBJECT_HEAP)
        return *start >= object->start && *end <= object_end(object);
    return range_owned(context, *start, *end, false);
}

static enum exec_result harness_error(struct context *context, const struct op *op,
                                      const char *what)
{
    char line[256];
    format_op(op, line, sizeof(line));
    report(context, "harness: %s: %s (errno %d %s)\n", line, what, errno, strerror(errno));
    return EXEC_HARNESS_ERROR;
}

/* How an mlock2(MLOCK_ONFAULT) of the pages [start, end) that just succeeded
 * leaves the pages it newly tracks: held, unless PINSHIM_ONFAULT=all or
 * (resident, the default) every page is resident now (mincore: the shim
 * asks /proc/self/smaps or PROCMAP_QUERY, with the same answer). */
static enum track onfault_hold(uintptr_t start, uintptr_t end)
{
    if (onfault_mode == ONFAULT_ALL)
        return TRACK_PLAIN;
    if (onfault_mode == ONFAULT_SKIP)
        return TRACK_ONFAULT;
    unsigned char resident[256];
    for (uintptr_t cursor = start; cursor < end;) {
        size_t pages = (end - cursor) / page_size;
        if (pages > sizeof(resident))
            pages = sizeof(resident);
        if (mincore((void *)cursor, pages * page_size, resident) != 0)
            return TRACK_ONFAULT; /* cannot tell; the check will say */
        for (size_t i = 0; i < pages; i++)
            if (!(resident[i] & 1))
                return TRACK_ONFAULT;
        cursor += pages * page_size;
    }
    return TRACK_PLAIN;
}

/* After a successful lock of [address, address + length) (its pages [start,
 * end)), which tracked pages (tracked_before: some of them were already):
 * what its run became. */
static void cover_lock(struct context *context, uintptr_t start, uintptr_t end, uint64_t length,
                       bool tracked_before)
{
    if (length < min_bytes)
        cover(context, COVER_LOCK_SMALL);
    if (start >= end || !compute_runs(context, context))
        return;
    const struct run *run = run_at(context, start);
    if (run == NULL)
        return;
    if (run->registered) {
        cover(context, COVER_LOCK_REGISTERING);
        if (length < min_bytes)
            cover(context, COVER_SMALL_LOCK_REGISTERED);
    }
    if (tracked_before || run->start < start || run->end > end)
        cover(context, COVER_LOCK_JOINED);
    if (run->onfault && run->bytes >= min_bytes)
        cover(context, COVER_RUN_HELD_ONFAULT);
    if (run_at(context, end - page_size) != run)
        cover(context, COVER_RUN_CUT_BY_BOUND);
}

static enum exec_result exec_allocate(struct context *context, const struct op *op)
{
    if (op->slot < context->slot_first || op->slot >= context->slot_end || objects[op->slot].live)
        return EXEC_SKIPPED;
    if (op->size == 0 || op->size > (uint64_t)MAX_OBJECT_PAGES * page_size)
        return EXEC_SKIPPED;
    void *pointer = NULL;
    bool rounded = false;
    if (op->kind == OP_MALLOC) {
        pointer = malloc(op->size);
    } else if (op->kind == OP_ALIGNED_ALLOC) {
        if (op->align == 0 || (op->align & (op->align - 1)) != 0)
            return EXEC_SKIPPED;
        pointer = aligned_alloc(op->align, op->size);
    } else {
        bool valid =
            op->align != 0 && (op->align & (op->align - 1)) == 0 && op->align % sizeof(void *) == 0;
        int error = posix_memalign(&pointer, op->align, op->size);
        if (!valid) {
            if (error != EINVAL)
                return harness_error(context, op, "posix_memalign accepted a bad alignment");
            return EXEC_FAILED;
        }
        if (error != 0) {
            errno = error;
            return harness_error(context, op, "posix_memalign failed");
        }
        rounded = op->size >= rounding_threshold;
    }
    if (pointer == NULL)
        return harness_error(context, op, "allocation failed");
    if (rounded) {
        size_t whole = (op->size + page_size - 1) / page_size * page_size;
        if ((uintptr_t)pointer % page_size != 0 || malloc_usable_size(pointer) < whole) {
            report(context,
                   "posix_memalign(%" PRIu64 ", %" PRIu64 ") = %p with %zu usable bytes: "
                   "not whole pages, page aligned\n",
                   op->align, op->size, pointer, malloc_usable_size(pointer));
            free(pointer);
            return EXEC_DONE; /* reported: fails the check */
        }
    }
    struct object *object = &objects[op->slot];
    memset(object, 0, sizeof(*object));
    object->live = true;
    object->kind = OBJECT_HEAP;
    object->pointer = pointer;
    object->size = op->size;
    object->start = page_ceil((uintptr_t)pointer);
    uintptr_t end = page_floor((uintptr_t)pointer + op->size);
    object->pages = end > object->start ? (end - object->start) / page_size : 0;
    /* Freed blocks may have left these pages locked: unknown until locked or unlocked. */
    memset(object->klock, KLOCK_UNKNOWN, object->pages);
    return EXEC_DONE;
}

static int mmap_flags(const struct op *op)
{
    return MAP_PRIVATE | MAP_ANONYMOUS | (op->flags & MMAP_FLAG_LOCKED ? MAP_LOCKED : 0) |
           (op->flags & MMAP_FLAG_NORESERVE ? MAP_NORESERVE : 0);
}

static int procmap_fd = -1;
static pid_t procmap_pid;
static bool procmap_unsupported;

/* The VMA holding address, or the first one above it: false if none (or when
 * the kernel cannot say, *unsupported). Only the whole-process context calls
 * it, so no lock. */
static bool procmap_query(uintptr_t address, uintptr_t *start, uintptr_t *end, bool *unsupported)
{
    *unsupported = procmap_unsupported;
    if (procmap_unsupported)
        return false;
    procmap_query_fd(&procmap_fd, &procmap_pid);
    struct procmap_query query;
    memset(&query, 0, sizeof(query));
    query.size = sizeof(query);
    query.query_flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA;
    query.query_addr = address;
    if (procmap_fd < 0 || ioctl(procmap_fd, PROCMAP_QUERY_IOCTL, &query) != 0) {
        if (procmap_fd < 0 || errno != ENOENT)
            procmap_unsupported = *unsupported = true;
        return false;
    }
    *start = query.vma_start;
    *end = query.vma_end;
    return true;
}

/* The VMAs touching [start, end), bounds only: returns how many, and the
 * first and the last in *first and *last when there are any. Asks
 * PROCMAP_QUERY, or reads /proc/self/maps where the kernel lacks it. */
static size_t vma_bounds_over(uintptr_t start, uintptr_t end, struct vma *first, struct vma *last)
{
    size_t touched = 0;
    uintptr_t cursor = start, from, to;
    bool unsupported = false;
    while (cursor < end && procmap_query(cursor, &from, &to, &unsupported) && from < end) {
        if (touched++ == 0 && first != NULL)
            *first = (struct vma){from, to, false};
        if (last != NULL)
            *last = (struct vma){from, to, false};
        cursor = to;
    }
    if (!unsupported)
        return touched;
    touched = 0;
    pthread_mutex_lock(&vmas_mutex);
    size_t count = read_vma_bounds();
    for (size_t i = 0; i < count; i++) {
        if (vmas[i].start >= end || vmas[i].end <= start)
            continue;
        if (touched++ == 0 && first != NULL)
            *first = vmas[i];
        if (last != NULL)
            *last = vmas[i];
    }
    pthread_mutex_unlock(&vmas_mutex);
    return touched;
}

/* Layout probes of whole-process runs (threads do not look): how many VMAs
 * [start, end) touches now. */
static size_t vmas_over(struct context *context, uintptr_t start, uintptr_t end)
{
    return context->whole_process ? vma_bounds_over(start, end, NULL, NULL) : 0;
}

/* Whether the VMA holding start begins below it or the one holding end - 1
 * ends above end (whole-process runs only). */
static bool vma_reaches_beyond(struct context *context, uintptr_t start, uintptr_t end)
{
    struct vma first, last;
    if (!context->whole_process || vma_bounds_over(start, end, &first, &last) == 0)
        return false;
    return first.start < start || last.end > end;
}

/* mmap (op->kind OP_MMAP) anywhere, or (OP_MMAP_BESIDE) with
 * MAP_FIXED_NOREPLACE right above or below the map object in op->target, so
 * that the kernel may merge the two into one VMA. */
static enum exec_result exec_mmap(struct context *context, const struct op *op)
{
    if (op->slot < context->slot_first || op->slot >= context->slot_end || objects[op->slot].live)
        return EXEC_SKIPPED;
    size_t pages = (op->length + page_size - 1) / page_size;
    if (pages == 0 || pages > MAX_OBJECT_PAGES)
        return EXEC_SKIPPED;
    bool locked = op->flags & MMAP_FLAG_LOCKED;
    mmap_function map = op->flags & MMAP_FLAG_MMAP64 ? mmap64 : mmap;
    uintptr_t want = 0;
    int flags = mmap_flags(op);
    if (op->kind == OP_MMAP_BESIDE) {
        const struct object *beside = slot_object(context, op->target);
        if (beside == NULL || beside->kind != OBJECT_MAP ||
            ((op->flags & MMAP_FLAG_BELOW) && beside->start < pages * page_size))
            return EXEC_SKIPPED;
        want = op->flags & MMAP_FLAG_BELOW ? beside->start - pages * page_size : object_end(beside);
        flags |= MAP_FIXED_NOREPLACE;
    }
    char *pointer = map((void *)want, op->length, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (pointer == MAP_FAILED) {
        if (locked && (errno == EAGAIN || errno == ENOMEM))
            return EXEC_FAILED; /* RLIMIT_MEMLOCK */
        if (op->kind == OP_MMAP_BESIDE && errno == EEXIST)
            return EXEC_FAILED; /* something is mapped there */
        return harness_error(context, op, "mmap failed");
    }
    bounds_mapped((uintptr_t)pointer, (uintptr_t)pointer + pages * page_size);
    if (op->kind == OP_MMAP_BESIDE && (uintptr_t)pointer != want) {
        /* A kernel without MAP_FIXED_NOREPLACE took the address as a hint. */
        bounds_unmapped((uintptr_t)pointer, (uintptr_t)pointer + pages * page_size);
        munmap(pointer, op->length);
        return EXEC_FAILED;
    }
    for (uintptr_t page = (uintptr_t)pointer; page < (uintptr_t)pointer + pages * page_size;
         page += page_size)
        if (object_at(context, page) != NULL)
            return harness_error(context, op, "mmap returned a page the model holds");
    struct object *object = &objects[op->slot];
    memset(object, 0, sizeof(*object));
    object->live = true;
    object->kind = OBJECT_MAP;
    object->pointer = pointer;
    object->start = (uintptr_t)pointer;
    object->pages = pages;
    memset(object->klock, locked ? KLOCK_YES : KLOCK_NO, pages);
    if (locked) {
        model_lock(context, object->start, object_end(object), object->start,
                   object->start + op->length, TRACK_PLAIN);
        cover_lock(context, object->start, object_end(object), op->length, false);
    }
    if (op->kind == OP_MMAP_BESIDE && vma_reaches_beyond(context, want, object_end(object)))
        cover(context, COVER_MMAP_MERGED);
    return EXEC_DONE;
}

/* After a lock or unlock of [start, end) in a whole-process run: whether it
 * split a VMA or joined VMAs, from how many VMAs [start, end) and its
 * neighbouring pages touched before (vmas_before) and touch now. */
static void note_vma_change(struct context *context, uintptr_t start, uintptr_t end,
                            size_t vmas_before)
{
    if (!context->whole_process)
        return;
    size_t vmas_after = vmas_over(context, start - page_size, end + page_size);
    if (vmas_after > vmas_before) {
        cover(context, COVER_LOCK_SPLIT_VMA);
    } else if (vmas_after < vmas_before) {
        cover(context, COVER_LOCK_MERGED_VMAS);
        for (uintptr_t page = start; page < end; page += page_size) {
            struct object *holder = object_at(context, page);
            if (holder != NULL)
                holder->remerged = true;
        }
    }
}

static enum exec_result exec_lock(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    uintptr_t address, start, end;
    if (object == NULL || !lock_target(context, object, op, &address, &start, &end))
        return EXEC_SKIPPED;
    size_t vmas_before = object->kind == OBJECT_MAP
                             ? vmas_over(context, start - page_size, end + page_size)
                             : SIZE_MAX;
    int result;
    if (op->kind == OP_MLOCK) {
        result = mlock((void *)address, op->length);
    } else if (op->kind == OP_MLOCK2) {
        result = mlock2((void *)address, op->length, (unsigned)op->flags);
    } else {
        bool had_registered = any_registered(context, start, end);
        result = munlock((void *)address, op->length);
        if (result != 0)
            return harness_error(context, op, "munlock failed");
        if (had_registered)
            cover(context, COVER_MUNLOCK_REGISTERED);
        if (model_bug("munlock-keeps"))
            model_set_klock(context, start, end, KLOCK_NO);
        else
            model_release(context, start, end, KLOCK_NO);
        if (vmas_before != SIZE_MAX)
            note_vma_change(context, start, end, vmas_before);
        return EXEC_DONE;
    }
    if (result != 0) {
        if (op->kind == OP_MLOCK2 && (op->flags & ~(uint64_t)MLOCK_ONFAULT) && errno == EINVAL)
            return EXEC_FAILED;
        if (op->kind == OP_MLOCK2 && op->flags != 0 && errno == EINVAL && !kernel_does.mlock2)
            return EXEC_FAILED;
        if (errno == ENOMEM || errno == EAGAIN || errno == EPERM)
            return EXEC_FAILED; /* RLIMIT_MEMLOCK; nothing changed */
        return harness_error(context, op, "lock failed");
    }
    enum track hold = TRACK_PLAIN;
    if (op->kind == OP_MLOCK2 && (op->flags & MLOCK_ONFAULT))
        hold = onfault_hold(start, end);
    bool tracked_before = any_tracked(context, start, end);
    model_lock(context, start, end, address, address + op->length, hold);
    cover_lock(context, start, end, op->length, tracked_before);
    if (vmas_before != SIZE_MAX)
        note_vma_change(context, start, end, vmas_before);
    return EXEC_DONE;
}

static enum exec_result exec_munmap(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_MAP || op->offset >= object->pages * page_size)
        return EXEC_SKIPPED;
    uintptr_t address = object->start + op->offset;
    bool invalid = address % page_size != 0 || op->length == 0;
    uintptr_t end = page_ceil(address + op->length);
    if (!invalid && (op->length > (uint64_t)MAX_SLOTS * MAX_OBJECT_PAGES * page_size ||
                     !range_owned(context, address, end, true)))
        return EXEC_SKIPPED;
    if (!invalid && any_registered(context, address, end))
        cover(context, COVER_MUNMAP_REGISTERED);
    if (!invalid)
        bounds_unmapped(address, end);
    int result = munmap((void *)address, op->length);
    if (invalid) {
        if (result == 0 || errno != EINVAL)
            return harness_error(context, op, "munmap with a bad argument did not fail EINVAL");
        return EXEC_FAILED;
    }
    if (result != 0)
        return harness_error(context, op, "munmap failed");
    return model_unmap(context, address, end) ? EXEC_DONE : EXEC_HARNESS_ERROR;
}

/* After a failed call that may have unmapped [start, end): cut out what is gone. */
static bool model_probe_unmapped(struct context *context, uintptr_t start, uintptr_t end)
{
    for (uintptr_t address = start; address < end; address += page_size)
        if (!page_mapped(address) && !model_unmap(context, address, address + page_size))
            return false;
    return true;
}

static enum exec_result exec_mmap_fixed(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_MAP || op->offset >= object->pages * page_size ||
        op->length == 0 || op->length > (uint64_t)MAX_SLOTS * MAX_OBJECT_PAGES * page_size)
        return EXEC_SKIPPED;
    uintptr_t address = object->start + op->offset;
    uintptr_t start = page_floor(address), end = page_ceil(address + op->length);
    if (!range_owned(context, start, end, true))
        return EXEC_SKIPPED;
    bool locked = op->flags & MMAP_FLAG_LOCKED;
    mmap_function map = op->flags & MMAP_FLAG_MMAP64 ? mmap64 : mmap;
    if (op->kind == OP_MMAP_NOREPLACE) {
        void *result = mmap((void *)address, op->length, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (result != MAP_FAILED && (uintptr_t)result != address) {
            /* A kernel without MAP_FIXED_NOREPLACE (before 4.17, or qemu-user
             * 7.2) took the address as a hint and mapped elsewhere. */
            uintptr_t at = (uintptr_t)result, at_end = page_ceil(at + op->length);
            bounds_mapped(at, at_end);
            bounds_unmapped(at, at_end);
            munmap(result, op->length);
            return EXEC_FAILED;
        }
        if (result != MAP_FAILED)
            return harness_error(context, op, "MAP_FIXED_NOREPLACE over a mapping succeeded");
        return EXEC_FAILED;
    }
    bool had_registered = any_registered(context, start, end);
    void *result =
        map((void *)address, op->length, PROT_READ | PROT_WRITE, mmap_flags(op) | MAP_FIXED, -1, 0);
    if (address % page_size != 0) {
        if (result != MAP_FAILED || errno != EINVAL)
            return harness_error(context, op, "MAP_FIXED at an unaligned address did not fail");
        return EXEC_FAILED;
    }
    if (result == MAP_FAILED) {
        if (!(locked && (errno == EAGAIN || errno == ENOMEM)))
            return harness_error(context, op, "mmap MAP_FIXED failed");
        return model_probe_unmapped(context, start, end) ? EXEC_FAILED : EXEC_HARNESS_ERROR;
    }
    if (result != (void *)address)
        return harness_error(context, op, "MAP_FIXED mapped elsewhere");
    model_release(context, start, end, KLOCK_NO);
    bounds_mapped(start, end);
    if (locked) {
        model_lock(context, start, end, address, address + op->length, TRACK_PLAIN);
        cover_lock(context, start, end, op->length, false);
    }
    if (had_registered)
        cover(context, COVER_MAP_FIXED_REGISTERED);
    return EXEC_DONE;
}

/* The layout around an mremap before the call (whole-process runs). */
struct remap_layout {
    bool looked;
    size_t source_vmas;     /* VMAs the old range touches */
    bool target_below_same; /* the target ends at the old range, inside the same VMA */
    bool target_above_same; /* the target starts at its end, inside the same VMA */
    bool target_in_source;  /* the target overlaps the VMAs of the old range */
    bool source_remerged;   /* see struct object */
    bool locked_neighbour;  /* the page right below or right above is a locked model page */
};

static bool page_locked_in_model(struct context *context, uintptr_t address)
{
    const struct object *holder = object_at(context, address);
    return holder != NULL && holder->klock[(address - holder->start) / page_size] == KLOCK_YES;
}

/* target: 0 unless MREMAP_FIXED. */
static struct remap_layout remap_layout_before(struct context *context, uintptr_t address,
                                               uintptr_t old_end, uintptr_t target,
                                               size_t new_pages)
{
    struct remap_layout layout = {0};
    if (!context->whole_process)
        return layout;
    layout.looked = true;
    const struct object *source = object_at(context, address);
    layout.source_remerged = source != NULL && source->remerged;
    layout.locked_neighbour = page_locked_in_model(context, address - page_size) ||
                              page_locked_in_model(context, old_end);
    struct vma first, last;
    layout.source_vmas = vma_bounds_over(address, old_end, &first, &last);
    if (target != 0 && layout.source_vmas > 0) {
        uintptr_t target_end = target + new_pages * page_size;
        layout.target_below_same = target_end == address && first.start < address;
        layout.target_above_same = target == old_end && last.end > old_end;
        layout.target_in_source = target < last.end && target_end > first.start;
    }
    return layout;
}

/* After a successful mremap: moved (the pages went elsewhere, or DONTUNMAP),
 * resized (in place: new pages minus old pages). */
static void cover_remap_layout(struct context *context, const struct remap_layout *layout,
                               bool moved, bool fixed, bool dontunmap, int resized)
{
    if (!layout->looked)
        return;
    if (fixed && dontunmap && layout->target_below_same)
        cover(context, COVER_DONTUNMAP_TARGET_BELOW);
    if (fixed && dontunmap && layout->target_above_same)
        cover(context, COVER_DONTUNMAP_TARGET_ABOVE);
    if (fixed && !dontunmap && (layout->target_below_same || layout->target_above_same))
        cover(context, COVER_FIXED_TARGET_ADJACENT);
    if (fixed && layout->target_in_source)
        cover(context, COVER_TARGET_IN_SOURCE_VMA);
    if (moved && layout->source_vmas >= 2)
        cover(context, COVER_SOURCE_SEVERAL_VMAS);
    if (moved && layout->source_remerged)
        cover(context, COVER_SOURCE_REMERGED);
    if (resized > 0 && layout->locked_neighbour)
        cover(context, COVER_GROWN_BESIDE_LOCKED);
    if (resized < 0 && layout->locked_neighbour)
        cover(context, COVER_SHRUNK_BESIDE_LOCKED);
}

/* A successful mremap(MREMAP_DONTUNMAP): the old range, where it went, the
 * part of the old range's VMAs the model itself predicts unlocked, and the
 * VMAs the old range touched before the call (what the shim releases and
 * reads back). */
struct dontunmap_call {
    uintptr_t old_start, old_end, new_start, new_end, unlocked_start, unlocked_end;
    uintptr_t released_start, released_end;
};

/* After MREMAP_DONTUNMAP the kernel, not the model, decides which pages of the
 * VMAs around the old range and the target are still locked.
 *
 * Linux clears VM_LOCKED on "the old VMA" once the pages have moved
 * (mm/mremap.c). The new range is first merged, where it can be, with its
 * neighbours (the VMA before it and the VMA after it, which with a target just
 * below or above the source is the source's own VMA), and when the merge
 * swallows the source's VMA the "old VMA" is the merged one: the moved pages
 * and the neighbour they merged with lose their lock too (seen on Linux 6.18;
 * issue 9 dates it from 6.17). Whether they merge depends on the layout: a
 * range moved out of a VMA that has no anon_vma (never faulted in, e.g.
 * locked with MLOCK_ONFAULT, and never merged into a VMA that was) gets the
 * page offset of its new address and merges with both neighbours; one with an
 * anon_vma keeps its old offset and merges with neither. So the same call
 * leaves [0, 96K) of a 120K mapping locked in a bare program (where mmap
 * placed the mapping against an older, faulted-in VMA and merged it into
 * that) and unlocks all of it in model_random's own layout (issue 9, seed 18;
 * kept as regression_dontunmap_fixed_below_merge.txt). A rule in the model
 * would hold on one machine and fail on the next.
 *
 * So every model page in the VMAs the old range, the target and their
 * adjacent neighbours touched before the call, and in the VMAs those pages
 * and the new range lie in after it (kernel_decides), takes its lock state
 * from /proc/self/smaps, and stays tracked only if it was tracked before the
 * call (a moved page: if its source was) and is still locked. The shim
 * releases the VMAs the old range touched (unlocked_start, unlocked_end) and
 * reads back what is still locked there and at the new place, with whole
 * pages as lock bytes: so the model, there. Held pages stay held.
 *
 * The model's own prediction stays as a second opinion where it does not
 * depend on the layout: the VMAs holding the old range (as the target cut
 * them) are unlocked, and no page that was unlocked, or is moved from an
 * unlocked source, becomes locked (a merge joins VMAs with the same flags
 * only). The kernel disagreeing with that is a model failure. */
static void adopt_kernel_after_dontunmap(struct context *context, const struct dontunmap_call *call,
                                         const struct span_set *kernel_decides)
{
    struct span_set spans = *kernel_decides;
    bool merged = false, neighbour_unlocked = false;
    model_bytes_remove(context, call->released_start, call->released_end);
    pthread_mutex_lock(&vmas_mutex);
    size_t count = read_vmas();
    /* After the call: every VMA holding a page of the first spans, or of the new range. */
    struct span_set before = spans;
    span_add(&before, call->new_start, call->new_end);
    for (size_t i = 0; i < count; i++)
        for (size_t j = 0; j < before.count; j++)
            if (vmas[i].start < before.end[j] && vmas[i].end > before.start[j])
                span_add(&spans, vmas[i].start, vmas[i].end);
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        if (!object->live)
            continue;
        for (size_t page = 0; page < object->pages; page++) {
            uintptr_t address = object->start + page * page_size;
            if (!span_holds(&spans, address))
                continue;
            const struct vma *vma = vma_containing(count, address);
            if (vma == NULL) {
                report(context,
                       "kernel: slot %d page %zu (%#lx) is not mapped after "
                       "MREMAP_DONTUNMAP\n",
                       slot, page, (unsigned long)address);
                continue;
            }
            bool moved = address >= call->new_start && address < call->new_end;
            bool released =
                !moved && address >= call->released_start && address < call->released_end;
            bool predicted_unlocked =
                !moved && ((address >= call->old_start && address < call->old_end) ||
                           (address >= call->unlocked_start && address < call->unlocked_end));
            if (vma->locked && (predicted_unlocked || object->klock[page] == KLOCK_NO)) {
                report(context,
                       "kernel: slot %d page %zu (%#lx) is locked after MREMAP_DONTUNMAP; the "
                       "model says %s\n",
                       slot, page, (unsigned long)address,
                       predicted_unlocked ? "its VMA is always unlocked" : "it was not locked");
                continue;
            }
            if (!vma->locked && object->klock[page] == KLOCK_YES) {
                merged |= moved;
                neighbour_unlocked |= !moved && !predicted_unlocked;
            }
            object->klock[page] = vma->locked ? KLOCK_YES : KLOCK_NO;
            if (!vma->locked) {
                object->track[page] = TRACK_NONE;
                object->origin[page] = 0;
                bytes_remove(object, address, address + page_size);
            } else if ((moved || released) && object->track[page] != TRACK_NONE) {
                bytes_add(object, address, address + page_size);
            }
        }
    }
    pthread_mutex_unlock(&vmas_mutex);
    if (merged)
        cover(context, COVER_MREMAP_DONTUNMAP_MERGED);
    if (neighbour_unlocked)
        cover(context, COVER_DONTUNMAP_NEIGHBOUR_UNLOCKED);
}

/* After a failed MREMAP_DONTUNMAP: the shim took the VMAs the old range
 * touched and the target, and put back what is still locked there, its
 * whole pages as lock bytes (as after a successful one). */
static void restore_after_failed_dontunmap(struct context *context, uintptr_t start, uintptr_t end)
{
    for (uintptr_t page = start; page < end; page += page_size) {
        struct object *holder = object_at(context, page);
        if (holder != NULL && holder->track[(page - holder->start) / page_size] != TRACK_NONE)
            bytes_add(holder, page, page + page_size);
    }
}

static enum exec_result exec_mremap(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_MAP || op->flags >= MREMAP_MODE_COUNT ||
        op->offset >= object->pages * page_size || op->length == 0 || op->size == 0 ||
        op->length > (uint64_t)MAX_OBJECT_PAGES * page_size ||
        op->size > (uint64_t)MAX_OBJECT_PAGES * page_size)
        return EXEC_SKIPPED;
    enum mremap_mode mode = (enum mremap_mode)op->flags;
    uintptr_t address = object->start + op->offset;
    if (mode == MREMAP_MODE_UNALIGNED) {
        void *result = mremap((void *)(address | 1), op->length, op->size, MREMAP_MAYMOVE);
        if (result != MAP_FAILED || errno != EINVAL)
            return harness_error(context, op, "mremap at an unaligned address did not fail");
        return EXEC_FAILED;
    }
    if (address % page_size != 0)
        return EXEC_SKIPPED;
    size_t old_pages = (op->length + page_size - 1) / page_size;
    size_t new_pages = (op->size + page_size - 1) / page_size;
    uintptr_t old_end = address + old_pages * page_size;
    if (!range_owned(context, address, old_end, true))
        return EXEC_SKIPPED;
    bool fixed = mode == MREMAP_MODE_FIXED || mode == MREMAP_MODE_DONTUNMAP_FIXED;
    bool dontunmap = mode == MREMAP_MODE_DONTUNMAP || mode == MREMAP_MODE_DONTUNMAP_FIXED;
    if (dontunmap && !kernel_does.dontunmap_source_listed)
        return EXEC_SKIPPED;
    int flags = mode == MREMAP_MODE_IN_PLACE ? 0 : MREMAP_MAYMOVE;
    uintptr_t target = 0, unlocked_start = 0, unlocked_end = 0;
    if (fixed) {
        struct object *over = slot_object(context, op->target);
        if (over == NULL || over->kind != OBJECT_MAP || op->target_offset % page_size != 0 ||
            op->target_offset >= over->pages * page_size)
            return EXEC_SKIPPED;
        target = over->start + op->target_offset;
        if (!range_owned(context, target, target + new_pages * page_size, true))
            return EXEC_SKIPPED;
        flags |= MREMAP_FIXED;
    }
    struct span_set kernel_decides = {0};
    if (dontunmap) {
        /* Linux clears VM_LOCKED on every VMA the old range touches, wholly,
         * not only on the old range (since 6.17 a move may span several
         * VMAs); MREMAP_FIXED first unmaps the target, which may cut one of
         * them. That much the model predicts (unlocked_start, unlocked_end),
         * whatever the layout. How much more loses its lock depends on VMA
         * merges, that is on the layout: see adopt_kernel_after_dontunmap.
         * Other threads' mappings may merge into those VMAs, so only
         * whole-process runs. */
        if (op->length != op->size || !context->whole_process)
            return EXEC_SKIPPED;
        pthread_mutex_lock(&vmas_mutex);
        size_t count = read_vmas();
        const struct vma *first = vma_containing(count, address);
        const struct vma *last = vma_containing(count, old_end - 1);
        if (first != NULL && last != NULL) {
            unlocked_start = first->start;
            unlocked_end = last->end;
        }
        span_add_vma_cluster(&kernel_decides, count, address, old_end);
        if (fixed)
            span_add_vma_cluster(&kernel_decides, count, target, target + new_pages * page_size);
        pthread_mutex_unlock(&vmas_mutex);
        if (unlocked_end == 0)
            return harness_error(context, op, "no VMA holds the old range");
        flags |= MREMAP_DONTUNMAP;
    }
    /* The VMAs the shim releases and reads back (before the target cuts them). */
    uintptr_t released_start = unlocked_start, released_end = unlocked_end;
    if (dontunmap && fixed) {
        uintptr_t target_end = target + new_pages * page_size;
        if (target < unlocked_end && target_end > unlocked_start) {
            if (target_end <= address)
                unlocked_start = target_end;
            else
                unlocked_end = target;
        }
    }

    struct remap_layout layout =
        remap_layout_before(context, address, old_end, fixed ? target : 0, new_pages);

    /* What moves: the old pages' states, for growth the old last page's, and
     * the lock bytes of what is kept (moved by the distance moved). */
    uint8_t klock[MAX_OBJECT_PAGES], track[MAX_OBJECT_PAGES], origin[MAX_OBJECT_PAGES];
    for (size_t page = 0; page < new_pages; page++) {
        uintptr_t from = address + (page < old_pages ? page : old_pages - 1) * page_size;
        const struct object *holder = object_at(context, from);
        size_t index = (from - holder->start) / page_size;
        klock[page] = holder->klock[index];
        track[page] = holder->track[index];
        origin[page] = holder->origin[index];
        if (page >= old_pages && model_bug("mremap-tail-unregistered"))
            track[page] = origin[page] = TRACK_NONE;
    }
    uintptr_t kept_end = new_pages < old_pages ? address + new_pages * page_size : old_end;
    struct byte_range moved_bytes[4 * MAX_LOCK_RANGES];
    size_t moved_count = 0;
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        const struct object *holder = &objects[slot];
        if (!holder->live || holder->start >= kept_end || object_end(holder) <= address)
            continue;
        for (size_t i = 0; i < holder->byte_ranges && moved_count < 4 * MAX_LOCK_RANGES; i++) {
            uintptr_t from = holder->bytes[i].start > address ? holder->bytes[i].start : address;
            uintptr_t to = holder->bytes[i].end < kept_end ? holder->bytes[i].end : kept_end;
            if (from < to)
                moved_bytes[moved_count++] = (struct byte_range){from, to};
        }
    }
    bool tail_tracked = new_pages > old_pages && track[new_pages - 1] != TRACK_NONE;

    pthread_mutex_lock(&marks_mutex);
    void *result = flags & MREMAP_FIXED
                       ? mremap((void *)address, op->length, op->size, flags, (void *)target)
                       : mremap((void *)address, op->length, op->size, flags);
    int call_errno = errno;
    if (result != MAP_FAILED)
        bounds_remapped_locked(address, old_end, (uintptr_t)result,
                               (uintptr_t)result + new_pages * page_size, dontunmap);
    pthread_mutex_unlock(&marks_mutex);
    errno = call_errno;
    if (result == MAP_FAILED) {
        if (errno != ENOMEM && errno != EFAULT && errno != EINVAL && errno != EAGAIN)
            return harness_error(context, op, "mremap failed unexpectedly");
        /* A failed MREMAP_FIXED may already have unmapped the target. */
        if (fixed && !model_probe_unmapped(context, target, target + new_pages * page_size))
            return EXEC_HARNESS_ERROR;
        if (dontunmap) {
            restore_after_failed_dontunmap(context, released_start, released_end);
            if (fixed)
                restore_after_failed_dontunmap(context, target, target + new_pages * page_size);
        }
        return EXEC_FAILED;
    }
    uintptr_t moved_to = (uintptr_t)result;
    uintptr_t new_end = moved_to + new_pages * page_size;
    if (fixed && moved_to != target)
        return harness_error(context, op, "MREMAP_FIXED moved elsewhere");
    if (tail_tracked)
        cover(context, COVER_MREMAP_GROWN);
    if (moved_to != address && any_registered(context, address, old_end))
        cover(context, COVER_MREMAP_MOVED);
    if (fixed)
        cover(context, COVER_MREMAP_FIXED);
    if (dontunmap)
        cover(context, COVER_MREMAP_DONTUNMAP);
    cover_remap_layout(context, &layout, moved_to != address || dontunmap, fixed, dontunmap,
                       moved_to == address ? (int)new_pages - (int)old_pages : 0);
    if (moved_to == address) {
        if (new_pages < old_pages)
            cover(context, COVER_MREMAP_SHRUNK);
        if (new_pages < old_pages)
            return model_unmap(context, new_end, old_end) ? EXEC_DONE : EXEC_HARNESS_ERROR;
        if (new_pages > old_pages) {
            /* Grown in place: the pages after old_end were free. */
            struct object *holder = object_at(context, old_end - page_size);
            size_t extra = new_pages - old_pages;
            if (object_at(context, old_end) != NULL)
                return harness_error(context, op, "mremap grew over a model page");
            if (object_end(holder) == old_end && holder->pages + extra <= MAX_OBJECT_PAGES) {
                memcpy(holder->klock + holder->pages, klock + old_pages, extra);
                memcpy(holder->track + holder->pages, track + old_pages, extra);
                memcpy(holder->origin + holder->pages, origin + old_pages, extra);
                holder->pages += extra;
            } else if (model_add_map(context, old_end, extra, klock + old_pages, track + old_pages,
                                     origin + old_pages) == NULL) {
                return EXEC_HARNESS_ERROR;
            }
            if (tail_tracked)
                model_bytes_add(context, old_end, new_end);
        }
        return EXEC_DONE;
    }
    if (!dontunmap && !model_unmap(context, address, old_end))
        return EXEC_HARNESS_ERROR;
    if (fixed) {
        if (!model_unmap(context, target, target + new_pages * page_size))
            return EXEC_HARNESS_ERROR;
    } else if (object_at(context, moved_to) != NULL) {
        return harness_error(context, op, "mremap moved onto a model page");
    }
    struct object *moved = model_add_map(context, moved_to, new_pages, klock, track, origin);
    if (moved == NULL)
        return EXEC_HARNESS_ERROR;
    if (dontunmap) {
        struct dontunmap_call call = {address,        old_end,      moved_to,       new_end,
                                      unlocked_start, unlocked_end, released_start, released_end};
        adopt_kernel_after_dontunmap(context, &call, &kernel_decides);
        return EXEC_DONE;
    }
    for (size_t i = 0; i < moved_count; i++)
        bytes_add(moved, moved_bytes[i].start - address + moved_to,
                  moved_bytes[i].end - address + moved_to);
    if (tail_tracked)
        bytes_add(moved, moved_to + old_pages * page_size, new_end);
    return EXEC_DONE;
}

static void forget_heap_object(struct context *context, struct object *object)
{
    if (any_registered(context, object->start, object_end(object)))
        cover(context, COVER_FREE_REGISTERED);
    for (size_t page = 0; page < object->pages; page++)
        if (object->klock[page] != KLOCK_NO)
            add_leftover(context, object->start + page * page_size,
                         object->start + (page + 1) * page_size);
    /* The shim releases every page the block touches (none holds lock bytes
     * of other memory: locks stay inside the interior pages). */
    memset(object->track, TRACK_NONE, object->pages);
    memset(object->origin, 0, object->pages);
    object->byte_ranges = 0;
    object->live = false;
}

/* Hides a size from the compiler's allocation-size warnings: these calls are
 * meant to fail. */
static volatile size_t too_big_size = (size_t)PTRDIFF_MAX + 1;
static volatile size_t overflow_count = SIZE_MAX / 2;

/* A failed realloc leaves the block valid; GCC's use-after-free warning cannot know it failed. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif
static enum exec_result exec_free(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_HEAP)
        return EXEC_SKIPPED;
    if (op->kind == OP_FREE) {
        free(object->pointer);
        forget_heap_object(context, object);
        return EXEC_DONE;
    }
    char *result;
    size_t size = op->size;
    switch ((enum realloc_mode)op->flags) {
    case REALLOC_TOO_BIG:
    case REALLOC_ARRAY_OVERFLOW:
        errno = 0;
        result = op->flags == REALLOC_TOO_BIG ? realloc(object->pointer, too_big_size)
                                              : reallocarray(object->pointer, overflow_count, 4);
        if (result != NULL || errno != ENOMEM)
            return harness_error(context, op, "an impossible realloc did not fail ENOMEM");
        return EXEC_FAILED; /* the block and its registrations stay */
    case REALLOC_PLAIN:
        if (size > (uint64_t)MAX_OBJECT_PAGES * page_size)
            return EXEC_SKIPPED;
        result = realloc(object->pointer, size);
        break;
    case REALLOC_ARRAY:
        if (size > (uint64_t)MAX_OBJECT_PAGES * page_size)
            return EXEC_SKIPPED;
        size = size / 16 * 16;
        result = reallocarray(object->pointer, size / 16, 16);
        break;
    default:
        return EXEC_SKIPPED;
    }
    if (size == 0) {
        /* glibc frees the block and may return NULL. */
        forget_heap_object(context, object);
        if (result != NULL)
            free(result);
        return EXEC_DONE;
    }
    if (result == NULL)
        return harness_error(context, op, "realloc failed");
    forget_heap_object(context, object);
    object->live = true;
    object->pointer = result;
    object->size = size;
    object->start = page_ceil((uintptr_t)result);
    uintptr_t end = page_floor((uintptr_t)result + size);
    object->pages = end > object->start ? (end - object->start) / page_size : 0;
    memset(object->klock, KLOCK_UNKNOWN, object->pages);
    return EXEC_DONE;
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic pop
#endif

/* Lock or unlock from inside a map object across its end into an unmapped
 * page: Linux applies the call up to the hole and fails with ENOMEM. */
static enum exec_result exec_hole(struct context *context, const struct op *op)
{
    struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_MAP || op->offset >= object->pages * page_size)
        return EXEC_SKIPPED;
    uintptr_t hole = object_end(object);
    if (object_at(context, hole) != NULL || page_mapped(hole))
        return EXEC_SKIPPED; /* no hole there now */
    uintptr_t address = object->start + op->offset;
    size_t length = hole + page_size - address;
    uintptr_t start = page_floor(address);
    int result = op->kind == OP_MLOCK_HOLE ? mlock((void *)address, length)
                                           : munlock((void *)address, length);
    if (result == 0 || errno != ENOMEM)
        return harness_error(context, op, "a call over a hole did not fail ENOMEM");
    if (op->kind == OP_MUNLOCK_HOLE) {
        model_release(context, start, hole, KLOCK_NO);
    } else {
        /* Locked up to the hole, unless RLIMIT_MEMLOCK stopped it first. */
        for (uintptr_t page = start; page < hole; page += page_size) {
            struct object *holder = object_at(context, page);
            size_t index = (page - holder->start) / page_size;
            if (holder->klock[index] != KLOCK_YES)
                holder->klock[index] = KLOCK_UNKNOWN;
        }
    }
    return EXEC_FAILED;
}

static enum exec_result exec_all(struct context *context, const struct op *op)
{
    if (!context->whole_process)
        return EXEC_SKIPPED;
    if (op->kind == OP_MUNLOCKALL) {
        if (munlockall() != 0)
            return harness_error(context, op, "munlockall failed");
        for (int slot = 0; slot < MAX_SLOTS; slot++) {
            memset(objects[slot].klock, KLOCK_NO, MAX_OBJECT_PAGES);
            memset(objects[slot].track, TRACK_NONE, MAX_OBJECT_PAGES);
            memset(objects[slot].origin, 0, MAX_OBJECT_PAGES);
            objects[slot].byte_ranges = 0;
        }
        context->leftover_count = 0;
        for (int t = 0; t < MAX_THREADS; t++)
            thread_contexts[t].leftover_count = 0;
        return EXEC_DONE;
    }
    if (mlockall(MCL_CURRENT) != 0) {
        if (errno == ENOMEM || errno == EPERM)
            return EXEC_FAILED; /* RLIMIT_MEMLOCK */
        return harness_error(context, op, "mlockall failed");
    }
    for (int slot = 0; slot < MAX_SLOTS; slot++)
        memset(objects[slot].klock, KLOCK_YES, MAX_OBJECT_PAGES);
    return EXEC_DONE;
}

/* ---- Copies (see the header) ---- */

#define COPY_MAX_BYTES (1u << 20) /* the most one copy moves: the device buffer's size */

/* cudaMemcpyKind, hipMemcpyKind: host to device, device to host. */
enum { COPY_HOST_TO_DEVICE = 1, COPY_DEVICE_TO_HOST = 2 };

/* The copy counters: fake_cuda_copy_count's kinds (PINNED, PAGEABLE, REFUSED,
 * DEVICE, HOST, INVALID) and fake_gpu_copy_count's (PINNED, STAGED, REFUSED,
 * HOST, DEVICE); the first two mean the same in both. */
enum { COPY_COUNT_PINNED = 0, COPY_COUNT_PAGEABLE = 1, COPY_COUNT_KINDS = 6 };

/* Level Zero's descriptors as ze_api.h lays them out (the model is built
 * without the vendors' headers). */
struct ze_desc_context {
    uint32_t stype;
    const void *next;
    uint32_t flags;
};
struct ze_desc_queue {
    uint32_t stype;
    const void *next;
    uint32_t ordinal, index, flags, mode, priority;
};
struct ze_desc_device_memory {
    uint32_t stype;
    const void *next;
    uint32_t flags, ordinal;
};
enum {
    ZE_STYPE_CONTEXT_DESC = 0xd,
    ZE_STYPE_COMMAND_QUEUE_DESC = 0xe,
    ZE_STYPE_DEVICE_MEM_ALLOC_DESC = 0x15,
    ZE_MODE_SYNCHRONOUS = 1,
    ZE_MODE_ASYNCHRONOUS = 2,
};

/* The vendor's copy calls, the device buffer and the fake's counters, set
 * up at the first copy (copier_ready); copies are serialised by copy_mutex,
 * so that the counters' changes are a copy's own. */
static struct {
    bool ready;
    void *device;
    /* CUDA, HIP: (dst, src, bytes, kind), (..., stream), (stream), () */
    int (*copy)(void *, const void *, size_t, int);
    int (*copy_async)(void *, const void *, size_t, int, void *);
    int (*synchronize)(void *);
    int (*get_last_error)(void);
    /* Level Zero: an immediate list of each mode */
    int (*append_copy)(void *, void *, const void *, size_t, void *, uint32_t, void **);
    int (*list_synchronize)(void *, uint64_t);
    void *sync_list, *async_list;
    uint64_t (*count)(int);
    int count_kinds;
} copier;
static pthread_mutex_t copy_mutex = PTHREAD_MUTEX_INITIALIZER;

typedef int (*ze_get_fn)(uint32_t *, void **);
typedef int (*ze_device_get_fn)(void *, uint32_t *, void **);
typedef int (*ze_context_create_fn)(void *, const struct ze_desc_context *, void **);
typedef int (*ze_list_create_fn)(void *, void *, const struct ze_desc_queue *, void **);
typedef int (*ze_alloc_fn)(void *, const struct ze_desc_device_memory *, size_t, size_t, void *,
                           void **);

/* Level Zero's device memory and immediate lists, from the loader. */
static bool ze_copier(void *loader)
{
    ze_get_fn driver_get = (ze_get_fn)dlsym(loader, "zeDriverGet");
    ze_device_get_fn device_get = (ze_device_get_fn)dlsym(loader, "zeDeviceGet");
    ze_context_create_fn context_create = (ze_context_create_fn)dlsym(loader, "zeContextCreate");
    ze_list_create_fn list_create =
        (ze_list_create_fn)dlsym(loader, "zeCommandListCreateImmediate");
    ze_alloc_fn alloc = (ze_alloc_fn)dlsym(loader, "zeMemAllocDevice");
    copier.append_copy = (int (*)(void *, void *, const void *, size_t, void *, uint32_t,
                                  void **))dlsym(loader, "zeCommandListAppendMemoryCopy");
    copier.list_synchronize =
        (int (*)(void *, uint64_t))dlsym(loader, "zeCommandListHostSynchronize");
    if (driver_get == NULL || device_get == NULL || context_create == NULL || list_create == NULL ||
        alloc == NULL || copier.append_copy == NULL || copier.list_synchronize == NULL)
        return false;
    uint32_t count = 1;
    void *driver = NULL, *device = NULL, *ze_context = NULL;
    if (driver_get(&count, &driver) != 0 || count == 0)
        return false;
    count = 1;
    if (device_get(driver, &count, &device) != 0 || count == 0)
        return false;
    struct ze_desc_context context_desc = {ZE_STYPE_CONTEXT_DESC, NULL, 0};
    if (context_create(driver, &context_desc, &ze_context) != 0)
        return false;
    struct ze_desc_queue sync_desc = {ZE_STYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                      ZE_MODE_SYNCHRONOUS,         0};
    struct ze_desc_queue async_desc = {ZE_STYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0,
                                       ZE_MODE_ASYNCHRONOUS,        0};
    struct ze_desc_device_memory memory_desc = {ZE_STYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
    return list_create(ze_context, device, &sync_desc, &copier.sync_list) == 0 &&
           list_create(ze_context, device, &async_desc, &copier.async_list) == 0 &&
           alloc(ze_context, &memory_desc, COPY_MAX_BYTES, 0, device, &copier.device) == 0 &&
           copier.device != NULL;
}

/* Sets the copies up, once the runtime is loaded in the process (and, for
 * Level Zero, initialised: zeInit): false until then (the model never loads
 * or starts a runtime itself; see the header). A loaded runtime that gives
 * no device memory or copy calls is a harness error (*failed). copy_mutex held. */
static bool copier_ready(struct context *context, bool *failed)
{
    *failed = false;
    if (copier.ready)
        return true;
    if (child_registration_disabled || !load_fake())
        return false;
    void *runtime = dlopen(fake_library(), RTLD_NOW | RTLD_NOLOAD);
    if (runtime == NULL)
        return false;
    bool ok = false;
    if (vendor == MODEL_ZE) {
        int (*initialized)(void) = (int (*)(void))dlsym(runtime, "fake_ze_initialized");
        if (initialized == NULL || !initialized()) {
            dlclose(runtime);
            return false;
        }
        copier.count = (uint64_t(*)(int))dlsym(runtime, "fake_gpu_copy_count");
        copier.count_kinds = 5;
        ok = copier.count != NULL && ze_copier(runtime);
    } else {
        bool cuda = vendor == MODEL_CUDA;
        int (*device_malloc)(void **, size_t) =
            (int (*)(void **, size_t))dlsym(runtime, cuda ? "cudaMalloc" : "hipMalloc");
        copier.copy = (int (*)(void *, const void *, size_t, int))dlsym(
            runtime, cuda ? "cudaMemcpy" : "hipMemcpy");
        copier.copy_async = (int (*)(void *, const void *, size_t, int, void *))dlsym(
            runtime, cuda ? "cudaMemcpyAsync" : "hipMemcpyAsync");
        copier.synchronize = (int (*)(void *))dlsym(runtime, cuda ? "cudaStreamSynchronize"
                                                                  : "hipStreamSynchronize");
        copier.get_last_error =
            (int (*)(void))dlsym(runtime, cuda ? "cudaGetLastError" : "hipGetLastError");
        if (device_malloc != NULL && copier.copy != NULL && copier.copy_async != NULL &&
            copier.synchronize != NULL && copier.get_last_error != NULL &&
            device_malloc(&copier.device, COPY_MAX_BYTES) == 0 && copier.device != NULL) {
            /* CUDA: the driver's counters (the runtime has loaded it by now). */
            void *counters = cuda ? dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) : runtime;
            copier.count = counters
                               ? (uint64_t(*)(int))dlsym(counters, cuda ? "fake_cuda_copy_count"
                                                                        : "fake_gpu_copy_count")
                               : NULL;
            copier.count_kinds = cuda ? 6 : 5;
            if (cuda && counters != NULL)
                dlclose(counters);
            ok = copier.count != NULL;
        }
    }
    dlclose(runtime); /* the reference NOLOAD took; the library stays */
    if (!ok) {
        *failed = true;
        report(context, "harness: cannot copy through %s (no device memory or copy calls)\n",
               fake_library());
        return false;
    }
    copier.ready = true;
    return true;
}

/* One copy through the vendor's API, waited for when asynchronous. */
static int vendor_copy(void *destination, const void *source, size_t length, int kind, bool async)
{
    if (vendor == MODEL_ZE) {
        void *list = async ? copier.async_list : copier.sync_list;
        int result = copier.append_copy(list, destination, source, length, NULL, 0, NULL);
        return result != 0 || !async ? result : copier.list_synchronize(list, UINT64_MAX);
    }
    if (!async)
        return copier.copy(destination, source, length, kind);
    int result = copier.copy_async(destination, source, length, kind, NULL);
    return result != 0 ? result : copier.synchronize(NULL);
}

static uint8_t pattern_byte(uint64_t seed, size_t at)
{
    uint64_t mixed = (seed + at) * 0x9e3779b97f4a7c15ull;
    return (uint8_t)((mixed >> 32) ^ (at >> 12));
}

/* Whether the bytes [start, end) of object lie in locked pages, all in one
 * run or all in pages the shim does not track (context->runs as computed
 * now); *registered: in a registered run. */
static bool copy_range_valid(const struct context *context, const struct object *object,
                             uintptr_t start, uintptr_t end, bool *registered)
{
    if (start >= end || start < object->start || end > object_end(object))
        return false;
    const struct run *run = run_at(context, page_floor(start));
    for (uintptr_t page = page_floor(start); page < end; page += page_size) {
        if (object->klock[(page - object->start) / page_size] != KLOCK_YES ||
            run_at(context, page) != run)
            return false;
    }
    *registered = run != NULL && run->registered;
    return true;
}

/* A copy of locked memory: op->length bytes at op->offset of slot op->slot
 * filled with a pattern, copied to device memory and back to op->target_offset
 * of slot op->target (cleared first, or the same bytes, cleared after the
 * first copy); flags bit 0: the first copy asynchronous, bit 1: the second.
 * Both must succeed, the bytes arrive, and each copy count as pinned exactly
 * when its host range lies in a registered run. */
static enum exec_result exec_copy(struct context *context, const struct op *op, size_t index)
{
    struct object *source = slot_object(context, op->slot);
    struct object *destination = slot_object(context, op->target);
    if (source == NULL || destination == NULL || op->length == 0 || op->length > COPY_MAX_BYTES ||
        op->offset >= source->pages * page_size ||
        op->target_offset >= destination->pages * page_size)
        return EXEC_SKIPPED;
    size_t length = (size_t)op->length;
    unsigned char *from = (unsigned char *)(source->start + op->offset);
    unsigned char *to = (unsigned char *)(destination->start + op->target_offset);
    bool same = from == to;
    if (!same && from < to + length && to < from + length)
        return EXEC_SKIPPED;
    bool from_registered = false, to_registered = false;
    if (!compute_runs(context, context) ||
        !copy_range_valid(context, source, (uintptr_t)from, (uintptr_t)from + length,
                          &from_registered) ||
        !copy_range_valid(context, destination, (uintptr_t)to, (uintptr_t)to + length,
                          &to_registered))
        return EXEC_SKIPPED;
    pthread_mutex_lock(&copy_mutex);
    bool failed;
    if (!copier_ready(context, &failed)) {
        pthread_mutex_unlock(&copy_mutex);
        return failed ? EXEC_HARNESS_ERROR : EXEC_SKIPPED;
    }
    if (shim_drain != NULL)
        shim_drain();
    uint64_t seed = ((uint64_t)index << 20) ^ op->offset ^ (op->length << 40);
    for (size_t i = 0; i < length; i++)
        from[i] = pattern_byte(seed, i);
    if (!same)
        for (size_t i = 0; i < length; i++)
            to[i] = (uint8_t)~pattern_byte(seed, i);
    uint64_t before[COPY_COUNT_KINDS] = {0}, after[COPY_COUNT_KINDS] = {0};
    for (int kind = 0; kind < copier.count_kinds; kind++)
        before[kind] = copier.count(kind);
    int to_device =
        vendor_copy(copier.device, from, length, COPY_HOST_TO_DEVICE, (op->flags & 1) != 0);
    if (same)
        for (size_t i = 0; i < length; i++)
            to[i] = (uint8_t)~pattern_byte(seed, i);
    int to_host = to_device != 0 ? 0
                                 : vendor_copy(to, copier.device, length, COPY_DEVICE_TO_HOST,
                                               (op->flags & 2) != 0);
    for (int kind = 0; kind < copier.count_kinds; kind++)
        after[kind] = copier.count(kind);
    if ((to_device != 0 || to_host != 0) && copier.get_last_error != NULL)
        copier.get_last_error(); /* reported below, not left for the next check */
    pthread_mutex_unlock(&copy_mutex);

    char line[256];
    format_op(op, line, sizeof(line));
    if (to_device != 0 || to_host != 0) {
        report(context, "copy failed: %s: host to device %d, device to host %d\n", line, to_device,
               to_host);
        return EXEC_DONE;
    }
    for (size_t i = 0; i < length; i++) {
        if (to[i] != pattern_byte(seed, i) || (!same && from[i] != pattern_byte(seed, i))) {
            report(context, "copy moved the wrong bytes: %s: byte %zu\n", line, i);
            return EXEC_DONE;
        }
    }
    uint64_t pinned = (uint64_t)from_registered + (uint64_t)to_registered;
    for (int kind = 0; kind < copier.count_kinds; kind++) {
        uint64_t want = kind == COPY_COUNT_PINNED     ? pinned
                        : kind == COPY_COUNT_PAGEABLE ? 2 - pinned
                                                      : 0;
        if (after[kind] - before[kind] != want)
            report(context,
                   "copy counted wrong: %s: %" PRIu64 " copies of outcome %d, the model "
                   "expects %" PRIu64 " (host ranges %s, %s)\n",
                   line, after[kind] - before[kind], kind, want,
                   from_registered ? "registered" : "unregistered",
                   to_registered ? "registered" : "unregistered");
    }
    cover(context, from_registered ? COVER_COPY_PINNED : COVER_COPY_PAGEABLE);
    cover(context, to_registered ? COVER_COPY_PINNED : COVER_COPY_PAGEABLE);
    return EXEC_DONE;
}

static enum exec_result exec_fork(struct context *context, const struct op *op, size_t index);

static enum exec_result execute(struct context *context, const struct op *op, size_t index)
{
    switch (op->kind) {
    case OP_MALLOC:
    case OP_POSIX_MEMALIGN:
    case OP_ALIGNED_ALLOC:
        return exec_allocate(context, op);
    case OP_MMAP:
    case OP_MMAP_BESIDE:
        return exec_mmap(context, op);
    case OP_MLOCK:
    case OP_MLOCK2:
    case OP_MUNLOCK:
        return exec_lock(context, op);
    case OP_MUNMAP:
        return exec_munmap(context, op);
    case OP_MMAP_FIXED:
    case OP_MMAP_NOREPLACE:
        return exec_mmap_fixed(context, op);
    case OP_MREMAP:
        return exec_mremap(context, op);
    case OP_FREE:
    case OP_REALLOC:
        return exec_free(context, op);
    case OP_MUNLOCKALL:
    case OP_MLOCKALL:
        return exec_all(context, op);
    case OP_FORK:
        return exec_fork(context, op, index);
    case OP_MLOCK_HOLE:
    case OP_MUNLOCK_HOLE:
        return exec_hole(context, op);
    case OP_COPY:
        return exec_copy(context, op, index);
    case OP_KIND_COUNT:
        break;
    }
    return EXEC_SKIPPED;
}

/* ------------------------------------------------------------------------ */
/* Generating operations.                                                   */

/* A live object of this context matching want (or any), chosen at random. */
static struct object *pick_object(struct context *context, bool (*want)(const struct object *))
{
    int candidates[SLOTS_PER_THREAD * MAX_THREADS];
    int count = 0;
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        if (objects[slot].live && (want == NULL || want(&objects[slot])))
            candidates[count++] = slot;
    if (count == 0)
        return NULL;
    return &objects[candidates[rng_below(&context->rng, (uint64_t)count)]];
}

static bool is_heap(const struct object *object)
{
    return object->kind == OBJECT_HEAP;
}

static bool is_map(const struct object *object)
{
    return object->kind == OBJECT_MAP;
}

static bool has_pages(const struct object *object)
{
    return object->pages > 0;
}

/* A byte range inside [0, pages) pages: whole, page-aligned, unaligned, or
 * around PINSHIM_MIN_BYTES. */
static void pick_span(struct context *context, size_t pages, uint64_t *offset, uint64_t *length)
{
    uint64_t *rng = &context->rng;
    uint64_t first = rng_below(rng, pages);
    uint64_t last = rng_between(rng, first, pages - 1); /* inclusive */
    if (rng_chance(rng, 0.5)) {
        /* Bias toward larger spans so large locks are common. */
        first = rng_below(rng, (pages + 3) / 4);
        last = rng_between(rng, first + (pages - first) / 2, pages - 1);
    }
    unsigned choice = (unsigned)rng_below(rng, 100);
    if (choice < 15) {
        *offset = 0;
        *length = pages * page_size;
    } else if (choice < 45) {
        *offset = first * page_size;
        *length = (last - first + 1) * page_size;
    } else if (choice < 82) {
        uint64_t head = rng_below(rng, page_size);
        uint64_t tail = rng_between(rng, 1, page_size);
        *offset = first * page_size + head;
        uint64_t end = last * page_size + tail;
        if (end <= *offset)
            end = (last + 1) * page_size;
        *length = end - *offset;
    } else if (choice < 97) {
        static const int64_t deltas[] = {-1, 0, 1, -4096, 4096, -100, 100};
        int64_t delta = deltas[rng_below(rng, sizeof(deltas) / sizeof(*deltas))];
        uint64_t want = (uint64_t)((int64_t)min_bytes + delta);
        uint64_t head = rng_chance(rng, 0.5) ? rng_below(rng, page_size) : 0;
        uint64_t span = (head + want + page_size - 1) / page_size;
        if (span <= pages) {
            *offset = rng_below(rng, pages - span + 1) * page_size + head;
            *length = want;
        } else {
            *offset = first * page_size;
            *length = (last - first + 1) * page_size;
        }
    } else {
        *offset = first * page_size + rng_between(rng, 1, page_size - 1);
        *length = 0; /* Linux still acts on the page */
    }
}

/* The map object starting where object ends, if this context owns one. */
static struct object *next_adjacent(struct context *context, const struct object *object)
{
    struct object *next = object_at(context, object_end(object));
    return next != NULL && next->kind == OBJECT_MAP && object->kind == OBJECT_MAP ? next : NULL;
}

static uint64_t pick_heap_size(struct context *context)
{
    uint64_t *rng = &context->rng;
    unsigned choice = (unsigned)rng_below(rng, 100);
    if (choice < 15)
        return rng_between(rng, 1024, 64 * 1024 - 1);
    if (choice < 80)
        return rng_between(rng, 64 * 1024, 320 * 1024);
    return rng_between(rng, 320 * 1024, 520 * 1024);
}

/* ---- Layout plans ----
 * A few ops built together so that a whole-process run reaches, on purpose,
 * the layouts where the kernel's VMA splits and merges decide what stays
 * locked (issue 9: a machine whose layout differed met a merge the model did
 * not know). Each op is an ordinary op, recorded and replayed as such; when
 * an earlier op of a plan fails, the later ones are skipped or act on what
 * is there. The coverage counters (COVER_DONTUNMAP_TARGET_BELOW ...) say
 * whether the layouts were reached, from the kernel's VMAs, not from the
 * plan. */

enum plan_kind {
    PLAN_SPLIT_MOVE,           /* lock a middle part (split), maybe join again, move across */
    PLAN_ADJACENT_MOVE,        /* lock, then move pages right below or above, same mapping */
    PLAN_MMAP_BESIDE,          /* map next to a mapping (merge), lock one, resize the other */
    PLAN_RESIZE_BESIDE_LOCKED, /* grow or shrink in place next to locked pages */
    PLAN_KIND_COUNT
};

static struct op plan_op(enum op_kind kind, int slot)
{
    struct op op;
    memset(&op, 0, sizeof(op));
    op.kind = kind;
    op.slot = slot;
    op.target = -1;
    return op;
}

static struct op plan_lock(struct context *context, int slot, size_t first, size_t count)
{
    bool onfault = rng_chance(&context->rng, 0.5);
    struct op op = plan_op(onfault ? OP_MLOCK2 : OP_MLOCK, slot);
    op.offset = first * page_size;
    op.length = count * page_size;
    op.flags = onfault ? MLOCK_ONFAULT : 0;
    return op;
}

static struct object *pick_map_with(struct context *context, size_t min_pages)
{
    int candidates[MAX_SLOTS];
    int count = 0;
    for (int slot = context->slot_first; slot < context->slot_end; slot++)
        if (objects[slot].live && objects[slot].kind == OBJECT_MAP &&
            objects[slot].pages >= min_pages)
            candidates[count++] = slot;
    return count ? &objects[candidates[rng_below(&context->rng, (uint64_t)count)]] : NULL;
}

/* A move of pages [first, first + count) of the n-page map object in slot:
 * mostly MREMAP_FIXED (with or without DONTUNMAP) onto the pages right below
 * or above, or elsewhere in the same mapping; sometimes DONTUNMAP or a plain
 * move to where the kernel likes. */
static struct op plan_move(struct context *context, int slot, size_t n, size_t first, size_t count)
{
    uint64_t *rng = &context->rng;
    struct op op = plan_op(OP_MREMAP, slot);
    op.offset = first * page_size;
    op.length = op.size = count * page_size;
    unsigned choice = (unsigned)rng_below(rng, 100);
    op.flags = choice < 40   ? MREMAP_MODE_DONTUNMAP_FIXED
               : choice < 70 ? MREMAP_MODE_FIXED
               : choice < 90 ? MREMAP_MODE_DONTUNMAP
                             : MREMAP_MODE_MAYMOVE;
    if (op.flags != MREMAP_MODE_FIXED && op.flags != MREMAP_MODE_DONTUNMAP_FIXED)
        return op;
    bool below = first >= count, above = first + 2 * count <= n;
    unsigned where = (unsigned)rng_below(rng, 3); /* below, above, elsewhere */
    if (where == 0 && !below)
        where = above ? 1 : 2;
    if (where == 1 && !above)
        where = below ? 0 : 2;
    op.target = slot;
    if (where == 0) {
        op.target_offset = (first - count) * page_size;
    } else if (where == 1) {
        op.target_offset = (first + count) * page_size;
    } else if (first >= count + 1) {
        op.target_offset = rng_below(rng, first - count) * page_size;
    } else if (first + 2 * count + 1 <= n) {
        op.target_offset = rng_between(rng, first + count + 1, n - count) * page_size;
    } else {
        op.target = -1;
        op.flags = op.flags == MREMAP_MODE_FIXED ? MREMAP_MODE_MAYMOVE : MREMAP_MODE_DONTUNMAP;
    }
    return op;
}

/* Fills context->plan; false when no plan fits the objects there are now. */
static bool make_plan(struct context *context, bool can_create)
{
    uint64_t *rng = &context->rng;
    struct op *plan = context->plan;
    size_t count = 0;
    switch ((enum plan_kind)rng_below(rng, PLAN_KIND_COUNT)) {
    case PLAN_SPLIT_MOVE: {
        /* mlock of a middle part splits the VMA in three; munlock of it, or
         * a lock of the whole, may join them again. The move spans where a
         * boundary was. */
        struct object *object = pick_map_with(context, 6);
        if (object == NULL)
            return false;
        int slot = (int)(object - objects);
        size_t n = object->pages;
        size_t low = rng_between(rng, 1, n - 3), high = rng_between(rng, low + 1, n - 2);
        plan[count++] = plan_lock(context, slot, low, high - low);
        if (rng_chance(rng, 0.6)) {
            struct op join = plan[0];
            if (rng_chance(rng, 0.5)) {
                join.kind = OP_MUNLOCK;
                join.flags = 0;
            } else {
                join.offset = 0;
                join.length = n * page_size;
            }
            plan[count++] = join;
        }
        size_t boundary = rng_chance(rng, 0.5) ? low : high;
        size_t first = rng_between(rng, boundary > 3 ? boundary - 3 : 0, boundary - 1);
        size_t last = rng_between(rng, boundary + 1, boundary + 3 < n ? boundary + 3 : n);
        plan[count++] = plan_move(context, slot, n, first, last - first);
        break;
    }
    case PLAN_ADJACENT_MOVE: {
        /* Issue 9's seed 18: lock (often on fault, in a fresh mapping that
         * was never faulted in), then move a few pages onto the ones right
         * below or above, inside the same mapping. */
        int slot;
        size_t n;
        if (can_create && rng_chance(rng, 0.5)) {
            slot = free_slot(context);
            n = rng_between(rng, 4, 48);
            struct op map = plan_op(OP_MMAP, slot);
            map.length = n * page_size;
            map.flags = rng_chance(rng, 0.8) ? MMAP_FLAG_NORESERVE : 0;
            plan[count++] = map;
        } else {
            struct object *object = pick_map_with(context, 3);
            if (object == NULL)
                return false;
            slot = (int)(object - objects);
            n = object->pages;
        }
        size_t moved = rng_between(rng, 1, n / 3 < 4 ? n / 3 : 4);
        bool below = rng_chance(rng, 0.5);
        size_t first =
            below ? rng_between(rng, moved, n - moved) : rng_below(rng, n - 2 * moved + 1);
        size_t target = below ? first - moved : first + moved;
        size_t low = below ? target : first, high = below ? first + moved : target + moved;
        size_t lock_low = rng_chance(rng, 0.5) ? 0 : rng_between(rng, 0, low);
        size_t lock_high = rng_chance(rng, 0.5) ? n : rng_between(rng, high, n);
        if (rng_chance(rng, 0.85)) {
            /* Mostly on fault: mlock faults the pages in, and a VMA that was
             * faulted in does not merge with its neighbours when moved. */
            plan[count] = plan_lock(context, slot, lock_low, lock_high - lock_low);
            plan[count].kind = rng_chance(rng, 0.75) ? OP_MLOCK2 : OP_MLOCK;
            plan[count].flags = plan[count].kind == OP_MLOCK2 ? MLOCK_ONFAULT : 0;
            count++;
        }
        struct op move = plan_op(OP_MREMAP, slot);
        move.offset = first * page_size;
        move.length = move.size = moved * page_size;
        move.flags = rng_chance(rng, 0.7) ? MREMAP_MODE_DONTUNMAP_FIXED : MREMAP_MODE_FIXED;
        move.target = slot;
        move.target_offset = target * page_size;
        plan[count++] = move;
        break;
    }
    case PLAN_MMAP_BESIDE: {
        /* A mapping right above or below another, which the kernel merges
         * with it when their flags agree; then locks across or beside the
         * seam, and an in-place resize next to the locked one. */
        struct object *object = pick_map_with(context, 1);
        if (object == NULL || !can_create)
            return false;
        int beside = (int)(object - objects), slot = free_slot(context);
        size_t pages = rng_between(rng, 1, 32);
        bool below = rng_chance(rng, 0.5);
        struct op map = plan_op(OP_MMAP_BESIDE, slot);
        map.length = pages * page_size;
        map.target = beside;
        /* Half the time locked as the neighbouring page is, so that the
         * flags agree and the kernel can merge the two. */
        bool neighbour_locked = object->klock[below ? 0 : object->pages - 1] == KLOCK_YES;
        bool locked = rng_chance(rng, 0.5) ? neighbour_locked : rng_chance(rng, 0.3);
        map.flags = (below ? MMAP_FLAG_BELOW : 0) | (locked ? MMAP_FLAG_LOCKED : 0) |
                    (rng_chance(rng, 0.2) ? MMAP_FLAG_NORESERVE : 0);
        plan[count++] = map;
        int lower = below ? slot : beside, upper = below ? beside : slot;
        size_t lower_pages = below ? pages : object->pages;
        size_t upper_pages = below ? object->pages : pages;
        unsigned choice = (unsigned)rng_below(rng, 3);
        if (choice == 0) {
            /* Across the seam. */
            size_t from = rng_below(rng, lower_pages);
            plan[count] = plan_lock(context, lower, from, lower_pages - from);
            plan[count++].length += rng_between(rng, 1, upper_pages) * page_size;
        } else {
            /* Lock one whole, shrink (or grow) the other in place beside it. */
            bool lock_upper = choice == 1;
            size_t other_pages = lock_upper ? lower_pages : upper_pages;
            plan[count++] = plan_lock(context, lock_upper ? upper : lower, 0,
                                      lock_upper ? upper_pages : lower_pages);
            struct op resize = plan_op(OP_MREMAP, lock_upper ? lower : upper);
            resize.flags = MREMAP_MODE_IN_PLACE;
            size_t first = lock_upper ? rng_below(rng, other_pages) : 0;
            size_t span = lock_upper ? other_pages - first : rng_between(rng, 1, other_pages);
            resize.offset = first * page_size;
            resize.length = span * page_size;
            resize.size = (span > 1 && rng_chance(rng, 0.7) ? rng_between(rng, 1, span - 1)
                                                            : span + rng_between(rng, 1, 4)) *
                          page_size;
            plan[count++] = resize;
        }
        break;
    }
    case PLAN_RESIZE_BESIDE_LOCKED: {
        /* Unmap the top of a mapping (room to grow into), lock the part
         * below a range, then grow or shrink the range in place; or lock the
         * part above a range and shrink it. */
        struct object *object = pick_map_with(context, 6);
        if (object == NULL)
            return false;
        int slot = (int)(object - objects);
        size_t n = object->pages, hole = rng_between(rng, 1, 3), top = n - hole;
        size_t split = rng_between(rng, 1, top - 2);
        struct op unmap = plan_op(OP_MUNMAP, slot);
        unmap.offset = top * page_size;
        unmap.length = hole * page_size;
        plan[count++] = unmap;
        struct op resize = plan_op(OP_MREMAP, slot);
        resize.flags = MREMAP_MODE_IN_PLACE;
        if (rng_chance(rng, 0.7)) {
            plan[count++] = plan_lock(context, slot, 0, split);
            size_t span = top - split;
            resize.offset = split * page_size;
            resize.length = span * page_size;
            resize.size = (span > 1 && rng_chance(rng, 0.4) ? rng_between(rng, 1, span - 1)
                                                            : span + rng_between(rng, 1, hole)) *
                          page_size;
        } else {
            plan[count++] = plan_lock(context, slot, split, top - split);
            resize.offset = 0;
            resize.length = split * page_size;
            resize.size = (split > 1 ? rng_between(rng, 1, split - 1) : 1) * page_size;
        }
        plan[count++] = resize;
        break;
    }
    case PLAN_KIND_COUNT:
        return false;
    }
    context->plan_count = count;
    context->plan_next = 0;
    return count > 0;
}

/* A stretch of locked pages of one object, all in one run or all
 * untracked: where a copy may go (see exec_copy). */
struct copy_segment {
    int slot;
    uintptr_t start, end;
};

/* The copy segments of this context (context->runs computed), at most max. */
static size_t copy_segments(struct context *context, struct copy_segment *out, size_t max)
{
    size_t count = 0;
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        const struct object *object = &objects[slot];
        if (!object->live)
            continue;
        bool open = false;
        const struct run *run = NULL;
        for (size_t page = 0; page < object->pages; page++) {
            uintptr_t address = object->start + page * page_size;
            if (object->klock[page] != KLOCK_YES) {
                open = false;
                continue;
            }
            const struct run *holder = run_at(context, address);
            if (open && holder == run) {
                out[count - 1].end = address + page_size;
                continue;
            }
            if (count == max)
                return count;
            out[count++] = (struct copy_segment){slot, address, address + page_size};
            open = true;
            run = holder;
        }
    }
    return count;
}

/* A copy (exec_copy): a few KiB to 1 MiB of locked memory, mostly small,
 * back into another stretch of locked memory or into the same bytes. */
static void generate_copy(struct context *context, struct op *op)
{
    uint64_t *rng = &context->rng;
    struct copy_segment segments[256];
    size_t count = compute_runs(context, context) ? copy_segments(context, segments, 256) : 0;
    op->slot = op->target =
        (int)(rng_below(rng, (uint64_t)(context->slot_end - context->slot_first)) +
              (uint64_t)context->slot_first);
    if (count == 0) {
        op->length = page_size; /* nothing locked: skipped */
        return;
    }
    const struct copy_segment *source = &segments[rng_below(rng, count)];
    uint64_t room = source->end - source->start;
    if (room > COPY_MAX_BYTES)
        room = COPY_MAX_BYTES;
    unsigned choice = (unsigned)rng_below(rng, 100);
    uint64_t most = choice < 55 ? 16384 : choice < 90 ? 262144 : room;
    op->length = rng_between(rng, 1, most < room ? most : room);
    op->slot = op->target = source->slot;
    op->offset = source->start - objects[source->slot].start +
                 rng_below(rng, source->end - source->start - op->length + 1);
    op->target_offset = op->offset;
    op->flags = rng_below(rng, 4);
    if (rng_chance(rng, 0.4))
        return; /* back into the same bytes */
    for (int attempt = 0; attempt < 4; attempt++) {
        const struct copy_segment *other = &segments[rng_below(rng, count)];
        if (other->end - other->start < op->length)
            continue;
        uintptr_t at = other->start + rng_below(rng, other->end - other->start - op->length + 1);
        uintptr_t from = objects[source->slot].start + op->offset;
        if (at < from + op->length && from < at + op->length)
            continue;
        op->target = other->slot;
        op->target_offset = at - objects[other->slot].start;
        return;
    }
}

static bool generate_op(struct context *context, struct op *op)
{
    uint64_t *rng = &context->rng;
    size_t live = live_objects(context);
    bool can_create = live < context->object_cap && free_slot(context) >= 0;
    bool must_shrink = live > context->object_cap + 2;
    bool have_heap = pick_object(context, is_heap) != NULL;
    bool have_map = pick_object(context, is_map) != NULL;
    bool have_pages = pick_object(context, has_pages) != NULL;

    if (context->plan_next < context->plan_count) {
        *op = context->plan[context->plan_next++];
        return true;
    }
    if (context->whole_process && rng_chance(rng, settings.layout_rate) &&
        make_plan(context, free_slot(context) >= 0 && !must_shrink)) {
        *op = context->plan[context->plan_next++];
        return true;
    }
    memset(op, 0, sizeof(*op));
    op->slot = op->target = -1;
    if (context->whole_process && !in_fork_child && rng_chance(rng, settings.fork_rate)) {
        op->kind = OP_FORK;
        op->seed = rng_next(rng);
        op->flags = rng_between(rng, 10, 60);
        return true;
    }

    struct {
        enum op_kind kind;
        unsigned weight;
    } table[] = {
        {OP_MALLOC, can_create ? 50 : 0},
        {OP_POSIX_MEMALIGN, can_create ? 50 : 0},
        {OP_ALIGNED_ALLOC, can_create ? 20 : 0},
        {OP_MMAP, can_create ? 60 : 0},
        {OP_MLOCK, have_pages && !must_shrink ? 140 : 0},
        {OP_MLOCK2, have_pages && !must_shrink ? 60 : 0},
        {OP_MUNLOCK, have_pages && !must_shrink ? 100 : 0},
        {OP_MUNMAP, have_map ? (must_shrink ? 100 : 60) : 0},
        {OP_MMAP_FIXED, have_map && !must_shrink ? 30 : 0},
        {OP_MMAP_NOREPLACE, have_map && !must_shrink ? 5 : 0},
        {OP_MREMAP, have_map && !must_shrink ? 80 : 0},
        {OP_FREE, have_heap ? (must_shrink ? 100 : 50) : 0},
        {OP_REALLOC, have_heap && !must_shrink ? 40 : 0},
        {OP_MUNLOCKALL, context->whole_process ? 8 : 0},
        {OP_MLOCKALL, context->whole_process ? 2 : 0},
        {OP_MLOCK_HOLE, context->whole_process && have_map ? 8 : 0},
        {OP_MUNLOCK_HOLE, context->whole_process && have_map ? 8 : 0},
        {OP_COPY, 0}, /* settings.copy_rate of all: set below */
    };
    unsigned total = 0;
    size_t entries = sizeof(table) / sizeof(*table);
    for (size_t i = 0; i + 1 < entries; i++)
        total += table[i].weight;
    if (have_pages && settings.copy_rate > 0 && settings.copy_rate < 1)
        table[entries - 1].weight =
            (unsigned)((double)total * settings.copy_rate / (1 - settings.copy_rate) + 0.5);
    total += table[entries - 1].weight;
    if (total == 0)
        return false;
    unsigned pick = (unsigned)rng_below(rng, total);
    size_t chosen = 0;
    while (pick >= table[chosen].weight) {
        pick -= table[chosen].weight;
        chosen++;
    }
    op->kind = table[chosen].kind;

    struct object *object = NULL;
    switch (op->kind) {
    case OP_MALLOC:
        op->slot = free_slot(context);
        op->size = pick_heap_size(context);
        break;
    case OP_POSIX_MEMALIGN: {
        static const uint64_t alignments[] = {16, 64, 256, 4096, 65536, 24 /* invalid */};
        op->slot = free_slot(context);
        op->size = pick_heap_size(context);
        op->align = alignments[rng_below(rng, rng_chance(rng, 0.03) ? 6 : 5)];
        break;
    }
    case OP_ALIGNED_ALLOC: {
        static const uint64_t alignments[] = {16, 4096, 8192};
        op->slot = free_slot(context);
        op->size = pick_heap_size(context);
        op->align = alignments[rng_below(rng, 3)];
        break;
    }
    case OP_MMAP:
        op->slot = free_slot(context);
        op->length = rng_between(rng, 1, 160) * page_size;
        if (rng_chance(rng, 0.2))
            op->length -= rng_below(rng, page_size - 1) + 1;
        if (op->length == 0)
            op->length = page_size;
        op->flags = (rng_chance(rng, 0.35) ? MMAP_FLAG_LOCKED : 0) |
                    (rng_chance(rng, 0.3) ? MMAP_FLAG_MMAP64 : 0);
        break;
    case OP_MLOCK:
    case OP_MLOCK2:
    case OP_MUNLOCK: {
        object = pick_object(context, has_pages);
        op->slot = (int)(object - objects);
        pick_span(context, object->pages, &op->offset, &op->length);
        /* Sometimes run on into the adjacent map object. */
        struct object *next = next_adjacent(context, object);
        if (next != NULL && rng_chance(rng, 0.5) && op->length > 0)
            op->length = object->pages * page_size - op->offset +
                         rng_between(rng, 1, next->pages * page_size);
        if (op->kind == OP_MLOCK2)
            op->flags = rng_chance(rng, 0.03) ? 0x10 : (rng_chance(rng, 0.5) ? MLOCK_ONFAULT : 0);
        break;
    }
    case OP_MUNMAP:
    case OP_MMAP_FIXED:
    case OP_MMAP_NOREPLACE: {
        object = pick_object(context, is_map);
        op->slot = (int)(object - objects);
        if (must_shrink || rng_chance(rng, 0.2)) {
            op->offset = 0;
            op->length = object->pages * page_size;
        } else {
            pick_span(context, object->pages, &op->offset, &op->length);
            if (op->length == 0)
                op->length = 1;
            if (rng_chance(rng, 0.9) || op->kind == OP_MMAP_NOREPLACE)
                op->offset = op->offset / page_size * page_size;
        }
        struct object *next = next_adjacent(context, object);
        if (next != NULL && rng_chance(rng, 0.3))
            op->length = object->pages * page_size - op->offset +
                         rng_between(rng, 1, next->pages * page_size);
        if (op->kind == OP_MUNMAP && rng_chance(rng, 0.03))
            op->length = 0; /* EINVAL */
        if (op->kind == OP_MMAP_FIXED)
            op->flags = (rng_chance(rng, 0.5) ? MMAP_FLAG_LOCKED : 0) |
                        (rng_chance(rng, 0.3) ? MMAP_FLAG_MMAP64 : 0);
        break;
    }
    case OP_MREMAP: {
        object = pick_object(context, is_map);
        op->slot = (int)(object - objects);
        uint64_t first = 0, count = object->pages;
        if (rng_chance(rng, 0.4)) {
            first = rng_below(rng, object->pages);
            count = rng_between(rng, 1, object->pages - first);
        }
        op->offset = first * page_size;
        op->length = count * page_size - (rng_chance(rng, 0.2) ? rng_below(rng, page_size) : 0);
        unsigned choice = (unsigned)rng_below(rng, 100);
        op->flags = choice < 25   ? MREMAP_MODE_IN_PLACE
                    : choice < 63 ? MREMAP_MODE_MAYMOVE
                    : choice < 82 ? MREMAP_MODE_FIXED
                    : choice < 90 ? MREMAP_MODE_DONTUNMAP
                    : choice < 96 ? MREMAP_MODE_DONTUNMAP_FIXED
                                  : MREMAP_MODE_UNALIGNED;
        uint64_t new_pages;
        unsigned shape = (unsigned)rng_below(rng, 3);
        if (shape == 0)
            new_pages = rng_between(rng, 1, count);
        else if (shape == 1)
            new_pages = count;
        else
            new_pages = rng_between(rng, count, count * 2 + 4);
        uint64_t room = MAX_OBJECT_PAGES - (object->pages - count);
        if (new_pages > room)
            new_pages = room;
        if (new_pages == 0)
            new_pages = 1;
        op->size = new_pages * page_size - (rng_chance(rng, 0.2) ? rng_below(rng, page_size) : 0);
        bool dontunmap =
            op->flags == MREMAP_MODE_DONTUNMAP || op->flags == MREMAP_MODE_DONTUNMAP_FIXED;
        if (dontunmap && !context->whole_process) /* see exec_mremap */
            op->flags =
                op->flags == MREMAP_MODE_DONTUNMAP ? MREMAP_MODE_MAYMOVE : MREMAP_MODE_FIXED;
        else if (dontunmap)
            op->size = op->length;
        if (op->flags == MREMAP_MODE_FIXED || op->flags == MREMAP_MODE_DONTUNMAP_FIXED) {
            struct object *over = pick_object(context, is_map);
            uint64_t pages_needed = (op->size + page_size - 1) / page_size;
            if (op->flags == MREMAP_MODE_DONTUNMAP_FIXED && first >= pages_needed &&
                rng_chance(rng, 0.5)) {
                /* Right below the old range: the moved range may merge with it. */
                op->target = op->slot;
                op->target_offset = (first - pages_needed) * page_size;
            } else if (over->pages < pages_needed) {
                op->flags = MREMAP_MODE_MAYMOVE;
            } else {
                op->target = (int)(over - objects);
                op->target_offset = rng_below(rng, over->pages - pages_needed + 1) * page_size;
            }
        }
        break;
    }
    case OP_FREE:
    case OP_REALLOC:
        object = pick_object(context, is_heap);
        op->slot = (int)(object - objects);
        if (op->kind == OP_REALLOC) {
            unsigned choice = (unsigned)rng_below(rng, 100);
            op->flags = choice < 70   ? REALLOC_PLAIN
                        : choice < 85 ? REALLOC_ARRAY
                        : choice < 93 ? REALLOC_TOO_BIG
                                      : REALLOC_ARRAY_OVERFLOW;
            op->size = rng_chance(rng, 0.05) ? 0 : pick_heap_size(context);
        }
        break;
    case OP_MLOCK_HOLE:
    case OP_MUNLOCK_HOLE:
        object = pick_object(context, is_map);
        op->slot = (int)(object - objects);
        op->offset = rng_below(rng, object->pages * page_size);
        break;
    case OP_COPY:
        generate_copy(context, op);
        break;
    default:
        break;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Runs.                                                                    */

static void print_counts(FILE *stream, const struct op_counts *counts)
{
    fprintf(stream, "ops:");
    for (int kind = 0; kind < OP_KIND_COUNT; kind++)
        if (counts->done[kind] + counts->failed[kind] + counts->skipped[kind])
            fprintf(stream, " %s=%" PRIu64 "/%" PRIu64 "/%" PRIu64, op_info[kind].name,
                    counts->done[kind], counts->failed[kind], counts->skipped[kind]);
    fprintf(stream, " (done/failed/skipped)\ncoverage:");
    for (int what = 0; what < COVER_COUNT; what++)
        fprintf(stream, " %s=%" PRIu64, coverage_names[what], counts->covered[what]);
    fprintf(stream, "\n");
}

static void count_result(struct context *context, const struct op *op, enum exec_result result)
{
    if (result == EXEC_DONE)
        context->counts.done[op->kind]++;
    else if (result == EXEC_FAILED)
        context->counts.failed[op->kind]++;
    else if (result == EXEC_SKIPPED)
        context->counts.skipped[op->kind]++;
}

enum step_verdict { STEP_OK, STEP_DISAGREE, STEP_HARNESS };

/* --trace: the op, its outcome and the context's live objects (slot, heap
 * or mapping, first address, pages), one line as it ends; with threads the
 * line names the thread, and the lines of threads interleave as their ops
 * end (how a failure's registration came to span two threads' objects was
 * read from these). */
static void trace_op(const struct context *context, const struct op *op, size_t index,
                     enum exec_result result)
{
    static const char *const outcome[] = {"done", "failed", "skipped", "harness error"};
    char line[256], live[4096];
    size_t used = 0;
    live[0] = '\0';
    format_op(op, line, sizeof(line));
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        if (!objects[slot].live || used >= sizeof(live))
            continue;
        int written = snprintf(live + used, sizeof(live) - used, " %d:%s+%lx/%zu", slot,
                               objects[slot].kind == OBJECT_HEAP ? "h" : "m",
                               (unsigned long)objects[slot].start, objects[slot].pages);
        used += written > 0 ? (size_t)written : 0;
    }
    pthread_mutex_lock(&output_mutex);
    if (context->index >= 0)
        printf("trace T%d %zu %s -> %s;%s\n", context->index, index, line, outcome[result], live);
    else
        printf("trace %zu %s -> %s;%s\n", index, line, outcome[result], live);
    pthread_mutex_unlock(&output_mutex);
}

/* Executes one op of a whole-process run and checks everything after it. */
static enum step_verdict step(struct context *context, const struct op *op, size_t index)
{
    enum exec_result result = execute(context, op, index);
    count_result(context, op, result);
    if (settings.trace)
        trace_op(context, op, index, result);
    if (result == EXEC_HARNESS_ERROR)
        return STEP_HARNESS;
    reclaim_leftovers(context);
    bool ok = context->report_length == 0;
    if (!check_runtime(context, context))
        ok = false;
    bool kernel_due = op->kind == OP_FORK || (settings.kernel_check_every &&
                                              (index + 1) % settings.kernel_check_every == 0);
    if (ok && kernel_due && !check_kernel(context))
        ok = false;
    return ok ? STEP_OK : STEP_DISAGREE;
}

/* Frees and unmaps every object, then expects nothing registered at all. */
static enum step_verdict cleanup(struct context *context)
{
    bool ok = check_kernel(context);
    for (int slot = context->slot_first; slot < context->slot_end && ok; slot++) {
        struct object *object = &objects[slot];
        if (!object->live)
            continue;
        if (object->kind == OBJECT_HEAP) {
            free(object->pointer);
            forget_heap_object(context, object);
        } else {
            uintptr_t start = object->start, end = object_end(object);
            bounds_unmapped(start, end);
            if (munmap((void *)start, end - start) != 0) {
                report(context, "harness: cleanup munmap failed\n");
                return STEP_HARNESS;
            }
            model_unmap(context, start, end);
        }
        reclaim_leftovers(context);
        ok = check_runtime(context, context);
    }
    if (ok && !child_registration_disabled && load_fake() && fake.snapshot(context->snapshot, 1)) {
        report(context, "registrations remain after every object is gone\n");
        ok = false;
    }
    return ok ? STEP_OK : STEP_DISAGREE;
}

static void print_report(struct context *context)
{
    fwrite(context->report, 1, context->report_length, stdout);
    context->report_length = 0;
}

static void init_process_context(struct context *context, int slot_end, size_t cap, uint64_t seed)
{
    context->index = -1;
    context->slot_first = 0;
    context->slot_end = slot_end;
    context->object_cap = cap;
    context->whole_process = true;
    context->rng = seed;
    context->plan_count = context->plan_next = 0;
}

/* The child of a fork op: same objects, no locks (Linux does not inherit
 * them), no registrations; it runs its own operations and exits with its
 * verdict. */
static void run_fork_child(struct context *parent, const struct op *op, size_t parent_index,
                           bool parent_had_runtime)
{
    in_fork_child = true;
    child_registration_disabled = parent_had_runtime;
    if (parent_had_runtime) {
        frozen_count = fake.snapshot(frozen_snapshot, MAX_RANGES);
        frozen_register_calls = fake_calls(FAKE_CALL_REGISTER);
        frozen_unregister_calls = fake_calls(FAKE_CALL_UNREGISTER);
    }
    /* Nothing is tracked in the child (the mapping bounds stay), and the
     * parent's device memory is not the child's. */
    memset(&copier, 0, sizeof(copier));
    for (int slot = 0; slot < MAX_SLOTS; slot++) {
        memset(objects[slot].klock, KLOCK_NO, MAX_OBJECT_PAGES);
        memset(objects[slot].track, TRACK_NONE, MAX_OBJECT_PAGES);
        memset(objects[slot].origin, 0, MAX_OBJECT_PAGES);
        objects[slot].byte_ranges = 0;
    }
    struct context *context = parent; /* always process_context */
    init_process_context(context, parent->slot_end, parent->object_cap, op->seed);
    context->leftover_count = 0;
    context->report_length = 0;
    context->op_count = 0;
    for (int t = 0; t < MAX_THREADS; t++)
        thread_contexts[t].leftover_count = 0;
    enum step_verdict verdict = STEP_OK;
    size_t index = 0;
    if (!check_runtime(context, context))
        verdict = STEP_DISAGREE;
    for (; verdict == STEP_OK && index < op->flags; index++) {
        struct op child_op;
        if (!generate_op(context, &child_op))
            break;
        record_op(context, &child_op);
        verdict = step(context, &child_op, index);
    }
    if (verdict == STEP_OK)
        verdict = cleanup(context);
    if (verdict != STEP_OK) {
        printf("FORK CHILD FAILURE (%s) of op %zu, child op %zu, seed %" PRIu64 ", %s:\n",
               verdict == STEP_HARNESS ? "harness" : "disagreement", parent_index,
               index ? index - 1 : 0, op->seed,
               child_registration_disabled ? "runtime inherited" : "runtime usable");
        print_report(context);
        printf("child sequence:\n");
        print_sequence(stdout, context->ops, context->op_count);
        fflush(stdout);
        exit(verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE);
    }
    fflush(stdout);
    exit(EXIT_AGREE); /* through the shim's exit path */
}

static enum exec_result exec_fork(struct context *context, const struct op *op, size_t index)
{
    if (!context->whole_process || in_fork_child || op->flags > 10000)
        return EXEC_SKIPPED;
    bool had_runtime = load_fake();
    cover(context, had_runtime ? COVER_FORK_INHERITED : COVER_FORK_FRESH);
    uint64_t registers = fake_calls(FAKE_CALL_REGISTER);
    uint64_t unregisters = fake_calls(FAKE_CALL_UNREGISTER);
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    if (child < 0)
        return harness_error(context, op, "fork failed");
    if (child == 0)
        run_fork_child(context, op, index, had_runtime);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != EXIT_AGREE) {
        if (WIFEXITED(status) && WEXITSTATUS(status) == EXIT_HARNESS)
            return harness_error(context, op, "the fork child hit a harness error");
        report(context, "fork child failed: %s %d\n", WIFEXITED(status) ? "exit" : "signal",
               WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        return EXEC_DONE;
    }
    if (fake_calls(FAKE_CALL_REGISTER) != registers ||
        fake_calls(FAKE_CALL_UNREGISTER) != unregisters)
        report(context, "the parent called the runtime during fork\n");
    return EXEC_DONE;
}

/* Runs ops in a fresh process (this program, --replay) and classifies the
 * outcome: 0 pass, 1 disagreement, 3 harness, 128+N signal N. *failed_at is
 * the op index the replay failed at (or count when it failed at cleanup). */
static int run_candidate(const struct op *ops, size_t count, size_t *failed_at)
{
    const char *directory = getenv("TMPDIR");
    char path[1024];
    snprintf(path, sizeof(path), "%s/model_random-candidate-XXXXXX",
             directory && *directory ? directory : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    FILE *file = fdopen(fd, "w");
    print_sequence(file, ops, count);
    fclose(file);
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) {
        unlink(path);
        return -1;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        dup2(pipe_fds[1], STDOUT_FILENO);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, STDERR_FILENO);
        close(pipe_fds[0]);
        char kernel_every[32];
        snprintf(kernel_every, sizeof(kernel_every), "%zu", settings.kernel_check_every);
        const char *argv[16];
        int argc = 0;
        argv[argc++] = saved_argv[0];
        argv[argc++] = "--replay";
        argv[argc++] = path;
        argv[argc++] = "--no-shrink";
        argv[argc++] = "--quiet";
        argv[argc++] = "--kernel-check-every";
        argv[argc++] = kernel_every;
        if (settings.expose_known_bugs)
            argv[argc++] = "--expose-known-bugs";
        if (settings.model_bug) {
            argv[argc++] = "--inject-model-bug";
            argv[argc++] = settings.model_bug;
        }
        argv[argc] = NULL;
        alarm(120); /* a hang counts as SIGALRM */
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    close(pipe_fds[1]);
    char output[8192];
    size_t used = 0;
    ssize_t got;
    while ((got = read(pipe_fds[0], output + used, sizeof(output) - 1 - used)) > 0 ||
           (got < 0 && errno == EINTR)) {
        if (got > 0)
            used += (size_t)got;
        if (used == sizeof(output) - 1) {
            /* Keep the tail, where the verdict line is. */
            memmove(output, output + 4096, used - 4096);
            used -= 4096;
        }
    }
    output[used] = '\0';
    close(pipe_fds[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    unlink(path);
    const char *verdict = strstr(output, "FAILED-AT ");
    *failed_at = verdict ? (size_t)strtoull(verdict + 10, NULL, 10) : count;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* Delta debugging: drop chunks, then single ops, while the failure (same
 * class) persists; each candidate runs in a fresh process. */
static void shrink(const struct op *failing, size_t count, int failure_class)
{
    struct op *best = malloc(count * sizeof(*best));
    struct op *candidate = malloc(count * sizeof(*candidate));
    if (best == NULL || candidate == NULL)
        return;
    memcpy(best, failing, count * sizeof(*best));
    size_t best_count = count;
    double deadline = seconds_now() + settings.shrink_budget_seconds;
    size_t runs = 0;
    size_t failed_at = 0;
    /* The recorded sequence must fail on its own first. */
    int first = run_candidate(best, best_count, &failed_at);
    runs++;
    if (first != failure_class) {
        printf("shrink: the recorded sequence does not reproduce in a fresh process "
               "(class %d, wanted %d); not shrinking\n",
               first, failure_class);
        free(best);
        free(candidate);
        return;
    }
    if (failed_at + 1 < best_count)
        best_count = failed_at + 1;
    size_t chunk = best_count / 2 ? best_count / 2 : 1;
    while (chunk >= 1 && seconds_now() < deadline) {
        bool progress = false;
        for (size_t start = 0; start < best_count && seconds_now() < deadline;) {
            size_t end = start + chunk < best_count ? start + chunk : best_count;
            size_t n = 0;
            for (size_t i = 0; i < best_count; i++)
                if (i < start || i >= end)
                    candidate[n++] = best[i];
            if (n == 0) {
                start = end;
                continue;
            }
            int outcome = run_candidate(candidate, n, &failed_at);
            runs++;
            if (outcome == failure_class) {
                best_count = failed_at + 1 < n ? failed_at + 1 : n;
                memcpy(best, candidate, best_count * sizeof(*best));
                progress = true;
            } else {
                start = end;
            }
        }
        if (!progress) {
            if (chunk == 1)
                break;
            chunk /= 2;
        } else if (chunk > best_count / 2 && best_count > 1) {
            chunk = best_count / 2;
        }
    }
    printf("shortest failing sequence (%zu ops, class %d, %zu runs%s):\n", best_count,
           failure_class, runs, seconds_now() >= deadline ? ", budget spent" : "");
    print_sequence(stdout, best, best_count);
    if (settings.shrunk_out) {
        FILE *out = fopen(settings.shrunk_out, "w");
        if (out) {
            print_sequence(out, best, best_count);
            fclose(out);
        }
    }
    free(best);
    free(candidate);
}

/* What an emulator does otherwise than Linux, probed in every run (raw system
 * calls, unseen by the shim). Without the mlock2 system call glibc's mlock2
 * locks with flags 0 through mlock and fails every MLOCK_ONFAULT lock with
 * EINVAL: such locks are then failed calls. Where /proc/self/maps loses the
 * source of an MREMAP_DONTUNMAP move, such moves are skipped. */
static void probe_emulation(void)
{
    kernel_does.mlock2 = kernel_does.dontunmap_source_listed = true;
    long mapped = syscall(SYS_mmap, NULL, 2 * page_size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == -1)
        return;
    kernel_does.mlock2 =
        syscall(SYS_mlock2, (void *)mapped, page_size, MLOCK_ONFAULT) == 0 || errno != ENOSYS;
    long moved = syscall(SYS_mremap, (void *)mapped, page_size, page_size,
                         MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
    if (moved != -1) {
        pthread_mutex_lock(&vmas_mutex);
        size_t count = read_vma_bounds();
        kernel_does.dontunmap_source_listed = vma_containing(count, (uintptr_t)mapped) != NULL;
        pthread_mutex_unlock(&vmas_mutex);
        syscall(SYS_munmap, (void *)moved, page_size);
    }
    syscall(SYS_munmap, (void *)mapped, 2 * page_size);
}

/* What this kernel does with the layouts the plans aim at, found once before
 * any op with raw system calls (the shim does not see them) on a scratch
 * mapping that PROT_NONE guards keep apart from every other VMA. A test
 * requires the counters that only such a kernel can reach only where the
 * probe found it. */
static void probe_kernel(void)
{
    uintptr_t page = page_size;
    long mapped = syscall(SYS_mmap, NULL, 18 * page, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == -1)
        return;
    char *guarded = (char *)mapped, *scratch = guarded + page;
    if (syscall(SYS_mprotect, scratch, 16 * page, PROT_READ | PROT_WRITE) == 0 &&
        syscall(SYS_mlock2, scratch, 8 * page, MLOCK_ONFAULT) == 0) {
        if (syscall(SYS_mremap, scratch + 5 * page, page, page,
                    MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, scratch + 4 * page) != -1) {
            pthread_mutex_lock(&vmas_mutex);
            size_t count = read_vmas();
            const struct vma *vma = vma_containing(count, (uintptr_t)scratch);
            kernel_does.dontunmap_merges = vma != NULL && !vma->locked;
            pthread_mutex_unlock(&vmas_mutex);
        }
        syscall(SYS_munlock, scratch, 16 * page);
        /* Pages 8-10 span three VMAs once page 9 alone is locked. */
        if (syscall(SYS_mlock, scratch + 9 * page, page) == 0)
            kernel_does.moves_several_vmas =
                syscall(SYS_mremap, scratch + 8 * page, 3 * page, 3 * page,
                        MREMAP_MAYMOVE | MREMAP_FIXED, scratch + 13 * page) != -1;
        syscall(SYS_munlock, scratch, 16 * page);
    }
    syscall(SYS_munmap, guarded, 18 * page);
}

static int finish_single(struct context *context, enum step_verdict verdict, size_t index)
{
    if (settings.record_path) {
        FILE *out = fopen(settings.record_path, "w");
        if (out) {
            print_sequence(out, context->ops, context->op_count);
            fclose(out);
        }
    }
    if (verdict == STEP_OK) {
        if (!settings.quiet) {
            print_counts(stdout, &context->counts);
            printf("summary seed=%" PRIu64 " ops=%zu checks=%" PRIu64 " register_calls=%" PRIu64
                   " unregister_calls=%" PRIu64 " layout=%s kernel_dontunmap_merges=%d"
                   " kernel_moves_several_vmas=%d kernel_mlock2=%d"
                   " kernel_dontunmap_source_listed=%d\n",
                   settings.seed, context->op_count, context->checks,
                   fake_calls(FAKE_CALL_REGISTER), fake_calls(FAKE_CALL_UNREGISTER),
                   layout_fixed ? "fixed" : "randomised", kernel_does.dontunmap_merges,
                   kernel_does.moves_several_vmas, kernel_does.mlock2,
                   kernel_does.dontunmap_source_listed);
        }
        printf("PASS\n");
        return EXIT_AGREE;
    }
    int code = verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE;
    printf("FAILURE (%s) seed=%" PRIu64 " at op %zu%s\n",
           verdict == STEP_HARNESS ? "harness error" : "model and runtime disagree", settings.seed,
           index, index == context->op_count ? " (final cleanup)" : "");
    if (index < context->op_count) {
        printf("op: ");
        print_op(stdout, index, &context->ops[index]);
    }
    print_report(context);
    if (!settings.quiet) {
        printf("sequence (%zu ops):\n", context->op_count);
        print_sequence(stdout, context->ops, context->op_count);
    }
    printf("FAILED-AT %zu\n", index);
    fflush(stdout);
    if (settings.shrink && code == EXIT_DISAGREE) {
        shrink(context->ops, context->op_count, code);
    }
    return code;
}

static int run_single(void)
{
    struct context *context = &process_context;
    init_process_context(context, SLOTS_PER_THREAD, 14, settings.seed);
    if (settings.ops > SEQUENCE_CAPACITY - 20000 || !reserve_ops(context, SEQUENCE_CAPACITY)) {
        fprintf(stderr, "model_random: at most %d ops\n", SEQUENCE_CAPACITY - 20000);
        return EXIT_USAGE;
    }
    enum step_verdict verdict = STEP_OK;
    size_t index = 0;
    for (; index < settings.ops; index++) {
        struct op op;
        if (!generate_op(context, &op) || !record_op(context, &op)) {
            report(context, "harness: cannot generate an op\n");
            verdict = STEP_HARNESS;
            break;
        }
        verdict = step(context, &op, index);
        if (verdict != STEP_OK)
            break;
    }
    if (verdict == STEP_OK)
        verdict = cleanup(context);
    if (verdict != STEP_OK && index == settings.ops)
        index = context->op_count;
    return finish_single(context, verdict, index);
}

/* Reads the sequence with plain read(2) into a static buffer (no stdio: see
 * reserve_ops). */
static char replay_text[1 << 22];

static int run_replay(void)
{
    struct context *context = &process_context;
    init_process_context(context, SLOTS_PER_THREAD, 14, settings.seed);
    if (!reserve_ops(context, SEQUENCE_CAPACITY))
        return EXIT_HARNESS;
    int fd = open(settings.replay_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "cannot open %s: %s\n", settings.replay_path, strerror(errno));
        return EXIT_USAGE;
    }
    size_t length = 0;
    ssize_t got;
    while ((got = read(fd, replay_text + length, sizeof(replay_text) - 1 - length)) > 0 ||
           (got < 0 && errno == EINTR))
        if (got > 0)
            length += (size_t)got;
    close(fd);
    replay_text[length] = '\0';
    size_t line_number = 0;
    for (char *line = replay_text; line != NULL && *line != '\0';) {
        char *next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        line_number++;
        const char *text = line;
        while (*text == ' ' || *text == '\t')
            text++;
        if (*text != '#' && *text != '\0') {
            struct op op;
            if (!parse_op(text, &op) || !record_op(context, &op)) {
                fprintf(stderr, "%s:%zu: cannot parse: %s\n", settings.replay_path, line_number,
                        line);
                return EXIT_USAGE;
            }
        }
        line = next;
    }
    enum step_verdict verdict = STEP_OK;
    size_t index = 0;
    for (; index < context->op_count; index++) {
        verdict = step(context, &context->ops[index], index);
        if (verdict != STEP_OK)
            break;
    }
    if (verdict == STEP_OK)
        verdict = cleanup(context);
    return finish_single(context, verdict, index);
}

/* ---- multi-threaded runs ---- */

/* The paired releases of the current pair round. */
struct pair_plan {
    int threads[2];
    uintptr_t start, end; /* the region */
    char what[256];       /* for a failure report */
};
static struct pair_plan pair_plans[MAX_THREADS / 2];
static size_t pair_count;
static int pair_arrivals[MAX_THREADS / 2];

static void thread_failure(struct context *context, enum step_verdict verdict, size_t index)
{
    pthread_mutex_lock(&output_mutex);
    printf("FAILURE (%s) seed=%" PRIu64 " thread %d at op %zu\n",
           verdict == STEP_HARNESS ? "harness error" : "model and runtime disagree", settings.seed,
           context->index, index);
    if (index < context->op_count) {
        printf("op: ");
        print_op(stdout, index, &context->ops[index]);
    }
    print_report(context);
    for (size_t p = 0; p < pair_count; p++)
        printf("  pair %zu of this pair round: %s\n", p, pair_plans[p].what);
    printf("thread %d sequence (%zu ops; threads interleave, so replay by seed only):\n",
           context->index, context->op_count);
    print_sequence(stdout, context->ops, context->op_count);
    printf("FAILED-AT %zu\n", index);
    fflush(stdout);
    _exit(verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE);
}

/* ---- threads sharing mappings (--share) ----
 *
 * Without --share each thread works on mappings of its own, so no
 * registration ever holds two threads' pages. With --share the main thread
 * (thread 0, at a barrier, while the others wait) maps regions, locks each
 * whole (one registration), and hands every thread a window of pages in them:
 * a map object in that thread's slots. The threads then lock, unlock, unmap,
 * map over (MAP_FIXED) and shrink in place (mremap) inside their own windows
 * at the same time, so releases split one registration from several threads
 * at once.
 *
 * The model stays exact: a page is only ever changed by the thread that owns
 * it (the bounds are the process's, under their mutex). But a run holds
 * several threads' pages, and whether it is registered, and where its
 * registration ends, depends on all of them (a page another thread locks
 * with MLOCK_ONFAULT holds it; one it unlocks cuts it). And while thread A
 * releases its part of a run, the rest of it, thread B's pages included, is
 * unregistered and registered again, so B's own check after an op may find
 * its pages missing for a moment. So a thread checks after each op only that
 * none of its own pages that must not be registered (not tracked, or held)
 * is; the full check, registrations as (base, size) pairs, runs at every
 * barrier, when all threads wait.
 *
 * The dangerous interleaving is reached on purpose, not by luck: at every
 * barrier, --pair-rounds times, the main thread maps one region per pair of
 * threads, locks it whole (one registration) and cuts it into pieces owned by
 * the two threads: halves, or a lower, middle and upper piece where one
 * thread releases the middle and the other the upper (a release of the
 * middle registers the lower rest first and the upper rest after it, so the
 * upper piece is out of the registry meanwhile), or four pieces. Both
 * threads leave a barrier, meet at a spin rendezvous and release their piece
 * at once (munlock, munmap, MAP_FIXED over it, or an in-place shrink); one of
 * them may wait up to --pair-delay-us first, so that with a runtime whose
 * cudaHostUnregister is slow (tests/faults/slow_runtime.c) it lands inside
 * the other's release. Then the main thread checks the whole process. */

static pthread_barrier_t barrier;

static void share_failure(enum step_verdict verdict, const char *where)
{
    struct context *context = &process_context;
    pthread_mutex_lock(&output_mutex);
    printf("FAILURE (%s) seed=%" PRIu64 " %s\n",
           verdict == STEP_HARNESS ? "harness error" : "model and runtime disagree", settings.seed,
           where);
    for (size_t p = 0; p < pair_count; p++)
        printf("  pair %zu: %s\n", p, pair_plans[p].what);
    print_report(context);
    printf("FAILED-AT %s\n", where);
    fflush(stdout);
    _exit(verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE);
}

/* Checks the whole process (all threads wait), both ways. */
static void share_check(const char *where)
{
    struct context *context = &process_context;
    if (context->report_length != 0 || !check_runtime(context, context))
        share_failure(STEP_DISAGREE, where);
}

/* Unmaps every live object of [start, end) (any thread's); all threads wait. */
static void share_unmap_objects(uintptr_t start, uintptr_t end)
{
    struct context *context = &process_context;
    for (int slot = context->slot_first; slot < context->slot_end; slot++) {
        struct object *object = &objects[slot];
        while (object->live && object->start < end && object_end(object) > start) {
            uintptr_t from = object->start, to = object_end(object);
            bounds_unmapped(from, to);
            if (munmap((void *)from, to - from) != 0) {
                report(context, "harness: munmap of a window failed (errno %d)\n", errno);
                share_failure(STEP_HARNESS, "unmapping windows");
            }
            if (!model_unmap(context, from, to))
                share_failure(STEP_HARNESS, "unmapping windows");
        }
    }
}

/* Maps pages, locks them whole in one call (or as asked), and gives
 * [first[i], first[i] + pages[i]) to owner[i]'s context as a map object;
 * stores each object's slot in slots[i]. lock_kind: 0 mmap MAP_LOCKED, 1
 * mlock, 2 mlock2 MLOCK_ONFAULT, 3 none. Returns the region's start. */
static uintptr_t share_map_region(size_t total, const size_t *first, const size_t *pages,
                                  const int *owner, int *slots, size_t count, int lock_kind)
{
    struct context *context = &process_context;
    size_t length = total * page_size;
    char *region = mmap(NULL, length, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | (lock_kind == 0 ? MAP_LOCKED : 0), -1, 0);
    if (region == MAP_FAILED && lock_kind == 0) {
        lock_kind = 3; /* RLIMIT_MEMLOCK */
        region = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (region == MAP_FAILED) {
        report(context, "harness: mmap of %zu pages for windows failed (errno %d)\n", total, errno);
        share_failure(STEP_HARNESS, "mapping windows");
    }
    uintptr_t start = (uintptr_t)region, end = start + length;
    bounds_mapped(start, end);
    int result = lock_kind == 1   ? mlock(region, length)
                 : lock_kind == 2 ? mlock2(region, length, MLOCK_ONFAULT)
                                  : 0;
    bool locked = lock_kind != 3;
    if (result != 0) {
        munlock(region, length); /* a failed lock may have locked part */
        locked = false;
    }
    enum track hold = lock_kind == 2 ? onfault_hold(start, end) : TRACK_PLAIN;
    static uint8_t klock[MAX_OBJECT_PAGES * MAX_THREADS], track[MAX_OBJECT_PAGES * MAX_THREADS],
        origin[MAX_OBJECT_PAGES * MAX_THREADS];
    memset(klock, locked ? KLOCK_YES : KLOCK_NO, total);
    memset(track, locked ? hold : TRACK_NONE, total);
    memset(origin, locked ? next_lock_origin() : 0, total);
    for (size_t i = 0; i < count; i++) {
        struct context *thread = &thread_contexts[owner[i]];
        uintptr_t window = start + first[i] * page_size;
        struct object *object = model_add_map(thread, window, pages[i], klock + first[i],
                                              track + first[i], origin + first[i]);
        if (object == NULL)
            share_failure(STEP_HARNESS, "handing out windows");
        if (locked)
            bytes_add(object, start, end);
        slots[i] = (int)(object - objects);
    }
    return start;
}

/* Windows for the next stretch of ops: what the threads left of the last ones
 * is unmapped (and must leave nothing registered), and one or two regions,
 * each locked whole, are cut into one window per thread, in a random order. */
static void share_setup(size_t round)
{
    struct context *context = &process_context;
    uint64_t *rng = &context->rng;
    share_unmap_objects(0, UINTPTR_MAX);
    char where[96];
    snprintf(where, sizeof(where), "after unmapping the windows of round %zu", round);
    share_check(where);
    int count = settings.threads;
    size_t regions = rng_between(rng, 1, 2);
    for (size_t r = 0; r < regions; r++) {
        size_t first[MAX_THREADS], pages[MAX_THREADS], total = 0;
        int owner[MAX_THREADS], slots[MAX_THREADS];
        for (int t = 0; t < count; t++)
            owner[t] = t;
        for (int t = count - 1; t > 0; t--) {
            int other = (int)rng_below(rng, (uint64_t)t + 1), keep = owner[t];
            owner[t] = owner[other];
            owner[other] = keep;
        }
        for (int t = 0; t < count; t++) {
            pages[t] = rng_between(rng, 4, 32);
            first[t] = total;
            total += pages[t];
        }
        unsigned choice = (unsigned)rng_below(rng, 10);
        int lock_kind = choice < 2 ? 0 : choice < 7 ? 1 : choice < 9 ? 2 : 3;
        share_map_region(total, first, pages, owner, slots, (size_t)count, lock_kind);
    }
    snprintf(where, sizeof(where), "after handing out the windows of round %zu", round);
    share_check(where);
}

static void describe_op(char *out, size_t size, int thread, const struct op *op)
{
    char line[160];
    format_op(op, line, sizeof(line));
    snprintf(out, size, "thread %d: %s", thread, line);
}

/* One pair round: for each pair of threads, a region locked whole (one
 * registration), cut into pieces the two own; each thread gets the release
 * of one of its pieces as its pair op. All threads wait meanwhile. */
static void pair_setup(size_t round, size_t pair_round)
{
    struct context *context = &process_context;
    uint64_t *rng = &context->rng;
    int count = settings.threads, order[MAX_THREADS];
    for (int t = 0; t < count; t++)
        order[t] = t;
    for (int t = count - 1; t > 0; t--) {
        int other = (int)rng_below(rng, (uint64_t)t + 1), keep = order[t];
        order[t] = order[other];
        order[other] = keep;
    }
    pair_count = (size_t)count / 2;
    for (size_t p = 0; p < pair_count; p++) {
        struct pair_plan *plan = &pair_plans[p];
        int a = order[2 * p], b = order[2 * p + 1];
        plan->threads[0] = a;
        plan->threads[1] = b;
        /* Pieces and who releases which: halves; lower, middle (a) and upper
         * (b); or four pieces with random owners. */
        unsigned pattern = (unsigned)rng_below(rng, 10);
        size_t pieces = pattern < 4 ? 2 : pattern < 8 ? 3 : 4;
        int owner[4];
        size_t release[2];
        if (pieces == 2) {
            owner[0] = a;
            owner[1] = b;
            release[0] = 0;
            release[1] = 1;
        } else if (pieces == 3) {
            owner[0] = rng_chance(rng, 0.5) ? a : b;
            owner[1] = a;
            owner[2] = b;
            release[0] = 1;
            release[1] = 2;
        } else {
            for (size_t i = 0; i < 4; i++)
                owner[i] = rng_chance(rng, 0.5) ? a : b;
            owner[rng_below(rng, 2)] = a;
            owner[2 + rng_below(rng, 2)] = b;
            for (int side = 0; side < 2; side++) {
                size_t own[4], n = 0;
                for (size_t i = 0; i < 4; i++)
                    if (owner[i] == plan->threads[side])
                        own[n++] = i;
                release[side] = own[rng_below(rng, n)];
            }
        }
        size_t first[4], pages[4], total = 0;
        for (size_t i = 0; i < pieces; i++) {
            pages[i] = rng_between(rng, settings.pair_pages / 2, settings.pair_pages);
            first[i] = total;
            total += pages[i];
        }
        unsigned choice = (unsigned)rng_below(rng, 10);
        int lock_kind = choice < 1 ? 0 : choice < 8 ? 1 : 2;
        int slots[4];
        plan->start = share_map_region(total, first, pages, owner, slots, pieces, lock_kind);
        plan->end = plan->start + total * page_size;
        size_t written = (size_t)snprintf(plan->what, sizeof(plan->what),
                                          "%zu pieces of %zu pages at %#lx, lock %d;", pieces,
                                          total, (unsigned long)plan->start, lock_kind);
        /* Who may start late: with three pieces the one releasing the upper
         * piece, so that it comes while the middle's release is under way. */
        unsigned late = pieces == 3 ? 1 : (unsigned)rng_below(rng, 2);
        for (int side = 0; side < 2; side++) {
            struct context *thread = &thread_contexts[plan->threads[side]];
            size_t piece = release[side];
            struct op op;
            memset(&op, 0, sizeof(op));
            op.slot = slots[piece];
            op.target = -1;
            op.length = pages[piece] * page_size;
            unsigned kind = (unsigned)rng_below(rng, 10);
            if (kind < 5) {
                op.kind = OP_MUNLOCK;
            } else if (kind < 8) {
                op.kind = OP_MUNMAP;
            } else if (kind < 9) {
                op.kind = OP_MMAP_FIXED;
            } else {
                op.kind = OP_MREMAP;
                op.flags = MREMAP_MODE_IN_PLACE;
                op.size = (pages[piece] / 2) * page_size;
            }
            thread->pair_op = op;
            thread->has_pair_op = true;
            thread->pair = (int)p;
            thread->pair_delay_us =
                (unsigned)side == late
                    ? (unsigned)rng_between(rng, settings.pair_delay_us / 4, settings.pair_delay_us)
                    : 0;
            char line[200];
            describe_op(line, sizeof(line), plan->threads[side], &op);
            if (written < sizeof(plan->what))
                written += (size_t)snprintf(plan->what + written, sizeof(plan->what) - written,
                                            " %s (piece %zu, %u us late);", line, piece,
                                            thread->pair_delay_us);
        }
        __atomic_store_n(&pair_arrivals[p], 0, __ATOMIC_RELEASE);
    }
    char where[96];
    snprintf(where, sizeof(where), "setting up pair round %zu of round %zu", pair_round, round);
    share_check(where);
}

/* After the threads' paired releases (all wait again): everything agrees,
 * and once the pieces are gone nothing of them stays registered. */
static void pair_finish(size_t round, size_t pair_round)
{
    char where[96];
    snprintf(where, sizeof(where), "at paired release %zu of round %zu", pair_round, round);
    share_check(where);
    for (size_t p = 0; p < pair_count; p++)
        share_unmap_objects(pair_plans[p].start, pair_plans[p].end);
    snprintf(where, sizeof(where), "after unmapping paired release %zu of round %zu", pair_round,
             round);
    share_check(where);
    pair_count = 0;
}

/* An op inside this thread's windows: lock, unlock, unmap, map over, or
 * shrink in place. */
static bool generate_share_op(struct context *context, struct op *op)
{
    uint64_t *rng = &context->rng;
    memset(op, 0, sizeof(*op));
    op->slot = op->target = -1;
    op->kind = OP_MUNLOCK;
    struct object *object = pick_object(context, has_pages);
    if (object == NULL)
        return true; /* nothing left in its windows: skipped */
    op->slot = (int)(object - objects);
    unsigned choice = (unsigned)rng_below(rng, 100);
    if (choice >= 90 && object->pages < 2)
        choice = 0;
    if (choice < 30) {
        op->kind = OP_MLOCK;
    } else if (choice < 40) {
        op->kind = OP_MLOCK2;
        op->flags = rng_chance(rng, 0.5) ? MLOCK_ONFAULT : 0;
    } else if (choice < 70) {
        op->kind = OP_MUNLOCK;
    } else if (choice < 80) {
        op->kind = OP_MUNMAP;
    } else if (choice < 90) {
        op->kind = OP_MMAP_FIXED;
        op->flags = rng_chance(rng, 0.4) ? MMAP_FLAG_LOCKED : 0;
    } else {
        uint64_t first = rng_below(rng, object->pages - 1);
        uint64_t count = rng_between(rng, 2, object->pages - first);
        op->kind = OP_MREMAP;
        op->flags = MREMAP_MODE_IN_PLACE;
        op->offset = first * page_size;
        op->length = count * page_size;
        op->size = rng_between(rng, 1, count - 1) * page_size;
        return true;
    }
    pick_span(context, object->pages, &op->offset, &op->length);
    if (op->kind == OP_MUNMAP || op->kind == OP_MMAP_FIXED) {
        op->offset = op->offset / page_size * page_size;
        if (op->length == 0)
            op->length = 1;
    }
    struct object *next = next_adjacent(context, object);
    if (next != NULL && rng_chance(rng, 0.3) && op->length > 0)
        op->length =
            object->pages * page_size - op->offset + rng_between(rng, 1, next->pages * page_size);
    return true;
}

/* Whether op releases pages of a registration that also holds pages this
 * thread does not own (another thread's window). */
static bool releases_shared_registration(struct context *context, const struct op *op)
{
    const struct object *object = slot_object(context, op->slot);
    if (object == NULL || object->kind != OBJECT_MAP || !load_fake() ||
        (op->kind != OP_MUNLOCK && op->kind != OP_MUNMAP && op->kind != OP_MMAP_FIXED &&
         op->kind != OP_MREMAP))
        return false;
    uintptr_t start = page_floor(object->start + op->offset);
    uintptr_t end = page_ceil(object->start + op->offset + op->length);
    if (op->kind == OP_MREMAP)
        start = page_ceil(object->start + op->offset + op->size);
    size_t count = fake.snapshot(context->snapshot, MAX_RANGES);
    for (size_t i = 0; i < count; i++) {
        uintptr_t base = context->snapshot[i].base, stop = base + context->snapshot[i].size;
        if (base < end && stop > start &&
            (object_at(context, base) == NULL || object_at(context, stop - 1) == NULL))
            return true;
    }
    return false;
}

/* Runs this thread's part of a paired release: meets its partner at a spin
 * rendezvous, maybe waits a little more, and releases its piece. */
static void run_pair_op(struct context *context)
{
    int *arrivals = &pair_arrivals[context->pair];
    __atomic_add_fetch(arrivals, 1, __ATOMIC_ACQ_REL);
    for (unsigned spins = 1; __atomic_load_n(arrivals, __ATOMIC_ACQUIRE) < 2; spins++)
        if (spins % 256 == 0)
            sched_yield(); /* more threads than cores */
    if (context->pair_delay_us > 0) {
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        do
            clock_gettime(CLOCK_MONOTONIC, &now);
        while ((uint64_t)(now.tv_sec - start.tv_sec) * 1000000000u +
                   (uint64_t)(now.tv_nsec - start.tv_nsec) <
               (uint64_t)context->pair_delay_us * 1000u);
    }
    struct op op = context->pair_op;
    context->has_pair_op = false;
    if (!record_op(context, &op)) {
        report(context, "harness: no room for the pair op\n");
        thread_failure(context, STEP_HARNESS, context->op_count);
    }
    size_t index = context->op_count - 1;
    bool shared = releases_shared_registration(context, &op);
    enum exec_result result = execute(context, &op, index);
    count_result(context, &op, result);
    if (result == EXEC_HARNESS_ERROR)
        thread_failure(context, STEP_HARNESS, index);
    if (result == EXEC_DONE) {
        cover(context, COVER_PAIRED_RELEASE);
        if (shared)
            cover(context, COVER_SHARED_RELEASE);
    }
    if (context->report_length != 0 || !check_runtime(context, context))
        thread_failure(context, STEP_DISAGREE, index);
}

/* At a barrier, every other thread waits: check the whole process, reclaim,
 * and sometimes munlockall or fork. */
static void barrier_duties(size_t round)
{
    struct context *context = &process_context;
    reclaim_all_leftovers();
    struct op op;
    memset(&op, 0, sizeof(op));
    op.slot = op.target = -1;
    enum step_verdict verdict = STEP_OK;
    const char *what = "check";
    if (rng_chance(&context->rng, 0.1)) {
        op.kind = OP_MUNLOCKALL;
        what = op_info[op.kind].name;
        verdict = step(context, &op, round);
    } else if (rng_chance(&context->rng, settings.fork_rate * (double)settings.barrier_every)) {
        op.kind = OP_FORK;
        op.seed = rng_next(&context->rng);
        op.flags = rng_between(&context->rng, 10, 60);
        what = op_info[op.kind].name;
        verdict = step(context, &op, round);
    } else {
        context->checks++;
        if (!check_runtime(context, context) || !check_kernel(context))
            verdict = STEP_DISAGREE;
    }
    if (verdict != STEP_OK) {
        record_op(context, &op);
        pthread_mutex_lock(&output_mutex);
        printf("FAILURE (%s) seed=%" PRIu64 " at barrier %zu (%s)\n",
               verdict == STEP_HARNESS ? "harness error" : "model and runtime disagree",
               settings.seed, round, what);
        print_report(context);
        printf("FAILED-AT barrier %zu\n", round);
        fflush(stdout);
        _exit(verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE);
    }
}

static void *thread_main(void *argument)
{
    struct context *context = argument;
    size_t rounds = (settings.ops + settings.barrier_every - 1) / settings.barrier_every;
    size_t done = 0;
    if (settings.share) {
        pthread_barrier_wait(&barrier);
        if (context->index == 0)
            share_setup(0);
        pthread_barrier_wait(&barrier);
    }
    for (size_t round = 0; round < rounds; round++) {
        for (size_t k = 0; k < settings.barrier_every && done < settings.ops; k++, done++) {
            struct op op;
            bool generated =
                settings.share ? generate_share_op(context, &op) : generate_op(context, &op);
            if (!generated || !record_op(context, &op)) {
                report(context, "harness: cannot generate an op\n");
                thread_failure(context, STEP_HARNESS, context->op_count);
            }
            size_t index = context->op_count - 1;
            bool shared = settings.share && releases_shared_registration(context, &op);
            enum exec_result result = execute(context, &op, index);
            count_result(context, &op, result);
            if (settings.trace)
                trace_op(context, &op, index, result);
            if (result == EXEC_HARNESS_ERROR)
                thread_failure(context, STEP_HARNESS, index);
            if (shared && result == EXEC_DONE)
                cover(context, COVER_SHARED_RELEASE);
            bool ok = context->report_length == 0;
            if (!check_runtime(context, context))
                ok = false;
            if (!ok)
                thread_failure(context, STEP_DISAGREE, index);
        }
        pthread_barrier_wait(&barrier);
        if (context->index == 0)
            barrier_duties(round);
        for (size_t pair_round = 0; settings.share && pair_round < settings.pair_rounds;
             pair_round++) {
            if (context->index == 0)
                pair_setup(round, pair_round);
            pthread_barrier_wait(&barrier);
            if (context->has_pair_op)
                run_pair_op(context);
            pthread_barrier_wait(&barrier);
            if (context->index == 0)
                pair_finish(round, pair_round);
        }
        if (settings.share && context->index == 0)
            share_setup(round + 1);
        pthread_barrier_wait(&barrier);
    }
    return NULL;
}

static int run_threads(void)
{
    int count = settings.threads;
    pthread_barrier_init(&barrier, NULL, (unsigned)count);
    init_process_context(&process_context, count * SLOTS_PER_THREAD, (size_t)count * 6,
                         settings.seed ^ 0x5bd1e995u);
    if (!reserve_ops(&process_context, SEQUENCE_CAPACITY))
        return EXIT_HARNESS;
    pthread_t threads[MAX_THREADS];
    for (int t = 0; t < count; t++) {
        struct context *context = &thread_contexts[t];
        context->index = t;
        context->slot_first = t * SLOTS_PER_THREAD;
        context->slot_end = (t + 1) * SLOTS_PER_THREAD;
        context->object_cap = 6;
        context->whole_process = false;
        context->rng = settings.seed * 1000003u + (uint64_t)t + 1;
        size_t rounds = (settings.ops + settings.barrier_every - 1) / settings.barrier_every;
        if (!reserve_ops(context, settings.ops + rounds * settings.pair_rounds + 16))
            return EXIT_HARNESS;
        if (pthread_create(&threads[t], NULL, thread_main, context) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return EXIT_HARNESS;
        }
    }
    for (int t = 0; t < count; t++)
        pthread_join(threads[t], NULL);
    /* Everything from every thread, then gone. */
    process_context.slot_first = 0;
    enum step_verdict verdict = cleanup(&process_context);
    struct op_counts total = process_context.counts;
    uint64_t checks = process_context.checks;
    size_t ops = 0;
    for (int t = 0; t < count; t++) {
        for (int kind = 0; kind < OP_KIND_COUNT; kind++) {
            total.done[kind] += thread_contexts[t].counts.done[kind];
            total.failed[kind] += thread_contexts[t].counts.failed[kind];
            total.skipped[kind] += thread_contexts[t].counts.skipped[kind];
        }
        for (int what = 0; what < COVER_COUNT; what++)
            total.covered[what] += thread_contexts[t].counts.covered[what];
        checks += thread_contexts[t].checks;
        ops += thread_contexts[t].op_count;
    }
    if (verdict != STEP_OK) {
        printf("FAILURE (%s) seed=%" PRIu64 " at final cleanup\n",
               verdict == STEP_HARNESS ? "harness error" : "model and runtime disagree",
               settings.seed);
        print_report(&process_context);
        printf("FAILED-AT cleanup\n");
        return verdict == STEP_HARNESS ? EXIT_HARNESS : EXIT_DISAGREE;
    }
    if (!settings.quiet) {
        print_counts(stdout, &total);
        printf("summary seed=%" PRIu64 " threads=%d ops=%zu checks=%" PRIu64
               " register_calls=%" PRIu64 " unregister_calls=%" PRIu64 " share=%d pair_rounds=%zu"
               " kernel_mlock2=%d kernel_dontunmap_source_listed=%d\n",
               settings.seed, count, ops, checks, fake_calls(FAKE_CALL_REGISTER),
               fake_calls(FAKE_CALL_UNREGISTER), settings.share, settings.pair_rounds,
               kernel_does.mlock2, kernel_does.dontunmap_source_listed);
    }
    printf("PASS\n");
    return EXIT_AGREE;
}

/* ------------------------------------------------------------------------ */

static bool parse_min_bytes(const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || end == text)
        return false;
    unsigned long long scale = 1;
    if (*end == 'k' || *end == 'K')
        scale = 1024, end++;
    else if (*end == 'm' || *end == 'M')
        scale = 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        scale = 1024 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B')
        end++;
    if (*end == 'B')
        end++;
    if (*end != '\0')
        return false;
    *out = value * scale;
    return true;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: model_random [--seed S] [--ops N] [--threads T] [--fork-rate R]\n"
            "                    [--barrier-every K] [--kernel-check-every N] [--record FILE]\n"
            "                    [--replay FILE] [--no-shrink] [--shrunk-out FILE]\n"
            "                    [--shrink-budget SECONDS] [--quiet] [--trace]\n"
            "                    [--expose-known-bugs] [--inject-model-bug NAME]\n"
            "                    [--layout-rate R] [--copy-rate R] [--share [--pair-rounds N]\n"
            "                    [--pair-delay-us U] [--pair-pages P]]\n"
            "Run with LD_PRELOAD=libpinshim.so PINSHIM_CUDART=libfake_cudart.so.\n");
    return EXIT_USAGE;
}

/* Without address-space randomisation the same sequence meets the same
 * layout (whether a mapping can grow in place, which mappings are adjacent),
 * so a seed or a recorded sequence replays exactly. Re-executes itself once
 * with ADDR_NO_RANDOMIZE; where that is not allowed, runs as it is. */
static bool fix_layout(char **argv)
{
    int current = personality(0xffffffff);
    if (current == -1)
        return false;
    if (current & ADDR_NO_RANDOMIZE)
        return true;
    if (getenv("MODEL_RANDOM_KEEP_ASLR") != NULL ||
        personality((unsigned long)current | ADDR_NO_RANDOMIZE) == -1)
        return false;
    execv("/proc/self/exe", argv);
    personality((unsigned long)current);
    return false;
}

int main(int argc, char **argv)
{
    saved_argv = argv;
    const char *pair_rounds = NULL;
    layout_fixed = fix_layout(argv);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--no-shrink") == 0) {
            settings.shrink = false;
        } else if (strcmp(arg, "--quiet") == 0) {
            settings.quiet = true;
        } else if (strcmp(arg, "--trace") == 0) {
            settings.trace = true;
        } else if (strcmp(arg, "--expose-known-bugs") == 0) {
            settings.expose_known_bugs = true;
        } else if (strcmp(arg, "--share") == 0) {
            settings.share = true;
        } else if (value == NULL) {
            return usage();
        } else {
            i++;
            if (strcmp(arg, "--seed") == 0)
                settings.seed = strtoull(value, NULL, 0);
            else if (strcmp(arg, "--ops") == 0)
                settings.ops = strtoull(value, NULL, 0);
            else if (strcmp(arg, "--threads") == 0)
                settings.threads = atoi(value);
            else if (strcmp(arg, "--fork-rate") == 0)
                settings.fork_rate = strtod(value, NULL);
            else if (strcmp(arg, "--barrier-every") == 0)
                settings.barrier_every = strtoull(value, NULL, 0);
            else if (strcmp(arg, "--kernel-check-every") == 0)
                settings.kernel_check_every = strtoull(value, NULL, 0);
            else if (strcmp(arg, "--record") == 0)
                settings.record_path = value;
            else if (strcmp(arg, "--replay") == 0)
                settings.replay_path = value;
            else if (strcmp(arg, "--shrunk-out") == 0)
                settings.shrunk_out = value;
            else if (strcmp(arg, "--shrink-budget") == 0)
                settings.shrink_budget_seconds = strtod(value, NULL);
            else if (strcmp(arg, "--inject-model-bug") == 0)
                settings.model_bug = value;
            else if (strcmp(arg, "--layout-rate") == 0)
                settings.layout_rate = strtod(value, NULL);
            else if (strcmp(arg, "--copy-rate") == 0)
                settings.copy_rate = strtod(value, NULL);
            else if (strcmp(arg, "--pair-rounds") == 0)
                pair_rounds = value;
            else if (strcmp(arg, "--pair-pages") == 0)
                settings.pair_pages = strtoull(value, NULL, 0);
            else if (strcmp(arg, "--pair-delay-us") == 0)
                settings.pair_delay_us = (unsigned)strtoul(value, NULL, 0);
            else
                return usage();
        }
    }
    if (settings.threads < 1 || settings.threads > MAX_THREADS || settings.barrier_every == 0 ||
        (settings.share && (settings.threads < 2 || settings.replay_path != NULL ||
                            settings.pair_pages < 8 || settings.pair_pages > MAX_OBJECT_PAGES)))
        return usage();
    settings.pair_rounds = !settings.share ? 0 : pair_rounds ? strtoull(pair_rounds, NULL, 0) : 4;

    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    const char *min_text = getenv("PINSHIM_MIN_BYTES");
    if (min_text && *min_text && !parse_min_bytes(min_text, &min_bytes)) {
        fprintf(stderr, "model_random: cannot read PINSHIM_MIN_BYTES=%s\n", min_text);
        return EXIT_USAGE;
    }
    rounding_threshold = min_bytes < 65536 ? 65536 : (size_t)min_bytes;
    const char *onfault = getenv("PINSHIM_ONFAULT");
    if (onfault != NULL && *onfault != '\0') {
        if (strcasecmp(onfault, "skip") == 0)
            onfault_mode = ONFAULT_SKIP;
        else if (strcasecmp(onfault, "all") == 0)
            onfault_mode = ONFAULT_ALL;
        else if (strcasecmp(onfault, "resident") != 0) {
            fprintf(stderr, "model_random: cannot read PINSHIM_ONFAULT=%s\n", onfault);
            return EXIT_USAGE;
        }
    }
    shim_is_registered = (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    shim_get_counters =
        (size_t(*)(struct pinshim_counters *, size_t))dlsym(RTLD_DEFAULT, "pinshim_get_counters");
    /* MODEL_DRAIN=1: wait for the registration thread before each check;
     * else nothing waits, and what is locked must be registered when the
     * lock call returns. */
    if (getenv("MODEL_DRAIN") != NULL && getenv("MODEL_DRAIN")[0] == '1')
        shim_drain = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    const char *vendor_name = getenv("MODEL_VENDOR");
    if (vendor_name != NULL && strcmp(vendor_name, "hip") == 0)
        vendor = MODEL_HIP;
    else if (vendor_name != NULL && strcmp(vendor_name, "ze") == 0)
        vendor = MODEL_ZE;
    if (shim_is_registered == NULL || fake_library() == NULL) {
        printf("model_random: libpinshim.so is not preloaded or %s is unset\n",
               vendor == MODEL_CUDA ? "PINSHIM_CUDART" : "MODEL_FAKE");
        return EXIT_HARNESS;
    }
    /* MODEL_PROGRAM_CONTEXT=1: the program initialises CUDA itself (the fake
     * runtime on the fake driver: cudaFree(NULL) makes device 0's primary
     * context current on this thread), so that the shim, with
     * PINSHIM_CONTEXT=program, registers into it; its other threads have no
     * context and the shim uses the active primary one. */
    if (getenv("MODEL_PROGRAM_CONTEXT") != NULL && getenv("MODEL_PROGRAM_CONTEXT")[0] == '1') {
        /* CUDA: cudaFree(NULL); HIP: hipSetDevice(0); Level Zero: zeInit(0),
         * by name, as a program linked with the loader calls it, so that the
         * shim's definition sees the start (a start it does not see is found
         * later, by the engine's watcher: tests/integration/test_vendors.c). */
        static const char *const starts[] = {"cudaFree", "hipSetDevice", "zeInit"};
        void *runtime = dlopen(fake_library(), RTLD_NOW | RTLD_GLOBAL);
        void *start = runtime == NULL      ? NULL
                      : vendor == MODEL_ZE ? dlsym(RTLD_DEFAULT, starts[vendor])
                                           : dlsym(runtime, starts[vendor]);
        int started = -1;
        if (start != NULL && vendor == MODEL_CUDA)
            started = ((int (*)(void *))start)(NULL);
        else if (start != NULL)
            started = ((int (*)(int))start)(0);
        if (started != 0) {
            printf("model_random: cannot start the runtime through %s (%s)\n", fake_library(),
                   starts[vendor]);
            return EXIT_HARNESS;
        }
    }
    /* Set up stdio's buffer before any object exists. */
    static char stdout_buffer[1 << 16];
    setvbuf(stdout, stdout_buffer, _IOLBF, sizeof(stdout_buffer));

    /* MODEL_RANDOM_NO_PROCMAP=1: read /proc/self/maps as on kernels before 6.11. */
    procmap_unsupported = getenv("MODEL_RANDOM_NO_PROCMAP") != NULL;
    probe_emulation();
    if (settings.threads == 1)
        probe_kernel();
    if (settings.replay_path)
        return run_replay();
    if (settings.threads > 1)
        return run_threads();
    return run_single();
}
