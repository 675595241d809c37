/* The rules that depend on the page size, at the page sizes of the hosts the
 * shim runs on: 4 KiB (x86-64, most aarch64 kernels), 16 KiB and 64 KiB (the
 * aarch64 kernels of many GH200/GB200 nodes). The engine takes its page size
 * from engine_options (the runtime passes sysconf's), here injected; the page
 * index and the registry track 4 KiB granules, of which every page is a whole
 * number. A scripted backend keeps CUDA's rules (overlap refused with 712,
 * unregister only by the registered base) and checks that every registration
 * is made of whole pages. */
#include "block_extent.h"
#include "engine.h"
#include "mock_codes.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KIB ((uintptr_t)1024)
#define MAX_RANGES 64

/* The page sizes each test runs at. */
static uintptr_t page_sizes[] = {4 * KIB, 16 * KIB, 64 * KIB};

struct registered_range {
    uintptr_t base, length;
};

static struct {
    pthread_mutex_t mutex;
    struct registered_range ranges[MAX_RANGES];
    size_t count;
    unsigned register_calls, unregister_calls;
    unsigned overlaps;      /* registrations CUDA would refuse with 712 */
    unsigned partial_pages; /* registrations not made of whole pages */
    uintptr_t page;         /* the page size the engine was given */
    uintptr_t max_bytes;    /* larger registrations are refused (2); 0: none */
} backend = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static enum engine_choice choose_place(void *context, bool from_worker,
                                       const struct range_place *hint, struct range_place *place)
{
    (void)context;
    (void)from_worker;
    (void)hint;
    *place = (struct range_place){.device = 0};
    return ENGINE_PLACE_READY;
}

static int register_range_code(void *context, struct range_place *place, void *base, size_t length)
{
    (void)context;
    (void)place;
    uintptr_t start = (uintptr_t)base, end = start + length;
    pthread_mutex_lock(&backend.mutex);
    backend.register_calls++;
    if (start % backend.page != 0 || length % backend.page != 0 || length == 0)
        backend.partial_pages++;
    int result = backend.max_bytes != 0 && length > backend.max_bytes ? 2 : MOCK_OK;
    for (size_t i = 0; i < backend.count && result == MOCK_OK; i++) {
        const struct registered_range *range = &backend.ranges[i];
        if (start < range->base + range->length && range->base < end) {
            backend.overlaps++;
            result = MOCK_ALREADY_REGISTERED;
        }
    }
    if (result == MOCK_OK && backend.count < MAX_RANGES)
        backend.ranges[backend.count++] = (struct registered_range){start, length};
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static struct engine_result register_range(void *context, struct range_place *place, void *base,
                                           size_t length)
{
    return mock_result(register_range_code(context, place, base, length));
}

static int unregister_range_code(void *context, const struct range_place *place, void *base)
{
    (void)context;
    (void)place;
    pthread_mutex_lock(&backend.mutex);
    backend.unregister_calls++;
    int result = MOCK_NOT_REGISTERED;
    for (size_t i = 0; i < backend.count; i++) {
        if (backend.ranges[i].base == (uintptr_t)base) {
            backend.ranges[i] = backend.ranges[--backend.count];
            result = MOCK_OK;
            break;
        }
    }
    pthread_mutex_unlock(&backend.mutex);
    return result;
}

static struct engine_result unregister_range(void *context, const struct range_place *place,
                                             void *base, size_t length)
{
    (void)length;
    return mock_result(unregister_range_code(context, place, base));
}

static const struct engine_backend scripted_backend = {
    .choose_place = choose_place,
    .register_range = register_range,
    .unregister_range = unregister_range,
};

static struct engine engine;
/* Addresses only (the backend never touches memory), aligned to every page size. */
static const uintptr_t arena = 0x7e0000000000;
#define A(offset) (arena + (uintptr_t)(offset))

/* The engine at this page size: locks of at least min_bytes register,
 * synchronously, in registrations of at most max_registration bytes (0: no
 * limit). */
static void start_engine(uintptr_t page, uint64_t min_bytes, uint64_t max_registration)
{
    pthread_mutex_lock(&backend.mutex);
    backend.count = 0;
    backend.register_calls = backend.unregister_calls = 0;
    backend.overlaps = backend.partial_pages = 0;
    backend.page = page;
    backend.max_bytes = 0;
    pthread_mutex_unlock(&backend.mutex);
    struct engine_options options = {.min_bytes = min_bytes,
                                     .max_registration_bytes = max_registration,
                                     .asynchronous = false,
                                     .onfault = ENGINE_ONFAULT_RESIDENT,
                                     .page_size = page};
    cr_assert(engine_init(&engine, &scripted_backend, &options));
    cr_assert_eq(engine.options.page_size, page, "the engine uses a page of %#lx bytes, not %#lx",
                 (unsigned long)engine.options.page_size, (unsigned long)page);
}

static void stop_engine(void)
{
    engine_destroy(&engine);
}

static long succeed(void *arguments)
{
    (void)arguments;
    return 0;
}

static const struct engine_call succeeds = {succeed, NULL, "test"};

static void lock(uintptr_t addr, size_t length)
{
    cr_assert_eq(engine_lock(&engine, addr, length, 0, &succeeds), 0);
}

static uintptr_t page_floor(uintptr_t addr, uintptr_t page)
{
    return addr & ~(page - 1);
}

static uintptr_t page_ceil(uintptr_t addr, uintptr_t page)
{
    return (addr + page - 1) & ~(page - 1);
}

/* munlock(addr, length): the kernel unlocks every page the bytes touch, and
 * the interposed munlock hands the engine those pages. */
static void munlock_bytes(uintptr_t addr, size_t length, uintptr_t page)
{
    cr_assert_eq(engine_unlock(&engine, page_floor(addr, page), page_ceil(addr + length, page),
                               RELEASE_MUNLOCK, ENGINE_FAILED_CHANGED_NOTHING, &succeeds),
                 0);
}

/* free of the block [start, end): its usable bytes. */
static void free_block(uintptr_t start, uintptr_t end)
{
    cr_assert_eq(engine_release_block(&engine, start, end, RELEASE_FREE, false, &succeeds), 0);
}

static int by_base(const void *a, const void *b)
{
    const struct registered_range *x = a, *y = b;
    return x->base < y->base ? -1 : x->base > y->base;
}

/* The backend holds exactly the [start, end) pairs of expected, sorted, and
 * the engine agrees page for page. */
static void expect_ranges(const uintptr_t *expected, size_t pairs, uintptr_t page)
{
    pthread_mutex_lock(&backend.mutex);
    struct registered_range sorted[MAX_RANGES];
    size_t count = backend.count;
    memcpy(sorted, backend.ranges, count * sizeof(*sorted));
    unsigned overlaps = backend.overlaps, partial_pages = backend.partial_pages;
    pthread_mutex_unlock(&backend.mutex);
    qsort(sorted, count, sizeof(*sorted), by_base);
    cr_assert_eq(overlaps, 0, "a registration overlapped another (CUDA refuses it with 712)");
    cr_assert_eq(partial_pages, 0, "a registration was not made of whole %lu KiB pages",
                 (unsigned long)(page / KIB));
    cr_assert_eq(count, pairs, "page %lu KiB: %zu registrations, expected %zu",
                 (unsigned long)(page / KIB), count, pairs);
    for (size_t i = 0; i < pairs; i++) {
        cr_assert_eq(sorted[i].base, expected[2 * i],
                     "page %lu KiB: registration %zu starts at +%#lx, expected +%#lx",
                     (unsigned long)(page / KIB), i, (unsigned long)(sorted[i].base - arena),
                     (unsigned long)(expected[2 * i] - arena));
        cr_assert_eq(sorted[i].base + sorted[i].length, expected[2 * i + 1],
                     "page %lu KiB: registration %zu ends at +%#lx, expected +%#lx",
                     (unsigned long)(page / KIB), i,
                     (unsigned long)(sorted[i].base + sorted[i].length - arena),
                     (unsigned long)(expected[2 * i + 1] - arena));
    }
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.live_ranges, pairs);
    uintptr_t bytes = 0;
    for (size_t i = 0; i < pairs; i++) {
        bytes += expected[2 * i + 1] - expected[2 * i];
        /* The engine's own view: the first and last byte of each range, and
         * the bytes on either side unless another range holds them. */
        cr_assert(engine_is_registered(&engine, expected[2 * i]));
        cr_assert(engine_is_registered(&engine, expected[2 * i + 1] - 1));
        bool joined_below = i > 0 && expected[2 * i - 1] == expected[2 * i];
        bool joined_above = i + 1 < pairs && expected[2 * i + 2] == expected[2 * i + 1];
        if (!joined_below)
            cr_assert_not(engine_is_registered(&engine, expected[2 * i] - 1));
        if (!joined_above)
            cr_assert_not(engine_is_registered(&engine, expected[2 * i + 1]));
    }
    cr_assert_eq(counters.live_bytes, bytes);
}

#define EXPECT_RANGES(page, ...)                                                                   \
    do {                                                                                           \
        const uintptr_t expected_[] = {__VA_ARGS__};                                               \
        expect_ranges(expected_, sizeof(expected_) / sizeof(*expected_) / 2, page);                \
    } while (0)
#define EXPECT_NO_RANGES(page) expect_ranges(NULL, 0, page)

ParameterizedTestParameters(page_sizes, lock_registers_every_page_it_touches)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* mlock rounds its range out to pages; so does the registration. */
ParameterizedTest(uintptr_t *size, page_sizes, lock_registers_every_page_it_touches)
{
    uintptr_t page = *size;
    start_engine(page, 1, 0);
    lock(A(page / 2 + 8), 2 * page); /* from inside page 0 into page 2 */
    EXPECT_RANGES(page, A(0), A(3 * page));
    lock(A(5 * page), 2 * page); /* whole pages */
    EXPECT_RANGES(page, A(0), A(3 * page), A(5 * page), A(7 * page));
    lock(A(8 * page - 1), 2); /* two bytes on either side of a page boundary: the run grows */
    EXPECT_RANGES(page, A(0), A(3 * page), A(5 * page), A(9 * page));
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_ok, 3);
    cr_assert_eq(counters.register_bytes, 9 * page);
    /* A byte of a registered page, even outside the lock's bytes, overlaps. */
    cr_assert(engine_may_overlap(&engine, A(1), A(2)));
    cr_assert_not(engine_may_overlap(&engine, A(3 * page), A(5 * page)), "the gap");
    stop_engine();
}

ParameterizedTestParameters(page_sizes, a_lock_inside_registered_pages_registers_nothing)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

ParameterizedTest(uintptr_t *size, page_sizes, a_lock_inside_registered_pages_registers_nothing)
{
    uintptr_t page = *size;
    start_engine(page, 1, 0);
    lock(A(100), page);                 /* pages 0 and 1 */
    lock(A(page / 2), page / 4);        /* inside page 0 */
    lock(A(2 * page - 10), 10);         /* the end of page 1 */
    lock(A(page + page / 2), page / 2); /* the rest of page 1 */
    EXPECT_RANGES(page, A(0), A(2 * page));
    cr_assert_eq(backend.register_calls, 1);
    stop_engine();
}

ParameterizedTestParameters(page_sizes, min_bytes_counts_the_lock_not_its_pages)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* PINSHIM_MIN_BYTES compares the bytes locked in a run: a 1 KiB lock on a
 * 64 KiB page stays unregistered however large its page, and small locks
 * that join one run count together. */
ParameterizedTest(uintptr_t *size, page_sizes, min_bytes_counts_the_lock_not_its_pages)
{
    uintptr_t page = *size;
    start_engine(page, 64 * KIB, 0);
    lock(A(0), KIB);
    uintptr_t second = A(2 * page + KIB); /* page 1 lies between */
    lock(second, 64 * KIB - 1);
    uintptr_t second_end = page_ceil(second + 64 * KIB - 1, page);
    EXPECT_NO_RANGES(page);
    lock(A(20 * page + 8), 64 * KIB);
    EXPECT_RANGES(page, A(20 * page), page_ceil(A(20 * page + 8 + 64 * KIB), page));
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.register_skipped_small, 2);
    /* A lock of the page between the two small ones joins them: 1 KiB +
     * (64 KiB - 1) + 1 byte is 64 KiB locked in one run. */
    lock(A(page), 1);
    EXPECT_RANGES(page, A(0), second_end, A(20 * page),
                  page_ceil(A(20 * page + 8 + 64 * KIB), page));
    stop_engine();
}

ParameterizedTestParameters(page_sizes, partial_unlocks_reregister_the_rest_in_whole_pages)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* munlock of the middle of a registration: its pages go, the rest is
 * registered again, on page boundaries. */
ParameterizedTest(uintptr_t *size, page_sizes, partial_unlocks_reregister_the_rest_in_whole_pages)
{
    uintptr_t page = *size;
    start_engine(page, 1, 0);
    lock(A(0), 8 * page);
    /* Bytes from inside page 2 to inside page 4: pages 2 to 4 are unlocked. */
    munlock_bytes(A(2 * page + 100), 2 * page, page);
    EXPECT_RANGES(page, A(0), A(2 * page), A(5 * page), A(8 * page));
    /* A few bytes inside page 6 unlock all of it. */
    munlock_bytes(A(6 * page + 10), 20, page);
    EXPECT_RANGES(page, A(0), A(2 * page), A(5 * page), A(6 * page), A(7 * page), A(8 * page));
    /* The first byte of a registration and the last. */
    munlock_bytes(A(0), 1, page);
    munlock_bytes(A(8 * page - 1), 1, page);
    EXPECT_RANGES(page, A(page), A(2 * page), A(5 * page), A(6 * page));
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_munlock, 4);
    /* The lock, the two sides of each middle cut, the rest of [1, 2). */
    cr_assert_eq(counters.register_ok, 1 + 2 + 2 + 1);
    stop_engine();
}

ParameterizedTestParameters(page_sizes, registrations_are_chunked_on_page_boundaries)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* PINSHIM_MAX_REGISTRATION that is not a whole number of pages: when the
 * driver refuses a run whole, the chunks are the whole pages below it. */
ParameterizedTest(uintptr_t *size, page_sizes, registrations_are_chunked_on_page_boundaries)
{
    uintptr_t page = *size;
    start_engine(page, 1, 2 * page + page / 2);
    backend.max_bytes = 3 * page;
    lock(A(10), 5 * page); /* pages 0 to 5 */
    EXPECT_RANGES(page, A(0), A(2 * page), A(2 * page), A(4 * page), A(4 * page), A(6 * page));
    stop_engine();
    /* Below one page: one page each. */
    start_engine(page, 1, page / 2);
    backend.max_bytes = 2 * page;
    lock(A(0), 3 * page);
    EXPECT_RANGES(page, A(0), A(page), A(page), A(2 * page), A(2 * page), A(3 * page));
    stop_engine();
    /* Taken whole, never cut. */
    start_engine(page, 1, page / 2);
    lock(A(0), 3 * page);
    EXPECT_RANGES(page, A(0), A(3 * page));
    stop_engine();
}

ParameterizedTestParameters(page_sizes, free_keeps_a_page_a_locked_neighbour_shares)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* Issue 9 item 2 at every page size: b = malloc(200) and a = malloc(100 KiB)
 * on one page; mlock(a); free(b) and the free of a block after a's end on
 * its last page leave a's registration whole; free(a) releases every page
 * it touches. */
ParameterizedTest(uintptr_t *size, page_sizes, free_keeps_a_page_a_locked_neighbour_shares)
{
    uintptr_t page = *size;
    start_engine(page, 64 * KIB, 0);
    uintptr_t b = A(page - 256), a = A(page - 32), a_bytes = 100 * KIB;
    uintptr_t a_end = page_ceil(a + a_bytes, page);
    lock(a, a_bytes);
    EXPECT_RANGES(page, A(0), a_end);
    free_block(b, b + 208);
    EXPECT_RANGES(page, A(0), a_end);
    free_block(a + a_bytes + 16, a_end + 100);
    EXPECT_RANGES(page, A(0), a_end);
    cr_assert_eq(backend.unregister_calls, 0);
    free_block(a, a + a_bytes);
    EXPECT_NO_RANGES(page);
    struct pinshim_counters counters;
    engine_get_counters(&engine, &counters);
    cr_assert_eq(counters.unregister_free, 1);
    stop_engine();
}

/* Two locked blocks share page 1 (on 64 KiB pages, two 24 KiB buffers do):
 * x ends in its first half, y starts in its second half. They are one run
 * (one page is in one registration). The free of one must not release the
 * page while the other's lock needs it. */
static void free_one_of_two_locked_blocks(uintptr_t page, bool x_first)
{
    start_engine(page, 1, 0);
    uintptr_t x = A(page / 2), x_end = A(page + page / 4);
    uintptr_t y = A(page + page / 2), y_end = A(3 * page + page / 2);
    if (x_first) {
        lock(x, x_end - x);
        lock(y, y_end - y);
    } else {
        lock(y, y_end - y);
        lock(x, x_end - x);
    }
    EXPECT_RANGES(page, A(0), A(4 * page));
    free_block(x, x_end);
    cr_assert(engine_is_registered(&engine, A(page)),
              "page %lu KiB, %s locked first: freeing x released page 1, which y's lock still "
              "needs",
              (unsigned long)(page / KIB), x_first ? "x" : "y");
    EXPECT_RANGES(page, A(page), A(4 * page));
    free_block(y, y_end);
    EXPECT_NO_RANGES(page);
    stop_engine();
}

ParameterizedTestParameters(page_sizes, free_of_the_later_locked_block_keeps_a_shared_page)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* y locked first: x's lock falls in y's registered page 1, and x's record
 * is page 0 alone. */
ParameterizedTest(uintptr_t *size, page_sizes, free_of_the_later_locked_block_keeps_a_shared_page)
{
    free_one_of_two_locked_blocks(*size, false);
}

ParameterizedTestParameters(page_sizes, free_of_the_first_locked_block_keeps_a_shared_page)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* x locked first: page 1 is in x's record, and y's lock needs it too (the
 * engine once released every page x's block touches from x's record, page 1
 * with them: y's first half page was then locked but unregistered). */
ParameterizedTest(uintptr_t *size, page_sizes, free_of_the_first_locked_block_keeps_a_shared_page)
{
    free_one_of_two_locked_blocks(*size, true);
}

ParameterizedTestParameters(page_sizes, free_inside_a_lock_releases_every_page_the_block_touches)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* The free rule for a block whose bytes the lock covered (the program locked
 * an arena of blocks): the pages the block covers whole go; one it shares
 * with a block the lock still holds stays. */
ParameterizedTest(uintptr_t *size, page_sizes,
                  free_inside_a_lock_releases_every_page_the_block_touches)
{
    uintptr_t page = *size;
    start_engine(page, 1, 0);
    lock(A(0), 16 * page);
    free_block(A(4 * page - 100), A(8 * page + 100));
    EXPECT_RANGES(page, A(0), A(4 * page), A(8 * page), A(16 * page));
    /* A block inside one page: the page keeps the lock's other bytes. */
    free_block(A(12 * page + 64), A(12 * page + 128));
    EXPECT_RANGES(page, A(0), A(4 * page), A(8 * page), A(16 * page));
    /* Its neighbours freed too, the page is held by nothing: it goes. */
    free_block(A(12 * page), A(12 * page + 64));
    free_block(A(12 * page + 128), A(13 * page));
    EXPECT_RANGES(page, A(0), A(4 * page), A(8 * page), A(12 * page), A(13 * page), A(16 * page));
    stop_engine();
}

ParameterizedTestParameters(page_sizes, free_beside_a_lock_keeps_the_pages_it_shares)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* The free rule for a block outside the lock's bytes: pages it shares with
 * the registration stay. */
ParameterizedTest(uintptr_t *size, page_sizes, free_beside_a_lock_keeps_the_pages_it_shares)
{
    uintptr_t page = *size;
    start_engine(page, 1, 0);
    lock(A(page / 2), 3 * page); /* bytes [0.5, 3.5) pages: pages 0 to 3 */
    free_block(A(8), A(page / 2));
    free_block(A(3 * page + page / 2), A(5 * page));
    EXPECT_RANGES(page, A(0), A(4 * page));
    cr_assert_eq(backend.unregister_calls, 0);
    stop_engine();
}

ParameterizedTestParameters(page_sizes, posix_memalign_rounds_large_buffers_to_whole_pages)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* posix_memalign of at least the threshold gets whole pages, page-aligned,
 * so that its lock shares no page with a neighbour: the neighbour's free
 * then leaves the registration alone, and the buffer's free takes all of it. */
ParameterizedTest(uintptr_t *size, page_sizes, posix_memalign_rounds_large_buffers_to_whole_pages)
{
    uintptr_t page = *size;
    size_t threshold = 64 * KIB;
    size_t alignment = 64, bytes = 100 * KIB + 1;
    cr_assert(block_extent_round_to_pages(page, threshold, &alignment, &bytes));
    cr_assert_eq(alignment, page);
    cr_assert_eq(bytes, page_ceil(100 * KIB + 1, page));
    cr_assert_eq(bytes % page, 0);
    /* A larger alignment is kept. */
    alignment = 2 * page;
    bytes = threshold;
    cr_assert(block_extent_round_to_pages(page, threshold, &alignment, &bytes));
    cr_assert_eq(alignment, 2 * page);
    cr_assert_eq(bytes, page_ceil(threshold, page));
    /* Below the threshold, an alignment posix_memalign rejects, and a size
     * that cannot be rounded: the call goes through as it was. */
    size_t unchanged[][2] = {{64, threshold - 1}, {0, threshold}, {3, threshold},
                             {24, threshold},     {4, threshold}, {64, SIZE_MAX - 10}};
    for (size_t i = 0; i < sizeof(unchanged) / sizeof(*unchanged); i++) {
        alignment = unchanged[i][0];
        bytes = unchanged[i][1];
        cr_assert_not(block_extent_round_to_pages(page, threshold, &alignment, &bytes),
                      "alignment %zu, %zu bytes", unchanged[i][0], unchanged[i][1]);
        cr_assert_eq(alignment, unchanged[i][0]);
        cr_assert_eq(bytes, unchanged[i][1]);
    }

    /* The rounded buffer at A(page), a small block right after it. */
    alignment = 64;
    bytes = 100 * KIB + 1;
    cr_assert(block_extent_round_to_pages(page, threshold, &alignment, &bytes));
    start_engine(page, threshold, 0);
    uintptr_t buffer = A(page), neighbour = buffer + bytes;
    lock(buffer, 100 * KIB + 1);
    EXPECT_RANGES(page, buffer, buffer + bytes);
    free_block(neighbour + 16, neighbour + 48);
    EXPECT_RANGES(page, buffer, buffer + bytes);
    free_block(buffer, buffer + bytes);
    EXPECT_NO_RANGES(page);
    stop_engine();
}

ParameterizedTestParameters(page_sizes, the_index_and_registry_hold_whole_pages)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* The registry below the engine: records of whole pages, split on a page
 * boundary, found from any byte of their pages; a byte-range query sees a
 * page from any of its granules. */
ParameterizedTest(uintptr_t *size, page_sizes, the_index_and_registry_hold_whole_pages)
{
    uintptr_t page = *size;
    struct range_registry registry;
    cr_assert(range_registry_init(&registry));
    struct range_record record = {.base = A(2 * page), .end = A(6 * page)};
    cr_assert_not_null(range_registry_insert(&registry, &record));
    struct range_record next = {.base = A(6 * page), .end = A(7 * page)};
    cr_assert_not_null(range_registry_insert(&registry, &next));
    const struct page_index *index = &registry.index;
    for (uintptr_t granule = A(2 * page); granule < A(7 * page); granule += PAGE_INDEX_GRANULE)
        cr_assert(page_index_any_used(index, granule, granule + 1));
    cr_assert_not(page_index_any_used(index, A(2 * page) - 1, A(2 * page)));
    cr_assert_not(page_index_any_used(index, A(7 * page), A(7 * page) + 1));
    /* Single bytes anywhere in a page: the last of the registration, one
     * inside a granule in its middle. */
    cr_assert(page_index_any_used(index, A(7 * page) - 1, A(7 * page)));
    cr_assert(page_index_any_used(index, A(3 * page) - 3, A(3 * page) - 2));
    cr_assert(page_index_any_used(index, A(2 * page) - 1, A(2 * page) + 1));
    /* The last granule of a page finds the page's record. */
    struct range_record *found =
        range_registry_containing(&registry, A(3 * page) - PAGE_INDEX_GRANULE + 5);
    cr_assert_not_null(found);
    cr_assert_eq(found->base, A(2 * page));
    found = range_registry_containing(&registry, A(7 * page) - 1);
    cr_assert_not_null(found);
    cr_assert_eq(found->base, A(6 * page));

    struct range_record *right = range_registry_split(&registry, A(2 * page), A(4 * page));
    cr_assert_not_null(right);
    cr_assert_eq(right->base, A(4 * page));
    cr_assert_eq(right->end, A(6 * page));
    found = range_registry_containing(&registry, A(4 * page) - 1);
    cr_assert_not_null(found);
    cr_assert_eq(found->base, A(2 * page));
    cr_assert_eq(found->end, A(4 * page));
    found = range_registry_first_overlap(&registry, A(4 * page) - 1, A(4 * page) + 1);
    cr_assert_not_null(found);
    cr_assert_eq(found->base, A(2 * page), "the lowest of the two records the bytes touch");

    range_registry_remove(&registry, A(4 * page));
    cr_assert_null(range_registry_containing(&registry, A(4 * page)));
    cr_assert_null(range_registry_containing(&registry, A(6 * page) - 1));
    cr_assert_not_null(range_registry_containing(&registry, A(6 * page)));
    range_registry_destroy(&registry);
}

ParameterizedTestParameters(page_sizes, free_fast_check_sees_every_granule_of_a_registered_page)
{
    return cr_make_param_array(uintptr_t, page_sizes, sizeof(page_sizes) / sizeof(*page_sizes));
}

/* Writes a glibc-like chunk header for a block of chunk bytes at ptr. */
static void make_block(char *ptr, size_t chunk)
{
    ((size_t *)ptr)[-1] = chunk | 1; /* PREV_INUSE */
}

/* free's lock-free window: a block that holds a byte of the lock, on any
 * granule of its pages, is never cleared; one on a registered page beside
 * the lock's bytes, and blocks away from every registration, are (their
 * free releases nothing: the free rule). */
ParameterizedTest(uintptr_t *size, page_sizes,
                  free_fast_check_sees_every_granule_of_a_registered_page)
{
    uintptr_t page = *size;
    size_t length = 64 * page;
    char *memory =
        mmap(NULL, length + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(memory, MAP_FAILED);
    char *region = (char *)page_ceil((uintptr_t)memory, page);
    start_engine(page, 1, 0);
    engine_enable_window(&engine);
    /* Lock bytes from the middle of page 16 to the middle of page 18: pages 16 to 18. */
    uintptr_t lock_start = (uintptr_t)region + 16 * page + page / 2;
    uintptr_t lock_end = lock_start + 2 * page;
    lock(lock_start, 2 * page);
    for (uintptr_t offset = 16 * page; offset < 19 * page; offset += PAGE_INDEX_GRANULE) {
        char *block = region + offset + 16;
        make_block(block, 48);
        uintptr_t start = (uintptr_t)block, end = start + 40;
        bool in_lock = start < lock_end && lock_start < end;
        bool cleared = engine_block_clear_fast(&engine, *engine.gate, block);
        cr_assert_eq(cleared, !in_lock,
                     "page %lu KiB: a block at +%#lx (%s the lock's bytes) was %s",
                     (unsigned long)(page / KIB), (unsigned long)offset, in_lock ? "in" : "beside",
                     cleared ? "cleared" : "not cleared");
    }
    /* A block from below that ends in page 16 before the lock: cleared; one
     * that ends in the lock's first bytes: not. */
    char *below = region + 16 * page - 64;
    make_block(below, 128);
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, below));
    char *into = (char *)lock_start - 64;
    make_block(into, 128);
    cr_assert_not(engine_block_clear_fast(&engine, *engine.gate, into));
    /* Blocks well away from it. */
    size_t cleared = 0;
    for (uintptr_t offset = 0; offset < 8 * page; offset += page) {
        char *block = region + offset + 64;
        make_block(block, 256);
        cleared += engine_block_clear_fast(&engine, *engine.gate, block);
    }
    cr_assert_eq(cleared, 8, "the fast check cleared %zu of 8 blocks far below the lock", cleared);
    char *above = region + 40 * page + 64;
    make_block(above, 256);
    cr_assert(engine_block_clear_fast(&engine, *engine.gate, above), "above every record");
    stop_engine();
    munmap(memory, length + page);
}
