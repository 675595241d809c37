/* The interposition layer: the exported libc entry points. Each resolves the
 * real function, steps aside while the shim is inside the CUDA runtime, keeps
 * the real call's return value and errno, and hands the bookkeeping to the
 * engine. Nothing else lives here. */
/* Define mmap and mmap64 as two symbols: no off_t redirection here. */
#undef _FILE_OFFSET_BITS

#include "block_extent.h"
#include "log.h"
#include "memory_map.h"
#include "runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
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
typedef size_t (*usable_size_fn)(void *);
typedef int (*mlock_fn)(const void *, size_t);
typedef int (*mlock2_fn)(const void *, size_t, unsigned int);
typedef int (*munlock_fn)(const void *, size_t);
typedef int (*mlockall_fn)(int);
typedef int (*munlockall_fn)(void);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void *, size_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);

/* glibc's own entry points, used only while the real ones are being resolved
 * (dlsym can allocate and free). */
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static void bootstrap_free(void *ptr);
static size_t bootstrap_usable_size(void *ptr);

static struct {
    free_fn free;
    realloc_fn realloc;
    reallocarray_fn reallocarray;
    posix_memalign_fn posix_memalign;
    usable_size_fn malloc_usable_size;
    mlock_fn mlock;
    mlock2_fn mlock2;
    munlock_fn munlock;
    mlockall_fn mlockall;
    munlockall_fn munlockall;
    mmap_fn mmap;
    mmap_fn mmap64;
    munmap_fn munmap;
    mremap_fn mremap;
} real = {.free = bootstrap_free, .malloc_usable_size = bootstrap_usable_size};

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
    real.realloc = (realloc_fn)next_symbol("realloc");
    real.reallocarray = (reallocarray_fn)next_symbol("reallocarray");
    real.posix_memalign = (posix_memalign_fn)next_symbol("posix_memalign");
    real.mlock = (mlock_fn)next_symbol("mlock");
    real.mlock2 = (mlock2_fn)next_symbol("mlock2");
    real.munlock = (munlock_fn)next_symbol("munlock");
    real.mlockall = (mlockall_fn)next_symbol("mlockall");
    real.munlockall = (munlockall_fn)next_symbol("munlockall");
    real.mmap = (mmap_fn)next_symbol("mmap");
    real.mmap64 = (mmap_fn)next_symbol("mmap64");
    real.munmap = (munmap_fn)next_symbol("munmap");
    real.mremap = (mremap_fn)next_symbol("mremap");
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

static inline free_fn real_free(void)
{
    return __atomic_load_n(&real.free, __ATOMIC_ACQUIRE);
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

/* Whether every page of [start, end) is mapped: msync(MS_ASYNC) checks the
 * mapping and, since Linux 2.6.19, does nothing else. */
static bool range_is_mapped(uintptr_t start, uintptr_t end)
{
    return start >= end || syscall(SYS_msync, start, end - start, MS_ASYNC) == 0;
}

/* The first unmapped page in [start, end), or end. Linux applies munlock up to
 * the first hole and then fails with ENOMEM. */
static uintptr_t first_unmapped_page(uintptr_t start, uintptr_t end)
{
    int saved_errno = errno;
    uintptr_t result = end;
    if (!range_is_mapped(start, end)) {
        /* Binary search on the length of the fully mapped prefix. */
        uintptr_t mapped_pages = 0, total_pages = (end - start) / runtime_page_size;
        while (total_pages - mapped_pages > 1) {
            uintptr_t middle = mapped_pages + (total_pages - mapped_pages) / 2;
            if (range_is_mapped(start, start + middle * runtime_page_size))
                mapped_pages = middle;
            else
                total_pages = middle;
        }
        result = start + mapped_pages * runtime_page_size;
    }
    errno = saved_errno;
    return result;
}

/* Puts back the ticket's pieces that are still mapped (after a failed replace). */
static void restore_mapped_pieces(struct engine_ticket *ticket)
{
    for (struct engine_ticket_piece *piece = ticket->head; piece != NULL; piece = piece->next)
        if (range_is_mapped(piece->start, piece->end))
            engine_register_pages(&runtime_engine, piece->start, piece->end);
    engine_ticket_discard(&runtime_engine, ticket);
}

/* Unregisters what overlaps [start, end) before a call that unlocks or releases
 * it, keeping the caller's errno for the real call. */
static void release_before(uintptr_t start, uintptr_t end, enum release_reason reason,
                           struct engine_ticket *ticket)
{
    int saved_errno = errno;
    engine_release(&runtime_engine, start, end, reason, ticket);
    errno = saved_errno;
}

/* After the real call: when it failed, registers again what it left locked
 * (from still_locked_from on); either way keeps the call's errno. */
static void settle_after(struct engine_ticket *ticket, bool failed, uintptr_t still_locked_from)
{
    int saved_errno = errno;
    if (failed)
        engine_restore(&runtime_engine, ticket, still_locked_from, UINTPTR_MAX);
    else
        engine_ticket_discard(&runtime_engine, ticket);
    errno = saved_errno;
}

/* ---- allocation ---- */

/* Whether the checks allowed glibc's chunk header as the source of block ends. */
static inline bool block_ends_from_header(void)
{
    return __builtin_expect(__atomic_load_n(&runtime_block_extent_source, __ATOMIC_RELAXED) ==
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

/* Releases the registrations overlapping the block's pages, rounded outward. */
__attribute__((noinline, cold)) static void release_block(uintptr_t start, uintptr_t end,
                                                          enum release_reason reason,
                                                          struct engine_ticket *ticket)
{
    release_before(page_floor(start), page_ceil(end), reason, ticket);
}

__attribute__((noinline)) static void free_with_registrations(void *ptr)
{
    uintptr_t start, end;
    if (block_may_hold_registration(ptr, &start, &end) && !runtime_guarded())
        release_block(start, end, RELEASE_FREE, NULL);
    real_free()(ptr);
}

/* With registrations. A block above every registration is cleared by one
 * load; on glibc's allocator the chunk header, the span's start and one word
 * of the bitmap clear nearly every other block, with no call and no stack
 * frame. The rest (the allocator's size needed, a block over two bitmap
 * words, or one holding a registered page) goes on to the full check. */
__attribute__((noinline)) static void free_while_registered(void *ptr)
{
    uintptr_t start = (uintptr_t)ptr;
    if (start >= __atomic_load_n(&runtime_engine.span_end, __ATOMIC_RELAXED)) {
        real_free()(ptr);
        return;
    }
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

PINSHIM_EXPORT void free(void *ptr)
{
    /* The hot path: one load decides that no registration can be involved;
     * both ways end in a tail call, so free keeps no stack frame. */
    if (__builtin_expect(!engine_has_registrations(&runtime_engine), 1) || ptr == NULL) {
        real_free()(ptr);
        return;
    }
    free_while_registered(ptr);
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
    if (ptr == NULL || overflow || runtime_guarded() ||
        !engine_has_registrations(&runtime_engine)) {
        if (is_array)
            return real.reallocarray
                       ? real.reallocarray(ptr, nmemb, size)
                       : (overflow ? (errno = ENOMEM, NULL) : real.realloc(ptr, total));
        return real.realloc(ptr, size);
    }
    struct engine_ticket ticket = {0};
    /* realloc(p, 0) frees p: nothing to put back afterwards. */
    uintptr_t start, end;
    if (block_may_hold_registration(ptr, &start, &end))
        release_block(start, end, RELEASE_REALLOC, total == 0 ? NULL : &ticket);
    void *result = is_array && real.reallocarray ? real.reallocarray(ptr, nmemb, size)
                                                 : real.realloc(ptr, total);
    /* A failed realloc leaves the block untouched and its pages locked. */
    settle_after(&ticket, result == NULL && total != 0, 0);
    return result;
}

PINSHIM_EXPORT void *realloc(void *ptr, size_t size)
{
    return realloc_common(ptr, 1, size, false);
}

PINSHIM_EXPORT void *reallocarray(void *ptr, size_t nmemb, size_t size)
{
    return realloc_common(ptr, nmemb, size, true);
}

PINSHIM_EXPORT int posix_memalign(void **memptr, size_t alignment, size_t size)
{
    ensure_resolved();
    if (resolving || real.posix_memalign == NULL) {
        void *memory = __libc_memalign(alignment, size);
        if (memory == NULL)
            return ENOMEM;
        *memptr = memory;
        return 0;
    }
    if (size < RUNTIME_SMALLEST_ROUNDING_THRESHOLD || runtime_guarded())
        return real.posix_memalign(memptr, alignment, size);
    /* Large buffers get whole pages so a later lock shares no page with a
     * neighbour. Invalid alignments pass unchanged so the real call rejects them. */
    bool valid_alignment =
        alignment != 0 && (alignment & (alignment - 1)) == 0 && alignment % sizeof(void *) == 0;
    if (valid_alignment && size >= runtime_rounding_threshold()) {
        size_t page = runtime_page_size;
        size_t rounded = (size + page - 1) & ~(page - 1);
        if (rounded >= size)
            return real.posix_memalign(memptr, alignment < page ? page : alignment, rounded);
    }
    return real.posix_memalign(memptr, alignment, size);
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
        real.posix_memalign == NULL || real.malloc_usable_size == bootstrap_usable_size ||
        real.free == bootstrap_free) {
        __atomic_store_n(&runtime_block_extent_source, BLOCK_EXTENT_ALLOCATOR_CALL,
                         __ATOMIC_RELAXED);
        log_debug("free finds block ends with malloc_usable_size (%s)",
                  runtime_config.block_size_from_allocator ? "PINSHIM_BLOCK_SIZE=allocator"
                  : runtime_future_mappings_locked()       ? "mlockall(MCL_FUTURE) is in effect"
                                                           : "the allocator is not resolved");
        return;
    }
    struct block_extent_allocator allocator = {
        .malloc = malloc,
        .posix_memalign = real.posix_memalign,
        .free = real.free,
        .usable_size = real.malloc_usable_size,
    };
    runtime_guard_enter();
    enum block_extent_source source = block_extent_choose(&allocator);
    runtime_guard_leave();
    __atomic_store_n(&runtime_block_extent_source, (int)source, __ATOMIC_RELAXED);
    log_debug("free finds block ends with %s", block_extent_source_name(source));
}

/* Once (runtime_block_extent_state). Other threads never wait for the
 * chooser: they keep the allocator's answer meanwhile. */
static void choose_block_extent_source_once(size_t length)
{
    if (__builtin_expect(__atomic_load_n(&runtime_block_extent_state, __ATOMIC_ACQUIRE) == 2, 1) ||
        length < runtime_config.min_bytes)
        return;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&runtime_block_extent_state, &expected, 1, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    choose_block_extent_source();
    __atomic_store_n(&runtime_block_extent_state, 2, __ATOMIC_RELEASE);
}

/* ---- locking ---- */

static void after_successful_lock(const void *addr, size_t length, uint64_t unlocks_before)
{
    int saved_errno = errno;
    runtime_ensure_initialized();
    engine_count(&runtime_engine.lock_calls);
    choose_block_extent_source_once(length);
    engine_after_lock(&runtime_engine, (uintptr_t)addr, length, unlocks_before);
    errno = saved_errno;
}

PINSHIM_EXPORT int mlock(const void *addr, size_t len)
{
    ensure_resolved();
    uint64_t unlocks_before = engine_unlock_sequence(&runtime_engine);
    int result = real.mlock(addr, len);
    if (result == 0 && !runtime_guarded())
        after_successful_lock(addr, len, unlocks_before);
    return result;
}

PINSHIM_EXPORT int mlock2(const void *addr, size_t len, unsigned int flags)
{
    ensure_resolved();
    uint64_t unlocks_before = engine_unlock_sequence(&runtime_engine);
    int result;
    if (real.mlock2 != NULL) {
        result = real.mlock2(addr, len, flags);
    } else {
        result = (int)syscall(SYS_mlock2, addr, len, flags);
    }
    /* MLOCK_ONFAULT locks lazily; registering faults the pages in, which the
     * program asked to keep resident anyway. */
    if (result == 0 && !runtime_guarded())
        after_successful_lock(addr, len, unlocks_before);
    return result;
}

PINSHIM_EXPORT int munlock(const void *addr, size_t len)
{
    ensure_resolved();
    if (runtime_guarded())
        return real.munlock(addr, len);
    engine_count(&runtime_engine.unlock_calls);
    uintptr_t start = page_floor((uintptr_t)addr);
    uintptr_t end = range_end((uintptr_t)addr, len);
    runtime_ensure_initialized();
    int unlock_token = engine_begin_unlock(&runtime_engine, start, end);
    int result;
    if (!engine_may_overlap(&runtime_engine, start, end)) {
        result = real.munlock(addr, len);
    } else {
        struct engine_ticket ticket = {0};
        release_before(start, end, RELEASE_MUNLOCK, &ticket);
        result = real.munlock(addr, len);
        /* ENOMEM: Linux unlocked up to the first hole; the rest is still locked. */
        settle_after(&ticket, result != 0,
                     result != 0 && errno == ENOMEM ? first_unmapped_page(start, end) : start);
    }
    int saved_errno = errno;
    engine_end_unlock(&runtime_engine, unlock_token, start, end);
    errno = saved_errno;
    return result;
}

PINSHIM_EXPORT int mlockall(int flags)
{
    ensure_resolved();
    int result = real.mlockall(flags);
    if (!runtime_guarded()) {
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
    if (runtime_guarded())
        return real.munlockall();
    engine_count(&runtime_engine.unlock_calls);
    runtime_ensure_initialized();
    int unlock_token = engine_begin_unlock(&runtime_engine, 0, PAGE_INDEX_LIMIT);
    struct engine_ticket ticket = {0};
    release_before(0, PAGE_INDEX_LIMIT, RELEASE_MUNLOCK, &ticket);
    int result = real.munlockall();
    runtime_note_munlockall(result);
    settle_after(&ticket, result != 0, 0);
    int saved_errno = errno;
    engine_end_unlock(&runtime_engine, unlock_token, 0, PAGE_INDEX_LIMIT);
    errno = saved_errno;
    return result;
}

/* ---- mappings ---- */

static void *mmap_common(mmap_fn next, void *addr, size_t length, int prot, int flags, int fd,
                         off_t offset)
{
    if (next == NULL) {
        long result = syscall(SYS_mmap, addr, length, prot, flags, fd, offset);
        return result == -1 ? MAP_FAILED : (void *)result;
    }
    if (__builtin_expect(!(flags & (MAP_FIXED | MAP_LOCKED)), 1) || runtime_guarded())
        return next(addr, length, prot, flags, fd, offset);

    uint64_t unlocks_before = engine_unlock_sequence(&runtime_engine);
    struct engine_ticket ticket = {0};
    uintptr_t start = (uintptr_t)addr;
    bool replaces = (flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE) && length != 0 &&
                    start % runtime_page_size == 0;
    if (replaces && engine_may_overlap(&runtime_engine, start, range_end(start, length)))
        release_before(start, range_end(start, length), RELEASE_MMAP_FIXED, &ticket);
    void *result = next(addr, length, prot, flags, fd, offset);
    int saved_errno = errno;
    if (result == MAP_FAILED)
        restore_mapped_pieces(&ticket);
    else
        engine_ticket_discard(&runtime_engine, &ticket);
    if (result != MAP_FAILED && (flags & MAP_LOCKED))
        after_successful_lock(result, length, unlocks_before);
    errno = saved_errno;
    return result;
}

PINSHIM_EXPORT void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    ensure_resolved();
    return mmap_common(real.mmap, addr, length, prot, flags, fd, offset);
}

PINSHIM_EXPORT void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    ensure_resolved();
    return mmap_common(real.mmap64 ? real.mmap64 : real.mmap, addr, length, prot, flags, fd,
                       offset);
}

PINSHIM_EXPORT int munmap(void *addr, size_t length)
{
    ensure_resolved();
    uintptr_t start = (uintptr_t)addr;
    if (runtime_guarded() || length == 0 || start % runtime_page_size != 0 ||
        !engine_may_overlap(&runtime_engine, start, range_end(start, length)))
        return real.munmap(addr, length);
    struct engine_ticket ticket = {0};
    release_before(start, range_end(start, length), RELEASE_MUNMAP, &ticket);
    int result = real.munmap(addr, length);
    settle_after(&ticket, result != 0, 0);
    return result;
}

/* Registers at new_start what was registered in the old range: a moved or
 * resized locked mapping stays locked (Linux carries VM_LOCKED with the VMA). */
static void register_moved_pieces(struct engine_ticket *ticket, uintptr_t old_start,
                                  uintptr_t old_end, uintptr_t new_start, size_t new_size)
{
    uintptr_t new_end = range_end(new_start, new_size);
    for (struct engine_ticket_piece *piece = ticket->head; piece != NULL; piece = piece->next) {
        if (piece->end <= old_start || piece->start >= old_end)
            continue; /* released with the old mapping, not moved */
        uintptr_t from = piece->start > old_start ? piece->start : old_start;
        uintptr_t to = piece->end < old_end ? piece->end : old_end;
        uintptr_t start = new_start + (from - old_start);
        uintptr_t end = new_start + (to - old_start);
        /* Growth of a locked mapping is locked too: one registration covers both. */
        if (to == old_end || end > new_end)
            end = new_end;
        if (start < end)
            engine_register_pages(&runtime_engine, start, end);
    }
}

static void register_locked_part(void *context, uintptr_t start, uintptr_t end)
{
    (void)context;
    engine_register_pages(&runtime_engine, start, end);
}

/* Registers the parts of [start, end) that the kernel holds locked. */
static void register_where_locked(uintptr_t start, uintptr_t end)
{
    if (start < end)
        memory_map_locked_parts(start, end, register_locked_part, NULL);
}

/* MREMAP_DONTUNMAP changes locks beyond the moved range: Linux clears the lock
 * of every mapping the old range touches and of a mapping the moved range
 * merges into, and MREMAP_FIXED first cuts the target out of its mapping. The
 * call is rare, so the shim releases the registrations of the whole mappings
 * around the old range, lets the call run, and registers again -- at the old
 * place, and moved to the new one -- only what /proc/self/smaps says is still
 * locked (each case found by the model-based test). */
static void *mremap_dontunmap(void *old_address, size_t old_size, size_t new_size, int flags,
                              void *new_address)
{
    uintptr_t old_start = (uintptr_t)old_address;
    uintptr_t old_end = range_end(old_start, old_size);
    uintptr_t span_start = old_start, span_end = old_end, low, high;
    if (memory_map_find(old_start, &low, &high))
        span_start = low;
    if (memory_map_find(old_end - 1, &low, &high))
        span_end = high;
    struct engine_ticket released = {0}, replaced = {0};
    release_before(span_start < old_start ? span_start : old_start,
                   span_end > old_end ? span_end : old_end, RELEASE_MREMAP, &released);
    if (flags & MREMAP_FIXED)
        release_before((uintptr_t)new_address, range_end((uintptr_t)new_address, new_size),
                       RELEASE_MREMAP, &replaced);
    void *result = real.mremap(old_address, old_size, new_size, flags, new_address);
    int saved_errno = errno;
    bool failed = result == MAP_FAILED;
    /* After success the target holds the moved pages, not what was registered there. */
    uintptr_t target_start = 0, target_end = 0;
    if (!failed && (flags & MREMAP_FIXED)) {
        target_start = (uintptr_t)result;
        target_end = range_end(target_start, new_size);
    }
    for (struct engine_ticket_piece *piece = released.head; piece != NULL; piece = piece->next) {
        register_where_locked(piece->start, piece->end < target_start ? piece->end : target_start);
        register_where_locked(piece->start > target_end ? piece->start : target_end, piece->end);
        if (failed || piece->end <= old_start || piece->start >= old_end)
            continue;
        uintptr_t from = piece->start > old_start ? piece->start : old_start;
        uintptr_t to = piece->end < old_end ? piece->end : old_end;
        register_where_locked((uintptr_t)result + (from - old_start),
                              (uintptr_t)result + (to - old_start));
    }
    /* A failed call changed nothing: what was registered at the target stays. */
    for (struct engine_ticket_piece *piece = replaced.head; failed && piece != NULL;
         piece = piece->next)
        register_where_locked(piece->start, piece->end);
    engine_ticket_discard(&runtime_engine, &released);
    engine_ticket_discard(&runtime_engine, &replaced);
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
    uintptr_t old_start = (uintptr_t)old_address;
    uintptr_t old_end = range_end(old_start, old_size);
    bool involved = !runtime_guarded() && old_start % runtime_page_size == 0 &&
                    (engine_may_overlap(&runtime_engine, old_start, old_end) ||
                     ((flags & MREMAP_DONTUNMAP) && engine_has_registrations(&runtime_engine)) ||
                     ((flags & MREMAP_FIXED) &&
                      engine_may_overlap(&runtime_engine, (uintptr_t)new_address,
                                         range_end((uintptr_t)new_address, new_size))));
    if (!involved)
        return real.mremap(old_address, old_size, new_size, flags, new_address);

    if ((flags & MREMAP_DONTUNMAP) && old_size != 0)
        return mremap_dontunmap(old_address, old_size, new_size, flags, new_address);

    struct engine_ticket moved = {0}, replaced = {0};
    if (old_size != 0)
        release_before(old_start, old_end, RELEASE_MREMAP, &moved);
    if (flags & MREMAP_FIXED)
        release_before((uintptr_t)new_address, range_end((uintptr_t)new_address, new_size),
                       RELEASE_MREMAP, &replaced);
    void *result = real.mremap(old_address, old_size, new_size, flags, new_address);
    int saved_errno = errno;
    if (result == MAP_FAILED) {
        engine_restore(&runtime_engine, &moved, 0, UINTPTR_MAX);
        restore_mapped_pieces(&replaced);
    } else {
        register_moved_pieces(&moved, old_start, old_end, (uintptr_t)result, new_size);
        engine_ticket_discard(&runtime_engine, &moved);
        engine_ticket_discard(&runtime_engine, &replaced);
    }
    errno = saved_errno;
    return result;
}
