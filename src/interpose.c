/* The interposition layer: the exported libc entry points. Each resolves the
 * real function, steps aside while the shim is inside the CUDA runtime, keeps
 * the real call's return value and errno, and hands the bookkeeping to the
 * engine. Nothing else lives here. */
/* Define mmap and mmap64 as two symbols: no off_t redirection here. */
#undef _FILE_OFFSET_BITS

#include "block_extent.h"
#include "loaded_objects.h"
#include "log.h"
#include "memory_map.h"
#include "interpose_internal.h"
#include "runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PINSHIM_EXPORT __attribute__((visibility("default")))

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

typedef void (*free_fn)(void *);
typedef void *(*realloc_fn)(void *, size_t);
typedef void *(*reallocarray_fn)(void *, size_t, size_t);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*memalign_fn)(size_t, size_t);
typedef void *(*valloc_fn)(size_t);
typedef size_t (*usable_size_fn)(void *);
typedef int (*mlock_fn)(const void *, size_t);
typedef int (*mlock2_fn)(const void *, size_t, unsigned int);
typedef int (*munlock_fn)(const void *, size_t);
typedef int (*mlockall_fn)(int);
typedef int (*munlockall_fn)(void);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void *, size_t);
typedef int (*mprotect_fn)(void *, size_t, int);
typedef int (*pkey_mprotect_fn)(void *, size_t, int, int);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);
typedef void (*exit_fn)(int);

/* glibc's own entry points, used only while the real ones are being resolved
 * (dlsym can allocate and free). */
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static void bootstrap_free(void *ptr);
static size_t bootstrap_usable_size(void *ptr);
/* The aligned allocations' rare paths stand in for the real functions until
 * they are resolved, so that the common path calls through the pointer
 * without testing it. */
static int posix_memalign_rare(void **memptr, size_t alignment, size_t size);
static void *aligned_alloc_rare(size_t alignment, size_t size);
static void *memalign_rare(size_t alignment, size_t size);
static void *valloc_rare(size_t size);

static struct {
    free_fn free;
    realloc_fn realloc;
    reallocarray_fn reallocarray;
    posix_memalign_fn posix_memalign;
    memalign_fn aligned_alloc;
    memalign_fn memalign;
    valloc_fn valloc;
    usable_size_fn malloc_usable_size;
    mlock_fn mlock;
    mlock2_fn mlock2;
    munlock_fn munlock;
    mlockall_fn mlockall;
    munlockall_fn munlockall;
    mmap_fn mmap;
    mmap_fn mmap64;
    munmap_fn munmap;
    mprotect_fn mprotect;
    pkey_mprotect_fn pkey_mprotect;
    mremap_fn mremap;
    exit_fn exit_now;
} real = {.free = bootstrap_free,
          .posix_memalign = posix_memalign_rare,
          .aligned_alloc = aligned_alloc_rare,
          .memalign = memalign_rare,
          .valloc = valloc_rare,
          .malloc_usable_size = bootstrap_usable_size};

/* Publishes a resolved function over its stand-in (kept when there is none):
 * the common paths read the pointers without synchronisation. */
#define PUBLISH_REAL(field, name)                                                                  \
    do {                                                                                           \
        void *found = next_symbol(name);                                                           \
        if (found != NULL)                                                                         \
            __atomic_store_n(&real.field, (__typeof__(real.field))found, __ATOMIC_RELEASE);        \
    } while (0)

static int resolved;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
/* Set while this thread runs dlsym for the real functions: what dlsym itself
 * calls must not wait for the resolution it is part of. */
static __thread int resolving __attribute__((tls_model("initial-exec")));

static void *next_symbol(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

static void resolve_once_body(void)
{
    resolving++;
    /* The page size, for the calls that look at it before the shim's set-up
     * (munmap, mremap, mprotect): the kernel's, from the auxiliary vector. */
    long page = sysconf(_SC_PAGESIZE);
    if (page > 0)
        runtime_page_size = (uintptr_t)page;
    real.realloc = (realloc_fn)next_symbol("realloc");
    real.reallocarray = (reallocarray_fn)next_symbol("reallocarray");
    PUBLISH_REAL(posix_memalign, "posix_memalign");
    PUBLISH_REAL(aligned_alloc, "aligned_alloc");
    PUBLISH_REAL(memalign, "memalign");
    PUBLISH_REAL(valloc, "valloc");
    real.mlock = (mlock_fn)next_symbol("mlock");
    real.mlock2 = (mlock2_fn)next_symbol("mlock2");
    real.munlock = (munlock_fn)next_symbol("munlock");
    real.mlockall = (mlockall_fn)next_symbol("mlockall");
    real.munlockall = (munlockall_fn)next_symbol("munlockall");
    real.mmap = (mmap_fn)next_symbol("mmap");
    real.mmap64 = (mmap_fn)next_symbol("mmap64");
    real.munmap = (munmap_fn)next_symbol("munmap");
    real.mprotect = (mprotect_fn)next_symbol("mprotect");
    real.pkey_mprotect = (pkey_mprotect_fn)next_symbol("pkey_mprotect");
    real.mremap = (mremap_fn)next_symbol("mremap");
    real.exit_now = (exit_fn)next_symbol("_exit");
    /* free and malloc_usable_size are read without synchronisation on the hot
     * path: publish them with release stores, last. */
    usable_size_fn next_usable = (usable_size_fn)next_symbol("malloc_usable_size");
    free_fn next_free = (free_fn)next_symbol("free");
    if (next_usable != NULL)
        __atomic_store_n(&real.malloc_usable_size, next_usable, __ATOMIC_RELEASE);
    if (next_free != NULL)
        __atomic_store_n(&real.free, next_free, __ATOMIC_RELEASE);
    resolving--;
    __atomic_store_n(&resolved, 1, __ATOMIC_RELEASE);
}

static void resolve_real_functions(void)
{
    if (resolving)
        return;
    pthread_once(&resolve_once, resolve_once_body);
}

static inline void ensure_resolved(void)
{
    if (__builtin_expect(!__atomic_load_n(&resolved, __ATOMIC_ACQUIRE), 0))
        resolve_real_functions();
}

/* Written twice at most (the bootstrap stand-in, then libc's free, with a
 * release store), an aligned pointer read plainly so that free's tail call
 * is one memory-indirect jump; both values are valid functions. */
static inline free_fn real_free(void)
{
    return real.free;
}

static void bootstrap_free(void *ptr)
{
    if (resolving)
        return; /* freed by dlsym while resolving: leaking a few bytes is safe */
    resolve_real_functions();
    if (real_free() != bootstrap_free)
        real_free()(ptr);
}

static size_t bootstrap_usable_size(void *ptr)
{
    if (resolving)
        return 0;
    resolve_real_functions();
    usable_size_fn next = __atomic_load_n(&real.malloc_usable_size, __ATOMIC_ACQUIRE);
    return next != bootstrap_usable_size ? next(ptr) : 0;
}

static inline uintptr_t page_floor(uintptr_t addr)
{
    return addr & ~(runtime_page_size - 1);
}

static inline uintptr_t page_ceil(uintptr_t addr)
{
    uintptr_t rounded = (addr + runtime_page_size - 1) & ~(runtime_page_size - 1);
    return rounded < addr ? UINTPTR_MAX & ~(runtime_page_size - 1) : rounded;
}

static inline uintptr_t range_end(uintptr_t addr, size_t length)
{
    uintptr_t end = addr + length;
    return page_ceil(end < addr ? UINTPTR_MAX : end);
}

/* ---- allocation ---- */

/* Whether the checks allowed glibc's chunk header as the source of block ends. */
static inline bool block_ends_from_header(void)
{
    return __builtin_expect(__atomic_load_n(&block_extent_chosen_source, __ATOMIC_RELAXED) ==
                                BLOCK_EXTENT_GLIBC_HEADER,
                            1);
}

/* Where the block at ptr ends: from glibc's chunk header when the checks
 * allowed it, else from the allocator. Never below ptr + 1. */
static inline uintptr_t block_end(void *ptr)
{
    uintptr_t start = (uintptr_t)ptr;
    if (block_ends_from_header()) {
        uintptr_t end = block_extent_glibc_end(ptr);
        return end > start ? end : start + 1;
    }
    size_t usable = __atomic_load_n(&real.malloc_usable_size, __ATOMIC_ACQUIRE)(ptr);
    uintptr_t end = start + (usable != 0 ? usable : 1);
    return end > start ? end : UINTPTR_MAX;
}

/* Whether the block at ptr may hold a registered page: its extent against the
 * registrations' span and the page bitmap, without a lock. The bitmap's 4 KiB
 * granules subdivide system pages, so the granules the block touches tell. */
static inline bool block_may_hold_registration(void *ptr, uintptr_t *start, uintptr_t *end)
{
    *start = (uintptr_t)ptr;
    *end = block_end(ptr);
    return engine_may_overlap(&runtime_engine, *start, *end);
}

/* The real calls, run by the engine inside its protocol. Every engine call
 * runs inside the guard: a signal handler or the CUDA runtime calling back
 * into the shim meanwhile goes straight to the real function rather than
 * wait for the operation it interrupted. */
struct block_call {
    void *ptr;
    size_t nmemb, size;
    bool is_array;
};

static long run_free(void *arguments)
{
    real_free()(((struct block_call *)arguments)->ptr);
    return 0;
}

static long run_realloc(void *arguments)
{
    struct block_call *call = arguments;
    if (call->is_array && real.reallocarray != NULL)
        return (long)real.reallocarray(call->ptr, call->nmemb, call->size);
    return (long)real.realloc(call->ptr, call->nmemb * call->size);
}

/* The block [start, end) may hold registered pages: they go, as the free
 * rule says, around call, the call that frees it (free, or an operator
 * delete). */
static void release_freed_block(uintptr_t start, uintptr_t end, const struct engine_call *call)
{
    reentry_guard_enter();
    engine_release_block(&runtime_engine, start, end, RELEASE_FREE, false, call);
    reentry_guard_leave();
}

__attribute__((noinline)) static void free_with_registrations(void *ptr)
{
    uintptr_t start, end;
    if (!block_may_hold_registration(ptr, &start, &end) || reentry_guarded()) {
        real_free()(ptr);
        return;
    }
    struct block_call arguments = {.ptr = ptr};
    struct engine_call call = {run_free, &arguments, "free"};
    release_freed_block(start, end, &call);
}

/* With registrations, the block not cleared by free's fast checks: below
 * the window or outside it, a large block, or one on a registered granule.
 * On glibc's allocator the chunk header, the span's start and one word of the
 * page bitmap clear nearly every other block, with no call and no stack
 * frame; the rest (the allocator's size needed, a block over two bitmap words,
 * or one holding a registered page) goes on to the full check. */
__attribute__((noinline)) static void free_while_registered(void *ptr)
{
    if (engine_block_clear_outside(&runtime_engine, ptr)) {
        real_free()(ptr);
        return;
    }
    uintptr_t start = (uintptr_t)ptr;
    if (block_ends_from_header()) {
        uintptr_t end = block_extent_glibc_end(ptr);
        if (end <= __atomic_load_n(&runtime_engine.span_start, __ATOMIC_RELAXED) ||
            page_index_one_word_used(&runtime_engine.registry.index, start, end) == 0) {
            real_free()(ptr);
            return;
        }
    }
    free_with_registrations(ptr);
}

/* A block in the window that the one add did not clear: the second look,
 * out of line with what the first computed. */
__attribute__((noinline)) static void free_after_second_look(void *ptr, uintptr_t sum,
                                                             uintptr_t granule)
{
    if (engine_block_clear_second_look(&runtime_engine, ptr, sum, granule)) {
        real_free()(ptr);
        return;
    }
    free_while_registered(ptr);
}

PINSHIM_EXPORT void free(void *ptr)
{
    /* The hot path (engine_block_window_check): one compare clears every block
     * while nothing is registered and every block above all registrations
     * (three instructions with the tail call); a block in the window is
     * cleared by its chunk header and one entry of the window's map, NULL
     * after the window, one below all registrations by its header.
     * The gate is an aligned word written under the engine's lock and read
     * here once, without synchronisation, so the compiler folds the load into
     * the compare: a reader that sees an old value raced a lock of the very
     * memory it frees (the program's own race), as with any lock-free check.
     * Each way ends in a tail call: no stack frame. */
    uintptr_t sum, granule;
    int verdict =
        engine_block_window_check(&runtime_engine, runtime_free_gate, ptr, &sum, &granule);
    if (__builtin_expect(verdict > 0, 1)) {
        real_free()(ptr);
        return;
    }
    if (verdict < 0)
        free_after_second_look(ptr, sum, granule);
    else
        free_while_registered(ptr);
}

void interpose_release_block(void *ptr, long (*run)(void *), void *arguments)
{
    ensure_resolved();
    uintptr_t start, end;
    if (engine_block_clear_fast(&runtime_engine, runtime_free_gate, ptr) ||
        !block_may_hold_registration(ptr, &start, &end) || reentry_guarded()) {
        run(arguments);
        return;
    }
    struct engine_call call = {run, arguments, "operator delete"};
    release_freed_block(start, end, &call);
}

void interpose_free(void *ptr)
{
    free(ptr);
}

static void *realloc_common(void *ptr, size_t nmemb, size_t size, bool is_array)
{
    ensure_resolved();
    if (__builtin_expect(!engine_has_registrations(&runtime_engine), 1) && !is_array &&
        real.realloc != NULL && !resolving)
        return real.realloc(ptr, size);
    size_t total;
    bool overflow = __builtin_mul_overflow(nmemb, size, &total);
    if (resolving || real.realloc == NULL) {
        if (overflow) {
            errno = ENOMEM;
            return NULL;
        }
        return __libc_realloc(ptr, total);
    }
    uintptr_t start, end;
    if (ptr == NULL || overflow || reentry_guarded() ||
        !engine_has_registrations(&runtime_engine) ||
        !block_may_hold_registration(ptr, &start, &end)) {
        if (is_array)
            return real.reallocarray
                       ? real.reallocarray(ptr, nmemb, size)
                       : (overflow ? (errno = ENOMEM, NULL) : real.realloc(ptr, total));
        return real.realloc(ptr, size);
    }
    struct block_call arguments = {ptr, is_array ? nmemb : 1, is_array ? size : total, is_array};
    struct engine_call call = {run_realloc, &arguments, "realloc"};
    /* realloc(p, 0) frees p; a failed realloc leaves the block and its pages
     * as they were, so what was released is put back. */
    reentry_guard_enter();
    long result =
        engine_release_block(&runtime_engine, start, end, RELEASE_REALLOC, total != 0, &call);
    reentry_guard_leave();
    return (void *)result;
}

PINSHIM_EXPORT void *realloc(void *ptr, size_t size)
{
    return realloc_common(ptr, 1, size, false);
}

PINSHIM_EXPORT void *reallocarray(void *ptr, size_t nmemb, size_t size)
{
    return realloc_common(ptr, nmemb, size, true);
}

/* The other aligned allocations get posix_memalign's rounding and alignment
 * (buffers large enough to be locked own whole pages, and PMD-aligned ones
 * while the shim makes huge pages). The call stays the program's own: an
 * alignment posix_memalign would reject is not rounded, so each function
 * keeps its own rules for it. */
static bool round_aligned_request(size_t *alignment, size_t *size)
{
    if (reentry_guarded())
        return false;
    size_t threshold = runtime_rounding_threshold(); /* initialises: the page size */
    if (!block_extent_round_to_pages(runtime_page_size, threshold, alignment, size))
        return false;
    *alignment = runtime_huge_pages_alignment(*alignment, *size);
    return true;
}

/* Whether the real function behind field is resolved: its pointer no longer
 * holds the rare path standing in for it. */
#define REAL_RESOLVED(field, stand_in)                                                             \
    (__atomic_load_n(&real.field, __ATOMIC_ACQUIRE) != (stand_in))

/* posix_memalign's rare paths, out of line so that its common one keeps no
 * stack frame: while the real functions are being resolved, and for
 * buffers large enough to be locked, which get whole pages so a later lock
 * shares no page with a neighbour (invalid alignments pass unchanged so the
 * real call rejects them). */
__attribute__((noinline)) static int posix_memalign_rare(void **memptr, size_t alignment,
                                                         size_t size)
{
    ensure_resolved();
    if (resolving || !REAL_RESOLVED(posix_memalign, posix_memalign_rare)) {
        void *memory = __libc_memalign(alignment, size);
        if (memory == NULL)
            return ENOMEM;
        *memptr = memory;
        return 0;
    }
    if (size >= RUNTIME_SMALLEST_ROUNDING_THRESHOLD)
        round_aligned_request(&alignment, &size);
    return real.posix_memalign(memptr, alignment, size);
}

PINSHIM_EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size)
{
    /* Small blocks (PyTorch's CPU tensors, 64-byte aligned) go straight to
     * the allocator: one compare and a tail call through the pointer, which
     * holds the rare path until the resolution (resolve_once_body) writes
     * glibc's own, safe to call while the rest is being resolved. */
    if (__builtin_expect(size < RUNTIME_SMALLEST_ROUNDING_THRESHOLD, 1))
        return __atomic_load_n(&real.posix_memalign, __ATOMIC_RELAXED)(memptr, alignment, size);
    return posix_memalign_rare(memptr, alignment, size);
}

/* aligned_alloc's and memalign's rare paths: next is where the real
 * function's pointer is kept, stand_in the rare path it holds until it is
 * resolved. aligned_alloc's size must be a multiple of its alignment for
 * some allocators (C11; ASan's refuses others with EINVAL): such a request
 * is passed unchanged, so that rounding never turns a refusal into a block. */
static void *aligned_rare(memalign_fn *next, memalign_fn stand_in, size_t alignment, size_t size,
                          bool size_of_alignments)
{
    ensure_resolved();
    memalign_fn resolved_next = __atomic_load_n(next, __ATOMIC_ACQUIRE);
    if (resolving || resolved_next == stand_in)
        return __libc_memalign(alignment, size);
    if (!size_of_alignments || (alignment != 0 && size % alignment == 0))
        round_aligned_request(&alignment, &size);
    return resolved_next(alignment, size);
}

__attribute__((noinline)) static void *aligned_alloc_rare(size_t alignment, size_t size)
{
    return aligned_rare(&real.aligned_alloc, aligned_alloc_rare, alignment, size, true);
}

__attribute__((noinline)) static void *memalign_rare(size_t alignment, size_t size)
{
    return aligned_rare(&real.memalign, memalign_rare, alignment, size, false);
}

PINSHIM_EXPORT void *aligned_alloc(size_t alignment, size_t size)
{
    if (__builtin_expect(size < RUNTIME_SMALLEST_ROUNDING_THRESHOLD, 1))
        return __atomic_load_n(&real.aligned_alloc, __ATOMIC_RELAXED)(alignment, size);
    return aligned_alloc_rare(alignment, size);
}

PINSHIM_EXPORT void *memalign(size_t alignment, size_t size)
{
    if (__builtin_expect(size < RUNTIME_SMALLEST_ROUNDING_THRESHOLD, 1))
        return __atomic_load_n(&real.memalign, __ATOMIC_RELAXED)(alignment, size);
    return memalign_rare(alignment, size);
}

/* valloc is memalign(page, size); a rounded request goes to memalign. */
__attribute__((noinline)) static void *valloc_rare(size_t size)
{
    ensure_resolved();
    if (resolving || !REAL_RESOLVED(valloc, valloc_rare) || !REAL_RESOLVED(memalign, memalign_rare))
        return __libc_memalign(runtime_page_size, size);
    size_t alignment = runtime_page_size;
    if (round_aligned_request(&alignment, &size))
        return real.memalign(alignment, size);
    return real.valloc(size);
}

PINSHIM_EXPORT void *valloc(size_t size)
{
    if (__builtin_expect(size < RUNTIME_SMALLEST_ROUNDING_THRESHOLD, 1))
        return __atomic_load_n(&real.valloc, __ATOMIC_RELAXED)(size);
    return valloc_rare(size);
}

struct block_extent_check {
    enum block_extent_source source;
};

static void *block_extent_check_thread(void *argument)
{
    struct block_extent_check *check = argument;
    struct block_extent_allocator allocator = {
        .malloc = malloc,
        .posix_memalign = real.posix_memalign,
        .free = real.free,
        .usable_size = real.malloc_usable_size,
    };
    reentry_guard_enter();
    check->source = block_extent_choose(&allocator);
    reentry_guard_leave();
    return NULL;
}

/* The checks allocate and free blocks of many sizes. On the locking thread
 * they would leave cached chunks and a taller heap in the program's own
 * arena, so where the process already runs threads, a short-lived thread of
 * their own (all signals blocked) gets an arena of its own for them. A
 * single-threaded process keeps them here: the first thread glibc sees
 * switches its malloc and free for good to the paths that lock an arena
 * (issue 37 measured 22 more instructions a free + malloc pair), far more
 * than the few cached chunks cost. Where no thread can be started, they run
 * here too. */
static enum block_extent_source run_block_extent_checks(void)
{
    struct block_extent_check check = {BLOCK_EXTENT_ALLOCATOR_CALL};
    if (block_extent_glibc_single_threaded()) {
        block_extent_check_thread(&check);
        return check.source;
    }
    sigset_t all, previous;
    sigfillset(&all);
    pthread_t thread;
    reentry_guard_enter();
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int error = pthread_create(&thread, NULL, block_extent_check_thread, &check);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (error == 0)
        pthread_join(thread, NULL);
    reentry_guard_leave();
    if (error != 0)
        block_extent_check_thread(&check);
    return check.source;
}

/* Picks where free learns a block's end. Only blocks that may hold a
 * registration need it, so it runs once, at the first lock that may register
 * (a process that never locks pays nothing), before that registration: the
 * call path that loads the CUDA runtime at the same moment. Until then, and
 * if the checks fail, free asks the allocator. */
static void choose_block_extent_source(void)
{
    if (runtime_rounding_threshold() == SIZE_MAX)
        return; /* registration is off: nothing to look up on free */
    /* Under mlockall(MCL_FUTURE) the checks' 40 MiB block would be locked and
     * faulted in: the call is kept instead. */
    if (runtime_config.block_size_from_allocator || runtime_future_mappings_locked() ||
        !REAL_RESOLVED(posix_memalign, posix_memalign_rare) ||
        real.malloc_usable_size == bootstrap_usable_size || real.free == bootstrap_free) {
        __atomic_store_n(&block_extent_chosen_source, BLOCK_EXTENT_ALLOCATOR_CALL,
                         __ATOMIC_RELAXED);
        log_debug("free finds block ends with malloc_usable_size (%s)",
                  runtime_config.block_size_from_allocator ? "PINSHIM_BLOCK_SIZE=allocator"
                  : runtime_future_mappings_locked()       ? "mlockall(MCL_FUTURE) is in effect"
                                                           : "the allocator is not resolved");
        return;
    }
    enum block_extent_source source = run_block_extent_checks();
    __atomic_store_n(&block_extent_chosen_source, (int)source, __ATOMIC_RELAXED);
    if (source == BLOCK_EXTENT_GLIBC_HEADER)
        engine_enable_window(&runtime_engine);
    log_debug("free finds block ends with %s", block_extent_source_name(source));
}

/* Once (block_extent_choice_state). Other threads never wait for the
 * chooser: they keep the allocator's answer meanwhile. */
static void choose_block_extent_source_once(size_t length)
{
    if (__builtin_expect(__atomic_load_n(&block_extent_choice_state, __ATOMIC_ACQUIRE) == 2, 1) ||
        length < runtime_config.min_bytes)
        return;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&block_extent_choice_state, &expected, 1, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    choose_block_extent_source();
    __atomic_store_n(&block_extent_choice_state, 2, __ATOMIC_RELEASE);
}

/* ---- calls made by a GPU runtime itself ---- */

/* Whether the call comes from a GPU vendor's own code: a driver or a runtime
 * locking, unlocking or mapping memory for itself, perhaps while it holds its
 * own locks. The shim must never call back into the runtime from inside that
 * stack (CUDA's cuMemHostRegister would wait for a lock its caller holds),
 * nor wait there for a claim that an operation inside the runtime holds:
 * such calls go straight to the real function. Memory a runtime locks for
 * itself is its own: it is never registered (registering it later, from
 * another thread, could race the runtime's own pinning of it). The loader's
 * list answers, with no system call (loaded_objects.h). */
static bool called_by_gpu_runtime(const void *caller)
{
    return loaded_objects_in_gpu_runtime((uintptr_t)caller);
}

/* A lock a runtime made for itself: counted, passed through. */
static void count_runtime_library_lock(void)
{
    int saved_errno = errno;
    runtime_ensure_initialized();
    engine_count(&engine_stats(&runtime_engine)->skipped_runtime_library);
    runtime_count_lock_call();
    static int logged;
    if (__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED) == 0)
        log_info("locks made by a GPU driver or runtime itself are passed through, not "
                 "registered (logged once)");
    errno = saved_errno;
}

/* ---- locking ---- */

struct lock_call {
    const void *addr;
    size_t length;
    unsigned flags;
};

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif

static long real_mlock(const struct lock_call *call)
{
    return real.mlock(call->addr, call->length);
}

static long real_mlock2(const struct lock_call *call)
{
    if (real.mlock2 != NULL)
        return real.mlock2(call->addr, call->length, call->flags);
    return syscall(SYS_mlock2, call->addr, call->length, call->flags);
}

/* The real lock, inside the engine's claim of its pages: huge pages are
 * asked for just before it faults them in (MLOCK_ONFAULT faults nothing in:
 * huge pages would lock 2 MiB per page touched), and counted after. */
static long lock_on_huge_pages(const struct lock_call *call, long (*lock)(const struct lock_call *))
{
    struct huge_pages_lock huge;
    runtime_huge_pages_before_lock((uintptr_t)call->addr, call->length,
                                   (call->flags & MLOCK_ONFAULT) == 0, &huge);
    long result = lock(call);
    runtime_huge_pages_after_lock(&huge, result == 0);
    return result;
}

static long run_mlock(void *arguments)
{
    return lock_on_huge_pages(arguments, real_mlock);
}

static long run_mlock2(void *arguments)
{
    return lock_on_huge_pages(arguments, real_mlock2);
}

static long run_munlock(void *arguments)
{
    struct lock_call *call = arguments;
    return real.munlock(call->addr, call->length);
}

static long run_munlockall(void *arguments)
{
    (void)arguments;
    return real.munlockall();
}

/* A lock that may register: counts it, picks free's block-size source once,
 * and hands the call to the engine. */
static int lock_through_engine(const void *addr, size_t len, unsigned engine_flags,
                               long (*run)(void *), struct lock_call *arguments, const char *name)
{
    int saved_errno = errno;
    runtime_ensure_initialized();
    choose_block_extent_source_once(len);
    runtime_notice_gpu();
    errno = saved_errno;
    struct engine_call call = {run, arguments, name};
    reentry_guard_enter();
    int result = (int)engine_lock(&runtime_engine, (uintptr_t)addr, len, engine_flags, &call);
    reentry_guard_leave();
    if (result == 0)
        runtime_count_lock_call();
    return result;
}

PINSHIM_EXPORT int mlock(const void *addr, size_t len)
{
    ensure_resolved();
    if (reentry_guarded())
        return real.mlock(addr, len);
    if (called_by_gpu_runtime(__builtin_return_address(0))) {
        int result = real.mlock(addr, len);
        count_runtime_library_lock();
        return result;
    }
    struct lock_call arguments = {addr, len, 0};
    return lock_through_engine(addr, len, 0, run_mlock, &arguments, "mlock");
}

PINSHIM_EXPORT int mlock2(const void *addr, size_t len, unsigned int flags)
{
    ensure_resolved();
    struct lock_call arguments = {addr, len, flags};
    if (reentry_guarded())
        return (int)real_mlock2(&arguments);
    if (called_by_gpu_runtime(__builtin_return_address(0))) {
        int result = (int)real_mlock2(&arguments);
        count_runtime_library_lock();
        return result;
    }
    /* MLOCK_ONFAULT locks lazily: PINSHIM_ONFAULT says what is registered. */
    return lock_through_engine(addr, len, (flags & MLOCK_ONFAULT) ? ENGINE_LOCK_ONFAULT : 0,
                               run_mlock2, &arguments, "mlock2");
}

PINSHIM_EXPORT int munlock(const void *addr, size_t len)
{
    ensure_resolved();
    if (reentry_guarded() || called_by_gpu_runtime(__builtin_return_address(0)))
        return real.munlock(addr, len);
    int saved_errno = errno;
    runtime_ensure_initialized();
    engine_count(&engine_stats(&runtime_engine)->unlock_calls);
    runtime_notice_gpu();
    errno = saved_errno;
    struct lock_call arguments = {addr, len, 0};
    struct engine_call call = {run_munlock, &arguments, "munlock"};
    /* ENOMEM: Linux unlocked up to the first hole; the rest is still locked. */
    reentry_guard_enter();
    int result = (int)engine_unlock(&runtime_engine, page_floor((uintptr_t)addr),
                                    range_end((uintptr_t)addr, len), RELEASE_MUNLOCK,
                                    ENGINE_FAILED_UNLOCKED_TO_HOLE, &call);
    reentry_guard_leave();
    return result;
}

PINSHIM_EXPORT int mlockall(int flags)
{
    ensure_resolved();
    int result = real.mlockall(flags);
    if (!reentry_guarded()) {
        int saved_errno = errno;
        runtime_ensure_initialized();
        runtime_note_mlockall(flags, result);
        errno = saved_errno;
    }
    return result;
}

PINSHIM_EXPORT int munlockall(void)
{
    ensure_resolved();
    if (reentry_guarded() || called_by_gpu_runtime(__builtin_return_address(0)))
        return real.munlockall();
    int saved_errno = errno;
    runtime_ensure_initialized();
    engine_count(&engine_stats(&runtime_engine)->unlock_calls);
    errno = saved_errno;
    struct engine_call call = {run_munlockall, NULL, "munlockall"};
    reentry_guard_enter();
    int result = (int)engine_unlock(&runtime_engine, 0, PAGE_INDEX_LIMIT, RELEASE_MUNLOCK,
                                    ENGINE_FAILED_CHANGED_NOTHING, &call);
    reentry_guard_leave();
    runtime_note_munlockall(result);
    return result;
}

/* ---- mappings ---- */

struct map_call {
    mmap_fn next;
    void *addr;
    size_t length;
    int prot, flags, fd;
    off_t offset;
};

static long run_mmap(void *arguments)
{
    struct map_call *call = arguments;
    return (long)call->next(call->addr, call->length, call->prot, call->flags, call->fd,
                            call->offset);
}

/* A new mapping is an object of its own: runs of locked pages never cross
 * its bounds (mapping_bounds.h). Returns result. */
static void *note_new_mapping(void *result, size_t length)
{
    if (result != MAP_FAILED && length != 0) {
        int saved_errno = errno;
        reentry_guard_enter();
        mapping_bounds_note_mapped(&runtime_mapping_bounds, (uintptr_t)result,
                                   range_end((uintptr_t)result, length));
        reentry_guard_leave();
        errno = saved_errno;
    }
    return result;
}

static void *mmap_common(mmap_fn next, const void *caller, void *addr, size_t length, int prot,
                         int flags, int fd, off_t offset)
{
    if (next == NULL) {
        long result = syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
        return result == -1 ? MAP_FAILED : (void *)result;
    }
    /* Before the fast path: a program initialising CUDA maps memory, which
     * is when ranges waiting for its context can go (one load otherwise). */
    runtime_notice_gpu();
    if (reentry_guarded())
        return next(addr, length, prot, flags, fd, offset);
    if (__builtin_expect(!(flags & (MAP_FIXED | MAP_LOCKED)), 1))
        return note_new_mapping(next(addr, length, prot, flags, fd, offset), length);
    if (called_by_gpu_runtime(caller)) {
        void *result = note_new_mapping(next(addr, length, prot, flags, fd, offset), length);
        if ((flags & MAP_LOCKED) && result != MAP_FAILED)
            count_runtime_library_lock();
        return result;
    }
    uintptr_t start = (uintptr_t)addr;
    bool replaces = (flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE) && length != 0 &&
                    start % runtime_page_size == 0;
    bool locks = (flags & MAP_LOCKED) != 0;
    int saved_errno = errno;
    if (locks) {
        runtime_ensure_initialized();
        choose_block_extent_source_once(length);
    }
    errno = saved_errno;
    struct map_call arguments = {next, addr, length, prot, flags, fd, offset};
    struct engine_call call = {run_mmap, &arguments, "mmap"};
    reentry_guard_enter();
    long result = engine_map(&runtime_engine, start, length, replaces, locks, &call);
    reentry_guard_leave();
    if (locks && result != -1)
        runtime_count_lock_call();
    return (void *)result;
}

PINSHIM_EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    ensure_resolved();
    return mmap_common(real.mmap, __builtin_return_address(0), addr, length, prot, flags, fd,
                       offset);
}

PINSHIM_EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    ensure_resolved();
    return mmap_common(real.mmap64 ? real.mmap64 : real.mmap, __builtin_return_address(0), addr,
                       length, prot, flags, fd, offset);
}

static long run_munmap(void *arguments)
{
    struct map_call *call = arguments;
    return real.munmap(call->addr, call->length);
}

PINSHIM_EXPORT int munmap(void *addr, size_t length)
{
    ensure_resolved();
    uintptr_t start = (uintptr_t)addr;
    if (reentry_guarded() || length == 0 || start % runtime_page_size != 0)
        return real.munmap(addr, length);
    runtime_notice_gpu();
    if (!engine_may_overlap(&runtime_engine, start, range_end(start, length)) ||
        called_by_gpu_runtime(__builtin_return_address(0))) {
        /* No page of it tracked (or the GPU runtime's own): the bounds go
         * before the call, so that a mapping placed there once it returns
         * keeps the marks it makes. Tracked pages' bounds go with the call,
         * inside the engine's operation on them. */
        int saved_errno = errno;
        reentry_guard_enter();
        mapping_bounds_note_unmapped(&runtime_mapping_bounds, start, range_end(start, length));
        reentry_guard_leave();
        errno = saved_errno;
        return real.munmap(addr, length);
    }
    struct map_call arguments = {.addr = addr, .length = length};
    struct engine_call call = {run_munmap, &arguments, "munmap"};
    reentry_guard_enter();
    int result = (int)engine_unlock(&runtime_engine, start, range_end(start, length),
                                    RELEASE_MUNMAP, ENGINE_FAILED_CHANGED_NOTHING, &call);
    reentry_guard_leave();
    return result;
}

/* mprotect, pkey_mprotect: memory registered READ_ONLY (it was read-only
 * when it was registered) that becomes writable is registered again without
 * READ_ONLY, so the device may write it as it may any writable locked
 * buffer. Taking protection away changes nothing: the registration stays
 * valid. One compare when nothing is registered there. */
struct protect_call {
    void *addr;
    size_t length;
    int prot, pkey;
    bool with_key;
};

static long run_mprotect(void *arguments)
{
    struct protect_call *call = arguments;
    if (call->with_key)
        return real.pkey_mprotect != NULL
                   ? real.pkey_mprotect(call->addr, call->length, call->prot, call->pkey)
                   : syscall(SYS_pkey_mprotect, call->addr, call->length, call->prot, call->pkey);
    if (real.mprotect == NULL) /* while the real functions are being resolved */
        return syscall(SYS_mprotect, call->addr, call->length, call->prot);
    return real.mprotect(call->addr, call->length, call->prot);
}

static int protect_common(struct protect_call *arguments, const void *caller)
{
    uintptr_t start = (uintptr_t)arguments->addr;
    if (!(arguments->prot & (PROT_READ | PROT_WRITE)) || reentry_guarded() ||
        arguments->length == 0 || start % runtime_page_size != 0 ||
        !engine_may_overlap(&runtime_engine, start, range_end(start, arguments->length)) ||
        called_by_gpu_runtime(caller))
        return (int)run_mprotect(arguments);
    struct engine_call call = {run_mprotect, arguments, "mprotect"};
    reentry_guard_enter();
    int result = (int)engine_protect(&runtime_engine, start, range_end(start, arguments->length),
                                     (arguments->prot & PROT_WRITE) != 0, &call);
    reentry_guard_leave();
    return result;
}

PINSHIM_EXPORT int mprotect(void *addr, size_t len, int prot)
{
    ensure_resolved();
    struct protect_call arguments = {addr, len, prot, 0, false};
    return protect_common(&arguments, __builtin_return_address(0));
}

PINSHIM_EXPORT int pkey_mprotect(void *addr, size_t len, int prot, int pkey)
{
    ensure_resolved();
    struct protect_call arguments = {addr, len, prot, pkey, true};
    return protect_common(&arguments, __builtin_return_address(0));
}

struct remap_call {
    void *old_address;
    size_t old_size, new_size;
    int flags;
    void *new_address;
};

/* The real mremap, the mappings' bounds moved with it: the marks' lock is
 * held around the call (mapping_bounds.h), and never with the engine's
 * mutex wanted (the engine runs this with its mutex dropped, and takes the
 * marks' lock only with its mutex held: one order). */
static long run_mremap(void *arguments)
{
    struct remap_call *call = arguments;
    struct mapping_bounds_remap bounds;
    int saved_errno = errno;
    mapping_bounds_remap_begin(&runtime_mapping_bounds, &bounds, (uintptr_t)call->old_address,
                               call->old_size, runtime_page_size);
    errno = saved_errno;
    long result = (long)real.mremap(call->old_address, call->old_size, call->new_size, call->flags,
                                    call->new_address);
    saved_errno = errno;
    mapping_bounds_remap_end(&runtime_mapping_bounds, &bounds, result, call->new_size, call->flags,
                             runtime_page_size);
    errno = saved_errno;
    return result;
}

PINSHIM_EXPORT void *mremap(void *old_address, size_t old_size, size_t new_size, int flags, ...)
{
    ensure_resolved();
    void *new_address = NULL;
    if (flags & MREMAP_FIXED) {
        va_list args;
        va_start(args, flags);
        new_address = va_arg(args, void *);
        va_end(args);
    }
    if (reentry_guarded())
        return real.mremap(old_address, old_size, new_size, flags, new_address);
    struct remap_call arguments = {old_address, old_size, new_size, flags, new_address};
    if (called_by_gpu_runtime(__builtin_return_address(0))) {
        reentry_guard_enter();
        void *result = (void *)run_mremap(&arguments);
        reentry_guard_leave();
        return result;
    }
    runtime_notice_gpu();
    struct engine_call call = {run_mremap, &arguments, "mremap"};
    reentry_guard_enter();
    long result = engine_remap(&runtime_engine, (uintptr_t)old_address, old_size, new_size, flags,
                               (uintptr_t)new_address, &call);
    reentry_guard_leave();
    return (void *)result;
}

/* ---- the program's own registrations: what the vendors' files share ---- */

/* name in the object file (a path or soname) if the process has loaded it,
 * else NULL; loads nothing. */
static void *symbol_of_loaded(const char *file, const char *name)
{
    void *handle = dlopen(file, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL)
        return NULL;
    void *symbol = dlsym(handle, name);
    dlclose(handle); /* drops the reference NOLOAD took */
    return symbol;
}

void *interpose_next_symbol(const char *name, const void *own, const void *caller,
                            const char *const *sonames)
{
    static pthread_mutex_t cache_mutex = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        const char *name;
        void *base, *symbol;
    } cache[8];
    Dl_info info = {0};
    bool have_caller = dladdr(caller, &info) != 0 && info.dli_fname != NULL;
    pthread_mutex_lock(&cache_mutex);
    for (unsigned i = 0; i < 8; i++)
        if (cache[i].name == name && cache[i].base == info.dli_fbase && cache[i].symbol != NULL) {
            void *symbol = cache[i].symbol;
            pthread_mutex_unlock(&cache_mutex);
            return symbol;
        }
    pthread_mutex_unlock(&cache_mutex);
    reentry_guard_enter();
    void *symbol = dlsym(RTLD_NEXT, name);
    if ((symbol == NULL || symbol == own) && have_caller)
        symbol = symbol_of_loaded(info.dli_fname, name);
    for (int i = 0; (symbol == NULL || symbol == own) && sonames[i] != NULL; i++)
        symbol = symbol_of_loaded(sonames[i], name);
    reentry_guard_leave();
    if (symbol == own)
        symbol = NULL;
    if (symbol != NULL) {
        static unsigned cache_next;
        pthread_mutex_lock(&cache_mutex);
        unsigned slot = cache_next++ % 8;
        cache[slot].name = name;
        cache[slot].base = info.dli_fbase;
        cache[slot].symbol = symbol;
        pthread_mutex_unlock(&cache_mutex);
    }
    return symbol;
}

/* ---- _exit ---- */

/* Python's multiprocessing workers, stress-ng's and many daemons' children
 * end with _exit: no exit handlers, no destructors, so without this they
 * would write no statistics. */
__attribute__((noreturn)) static void exit_now(int status)
{
    ensure_resolved();
    runtime_before_immediate_exit();
    if (real.exit_now != NULL)
        real.exit_now(status);
    for (;;)
        syscall(SYS_exit_group, status);
}

PINSHIM_EXPORT void _exit(int status)
{
    exit_now(status);
}

PINSHIM_EXPORT void _Exit(int status)
{
    exit_now(status);
}
