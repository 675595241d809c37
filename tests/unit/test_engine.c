/* The engine driven through a scripted backend, without LD_PRELOAD: the
 * backend keeps CUDA's rules (overlap refused with 712, unregister only by the
 * registered base) and records what it was asked; the "real calls" are
 * scripted too (succeed, fail with an errno, or wait for the test). */
#include "engine.h"
#include "log.h"
#include "mock_codes.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE ((uintptr_t)4096)
#define MAX_RANGES 4096

struct mock_range {
    uintptr_t base, length;
    int device;
    bool foreign; /* registered "by the program", not the engine */
};

static struct {
    pthread_mutex_t mutex;
    pthread_cond_t changed;
    struct mock_range ranges[MAX_RANGES];
    size_t count;
    unsigned register_calls, unregister_calls;
    unsigned fail_register_every, fail_unregister_every;
    int fail_error;
    enum engine_choice choice; /* what choose_place answers */
    int device;                /* the device it names */
    unsigned overlap_violations;
    useconds_t register_delay;
    bool count_only; /* many-range tests: keep a count, not the ranges */
    long live_count;
    unsigned wakes;       /* wake_worker calls */
    bool hold_unregister; /* unregister waits until released */
    bool unregister_waiting;
    /* kernel views for locked_parts / resident_parts: [start, end) pairs */
    uintptr_t locked[8][2], resident[8][2];
    size_t locked_count, resident_count;
    uint64_t locked_parts_calls;
    uintptr_t unmapped_from;     /* is_mapped: false for ranges reaching it (0: all mapped) */
    uint64_t max_register_bytes; /* larger registrations fail with 2 (0: no limit) */
    /* mapping_kinds: [start, end, kind] triples; none: every page writable */
    uintptr_t kinds[8][3];
    size_t kinds_count;
} mock = {.mutex = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static enum engine_choice mock_choose_place(void *context, bool from_worker,
                                            const struct range_place *hint,
                                            struct range_place *place)
{
    (void)context;
    (void)from_worker;
    pthread_mutex_lock(&mock.mutex);
    enum engine_choice choice = mock.choice;
    *place = (struct range_place){.device = -1};
    if (choice == ENGINE_PLACE_READY)
        place->device = hint != NULL && hint->device >= 0 ? hint->device : mock.device;
    pthread_mutex_unlock(&mock.mutex);
    return choice;
}

static int mock_register_code(void *context, struct range_place *place, void *base, size_t length)
{
    (void)context;
    if (mock.register_delay)
        usleep(mock.register_delay);
    pthread_mutex_lock(&mock.mutex);
    int result = 0;
    mock.register_calls++;
    if (mock.count_only) {
        bool refused = mock.max_register_bytes != 0 && length > mock.max_register_bytes;
        if (!refused)
            mock.live_count++;
        pthread_mutex_unlock(&mock.mutex);
        return refused ? 2 : 0;
    }
    uintptr_t start = (uintptr_t)base, end = start + length;
    if (mock.fail_register_every && mock.register_calls % mock.fail_register_every == 0) {
        result = mock.fail_error;
        goto out;
    }
    if (mock.max_register_bytes != 0 && length > mock.max_register_bytes) {
        result = 2; /* R580 drivers refuse 512 GiB and more: out of memory */
        goto out;
    }
    for (size_t i = 0; i < mock.count; i++) {
        struct mock_range *r = &mock.ranges[i];
        if (start < r->base + r->length && r->base < end) {
            if (!r->foreign)
                mock.overlap_violations++;
            result = MOCK_ALREADY_REGISTERED;
            goto out;
        }
    }
    cr_assert_lt(mock.count, MAX_RANGES);
    mock.ranges[mock.count++] = (struct mock_range){start, length, place->device, false};
out:
    pthread_mutex_unlock(&mock.mutex);
    return result;
}

static struct engine_result mock_register(void *context, struct range_place *place, void *base,
                                          size_t length)
{
    return mock_result(mock_register_code(context, place, base, length));
}

static int mock_unregister_code(void *context, const struct range_place *place, void *base)
{
    (void)context;
    (void)place;
    pthread_mutex_lock(&mock.mutex);
    while (mock.hold_unregister) {
        mock.unregister_waiting = true;
        pthread_cond_broadcast(&mock.changed);
        pthread_cond_wait(&mock.changed, &mock.mutex);
    }
    int result = MOCK_NOT_REGISTERED;
    __atomic_fetch_add(&mock.unregister_calls, 1, __ATOMIC_RELEASE);
    if (mock.count_only) {
        mock.live_count--;
        pthread_mutex_unlock(&mock.mutex);
        return 0;
    }
    if (mock.fail_unregister_every && mock.unregister_calls % mock.fail_unregister_every == 0) {
        result = mock.fail_error;
        goto out;
    }
    for (size_t i = 0; i < mock.count; i++) {
        struct mock_range *r = &mock.ranges[i];
        if (r->base == (uintptr_t)base) {
            cr_assert_not(r->foreign, "the engine unregistered a range it did not register");
            mock.ranges[i] = mock.ranges[--mock.count];
            result = 0;
            goto out;
        }
        if ((uintptr_t)base > r->base && (uintptr_t)base < r->base + r->length) {
            result = 1; /* interior pointer: cudaErrorInvalidValue */
            goto out;
        }
    }
out:
    pthread_mutex_unlock(&mock.mutex);
    return result;
}

static struct engine_result mock_unregister(void *context, const struct range_place *place,
                                            void *base, size_t length)
{
    (void)length;
    return mock_result(mock_unregister_code(context, place, base));
}

static const char *mock_error_name(void *context, int error)
{
    (void)context;
    return error == 2 ? "cudaErrorMemoryAllocation" : NULL;
}

static bool report_parts(uintptr_t (*parts)[2], size_t count, uintptr_t start, uintptr_t end,
                         void (*found)(void *, uintptr_t, uintptr_t), void *found_context)
{
    for (size_t i = 0; i < count; i++) {
        uintptr_t from = parts[i][0] > start ? parts[i][0] : start;
        uintptr_t to = parts[i][1] < end ? parts[i][1] : end;
        if (from < to)
            found(found_context, from, to);
    }
    return true;
}

static bool mock_locked_parts(void *context, uintptr_t start, uintptr_t end,
                              void (*found)(void *, uintptr_t, uintptr_t), void *found_context)
{
    (void)context;
    __atomic_fetch_add(&mock.locked_parts_calls, 1, __ATOMIC_RELAXED);
    return report_parts(mock.locked, mock.locked_count, start, end, found, found_context);
}

static bool mock_resident_parts(void *context, uintptr_t start, uintptr_t end,
                                void (*found)(void *, uintptr_t, uintptr_t), void *found_context)
{
    (void)context;
    return report_parts(mock.resident, mock.resident_count, start, end, found, found_context);
}

static bool mock_is_mapped(void *context, uintptr_t start, uintptr_t end)
{
    (void)context;
    (void)start;
    return mock.unmapped_from == 0 || end <= mock.unmapped_from;
}

static bool mock_mapping_kinds(void *context, uintptr_t start, uintptr_t end,
                               void (*found)(void *, uintptr_t, uintptr_t,
                                             enum engine_mapping_kind),
                               void *found_context)
{
    (void)context;
    uintptr_t cursor = start;
    for (size_t i = 0; i < mock.kinds_count && cursor < end; i++) {
        uintptr_t from = mock.kinds[i][0] > cursor ? mock.kinds[i][0] : cursor;
        uintptr_t to = mock.kinds[i][1] < end ? mock.kinds[i][1] : end;
        if (from >= to)
            continue;
        if (from > cursor)
            found(found_context, cursor, from, ENGINE_MAPPING_WRITABLE);
        found(found_context, from, to, (enum engine_mapping_kind)mock.kinds[i][2]);
        cursor = to;
    }
    if (cursor < end)
        found(found_context, cursor, end, ENGINE_MAPPING_WRITABLE);
    return true;
}

static bool mock_read_only_supported(void *context, const struct range_place *place)
{
    (void)context;
    (void)place;
    return true;
}

static void mock_wake_worker(void *context)
{
    (void)context;
    __atomic_fetch_add(&mock.wakes, 1, __ATOMIC_RELAXED);
}

static const struct engine_backend mock_backend = {
    .choose_place = mock_choose_place,
    .register_range = mock_register,
    .unregister_range = mock_unregister,
    .error_name = mock_error_name,
    .locked_parts = mock_locked_parts,
    .resident_parts = mock_resident_parts,
    .is_mapped = mock_is_mapped,
    .wake_worker = mock_wake_worker,
    .mapping_kinds = mock_mapping_kinds,
    .read_only_supported = mock_read_only_supported,
};

static struct engine engine;
static char *arena; /* addresses only: the mock never touches memory */

static struct engine_options options(bool asynchronous, uint64_t max_registration)
{
    return (struct engine_options){.min_bytes = 64 * 1024,
                                   .max_registration_bytes = max_registration,
                                   .asynchronous = asynchronous,
                                   .onfault = ENGINE_ONFAULT_RESIDENT,
                                   .page_size = PAGE};
}

static void restart_engine(struct engine_options wanted)
{
    engine_destroy(&engine);
    cr_assert(engine_init(&engine, &mock_backend, &wanted));
}

static void setup(void)
{
    pthread_mutex_lock(&mock.mutex);
    mock.count = 0;
    mock.register_calls = mock.unregister_calls = 0;
    mock.fail_register_every = mock.fail_unregister_every = 0;
    mock.fail_error = 2;
    mock.choice = ENGINE_PLACE_READY;
    mock.device = 0;
    mock.overlap_violations = 0;
    mock.register_delay = 0;
    mock.count_only = false;
    mock.live_count = 0;
    mock.wakes = 0;
    mock.hold_unregister = false;
    mock.unregister_waiting = false;
    mock.locked_count = mock.resident_count = 0;
    mock.unmapped_from = 0;
    mock.max_register_bytes = 0;
    mock.kinds_count = 0;
    pthread_mutex_unlock(&mock.mutex);
    struct engine_options wanted = options(false, 0);
    cr_assert(engine_init(&engine, &mock_backend, &wanted));
    arena = (char *)(uintptr_t)0x7e0000000000;
}

static void teardown(void)
{
    engine_destroy(&engine);
}

TestSuite(engine, .init = setup, .fini = teardown);

/* ---- scripted real calls ---- */

struct scripted {
    long result;
    int error;
    /* when set: the call waits until released (to hold an operation open) */
    pthread_mutex_t *gate_mutex;
    pthread_cond_t *gate;
    bool *inside, *released;
};

static long run_scripted(void *arguments)
{
    struct scripted *script = arguments;
    if (script != NULL && script->gate != NULL) {
        pthread_mutex_lock(script->gate_mutex);
        *script->inside = true;
        pthread_cond_broadcast(script->gate);
        while (!*script->released)
            pthread_cond_wait(script->gate, script->gate_mutex);
        pthread_mutex_unlock(script->gate_mutex);
    }
    if (script != NULL && script->result != 0)
        errno = script->error;
    return script != NULL ? script->result : 0;
}

static const struct engine_call succeeds = {run_scripted, NULL, "test"};

static void lock(uintptr_t addr, size_t length)
{
    cr_assert_eq(engine_lock(&engine, addr, length, 0, &succeeds), 0);
}

static void unlock(uintptr_t start, uintptr_t end, enum release_reason reason)
{
    cr_assert_eq(
        engine_unlock(&engine, start, end, reason, ENGINE_FAILED_CHANGED_NOTHING, &succeeds), 0);
}

static void free_block(uintptr_t start, uintptr_t end)
{
    engine_release_block(&engine, start, end, RELEASE_FREE, false, &succeeds);
}

/* An unlock whose real call fails with error: it returns -1 with that errno. */
static void unlock_fails(uintptr_t start, uintptr_t end, enum release_reason reason,
                         enum engine_failure_rule rule, int error)
{
    struct scripted fails = {.result = -1, .error = error};
    struct engine_call call = {run_scripted, &fails, "test"};
    errno = 0;
    cr_assert_eq(engine_unlock(&engine, start, end, reason, rule, &call), -1);
    cr_assert_eq(errno, error);
}

/* The mock's ranges, sorted, must equal the expected [start, end) pairs. */
static int compare_ranges(const void *a, const void *b)
{
    const struct mock_range *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

static void expect_ranges(const uintptr_t *expected, size_t pairs)
{
    pthread_mutex_lock(&mock.mutex);
    struct mock_range sorted[MAX_RANGES];
    size_t count = 0;
    for (size_t i = 0; i < mock.count; i++)
        if (!mock.ranges[i].foreign)
            sorted[count++] = mock.ranges[i];
    pthread_mutex_unlock(&mock.mutex);
    qsort(sorted, count, sizeof(*sorted), compare_ranges);
    cr_assert_eq(count, pairs, "expected %zu registrations, have %zu", pairs, count);
    for (size_t i = 0; i < pairs; i++) {
        cr_assert_eq(sorted[i].base, expected[2 * i], "range %zu starts at %#lx, expected %#lx", i,
                     (unsigned long)sorted[i].base, (unsigned long)expected[2 * i]);
        cr_assert_eq(sorted[i].base + sorted[i].length, expected[2 * i + 1],
                     "range %zu ends at %#lx, expected %#lx", i,
                     (unsigned long)(sorted[i].base + sorted[i].length),
                     (unsigned long)expected[2 * i + 1]);
    }
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, pairs);
    cr_assert_eq(mock.overlap_violations, 0);
    /* free's one-load shortcut: the span holds every registration. */
    for (size_t i = 0; i < pairs; i++)
        cr_assert(engine.span_start <= expected[2 * i] && expected[2 * i + 1] <= engine.span_end,
                  "range %zu [%#lx, %#lx) outside the span [%#lx, %#lx)", i,
                  (unsigned long)expected[2 * i], (unsigned long)expected[2 * i + 1],
                  (unsigned long)engine.span_start, (unsigned long)engine.span_end);
}

#define A(offset) ((uintptr_t)(arena + (offset)))

Test(engine, lock_registers_whole_pages)
{
    lock(A(100), 128 * 1024);
    uintptr_t expected[] = {A(0), A(0) + 33 * PAGE};
    expect_ranges(expected, 1);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 1);
    cr_assert_eq(counters.register_bytes, 33 * PAGE);
    cr_assert(engine_is_registered(&engine, A(0)));
    cr_assert(engine_is_registered(&engine, A(33 * PAGE - 1)));
    cr_assert_not(engine_is_registered(&engine, A(33 * PAGE)));
    struct engine_device_counts devices[4];
    cr_assert_eq(engine_get_devices(&engine, devices, 4), 1);
    cr_assert_eq(devices[0].registrations, 1);
    cr_assert_eq(devices[0].bytes, 33 * PAGE);
}

/* A release runs before the real call: what it needs is mapped after the
 * lock that made the range, never inside the release, where a new mapping
 * could fill a hole the program's call is about to meet. */
Test(engine, a_release_maps_nothing_of_its_own)
{
    lock(A(0), 64 * PAGE);
    void *piece_chunks = engine.piece_pool.chunks;
    size_t capacity = engine.registry.capacity;
    struct range_record *slots = engine.registry.slots;
    cr_assert_not_null(piece_chunks, "the pieces a release needs are ready after the lock");
    unlock(A(16 * PAGE), A(32 * PAGE), RELEASE_MUNLOCK); /* splits at both ends */
    cr_assert_eq(engine.piece_pool.chunks, piece_chunks);
    cr_assert_eq(engine.registry.capacity, capacity);
    cr_assert_eq(engine.registry.slots, slots);
    uintptr_t expected[] = {A(0), A(16 * PAGE), A(32 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 2);
}

/* node_pool_reserve(count): the next count gets map nothing. */
Test(engine, node_pool_reserve_readies_nodes)
{
    struct node_pool pool;
    node_pool_init(&pool, 48);
    cr_assert(node_pool_reserve(&pool, 64));
    void *chunks = pool.chunks;
    cr_assert_not_null(chunks);
    void *nodes[64];
    for (int i = 0; i < 64; i++)
        cr_assert_not_null(nodes[i] = node_pool_get(&pool));
    cr_assert_eq(pool.chunks, chunks);
    for (int i = 0; i < 64; i++)
        node_pool_put(&pool, nodes[i]);
    cr_assert_eq(pool.free_count, 64);
    cr_assert(node_pool_reserve(&pool, 64));
    cr_assert_eq(pool.chunks, chunks, "the free list counts");
    /* More than what is left: a new chunk, the old one's rest kept as free nodes. */
    size_t left = pool.free_count + pool.bump_left / pool.node_size;
    cr_assert(node_pool_reserve(&pool, left + 1));
    cr_assert_neq(pool.chunks, chunks);
    cr_assert_geq(pool.free_count + pool.bump_left / pool.node_size, left + 1);
    node_pool_destroy(&pool);
    cr_assert_eq(pool.free_count, 0);
}

Test(engine, failed_lock_registers_nothing_and_keeps_errno)
{
    struct scripted fails = {.result = -1, .error = EAGAIN};
    struct engine_call call = {run_scripted, &fails, "test"};
    errno = 0;
    cr_assert_eq(engine_lock(&engine, A(0), 64 * PAGE, 0, &call), -1);
    cr_assert_eq(errno, EAGAIN);
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.register_calls, 0);
}

Test(engine, lock_below_min_bytes_is_skipped_and_counted)
{
    lock(A(0), 64 * 1024 - 1);
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_skipped_small, 1);
    cr_assert_eq(mock.register_calls, 0);
}

Test(engine, relocking_registers_nothing_new)
{
    lock(A(0), 32 * PAGE);
    lock(A(0), 32 * PAGE);
    lock(A(PAGE), 20 * PAGE);
    uintptr_t expected[] = {A(0), A(32 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(mock.register_calls, 1);
}

/* A lock over a registration, and one beside it, make one run: one
 * registration, never two that overlap or touch (a copy across two fails). */
Test(engine, overlapping_and_adjacent_locks_join_one_registration)
{
    lock(A(16 * PAGE), 16 * PAGE);
    lock(A(0), 64 * PAGE);         /* covers it: two gaps */
    lock(A(64 * PAGE), 16 * PAGE); /* adjacent after */
    uintptr_t expected[] = {A(0), A(80 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(mock.register_calls, 3);
    cr_assert_eq(mock.unregister_calls, 2);
    cr_assert_eq(engine_stats(&engine)->counters.unregister_join, 2);
    cr_assert_eq(engine_stats(&engine)->runs_joined, 2);
}

Test(engine, partial_release_reregisters_what_stays_locked)
{
    lock(A(0), 64 * PAGE);
    unlock(A(16 * PAGE), A(32 * PAGE), RELEASE_MUNLOCK);
    uintptr_t expected[] = {A(0), A(16 * PAGE), A(32 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 2);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_ok, 1);
    cr_assert_eq(counters.unregister_munlock, 1);
    cr_assert_eq(counters.register_ok, 3);
}

Test(engine, release_spanning_several_ranges)
{
    lock(A(0), 32 * PAGE);
    lock(A(40 * PAGE), 32 * PAGE);
    lock(A(80 * PAGE), 32 * PAGE);
    unlock(A(16 * PAGE), A(96 * PAGE), RELEASE_MUNMAP);
    uintptr_t expected[] = {A(0), A(16 * PAGE), A(96 * PAGE), A(112 * PAGE)};
    expect_ranges(expected, 2);
}

/* What is left of a run below min_bytes is held, not registered again. */
Test(engine, a_remainder_below_min_bytes_is_held)
{
    lock(A(0), 32 * PAGE);
    unlock(A(8 * PAGE), A(32 * PAGE), RELEASE_MUNLOCK);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine_state_at(&engine, A(0)), RANGE_HELD);
    cr_assert_eq(engine_stats(&engine)->held_bytes, 8 * PAGE);
    /* Grown past min_bytes again, it is registered whole. */
    lock(A(8 * PAGE), 16 * PAGE);
    uintptr_t expected[] = {A(0), A(24 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(engine_stats(&engine)->held_bytes, 0);
}

/* free's lock-free answer: a range overlaps a registration only if it meets a
 * registered page; the span that clears most blocks with one load holds every
 * registration, also after the last one went and new ones came elsewhere. */
Test(engine, may_overlap_follows_the_registrations)
{
    cr_assert_not(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "nothing registered");
    lock(A(20 * PAGE), 16 * PAGE);
    lock(A(60 * PAGE), 16 * PAGE);
    cr_assert(engine_may_overlap(&engine, A(20 * PAGE), A(20 * PAGE) + 1));
    cr_assert(engine_may_overlap(&engine, A(75 * PAGE) + 100, A(75 * PAGE) + 101), "last byte");
    cr_assert(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "a block holding both");
    cr_assert_not(engine_may_overlap(&engine, A(0), A(20 * PAGE)), "just below");
    cr_assert_not(engine_may_overlap(&engine, A(76 * PAGE), A(200 * PAGE)), "just above");
    cr_assert_not(engine_may_overlap(&engine, A(40 * PAGE), A(50 * PAGE)), "between the two");
    cr_assert(engine_may_overlap(&engine, A(19 * PAGE) + 8, A(20 * PAGE) + 8), "shares a page");

    unlock(A(0), A(200 * PAGE), RELEASE_MUNMAP);
    cr_assert_not(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "all released");
    lock(A(2 * PAGE), 16 * PAGE);
    cr_assert(engine_may_overlap(&engine, A(2 * PAGE), A(3 * PAGE)));
    cr_assert_not(engine_may_overlap(&engine, A(20 * PAGE), A(76 * PAGE)), "old ranges gone");
    lock(A(150 * PAGE), 16 * PAGE);
    cr_assert(engine_may_overlap(&engine, A(165 * PAGE), A(166 * PAGE)));
    cr_assert(engine_may_overlap(&engine, A(2 * PAGE), A(3 * PAGE)));
    cr_assert_lt(engine.span_start, A(2 * PAGE) + 1);
    cr_assert_geq(engine.span_end, A(166 * PAGE));
}

Test(engine, free_of_the_locked_block_releases_every_page_it_touches)
{
    /* Lock at an offset inside a larger block, then free the block. */
    lock(A(3 * PAGE + 16), 100 * PAGE);
    free_block(A(16), A(110 * PAGE));
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_free, 1);
    cr_assert_eq(counters.live_bytes, 0);
    cr_assert_eq(counters.peak_bytes, 101 * PAGE);
}

/* Issue 9 item 2: b = malloc(200); a = malloc(100 KiB) on the same page;
 * mlock(a); free(b) must leave a's registration whole. */
Test(engine, free_of_a_neighbour_keeps_the_shared_page)
{
    uintptr_t b = A(PAGE - 256), a = A(PAGE - 32);
    lock(a, 100 * 1024);
    uintptr_t expected[] = {A(0), A(26 * PAGE)};
    expect_ranges(expected, 1);
    free_block(b, b + 208);
    expect_ranges(expected, 1);
    cr_assert_eq(mock.unregister_calls, 0);
    /* A neighbour after a's end, on its last page. */
    free_block(a + 100 * 1024 + 16, A(27 * PAGE) + 100);
    expect_ranges(expected, 1);
    /* a itself: every page it touches goes, the shared ones included (the
     * allocator may now give them back). */
    free_block(a, a + 100 * 1024);
    expect_ranges(NULL, 0);
}

/* A lock that covered several blocks (the program locked a whole arena):
 * freeing one of them releases every page it touches, shared ones included,
 * since the lock's bytes there may belong to blocks already freed (a page
 * kept for them could be given back to the kernel under the registration). */
/* One lock over many blocks: a freed block's pages go, but its first and
 * last, which still hold bytes the lock asked for (its neighbours'). */
Test(engine, free_inside_a_lock_of_many_blocks_keeps_the_pages_its_neighbours_hold)
{
    lock(A(0), 128 * PAGE);
    free_block(A(40 * PAGE) - 100, A(50 * PAGE) + 100);
    uintptr_t expected[] = {A(0), A(40 * PAGE), A(50 * PAGE), A(128 * PAGE)};
    expect_ranges(expected, 2);
    /* The neighbours go too: now every page of theirs goes with them. */
    free_block(A(39 * PAGE), A(40 * PAGE) - 100);
    free_block(A(50 * PAGE) + 100, A(52 * PAGE));
    uintptr_t after[] = {A(0), A(39 * PAGE), A(52 * PAGE), A(128 * PAGE)};
    expect_ranges(after, 2);
}

/* munlock that fails with ENOMEM unlocked up to the first hole: what lies
 * past it is still locked and is registered again. */
Test(engine, failed_unlock_restores_what_stays_locked)
{
    lock(A(0), 64 * PAGE);
    mock.unmapped_from = A(16 * PAGE); /* page 16 is the first not mapped */
    unlock_fails(A(0), A(64 * PAGE), RELEASE_MUNLOCK, ENGINE_FAILED_UNLOCKED_TO_HOLE, ENOMEM);
    uintptr_t expected[] = {A(16 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

Test(engine, failed_munmap_restores_everything)
{
    lock(A(0), 64 * PAGE);
    unlock_fails(A(8 * PAGE), A(24 * PAGE), RELEASE_MUNMAP, ENGINE_FAILED_CHANGED_NOTHING, EINVAL);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

Test(engine, already_registered_range_is_never_unregistered)
{
    pthread_mutex_lock(&mock.mutex);
    mock.ranges[mock.count++] = (struct mock_range){A(0), 64 * PAGE, 0, true};
    pthread_mutex_unlock(&mock.mutex);
    lock(A(0), 64 * PAGE);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_already_registered, 1);
    cr_assert_eq(counters.register_failed, 0);
    cr_assert_eq(counters.live_ranges, 0);
    free_block(A(0), A(64 * PAGE));
    cr_assert_eq(mock.unregister_calls, 0);
}

Test(engine, failed_registration_leaves_nothing_and_is_retried_later)
{
    mock.fail_register_every = 1;
    lock(A(0), 64 * PAGE);
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_failed, 1);
    struct engine_error_count errors[4];
    cr_assert_eq(engine_get_errors(&engine, errors, 4), 1);
    cr_assert_eq(errors[0].code, 2);
    cr_assert_eq(errors[0].count, 1);
    mock.fail_register_every = 0;
    lock(A(0), 64 * PAGE);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

Test(engine, failed_unregistration_is_counted_and_forgotten)
{
    lock(A(0), 64 * PAGE);
    mock.fail_unregister_every = 1;
    unlock(A(0), A(32 * PAGE), RELEASE_MUNMAP);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_failed, 1);
    cr_assert_eq(counters.unregister_munmap, 1);
    cr_assert_eq(counters.live_ranges, 0);
    cr_assert_eq(mock.register_calls, 1, "nothing registered again over a stuck registration");
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, disabled_means_no_registration)
{
    mock.choice = ENGINE_PLACE_DISABLED;
    lock(A(0), 64 * PAGE);
    cr_assert_eq(mock.register_calls, 0);
    cr_assert_eq(engine_stats(&engine)->skipped_disabled, 1);
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, shutdown_unregisters_everything_and_records_live)
{
    lock(A(0), 64 * PAGE);
    lock(A(100 * PAGE), 32 * PAGE);
    mock.choice = ENGINE_PLACE_DEFER;
    lock(A(200 * PAGE), 16 * PAGE);
    engine_shutdown(&engine);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine.live_ranges_at_exit, 2);
    cr_assert_eq(engine.live_bytes_at_exit, 96 * PAGE);
    cr_assert_eq(engine.pending_ranges_at_exit, 1);
    cr_assert_eq(engine.pending_bytes_at_exit, 16 * PAGE);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_exit, 2);
    mock.choice = ENGINE_PLACE_READY;
    lock(A(0), 64 * PAGE); /* after exit: nothing */
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, fork_reset_forgets_without_unregistering)
{
    lock(A(0), 64 * PAGE);
    engine_reset_after_fork(&engine);
    cr_assert_not(engine_has_registrations(&engine));
    cr_assert_eq(mock.unregister_calls, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 0);
}

/* ---- threads ---- */

struct worker {
    pthread_t thread;
    uintptr_t base;
    unsigned seed;
};

static void *worker_main(void *argument)
{
    struct worker *worker = argument;
    for (int i = 0; i < 2000; i++) {
        unsigned r = (unsigned)rand_r(&worker->seed);
        uintptr_t first = worker->base + (r % 48) * PAGE;
        uintptr_t pages = 16 + (r >> 8) % 32;
        if ((r >> 16) & 1)
            lock(first, pages * PAGE);
        else
            unlock(first, first + pages * PAGE, RELEASE_MUNLOCK);
    }
    free_block(worker->base, worker->base + 128 * PAGE);
    return NULL;
}

/* Eight threads over neighbouring areas that share a boundary page pairwise. */
Test(engine, concurrent_lock_and_release, .timeout = 120)
{
    struct worker workers[8];
    for (int i = 0; i < 8; i++) {
        workers[i].base = A((uintptr_t)i * 96 * PAGE);
        workers[i].seed = (unsigned)i * 7919u + 1;
        pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(workers[i].thread, NULL);
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.overlap_violations, 0);
}

/* A gate the scripted call waits at, so a test holds an operation open. */
static pthread_mutex_t gate_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate = PTHREAD_COND_INITIALIZER;
static bool gate_inside, gate_released;

static struct scripted gated_call(void)
{
    gate_inside = gate_released = false;
    return (struct scripted){0, 0, &gate_mutex, &gate, &gate_inside, &gate_released};
}

static void wait_inside_gate(void)
{
    pthread_mutex_lock(&gate_mutex);
    while (!gate_inside)
        pthread_cond_wait(&gate, &gate_mutex);
    pthread_mutex_unlock(&gate_mutex);
}

static void open_gate(void)
{
    pthread_mutex_lock(&gate_mutex);
    gate_released = true;
    pthread_cond_broadcast(&gate);
    pthread_mutex_unlock(&gate_mutex);
}

struct unlock_job {
    uintptr_t start, end;
    bool done;
    enum release_reason reason;
};

static void *unlock_job_main(void *argument)
{
    struct unlock_job *job = argument;
    unlock(job->start, job->end, job->reason);
    __atomic_store_n(&job->done, true, __ATOMIC_RELEASE);
    return NULL;
}

struct lock_job {
    uintptr_t addr;
    size_t length;
    struct scripted script;
};

static void *lock_job_main(void *argument)
{
    struct lock_job *job = argument;
    struct engine_call call = {run_scripted, &job->script, "test"};
    engine_lock(&engine, job->addr, job->length, 0, &call);
    return NULL;
}

/* A lock and an unlock of two buffers that share a page never interleave: the
 * unlock waits for the lock's whole operation (real call and registration),
 * so the shared page is never registered after the kernel unlocked it. */
Test(engine, lock_and_unlock_sharing_a_page_are_serialised, .timeout = 30)
{
    struct lock_job locker = {A(0), 17 * PAGE, gated_call()};
    pthread_t lock_thread, unlock_thread;
    pthread_create(&lock_thread, NULL, lock_job_main, &locker);
    wait_inside_gate(); /* the lock's real call is running */
    struct unlock_job unlocker = {A(16 * PAGE), A(32 * PAGE), false, RELEASE_MUNLOCK};
    pthread_create(&unlock_thread, NULL, unlock_job_main, &unlocker);
    usleep(20000);
    cr_assert_not(__atomic_load_n(&unlocker.done, __ATOMIC_ACQUIRE),
                  "the unlock ran while the lock of a shared page was in flight");
    open_gate();
    pthread_join(lock_thread, NULL);
    pthread_join(unlock_thread, NULL);
    /* The lock registered pages 0-16, then the unlock released page 16. */
    uintptr_t expected[] = {A(0), A(16 * PAGE)};
    expect_ranges(expected, 1);
}

static int claims_taken_now(void)
{
    pthread_mutex_lock(&engine.mutex);
    int taken = __builtin_popcountll(engine.claims_taken);
    pthread_mutex_unlock(&engine.mutex);
    return taken;
}

/* With every claim slot taken (64 operations held inside their real calls),
 * one more operation, on pages nobody claims, waits for a slot and runs
 * when one is given back; the slots are free again at the end. */
Test(engine, an_operation_waits_while_every_claim_slot_is_taken, .timeout = 60)
{
    static struct lock_job lockers[ENGINE_CLAIMS];
    pthread_t threads[ENGINE_CLAIMS];
    struct scripted held = gated_call();
    for (int i = 0; i < ENGINE_CLAIMS; i++) {
        lockers[i] = (struct lock_job){A((uintptr_t)i * 32 * PAGE), 16 * PAGE, held};
        pthread_create(&threads[i], NULL, lock_job_main, &lockers[i]);
    }
    while (claims_taken_now() < ENGINE_CLAIMS)
        usleep(1000);
    struct unlock_job extra = {A(ENGINE_CLAIMS * 32 * PAGE), A(ENGINE_CLAIMS * 32 * PAGE + PAGE),
                               false, RELEASE_MUNLOCK};
    pthread_t extra_thread;
    pthread_create(&extra_thread, NULL, unlock_job_main, &extra);
    usleep(20000);
    cr_assert_not(__atomic_load_n(&extra.done, __ATOMIC_ACQUIRE),
                  "an operation ran with every claim slot taken");
    cr_assert_eq(claims_taken_now(), ENGINE_CLAIMS);
    open_gate();
    for (int i = 0; i < ENGINE_CLAIMS; i++)
        pthread_join(threads[i], NULL);
    pthread_join(extra_thread, NULL);
    cr_assert(__atomic_load_n(&extra.done, __ATOMIC_ACQUIRE));
    cr_assert_eq(claims_taken_now(), 0, "every slot is given back");
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, ENGINE_CLAIMS, "every held lock registered its range");
}

struct overlap_watch {
    uintptr_t start, end;
    unsigned legit_after; /* unregistrations after which the range may go */
    bool ever_uncovered;
};

/* Looks until the range may legitimately go: it is uncovered only after the
 * release that owns it unregistered it (the count goes up before the pages
 * are cleared, so a check that saw it uncovered first and the count low
 * after caught a real gap). */
static void *watch_main(void *argument)
{
    struct overlap_watch *watch = argument;
    for (;;) {
        bool covered = engine_may_overlap(&engine, watch->start, watch->end);
        unsigned calls = __atomic_load_n(&mock.unregister_calls, __ATOMIC_ACQUIRE);
        if (calls >= watch->legit_after)
            return NULL;
        if (!covered)
            watch->ever_uncovered = true;
    }
}

/* Issue 9 item 1, at the engine: while one release unregisters a whole
 * registration and registers its remainder again, the remainder's pages stay
 * visible to the lock-free check (so another thread releasing them does not
 * skip its release), and that other release waits, then undoes the
 * remainder. */
Test(engine, remainder_stays_visible_while_a_release_is_in_flight, .timeout = 30)
{
    lock(A(0), 1024 * PAGE);
    struct unlock_job first = {A(0), A(512 * PAGE), false, RELEASE_MUNLOCK};
    struct unlock_job second = {A(512 * PAGE), A(1024 * PAGE), false, RELEASE_MUNLOCK};
    /* Until the second release unregisters it, the second half is registered
     * or being registered again: it must never look unregistered. */
    struct overlap_watch watch = {A(512 * PAGE), A(1024 * PAGE), 2, false};
    pthread_t watcher;
    pthread_create(&watcher, NULL, watch_main, &watch);
    pthread_mutex_lock(&mock.mutex);
    mock.hold_unregister = true;
    pthread_mutex_unlock(&mock.mutex);
    pthread_t first_thread, second_thread;
    pthread_create(&first_thread, NULL, unlock_job_main, &first);
    pthread_mutex_lock(&mock.mutex);
    while (!mock.unregister_waiting)
        pthread_cond_wait(&mock.changed, &mock.mutex);
    pthread_mutex_unlock(&mock.mutex);
    pthread_create(&second_thread, NULL, unlock_job_main, &second);
    usleep(20000);
    cr_assert_not(__atomic_load_n(&second.done, __ATOMIC_ACQUIRE));
    pthread_mutex_lock(&mock.mutex);
    mock.hold_unregister = false;
    pthread_cond_broadcast(&mock.changed);
    pthread_mutex_unlock(&mock.mutex);
    pthread_join(first_thread, NULL);
    pthread_join(second_thread, NULL);
    pthread_join(watcher, NULL);
    cr_assert_not(watch.ever_uncovered, "the remainder vanished from the lock-free view");
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.unregister_calls, 2);
}

static void *cancelled_unlock_main(void *argument)
{
    struct unlock_job *job = argument;
    unlock(job->start, job->end, RELEASE_MUNLOCK);
    __atomic_store_n(&job->done, true, __ATOMIC_RELEASE);
    pthread_testcancel();
    return NULL;
}

/* Issue 9 item 4: a thread cancelled while it waits inside the engine
 * finishes its operation (cancellation is off inside it) and dies at its
 * next cancellation point; the engine is not left locked. */
Test(engine, a_cancelled_thread_does_not_leave_the_engine_locked, .timeout = 30)
{
    lock(A(0), 64 * PAGE);
    struct lock_job holder = {A(64 * PAGE), 32 * PAGE, gated_call()};
    pthread_t holder_thread, victim;
    pthread_create(&holder_thread, NULL, lock_job_main, &holder);
    wait_inside_gate();
    struct unlock_job job = {A(60 * PAGE), A(66 * PAGE), false,
                             RELEASE_MUNLOCK}; /* waits for the holder */
    pthread_create(&victim, NULL, cancelled_unlock_main, &job);
    usleep(20000);
    pthread_cancel(victim);
    usleep(20000);
    open_gate();
    void *outcome;
    pthread_join(victim, &outcome);
    pthread_join(holder_thread, NULL);
    cr_assert_eq(outcome, PTHREAD_CANCELED);
    cr_assert(job.done, "the cancelled thread's unlock did not finish");
    unlock(A(0), A(8 * PAGE), RELEASE_MUNLOCK); /* the engine still works */
    uintptr_t expected[] = {A(8 * PAGE), A(60 * PAGE), A(66 * PAGE), A(96 * PAGE)};
    expect_ranges(expected, 2);
}

/* ---- asynchronous registration, deferral, chunks ---- */

Test(engine, asynchronous_lock_queues_and_the_worker_registers)
{
    restart_engine(options(true, 0));
    lock(A(0), 64 * PAGE);
    cr_assert_eq(mock.register_calls, 0, "registered inside the lock call");
    cr_assert_eq(mock.wakes, 1, "the registration thread was not asked for");
    cr_assert(engine_may_overlap(&engine, A(0), A(1)), "a queued range is visible to free");
    cr_assert_not(engine_is_registered(&engine, A(0)));
    engine_worker_run(&engine, 1000000, false);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_gt(engine_stats(&engine)->background_nanoseconds, 0);
    cr_assert_eq(engine_stats(&engine)->wait_nanoseconds, 0);
}

Test(engine, release_of_a_queued_range_cancels_it_without_cuda)
{
    restart_engine(options(true, 0));
    lock(A(0), 64 * PAGE);
    unlock(A(0), A(16 * PAGE), RELEASE_MUNLOCK);
    free_block(A(48 * PAGE), A(64 * PAGE));
    cr_assert_eq(mock.register_calls + mock.unregister_calls, 0);
    cr_assert_eq(engine_stats(&engine)->cancelled_queued, 2);
    engine_worker_run(&engine, 1000000, false);
    uintptr_t expected[] = {A(16 * PAGE), A(48 * PAGE)};
    expect_ranges(expected, 1);
}

static void *worker_thread_main(void *argument)
{
    (void)argument;
    engine_worker_run(&engine, 1000000, false);
    return NULL;
}

/* A release that meets a registration in flight on the registration thread
 * waits for it, then unregisters it. */
Test(engine, release_waits_for_a_registration_in_flight, .timeout = 30)
{
    restart_engine(options(true, 0));
    mock.register_delay = 100000;
    lock(A(0), 64 * PAGE);
    pthread_t worker;
    pthread_create(&worker, NULL, worker_thread_main, NULL);
    while (__atomic_load_n(&engine.queued_ranges, __ATOMIC_RELAXED) != 0)
        usleep(1000);
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    pthread_join(worker, NULL);
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.register_calls, 1);
    cr_assert_eq(mock.unregister_calls, 1);
}

Test(engine, drain_waits_for_the_queue)
{
    restart_engine(options(true, 0));
    mock.register_delay = 20000;
    lock(A(0), 64 * PAGE);
    lock(A(100 * PAGE), 64 * PAGE);
    pthread_t worker;
    pthread_create(&worker, NULL, worker_thread_main, NULL);
    cr_assert_eq(engine_drain(&engine, false), 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 2, "drain returned before the queue was registered");
    pthread_join(worker, NULL);
}

Test(engine, without_a_context_ranges_wait_and_are_registered_later)
{
    mock.choice = ENGINE_PLACE_DEFER;
    lock(A(0), 64 * PAGE);
    lock(A(100 * PAGE), 64 * PAGE);
    cr_assert_eq(mock.register_calls, 0);
    cr_assert_eq(engine.pending_ranges, 2);
    cr_assert_eq(engine.pending_bytes, 128 * PAGE);
    unlock(A(100 * PAGE), A(164 * PAGE), RELEASE_MUNLOCK); /* dropped, no CUDA call */
    cr_assert_eq(engine_stats(&engine)->dropped_pending, 1);
    cr_assert_eq(mock.unregister_calls, 0);
    mock.choice = ENGINE_PLACE_READY;
    mock.device = 2; /* the program's context appeared on device 2 */
    engine_worker_run(&engine, 1000000, false);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(mock.ranges[0].device, 2);
    cr_assert_eq(engine_stats(&engine)->deferred_total, 2);
    cr_assert_eq(engine_stats(&engine)->deferred_registered, 1);
    cr_assert_eq(engine.pending_ranges, 0);
}

/* The watcher: a pending range starts the thread even with no CUDA driver
 * loaded (a program may load one without any call the shim sees); it keeps
 * looking, backing off, and ends with the last pending range. */
static void *watcher_main(void *unused)
{
    (void)unused;
    engine_worker_run(&engine, 1000000, false);
    return NULL;
}

Test(engine, the_watcher_looks_until_the_last_pending_range_goes, .timeout = 30)
{
    mock.choice = ENGINE_PLACE_DEFER;
    lock(A(0), 64 * PAGE);
    cr_assert_eq(mock.wakes, 1, "no watcher for a pending range");
    pthread_t watcher;
    pthread_create(&watcher, NULL, watcher_main, NULL);
    while (__atomic_load_n(&engine.pending_passes, __ATOMIC_RELAXED) < 3)
        sched_yield();
    cr_assert_eq(engine.pending_ranges, 1);
    cr_assert_eq(mock.register_calls, 0);
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    pthread_join(watcher, NULL); /* returns: nothing left to wait for */
    cr_assert_eq(engine_stats(&engine)->dropped_pending, 1);
    cr_assert_eq(mock.register_calls, 0);
}

/* A run the driver takes in one call is one registration, however large;
 * one it refuses whole goes in chunks of max_registration_bytes. */
Test(engine, large_ranges_are_chunked_only_when_the_driver_refuses_them, .timeout = 60)
{
    restart_engine(options(false, (uint64_t)64 << 30));
    mock.count_only = true;
    uint64_t size = (uint64_t)200 << 30;
    lock(A(0), size);
    cr_assert_eq(mock.register_calls, 1);
    unlock(A(0), A(size), RELEASE_MUNLOCK);
    cr_assert_eq(mock.live_count, 0);
    mock.register_calls = mock.unregister_calls = 0;
    mock.max_register_bytes = (uint64_t)100 << 30;
    lock(A(0), size);
    cr_assert_eq(mock.register_calls, 5); /* refused whole, then 64 + 64 + 64 + 8 GiB */
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 4);
    cr_assert_eq(counters.live_bytes, size);
    cr_assert_eq(engine_stats(&engine)->runs_chunked, 1);
    /* A chunk is joined with nothing: a lock beside the last one is a
     * registration of its own. */
    lock(A(size), 64 * PAGE);
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 5);
    cr_assert_eq(mock.unregister_calls, 0);
    /* Released whole, also from the middle of a chunk. */
    unlock(A(0), A(size + 64 * PAGE), RELEASE_MUNLOCK);
    cr_assert_eq(mock.live_count, 0);
    cr_assert_eq(mock.unregister_calls, 5);
}

Test(engine, a_failed_chunk_leaves_the_others_consistent)
{
    restart_engine(options(false, 16 * PAGE));
    mock.max_register_bytes = 16 * PAGE;
    mock.fail_register_every = 3; /* the whole (1) is refused, then chunk 2 of 4 */
    lock(A(0), 64 * PAGE);
    uintptr_t expected[] = {A(0),         A(16 * PAGE), A(32 * PAGE),
                            A(48 * PAGE), A(48 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 3);
    cr_assert_eq(engine_state_at(&engine, A(16 * PAGE)), RANGE_HELD);
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    expect_ranges(NULL, 0);
}

/* MLOCK_ONFAULT with pages not resident: the run is held whole (a copy of
 * it works unregistered, and would fail half registered) until a plain lock
 * faults it all in; all resident, it is registered as a plain lock's. */
Test(engine, onfault_holds_its_run_until_every_page_is_resident)
{
    lock(A(64 * PAGE), 32 * PAGE); /* registered, then joined by the onfault lock */
    mock.resident[0][0] = A(4 * PAGE);
    mock.resident[0][1] = A(10 * PAGE);
    mock.resident[1][0] = A(40 * PAGE);
    mock.resident[1][1] = A(41 * PAGE);
    mock.resident_count = 2;
    cr_assert_eq(engine_lock(&engine, A(0), 64 * PAGE, ENGINE_LOCK_ONFAULT, &succeeds), 0);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine_stats(&engine)->skipped_onfault_pages, 57);
    cr_assert_eq(engine_state_at(&engine, A(70 * PAGE)), RANGE_HELD);
    /* A plain lock of part of it leaves it held; of all of it, registers it. */
    lock(A(0), 32 * PAGE);
    expect_ranges(NULL, 0);
    lock(A(32 * PAGE), 32 * PAGE);
    uintptr_t expected[] = {A(0), A(96 * PAGE)};
    expect_ranges(expected, 1);
    /* Every page resident: as a plain lock. */
    mock.resident[0][0] = A(200 * PAGE);
    mock.resident[0][1] = A(232 * PAGE);
    mock.resident_count = 1;
    cr_assert_eq(engine_lock(&engine, A(200 * PAGE), 32 * PAGE, ENGINE_LOCK_ONFAULT, &succeeds), 0);
    uintptr_t both[] = {A(0), A(96 * PAGE), A(200 * PAGE), A(232 * PAGE)};
    expect_ranges(both, 2);
}

Test(engine, onfault_skip_and_all)
{
    struct engine_options skip = options(false, 0);
    skip.onfault = ENGINE_ONFAULT_SKIP;
    restart_engine(skip);
    cr_assert_eq(engine_lock(&engine, A(0), 64 * PAGE, ENGINE_LOCK_ONFAULT, &succeeds), 0);
    expect_ranges(NULL, 0);
    struct engine_options all = options(false, 0);
    all.onfault = ENGINE_ONFAULT_ALL;
    restart_engine(all);
    cr_assert_eq(engine_lock(&engine, A(0), 64 * PAGE, ENGINE_LOCK_ONFAULT, &succeeds), 0);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

/* ---- the program's own registrations ---- */

static long run_program_register(void *arguments)
{
    uintptr_t *range = arguments;
    pthread_mutex_lock(&mock.mutex);
    for (size_t i = 0; i < mock.count; i++)
        if (range[0] < mock.ranges[i].base + mock.ranges[i].length &&
            mock.ranges[i].base < range[1]) {
            pthread_mutex_unlock(&mock.mutex);
            return MOCK_ALREADY_REGISTERED;
        }
    mock.ranges[mock.count++] = (struct mock_range){range[0], range[1] - range[0], 0, true};
    pthread_mutex_unlock(&mock.mutex);
    return 0;
}

static long run_program_unregister(void *arguments)
{
    uintptr_t *range = arguments;
    pthread_mutex_lock(&mock.mutex);
    for (size_t i = 0; i < mock.count; i++)
        if (mock.ranges[i].base == range[0] && mock.ranges[i].foreign) {
            mock.ranges[i] = mock.ranges[--mock.count];
            pthread_mutex_unlock(&mock.mutex);
            return 0;
        }
    pthread_mutex_unlock(&mock.mutex);
    return MOCK_NOT_REGISTERED;
}

Test(engine, program_registration_takes_the_pages_over)
{
    lock(A(0), 64 * PAGE);
    /* The program registers bytes inside pages 20..30 itself. */
    uintptr_t program[2] = {A(20 * PAGE) + 100, A(30 * PAGE) - 100};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_register(&engine, program[0], program[1] - program[0], 0, &call),
                 0);
    uintptr_t expected[] = {A(0), A(20 * PAGE), A(30 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 2);
    cr_assert_eq(mock.overlap_violations, 0);
    cr_assert(engine_is_shim_registration(&engine, A(5 * PAGE)));
    cr_assert_not(engine_is_shim_registration(&engine, A(25 * PAGE)));
    /* The shim never undoes the program's registration, also not at munlock. */
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    expect_ranges(NULL, 0);
    pthread_mutex_lock(&mock.mutex);
    cr_assert_eq(mock.count, 1, "the program's registration is gone");
    pthread_mutex_unlock(&mock.mutex);
    /* A new lock over it registers around it, never over it. */
    lock(A(0), 64 * PAGE);
    expect_ranges(expected, 2);
}

Test(engine, program_unregistration_lets_the_shim_take_the_pages_back)
{
    lock(A(0), 64 * PAGE);
    uintptr_t program[2] = {A(10 * PAGE), A(20 * PAGE)};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    engine_program_register(&engine, program[0], program[1] - program[0], 0, &call);
    mock.locked[0][0] = A(0);
    mock.locked[0][1] = A(64 * PAGE); /* still locked in the kernel */
    mock.locked_count = 1;
    struct engine_program_call undo = {{run_program_unregister, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_unregister(&engine, program[0], &undo), 0);
    /* Given back, the pages join their neighbours: one run, one registration. */
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(engine_stats(&engine)->program_took_back, 1);
}

/* The take-back follows the registry (kept equal to what is locked), not
 * the kernel's view: no locked_parts call, whose /proc/self/smaps read costs
 * in proportion to the process's memory, inside the program's call. */
Test(engine, take_back_follows_the_registry_without_asking_the_kernel)
{
    lock(A(0), 64 * PAGE);
    uintptr_t program[2] = {A(10 * PAGE), A(20 * PAGE)};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    engine_program_register(&engine, program[0], program[1] - program[0], 0, &call);
    mock.locked_count = 0; /* the kernel view would say: nothing locked */
    uint64_t asked = mock.locked_parts_calls;
    struct engine_program_call undo = {{run_program_unregister, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_unregister(&engine, program[0], &undo), 0);
    cr_assert_eq(mock.locked_parts_calls, asked, "the take-back asked the kernel");
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

/* Pages the program unlocked while it owned them are not taken back; pages
 * it locked while it owned them are. */
Test(engine, take_back_of_what_was_unlocked_and_locked_under_the_program)
{
    uintptr_t program[2] = {A(0), A(64 * PAGE)};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_register(&engine, program[0], 64 * PAGE, 0, &call), 0);
    lock(A(0), 32 * PAGE); /* the program's: nothing registered by the shim */
    expect_ranges(NULL, 0);
    unlock(A(0), A(16 * PAGE), RELEASE_MUNLOCK);
    struct engine_program_call undo = {{run_program_unregister, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_unregister(&engine, program[0], &undo), 0);
    uintptr_t expected[] = {A(16 * PAGE), A(32 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(engine_stats(&engine)->program_took_back, 1);
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    expect_ranges(NULL, 0);
}

/* With asynchronous registration the take-back is queued: an unlock right
 * after it (DeepSpeed's unpin: unregister, then munlock) makes no CUDA call. */
Test(engine, asynchronous_take_back_is_cancelled_by_the_unlock_after_it)
{
    restart_engine(options(true, 0));
    uintptr_t program[2] = {A(0), A(64 * PAGE)};
    lock(A(0), 64 * PAGE);
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_register(&engine, program[0], 64 * PAGE, 0, &call), 0);
    struct engine_program_call undo = {{run_program_unregister, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_unregister(&engine, program[0], &undo), 0);
    cr_assert_eq(engine.queued_ranges, 1, "the take-back was not queued");
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    engine_worker_run(&engine, 1000000, false);
    cr_assert_eq(mock.register_calls, 0);
    cr_assert_eq(mock.unregister_calls, 0);
    expect_ranges(NULL, 0);
}

Test(engine, program_registration_drops_queued_and_pending_ranges)
{
    restart_engine(options(true, 0));
    lock(A(0), 64 * PAGE);
    uintptr_t program[2] = {A(0), A(64 * PAGE)};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    engine_program_register(&engine, program[0], 64 * PAGE, 0, &call);
    engine_worker_run(&engine, 1000000, false);
    cr_assert_eq(mock.register_calls, 0, "the shim registered what the program took");
    expect_ranges(NULL, 0);
}

Test(engine, a_failed_program_registration_gives_the_pages_back)
{
    lock(A(0), 64 * PAGE);
    pthread_mutex_lock(&mock.mutex);
    mock.ranges[mock.count++] = (struct mock_range){A(100 * PAGE), PAGE, 0, true};
    pthread_mutex_unlock(&mock.mutex);
    /* The program's range reaches memory it registered before: 712 for it. */
    uintptr_t program[2] = {A(32 * PAGE), A(101 * PAGE)};
    struct engine_program_call call = {{run_program_register, program, "test"}, MOCK_OK};
    cr_assert_eq(engine_program_register(&engine, program[0], program[1] - program[0], 0, &call),
                 MOCK_ALREADY_REGISTERED);
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

/* ---- runs: one registration each (issue 34) ---- */

static struct mapping_bounds bounds;

/* Buffers mapped one after another sit side by side: each is an object of
 * its own, and releasing one registers none of the others again. */
Test(engine, side_by_side_mappings_are_apart_and_released_alone)
{
    engine_set_mapping_bounds(&engine, &bounds);
    for (uintptr_t i = 0; i < 8; i++)
        mapping_bounds_note_mapped(&bounds, A(i * 32 * PAGE), A((i + 1) * 32 * PAGE));
    for (uintptr_t i = 0; i < 8; i++)
        lock(A(i * 32 * PAGE), 32 * PAGE);
    cr_assert_eq(mock.register_calls, 8);
    cr_assert_eq(mock.unregister_calls, 0);
    unlock(A(3 * 32 * PAGE), A(4 * 32 * PAGE), RELEASE_MUNMAP);
    /* Its bounds went with it; its neighbours' stay. */
    cr_assert_not(page_index_test_bit(&bounds.marks, PAGE_INDEX_USED, A(3 * 32 * PAGE)));
    cr_assert_not(page_index_test_bit(&bounds.marks, PAGE_INDEX_BASE, A(4 * 32 * PAGE)));
    cr_assert(mapping_bounds_split_at(&bounds, A(3 * 32 * PAGE)));
    cr_assert(mapping_bounds_split_at(&bounds, A(4 * 32 * PAGE)));
    cr_assert_eq(mock.register_calls, 8, "releasing one registered another again");
    cr_assert_eq(mock.unregister_calls, 1);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 7);
    /* One object locked in two calls is one run. */
    mapping_bounds_note_mapped(&bounds, A(300 * PAGE), A(364 * PAGE));
    lock(A(300 * PAGE), 32 * PAGE);
    lock(A(332 * PAGE), 32 * PAGE);
    cr_assert(engine_is_registered(&engine, A(331 * PAGE)));
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 8);
    mapping_bounds_destroy(&bounds);
}

/* Two mappings of 16 pages side by side, locked in one call. */
static void lock_over_two_mappings(void)
{
    engine_set_mapping_bounds(&engine, &bounds);
    mapping_bounds_note_mapped(&bounds, A(0), A(16 * PAGE));
    mapping_bounds_note_mapped(&bounds, A(16 * PAGE), A(32 * PAGE));
    lock(A(0), 32 * PAGE);
}

/* One lock over two mappings side by side: two runs, two registrations
 * (the model found one: a record spanned the bound). */
Test(engine, one_lock_over_two_mappings_registers_each_apart)
{
    lock_over_two_mappings();
    uintptr_t apart[] = {A(0), A(16 * PAGE), A(16 * PAGE), A(32 * PAGE)};
    expect_ranges(apart, 2);
    mapping_bounds_destroy(&bounds);
}

/* A munmap that waits for pages another call holds keeps the bounds of
 * what it will unmap until it holds them: meanwhile its neighbour's pages
 * are still an object apart, and an unlock there registers its remainder
 * alone. CI's eight-thread model run found one registration over both when
 * munmap's bounds went before it held its pages, where the neighbour was
 * what was left of a mapping whose first part had been unmapped (no start
 * mark of its own: the bound was the mapping below's end mark alone), and
 * the mapping below was placed in the hole. */
Test(engine, a_munmap_waiting_for_its_pages_keeps_their_bounds, .timeout = 30)
{
    engine_set_mapping_bounds(&engine, &bounds);
    mapping_bounds_note_mapped(&bounds, A(0), A(128 * PAGE));
    mapping_bounds_note_unmapped(&bounds, A(0), A(64 * PAGE));
    mapping_bounds_note_mapped(&bounds, A(0), A(64 * PAGE));
    cr_assert_not(page_index_test_bit(&bounds.marks, PAGE_INDEX_USED, A(64 * PAGE)));
    lock(A(16 * PAGE), 48 * PAGE);
    lock(A(64 * PAGE), 64 * PAGE);
    /* A lock of the first page, held inside its real call, ... */
    struct lock_job holder = {A(0), PAGE, gated_call()};
    pthread_t holder_thread, unmap_thread;
    pthread_create(&holder_thread, NULL, lock_job_main, &holder);
    wait_inside_gate();
    /* ... makes the munmap of the first mapping wait. */
    struct unlock_job unmapper = {A(0), A(64 * PAGE), false, RELEASE_MUNMAP};
    pthread_create(&unmap_thread, NULL, unlock_job_main, &unmapper);
    usleep(20000);
    cr_assert_not(__atomic_load_n(&unmapper.done, __ATOMIC_ACQUIRE));
    cr_assert(mapping_bounds_split_at(&bounds, A(64 * PAGE)),
              "a munmap waiting for its pages dropped their bounds");
    unlock(A(80 * PAGE), A(96 * PAGE), RELEASE_MUNLOCK);
    uintptr_t apart[] = {A(16 * PAGE), A(64 * PAGE), A(64 * PAGE),
                         A(80 * PAGE), A(96 * PAGE), A(128 * PAGE)};
    expect_ranges(apart, 3);
    open_gate();
    pthread_join(holder_thread, NULL);
    pthread_join(unmap_thread, NULL);
    uintptr_t left[] = {A(64 * PAGE), A(80 * PAGE), A(96 * PAGE), A(128 * PAGE)};
    expect_ranges(left, 2);
    cr_assert_not(mapping_bounds_split_at(&bounds, A(64 * PAGE)), "the first mapping's end stayed");
    cr_assert_not(mapping_bounds_split_at(&bounds, A(0)), "the first mapping's start stayed");
    mapping_bounds_destroy(&bounds);
}

/* A munmap that fails unmapped nothing: the bounds stay, and so do the
 * registrations, each mapping's apart. */
Test(engine, a_failed_munmap_keeps_the_bounds)
{
    lock_over_two_mappings();
    unlock_fails(A(0), A(16 * PAGE), RELEASE_MUNMAP, ENGINE_FAILED_CHANGED_NOTHING, ENOMEM);
    cr_assert(mapping_bounds_split_at(&bounds, A(16 * PAGE)));
    uintptr_t apart[] = {A(0), A(16 * PAGE), A(16 * PAGE), A(32 * PAGE)};
    expect_ranges(apart, 2);
    unlock(A(0), A(16 * PAGE), RELEASE_MUNMAP);
    cr_assert(mapping_bounds_split_at(&bounds, A(16 * PAGE)), "the second mapping's start went");
    cr_assert_not(mapping_bounds_split_at(&bounds, A(0)));
    uintptr_t left[] = {A(16 * PAGE), A(32 * PAGE)};
    expect_ranges(left, 1);
    mapping_bounds_destroy(&bounds);
}

/* A lock of no bytes (the kernel still locks the page of an unaligned
 * address) is not tracked: a page with no lock bytes no free would find. */
Test(engine, a_lock_of_no_bytes_tracks_nothing)
{
    lock(A(1000), 0);
    cr_assert_eq(engine_state_at(&engine, A(0)), -1);
    cr_assert_not(engine_has_registrations(&engine));
}

/* Pieces of one buffer locked in any order end as one registration. */
Test(engine, pieces_in_any_order_make_one_registration)
{
    static const int orders[3][8] = {
        {0, 1, 2, 3, 4, 5, 6, 7}, {7, 6, 5, 4, 3, 2, 1, 0}, {3, 0, 6, 1, 7, 2, 5, 4}};
    for (int order = 0; order < 3; order++) {
        uintptr_t base = A((uintptr_t)order * 256 * PAGE);
        for (int i = 0; i < 8; i++)
            lock(base + (uintptr_t)orders[order][i] * 16 * PAGE, 16 * PAGE);
        unsigned registered = 0;
        pthread_mutex_lock(&mock.mutex);
        for (size_t r = 0; r < mock.count; r++)
            registered += mock.ranges[r].base == base && mock.ranges[r].length == 128 * PAGE;
        pthread_mutex_unlock(&mock.mutex);
        cr_assert_eq(registered, 1, "order %d: not one registration", order);
    }
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 3);
    cr_assert_eq(mock.overlap_violations, 0);
}

/* Two small buffers on one page: one page is in one registration, so they
 * are one run; the free of one leaves the other (and the shared page)
 * registered whole. */
Test(engine, buffers_sharing_a_page_are_one_run)
{
    uintptr_t x = A(PAGE / 2), x_end = A(20 * PAGE + 1000);
    uintptr_t y = x_end + 16, y_end = A(40 * PAGE);
    lock(x, x_end - x);
    lock(y, y_end - y);
    uintptr_t expected[] = {A(0), A(40 * PAGE)};
    expect_ranges(expected, 1);
    free_block(x, x_end);
    uintptr_t rest[] = {A(20 * PAGE), A(40 * PAGE)};
    expect_ranges(rest, 1);
    cr_assert(engine_is_registered(&engine, y));
}

/* A lock below min_bytes beside a registered run joins it; alone it is
 * held, and two such that add up to min_bytes in one run are registered. */
Test(engine, small_locks_join_their_run)
{
    lock(A(0), 32 * PAGE);
    lock(A(32 * PAGE), 100); /* 100 bytes: one page */
    uintptr_t joined[] = {A(0), A(33 * PAGE)};
    expect_ranges(joined, 1);
    lock(A(100 * PAGE), 8 * PAGE);
    lock(A(120 * PAGE), 8 * PAGE);
    expect_ranges(joined, 1);
    cr_assert_eq(engine_stats(&engine)->held_ranges, 2);
    lock(A(108 * PAGE), 12 * PAGE); /* 28 pages, 112 KiB locked in one run */
    uintptr_t both[] = {A(0), A(33 * PAGE), A(100 * PAGE), A(128 * PAGE)};
    expect_ranges(both, 2);
    cr_assert_eq(engine_stats(&engine)->held_ranges, 0);
}

/* The driver refuses the grown run (here: larger than it takes): what was
 * registered before is registered again as it was, the new pages apart,
 * counted and warned once; nothing is left unregistered that can be. */
Test(engine, a_refused_union_falls_back_to_the_old_pieces)
{
    mock.max_register_bytes = 40 * PAGE;
    lock(A(0), 32 * PAGE);
    lock(A(32 * PAGE), 16 * PAGE);
    uintptr_t pieces[] = {A(0), A(32 * PAGE), A(32 * PAGE), A(48 * PAGE)};
    expect_ranges(pieces, 2);
    cr_assert_eq(engine_stats(&engine)->join_failed, 1);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_failed, 0, "the pieces were registered");
    /* Released, the rest is one run again, registered whole. */
    unlock(A(40 * PAGE), A(48 * PAGE), RELEASE_MUNLOCK);
    uintptr_t rest[] = {A(0), A(40 * PAGE)};
    expect_ranges(rest, 1);
}

/* Pages no registration covers (VM_IO here) hold their run: the rest is not
 * registered either, so a copy across works unregistered. PROT_NONE pages
 * (no copy crosses them) cut the run instead: both sides registered. */
Test(engine, refused_pages_hold_their_run_and_no_access_pages_cut_it)
{
    mock.kinds[0][0] = A(40 * PAGE);
    mock.kinds[0][1] = A(44 * PAGE);
    mock.kinds[0][2] = ENGINE_MAPPING_IO;
    mock.kinds[1][0] = A(140 * PAGE);
    mock.kinds[1][1] = A(144 * PAGE);
    mock.kinds[1][2] = ENGINE_MAPPING_NO_ACCESS;
    mock.kinds_count = 2;
    mock.max_register_bytes = 1; /* every first try fails: the kinds are read */
    lock(A(0), 64 * PAGE);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine_state_at(&engine, A(10 * PAGE)), RANGE_HELD);
    mock.max_register_bytes = 0;
    /* A lock beside a held run joins it, and stays held. */
    lock(A(64 * PAGE), 32 * PAGE);
    expect_ranges(NULL, 0);
    /* The cut: a failure that finds PROT_NONE in the middle. */
    mock.max_register_bytes = 64 * PAGE;
    lock(A(100 * PAGE), 100 * PAGE);
    uintptr_t sides[] = {A(100 * PAGE), A(140 * PAGE), A(144 * PAGE), A(200 * PAGE)};
    expect_ranges(sides, 2);
}

/* With a registration thread: pieces locked while queued join at no call,
 * and a lock beside a registered run unregisters it before it returns (a
 * copy across the two then works unregistered until the whole is). */
Test(engine, asynchronous_pieces_join_while_queued)
{
    restart_engine(options(true, 0));
    for (uintptr_t i = 0; i < 16; i++)
        lock(A(i * 16 * PAGE), 16 * PAGE);
    cr_assert_eq(mock.register_calls, 0);
    engine_worker_run(&engine, 1000000, false);
    uintptr_t whole[] = {A(0), A(256 * PAGE)};
    expect_ranges(whole, 1);
    cr_assert_eq(mock.register_calls, 1);
    lock(A(256 * PAGE), 16 * PAGE);
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.unregister_calls, 1);
    engine_worker_run(&engine, 1000000, false);
    uintptr_t grown[] = {A(0), A(272 * PAGE)};
    expect_ranges(grown, 1);
}

struct neighbour_job {
    uintptr_t start;
    unsigned pieces;
};

static void *lock_neighbours_main(void *argument)
{
    struct neighbour_job *job = argument;
    for (unsigned i = 0; i < job->pieces; i++)
        engine_lock(&engine, job->start + (uintptr_t)i * 8 * PAGE, 8 * PAGE, 0, &succeeds);
    return NULL;
}

/* Many threads locking neighbouring pieces at once end with one
 * registration, and no call ever overlapped another. */
Test(engine, threads_locking_neighbours_end_with_one_registration, .timeout = 60)
{
    mock.register_delay = 200;
    enum { THREADS = 8, PIECES = 16 };
    pthread_t threads[THREADS];
    struct neighbour_job jobs[THREADS];
    for (unsigned t = 0; t < THREADS; t++) {
        /* Interleaved: thread t's pieces alternate with the others'. */
        jobs[t] = (struct neighbour_job){A((uintptr_t)t * PIECES * 8 * PAGE), PIECES};
        pthread_create(&threads[t], NULL, lock_neighbours_main, &jobs[t]);
    }
    for (unsigned t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    uintptr_t whole[] = {A(0), A(THREADS * PIECES * 8 * PAGE)};
    expect_ranges(whole, 1);
    cr_assert_eq(mock.overlap_violations, 0);
}

/* ---- scale ---- */

/* Many registrations released at once (exit, munlockall, munmap of a region)
 * and a lock over many gaps: each step continues where the last one stopped,
 * so this runs in linear time (it took minutes when each step rescanned). */
Test(engine, many_ranges_release_and_fill, .timeout = 120)
{
    enum { COUNT = 100000 };
    mock.count_only = true;
    for (uintptr_t i = 0; i < COUNT; i++)
        lock(A(2 * i * 16 * PAGE), 16 * PAGE);
    /* Every other 16-page block is registered; now lock the whole span,
     * which joins them all into one run. */
    lock(A(0), 2 * COUNT * 16 * PAGE);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 1);
    cr_assert_eq(counters.live_bytes, 2 * COUNT * 16 * PAGE);
    cr_assert_eq(mock.live_count, 1);
    cr_assert_eq(engine.registry.count, 1);
    /* Cut into COUNT runs again by unlocking every other block. */
    for (uintptr_t i = 0; i < COUNT; i++)
        unlock(A((2 * i + 1) * 16 * PAGE), A((2 * i + 2) * 16 * PAGE), RELEASE_MUNLOCK);
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, COUNT);
    engine_shutdown(&engine);
    cr_assert_eq(mock.live_count, 0);
    cr_assert_eq(engine.live_ranges_at_exit, COUNT);
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_exit, COUNT);
    cr_assert_not(engine_has_registrations(&engine));
}

/* ---- free's fast check ---- */

static unsigned next_random(unsigned *state)
{
    *state = *state * 1103515245u + 12345u;
    return *state >> 8;
}

/* Whether the free of [start, end) would release pages by the free rule: the
 * block holds lock bytes (see engine_release_block). */
static bool block_in_danger(uintptr_t start, uintptr_t end)
{
    return lock_bytes_any(&engine.lock_bytes, start, end);
}

/* Blocks in [memory, memory + size) with a glibc-like header; checks that
 * free's lock-free checks (the one-add check, then the one after a lock's
 * last byte) never clear a block whose free would release pages, and counts
 * how many they cleared, and how many of those share a registered page. */
static size_t touching_cleared;

static size_t check_blocks(char *memory, size_t size, unsigned *seed, size_t count)
{
    size_t cleared = 0;
    for (size_t i = 0; i < count; i++) {
        uintptr_t offset = 16 + (next_random(seed) % (unsigned)(size - (4 << 20))) / 16 * 16;
        size_t chunk = next_random(seed) % 8 == 0 ? 32 + (next_random(seed) % (2 << 20)) / 16 * 16
                                                  : 32 + (next_random(seed) % 16384) / 16 * 16;
        size_t flags = next_random(seed) % 8;
        char *ptr = memory + offset;
        ((size_t *)ptr)[-1] = chunk | flags;
        uintptr_t end = (uintptr_t)ptr + chunk - ((flags & 2) ? 16 : 8);
        bool clear = engine_block_clear_fast(&engine, *engine.gate, ptr);
        if (clear) {
            cleared++;
            cr_assert_not(block_in_danger((uintptr_t)ptr, end),
                          "cleared a block [%#lx, %#lx) whose free releases pages",
                          (unsigned long)(uintptr_t)ptr, (unsigned long)end);
            touching_cleared += page_index_any_used(&engine.registry.index, (uintptr_t)ptr, end);
        }
    }
    return cleared;
}

/* The map entry of the granule at granule, recomputed from scratch from
 * the registry (see struct engine_free_view): what the engine keeps up to
 * date piece by piece must equal it. */
static uint64_t expected_entry(uintptr_t granule)
{
    uintptr_t reach = ENGINE_WINDOW_LIMIT;
    uintptr_t dangers[64][2];
    size_t count = 0;
    uintptr_t cursor = granule, from, to;
    while (cursor < granule + reach + PAGE && count < 64 &&
           lock_bytes_next(&engine.lock_bytes, cursor, &from, &to)) {
        dangers[count][0] = from;
        dangers[count][1] = to;
        count++;
        cursor = to;
    }
    if (count == 0 || dangers[0][0] >= granule + reach)
        return 0;
    if (dangers[0][0] > granule)
        return reach - (dangers[0][0] - granule);
    if (dangers[0][1] >= granule + PAGE_INDEX_GRANULE)
        return reach;
    uintptr_t b = dangers[0][1] - granule;
    uintptr_t next = count > 1 && dangers[1][0] < granule + reach ? dangers[1][0] - granule : reach;
    return next > b ? engine_window_after_entry(b, next) : reach;
}

/* Returns how many entries it compared that see a danger (not vacuous). */
static size_t expect_window_exact(char *memory, size_t size)
{
    size_t seeing = 0;
    cr_assert_not_null(engine.window_entries, "the window is mapped");
    uintptr_t window = engine.free_view.window_start;
    for (uintptr_t granule = (uintptr_t)memory; granule < (uintptr_t)memory + size;
         granule += PAGE_INDEX_GRANULE) {
        if (granule < window || granule - window >= ENGINE_WINDOW_BYTES)
            continue;
        uint64_t entry = engine.window_entries[(granule - window) >> PAGE_INDEX_GRANULE_SHIFT];
        uint64_t expected = expected_entry(granule);
        cr_assert_eq(entry, expected, "granule %#lx: entry %#llx, recomputed %#llx",
                     (unsigned long)granule, (unsigned long long)entry,
                     (unsigned long long)expected);
        seeing += entry != 0;
    }
    return seeing;
}

Test(engine, free_fast_checks_never_clear_a_block_whose_free_releases_pages, .timeout = 60)
{
    size_t size = 256 << 20;
    char *memory = mmap(NULL, size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert_neq(memory, MAP_FAILED);
    /* A second region 128 GiB further on: outside the window. */
    char *far = mmap(memory + ((size_t)128 << 30), size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    engine_enable_window(&engine);
    unsigned seed = 4242;
    size_t cleared = 0, checked = 0, seeing = 0;
    for (int round = 0; round < 60; round++) {
        for (int i = 0; i < 20; i++) {
            char *region = far != MAP_FAILED && next_random(&seed) % 4 == 0 ? far : memory;
            uintptr_t start = (uintptr_t)region + (next_random(&seed) % (size / PAGE - 64)) * PAGE;
            size_t pages = 16 + next_random(&seed) % 48;
            if (next_random(&seed) % 3 == 0)
                unlock(start, start + pages * PAGE, RELEASE_MUNLOCK);
            else
                lock(start + next_random(&seed) % PAGE, pages * PAGE);
        }
        cleared += check_blocks(memory, size, &seed, 3000);
        seeing += expect_window_exact(memory, size);
        if (far != MAP_FAILED)
            cleared += check_blocks(far, size, &seed, 1000);
        checked += far != MAP_FAILED ? 4000 : 3000;
    }
    /* Not vacuous: most blocks are cleared, not all, and blocks beside the
     * locked bytes on registered pages among them. */
    cr_assert_gt(cleared, checked / 2, "cleared %zu of %zu", cleared, checked);
    cr_assert_lt(cleared, checked, "cleared every block");
    cr_assert_gt(touching_cleared, 0, "no block on a registered page was cleared");
    cr_assert_gt(seeing, 0, "the window's entries were compared where they see a danger");
    unlock((uintptr_t)memory, (uintptr_t)memory + size, RELEASE_MUNMAP);
    if (far != MAP_FAILED) {
        unlock((uintptr_t)far, (uintptr_t)far + size, RELEASE_MUNMAP);
        munmap(far, size);
    }
    munmap(memory, size);
}

/* Lone pages and small clusters, closer and further apart than an entry
 * looks ahead: each lock and unlock rewrites the entries below it up to
 * the nearest danger, and stops early where nothing changes. After every
 * step the map must equal the one recomputed from the registry. */
Test(engine, window_entries_stay_exact_around_lone_pages, .timeout = 60)
{
    size_t size = 128 << 20;
    char *memory = mmap(NULL, size, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert_neq(memory, MAP_FAILED);
    struct engine_options every_lock = options(false, 0);
    every_lock.min_bytes = 1;
    restart_engine(every_lock);
    engine_enable_window(&engine);
    enum { SPOTS = 96 };
    uintptr_t spots[SPOTS];
    bool locked[SPOTS] = {false};
    unsigned seed = 77;
    /* Gaps of 1 to 400 pages: some within an entry's reach (255), some not. */
    uintptr_t at = (uintptr_t)memory + 16 * PAGE;
    for (int i = 0; i < SPOTS; i++) {
        spots[i] = at;
        at += (1 + next_random(&seed) % 400) * PAGE;
        cr_assert_lt(at, (uintptr_t)memory + size - 8 * PAGE);
    }
    size_t lone_changes = 0, seeing = 0;
    for (int step = 0; step < 600; step++) {
        int i = (int)(next_random(&seed) % SPOTS);
        if (locked[i]) {
            unlock(spots[i], spots[i] + PAGE, RELEASE_MUNLOCK);
        } else {
            /* Some locks end inside their page: the entry there keeps the
             * end and what comes after it. */
            size_t length = next_random(&seed) % 3 == 0 ? 64 + next_random(&seed) % 2000 : PAGE;
            lock(spots[i], length);
        }
        locked[i] = !locked[i];
        bool alone = (i == 0 || !locked[i - 1] || spots[i] - spots[i - 1] > ENGINE_WINDOW_LIMIT);
        lone_changes += alone;
        seeing += expect_window_exact(memory, size);
    }
    cr_assert_gt(lone_changes, 100, "lone pages were locked and unlocked");
    cr_assert_gt(seeing, 600 * 255, "the entries compared see the locked pages");
    unlock((uintptr_t)memory, (uintptr_t)memory + size, RELEASE_MUNMAP);
    munmap(memory, size);
}

/* With no record, and for blocks above every record, one compare clears. */
Test(engine, free_fast_check_gate)
{
    engine_enable_window(&engine);
    char block[64];
    ((size_t *)(block + 16))[-1] = 48;
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, block + 16), "no record");
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, NULL));
    lock(A(0), 64 * PAGE);
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, NULL), "NULL");
    cr_assert_eq(*engine.gate, A(64 * PAGE));
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, (void *)A(64 * PAGE)),
              "the first byte above the span");
    unlock(A(0), A(64 * PAGE), RELEASE_MUNLOCK);
    cr_assert_eq(*engine.gate, 0, "no record: the gate is closed again");
}

/* ---- NUMA placement (issue 29) ---- */

/* Pages lie on node 0 below arena + 16 MiB and on node 1 above; the mock's
 * devices sit nearest node device % 2, device 3 nowhere known. */
#define NUMA_SPLIT ((uintptr_t)16 << 20)

static bool mock_page_nodes(void *context, uintptr_t start, uintptr_t end,
                            struct numa_placement *out)
{
    (void)context;
    uintptr_t split = (uintptr_t)arena + NUMA_SPLIT;
    if (start < split)
        out->bytes[0] += (end < split ? end : split) - start;
    if (end > split)
        out->bytes[1] += end - (start > split ? start : split);
    return true;
}

static int mock_device_node(void *context, const struct range_place *place)
{
    (void)context;
    return place->device == 3 ? -1 : place->device % 2;
}

static struct engine_backend numa_backend;

static void restart_with_numa(bool numa)
{
    numa_backend = mock_backend;
    numa_backend.page_nodes = mock_page_nodes;
    numa_backend.device_node = mock_device_node;
    struct engine_options wanted = options(false, 0);
    wanted.numa = numa;
    engine_destroy(&engine);
    cr_assert(engine_init(&engine, &numa_backend, &wanted));
}

/* Bytes by node, local to the registration's device or remote, the device's
 * node; one warning for the process, however much is remote. */
Test(engine, numa_bytes_by_node_local_and_remote)
{
    restart_with_numa(true);
    uint64_t warnings = log_warning_count();
    mock.device = 1;                           /* nearest node 1 */
    lock(A(0), 32 << 20);                      /* 16 MiB on node 0 (remote), 16 on node 1 */
    lock(A(NUMA_SPLIT + (32 << 20)), 8 << 20); /* 8 MiB on node 1 (local) */
    mock.device = 3;                           /* node unknown */
    lock(A(NUMA_SPLIT + (64 << 20)), 4 << 20);
    struct engine_statistics *statistics = engine_stats(&engine);
    cr_assert_eq(statistics->numa_nodes[0].bytes, 16 << 20);
    cr_assert_eq(statistics->numa_nodes[0].local_bytes, 0);
    cr_assert_eq(statistics->numa_nodes[1].bytes, (16 + 8 + 4) << 20);
    cr_assert_eq(statistics->numa_nodes[1].local_bytes, (16 + 8) << 20);
    cr_assert_eq(statistics->numa_remote_bytes, 16 << 20);
    cr_assert_eq(statistics->device_nodes[1], 1);
    cr_assert_eq(statistics->device_nodes[3], -1);
    cr_assert_eq(statistics->device_nodes[0], -1, "a device never used stays unknown");
    cr_assert_eq(log_warning_count() - warnings, 1, "remote memory is warned about once");
    mock.device = 0; /* nearest node 0: the 16 MiB on node 1 are remote now */
    unlock(A(0), A(32 << 20), RELEASE_MUNLOCK);
    lock(A(0), 32 << 20);
    cr_assert_eq(statistics->numa_remote_bytes, (16 + 16) << 20);
    cr_assert_eq(statistics->numa_nodes[0].local_bytes, 16 << 20);
    cr_assert_eq(log_warning_count() - warnings, 1);
}

Test(engine, numa_off_counts_nothing)
{
    restart_with_numa(false);
    mock.device = 1;
    lock(A(0), 32 << 20);
    cr_assert_eq(engine_stats(&engine)->numa_nodes[0].bytes, 0);
    cr_assert_eq(engine_stats(&engine)->numa_nodes[1].bytes, 0);
    cr_assert_eq(engine_stats(&engine)->device_nodes[1], -1);
}
