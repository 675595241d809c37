/* The engine driven through a scripted backend, without LD_PRELOAD: the
 * backend keeps CUDA's rules (overlap refused with 712, unregister only by the
 * registered base) and records what it was asked. */
#include "engine.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE ((uintptr_t)4096)
#define MAX_RANGES 4096

struct mock_range {
    uintptr_t base, length;
    bool foreign; /* registered "by the program", not the engine */
};

static struct {
    pthread_mutex_t mutex;
    struct mock_range ranges[MAX_RANGES];
    size_t count;
    unsigned register_calls, unregister_calls;
    unsigned fail_register_every, fail_unregister_every;
    int fail_error;
    bool ready;
    unsigned overlap_violations;
    useconds_t register_delay;
    bool count_only; /* many-range tests: keep a count, not the ranges */
    long live_count;
} mock = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static bool mock_ready(void *context)
{
    (void)context;
    return mock.ready;
}

static int mock_register(void *context, void *base, size_t length)
{
    (void)context;
    if (mock.register_delay)
        usleep(mock.register_delay);
    pthread_mutex_lock(&mock.mutex);
    int result = 0;
    mock.register_calls++;
    if (mock.count_only) {
        mock.live_count++;
        pthread_mutex_unlock(&mock.mutex);
        return 0;
    }
    uintptr_t start = (uintptr_t)base, end = start + length;
    if (mock.fail_register_every && mock.register_calls % mock.fail_register_every == 0) {
        result = mock.fail_error;
        goto out;
    }
    for (size_t i = 0; i < mock.count; i++) {
        struct mock_range *r = &mock.ranges[i];
        if (start < r->base + r->length && r->base < end) {
            if (!r->foreign)
                mock.overlap_violations++;
            result = ENGINE_CUDA_ALREADY_REGISTERED;
            goto out;
        }
    }
    cr_assert_lt(mock.count, MAX_RANGES);
    mock.ranges[mock.count++] = (struct mock_range){start, length, false};
out:
    pthread_mutex_unlock(&mock.mutex);
    return result;
}

static int mock_unregister(void *context, void *base)
{
    (void)context;
    pthread_mutex_lock(&mock.mutex);
    int result = ENGINE_CUDA_NOT_REGISTERED;
    mock.unregister_calls++;
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

static const char *mock_error_name(void *context, int error)
{
    (void)context;
    return error == 2 ? "cudaErrorMemoryAllocation" : NULL;
}

static const struct engine_backend mock_backend = {
    .ready = mock_ready,
    .register_range = mock_register,
    .unregister_range = mock_unregister,
    .error_name = mock_error_name,
};

static struct engine engine;
static char *arena; /* addresses only: the mock never touches memory */

static void setup(void)
{
    pthread_mutex_lock(&mock.mutex);
    mock.count = 0;
    mock.register_calls = mock.unregister_calls = 0;
    mock.fail_register_every = mock.fail_unregister_every = 0;
    mock.fail_error = 2;
    mock.ready = true;
    mock.overlap_violations = 0;
    mock.register_delay = 0;
    mock.count_only = false;
    mock.live_count = 0;
    pthread_mutex_unlock(&mock.mutex);
    cr_assert(engine_init(&engine, &mock_backend, 64 * 1024, PAGE));
    arena = (char *)(uintptr_t)0x7e0000000000;
}

static void teardown(void)
{
    engine_destroy(&engine);
}

TestSuite(engine, .init = setup, .fini = teardown);

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
    engine_after_lock(&engine, A(100), 128 * 1024, engine_unlock_sequence(&engine));
    uintptr_t expected[] = {A(0), A(0) + 33 * PAGE};
    expect_ranges(expected, 1);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 1);
    cr_assert_eq(counters.register_bytes, 33 * PAGE);
    cr_assert(engine_is_registered(&engine, A(0)));
    cr_assert(engine_is_registered(&engine, A(33 * PAGE - 1)));
    cr_assert_not(engine_is_registered(&engine, A(33 * PAGE)));
}

Test(engine, lock_below_min_bytes_is_skipped_and_counted)
{
    engine_after_lock(&engine, A(0), 64 * 1024 - 1, engine_unlock_sequence(&engine));
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_skipped_small, 1);
    cr_assert_eq(mock.register_calls, 0);
}

Test(engine, relocking_registers_nothing_new)
{
    engine_after_lock(&engine, A(0), 32 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(0), 32 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(PAGE), 20 * PAGE, engine_unlock_sequence(&engine));
    uintptr_t expected[] = {A(0), A(32 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(mock.register_calls, 1);
}

Test(engine, overlapping_and_adjacent_locks_never_overlap)
{
    engine_after_lock(&engine, A(16 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(0), 64 * PAGE,
                      engine_unlock_sequence(&engine)); /* covers it: two gaps */
    engine_after_lock(&engine, A(64 * PAGE), 16 * PAGE,
                      engine_unlock_sequence(&engine)); /* adjacent after */
    uintptr_t expected[] = {A(0),         A(16 * PAGE), A(16 * PAGE), A(32 * PAGE),
                            A(32 * PAGE), A(64 * PAGE), A(64 * PAGE), A(80 * PAGE)};
    expect_ranges(expected, 4);
}

Test(engine, partial_release_reregisters_what_stays_locked)
{
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    struct engine_ticket ticket = {0};
    engine_release(&engine, A(16 * PAGE), A(32 * PAGE), RELEASE_MUNLOCK, &ticket);
    uintptr_t expected[] = {A(0), A(16 * PAGE), A(32 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 2);
    cr_assert_not_null(ticket.head);
    cr_assert_eq(ticket.head->start, A(16 * PAGE));
    cr_assert_eq(ticket.head->end, A(32 * PAGE));
    cr_assert_null(ticket.head->next);
    engine_ticket_discard(&engine, &ticket);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_ok, 1);
    cr_assert_eq(counters.unregister_munlock, 1);
    cr_assert_eq(counters.register_ok, 3);
}

Test(engine, release_spanning_several_ranges)
{
    engine_after_lock(&engine, A(0), 16 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(20 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(40 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    engine_release(&engine, A(8 * PAGE), A(44 * PAGE), RELEASE_MUNMAP, NULL);
    uintptr_t expected[] = {A(0), A(8 * PAGE), A(44 * PAGE), A(56 * PAGE)};
    expect_ranges(expected, 2);
}

/* free's lock-free answer: a range overlaps a registration only if it meets a
 * registered page; the span that clears most blocks with one load holds every
 * registration, also after the last one went and new ones came elsewhere. */
Test(engine, may_overlap_follows_the_registrations)
{
    cr_assert_not(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "nothing registered");
    engine_after_lock(&engine, A(20 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(60 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    cr_assert(engine_may_overlap(&engine, A(20 * PAGE), A(20 * PAGE) + 1));
    cr_assert(engine_may_overlap(&engine, A(75 * PAGE) + 100, A(75 * PAGE) + 101), "last byte");
    cr_assert(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "a block holding both");
    cr_assert_not(engine_may_overlap(&engine, A(0), A(20 * PAGE)), "just below");
    cr_assert_not(engine_may_overlap(&engine, A(76 * PAGE), A(200 * PAGE)), "just above");
    cr_assert_not(engine_may_overlap(&engine, A(40 * PAGE), A(50 * PAGE)), "between the two");
    cr_assert(engine_may_overlap(&engine, A(19 * PAGE) + 8, A(20 * PAGE) + 8), "shares a page");

    engine_release(&engine, A(0), A(200 * PAGE), RELEASE_MUNMAP, NULL);
    cr_assert_not(engine_may_overlap(&engine, A(0), A(200 * PAGE)), "all released");
    /* A new registration below the old span, then one above it. */
    engine_after_lock(&engine, A(2 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    cr_assert(engine_may_overlap(&engine, A(2 * PAGE), A(3 * PAGE)));
    cr_assert_not(engine_may_overlap(&engine, A(20 * PAGE), A(76 * PAGE)), "old ranges gone");
    engine_after_lock(&engine, A(150 * PAGE), 16 * PAGE, engine_unlock_sequence(&engine));
    cr_assert(engine_may_overlap(&engine, A(165 * PAGE), A(166 * PAGE)));
    cr_assert(engine_may_overlap(&engine, A(2 * PAGE), A(3 * PAGE)));
    cr_assert_lt(engine.span_start, A(2 * PAGE) + 1);
    cr_assert_geq(engine.span_end, A(166 * PAGE));
}

Test(engine, release_inside_an_allocation_like_memtester)
{
    /* Lock at an aligned offset inside a larger block, then free the block. */
    engine_after_lock(&engine, A(3 * PAGE), 100 * PAGE, engine_unlock_sequence(&engine));
    engine_release(&engine, A(0), A(110 * PAGE), RELEASE_FREE, NULL);
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_free, 1);
    cr_assert_eq(counters.live_bytes, 0);
    cr_assert_eq(counters.peak_bytes, 100 * PAGE);
}

Test(engine, restore_after_failed_unlock)
{
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    struct engine_ticket ticket = {0};
    engine_release(&engine, A(0), A(64 * PAGE), RELEASE_MUNLOCK, &ticket);
    expect_ranges(NULL, 0);
    engine_restore(&engine, &ticket, A(16 * PAGE), UINTPTR_MAX);
    uintptr_t expected[] = {A(16 * PAGE), A(64 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_null(ticket.head);
}

Test(engine, already_registered_range_is_never_unregistered)
{
    pthread_mutex_lock(&mock.mutex);
    mock.ranges[mock.count++] = (struct mock_range){A(0), 64 * PAGE, true};
    pthread_mutex_unlock(&mock.mutex);
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_already_registered, 1);
    cr_assert_eq(counters.register_failed, 0);
    cr_assert_eq(counters.live_ranges, 0);
    engine_release(&engine, A(0), A(64 * PAGE), RELEASE_FREE, NULL);
    cr_assert_eq(mock.unregister_calls, 0);
}

Test(engine, failed_registration_leaves_nothing_and_is_retried_later)
{
    mock.fail_register_every = 1;
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    expect_ranges(NULL, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_failed, 1);
    struct engine_error_count errors[4];
    cr_assert_eq(engine_get_errors(&engine, errors, 4), 1);
    cr_assert_eq(errors[0].code, 2);
    cr_assert_eq(errors[0].count, 1);
    mock.fail_register_every = 0;
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    uintptr_t expected[] = {A(0), A(64 * PAGE)};
    expect_ranges(expected, 1);
}

Test(engine, failed_unregistration_is_counted_and_forgotten)
{
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    mock.fail_unregister_every = 1;
    engine_release(&engine, A(0), A(64 * PAGE), RELEASE_MUNMAP, NULL);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_failed, 1);
    cr_assert_eq(counters.unregister_munmap, 1);
    cr_assert_eq(counters.live_ranges, 0);
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, no_runtime_means_no_registration)
{
    mock.ready = false;
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    cr_assert_eq(mock.register_calls, 0);
    cr_assert_eq(engine.skipped_disabled, 1);
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, shutdown_unregisters_everything_and_records_live)
{
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    engine_after_lock(&engine, A(100 * PAGE), 32 * PAGE, engine_unlock_sequence(&engine));
    engine_shutdown(&engine);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine.live_ranges_at_exit, 2);
    cr_assert_eq(engine.live_bytes_at_exit, 96 * PAGE);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_exit, 2);
    engine_after_lock(&engine, A(0), 64 * PAGE,
                      engine_unlock_sequence(&engine)); /* after exit: nothing */
    cr_assert_not(engine_has_registrations(&engine));
}

Test(engine, fork_reset_forgets_without_unregistering)
{
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    engine_reset_after_fork(&engine);
    cr_assert_not(engine_has_registrations(&engine));
    cr_assert_eq(mock.unregister_calls, 0);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 0);
}

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
            engine_after_lock(&engine, first, pages * PAGE, engine_unlock_sequence(&engine));
        else
            engine_release(&engine, first, first + pages * PAGE, RELEASE_MUNLOCK, NULL);
    }
    engine_release(&engine, worker->base, worker->base + 128 * PAGE, RELEASE_FREE, NULL);
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

/* A lock whose registration comes after an unlock of a shared page was noted:
 * that page may be unlocked in the kernel by now and stays unregistered. */
Test(engine, unlock_noted_during_a_lock_keeps_the_shared_page_out)
{
    uint64_t before = engine_unlock_sequence(&engine);
    engine_note_unlock(&engine, A(16 * PAGE), A(32 * PAGE)); /* a neighbour's munlock */
    engine_after_lock(&engine, A(0), 17 * PAGE, before);
    uintptr_t expected[] = {A(0), A(16 * PAGE)};
    expect_ranges(expected, 1);
    cr_assert_eq(engine.skipped_race, 1);
    /* A later lock, after the unlock, registers the page again. */
    engine_after_lock(&engine, A(0), 17 * PAGE, engine_unlock_sequence(&engine));
    uintptr_t both[] = {A(0), A(16 * PAGE), A(16 * PAGE), A(17 * PAGE)};
    expect_ranges(both, 2);
}

/* An unlock still running (between its release and its system call) keeps
 * the pages it touches out, whatever sequence the lock read. */
Test(engine, running_unlock_keeps_its_pages_out)
{
    int token = engine_begin_unlock(&engine, A(16 * PAGE), A(32 * PAGE));
    engine_after_lock(&engine, A(0), 17 * PAGE, engine_unlock_sequence(&engine));
    uintptr_t expected[] = {A(0), A(16 * PAGE)};
    expect_ranges(expected, 1);
    engine_end_unlock(&engine, token, A(16 * PAGE), A(32 * PAGE));
    engine_after_lock(&engine, A(0), 17 * PAGE, engine_unlock_sequence(&engine));
    uintptr_t both[] = {A(0), A(16 * PAGE), A(16 * PAGE), A(17 * PAGE)};
    expect_ranges(both, 2);
}

Test(engine, unlock_in_the_middle_splits_the_registration)
{
    uint64_t before = engine_unlock_sequence(&engine);
    engine_note_unlock(&engine, A(8 * PAGE), A(9 * PAGE));
    engine_after_lock(&engine, A(0), 32 * PAGE, before);
    uintptr_t expected[] = {A(0), A(8 * PAGE), A(9 * PAGE), A(32 * PAGE)};
    expect_ranges(expected, 2);
}

Test(engine, too_many_unlocks_meanwhile_register_nothing)
{
    uint64_t before = engine_unlock_sequence(&engine);
    for (int i = 0; i <= ENGINE_RECENT_UNLOCKS; i++)
        engine_note_unlock(&engine, A(1000 * PAGE), A(1001 * PAGE));
    engine_after_lock(&engine, A(0), 32 * PAGE, before);
    expect_ranges(NULL, 0);
    cr_assert_eq(engine.skipped_race, 32);
}

/* Many registrations released at once (exit, munlockall, munmap of a region)
 * and a lock over many gaps: each step continues where the last one stopped,
 * so this runs in linear time (it took minutes when each step rescanned). */
Test(engine, many_ranges_release_and_fill, .timeout = 120)
{
    enum { COUNT = 100000 };
    mock.count_only = true;
    for (uintptr_t i = 0; i < COUNT; i++)
        engine_after_lock(&engine, A(2 * i * 16 * PAGE), 16 * PAGE,
                          engine_unlock_sequence(&engine));
    /* Every other 16-page block is registered; now lock the whole span. */
    engine_after_lock(&engine, A(0), 2 * COUNT * 16 * PAGE, engine_unlock_sequence(&engine));
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, 2 * COUNT);
    cr_assert_eq(counters.live_bytes, 2 * COUNT * 16 * PAGE);
    cr_assert_eq(mock.live_count, 2 * COUNT);
    engine_shutdown(&engine);
    cr_assert_eq(mock.live_count, 0);
    cr_assert_eq(engine.live_ranges_at_exit, 2 * COUNT);
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_exit, 2 * COUNT);
    cr_assert_not(engine_has_registrations(&engine));
}

/* The kernel's answer when too many unlocks raced a lock: pages 4-12 locked. */
static bool mock_locked_parts(void *context, uintptr_t start, uintptr_t end,
                              void (*found)(void *, uintptr_t, uintptr_t), void *found_context)
{
    (void)context;
    uintptr_t from = start > A(4 * PAGE) ? start : A(4 * PAGE);
    uintptr_t to = end < A(12 * PAGE) ? end : A(12 * PAGE);
    if (from < to)
        found(found_context, from, to);
    return true;
}

Test(engine, too_many_unlocks_meanwhile_ask_the_kernel)
{
    static struct engine_backend asking;
    asking = mock_backend;
    asking.locked_parts = mock_locked_parts;
    engine_destroy(&engine);
    cr_assert(engine_init(&engine, &asking, 64 * 1024, PAGE));
    uint64_t before = engine_unlock_sequence(&engine);
    for (int i = 0; i <= ENGINE_RECENT_UNLOCKS; i++)
        engine_note_unlock(&engine, A(1000 * PAGE), A(1001 * PAGE));
    engine_after_lock(&engine, A(0), 32 * PAGE, before);
    uintptr_t expected[] = {A(4 * PAGE), A(12 * PAGE)};
    expect_ranges(expected, 1);
}

static void *slow_locker(void *argument)
{
    (void)argument;
    engine_after_lock(&engine, A(0), 64 * PAGE, engine_unlock_sequence(&engine));
    return NULL;
}

/* A release that meets a registration still in flight waits for it, then
 * unregisters it: never a stale registration, never an overlap. */
Test(engine, release_waits_for_registration_in_flight)
{
    mock.register_delay = 200000;
    pthread_t thread;
    pthread_create(&thread, NULL, slow_locker, NULL);
    while (!engine_has_registrations(&engine))
        usleep(1000);
    engine_release(&engine, A(0), A(64 * PAGE), RELEASE_MUNLOCK, NULL);
    pthread_join(thread, NULL);
    expect_ranges(NULL, 0);
    cr_assert_eq(mock.unregister_calls, 1);
}
