/* The shim next to other code that interposes the allocator: jemalloc and
 * tcmalloc (both orders in LD_PRELOAD), valgrind's memcheck, AddressSanitizer,
 * and two unchanged runtimes (Python 3, a multithreaded C++ program).
 *
 * What holds in each case, as asserted below:
 *  - libpinshim.so first, then an allocator: everything works; the scenarios
 *    program checks the runtime's registrations against its locks after every
 *    step, and frees reach the shim (unregister.free counts them).
 *  - an allocator first: the shim warns once that free resolves elsewhere.
 *    free, realloc and posix_memalign are the allocator's, so the shim neither
 *    rounds large posix_memalign requests nor sees frees (unregister.free and
 *    unregister.realloc stay 0). mlock/munlock still reach it: registrations
 *    follow the locks, memory freed while locked stays registered until an
 *    munlock/munmap touches it or exit (unregister.exit), and the runtime ends
 *    empty. Both allocators hand out page-aligned blocks of whole pages at
 *    these sizes, so no two buffers share a page and no violation occurs.
 *  - valgrind memcheck: it redirects the malloc family in every loaded object,
 *    the shim's free and posix_memalign included ("REDIR: ... libpinshim.so:free"
 *    with -v), so the shim sees no free, rounds nothing and prints no warning
 *    (dlsym still finds its free). Single-threaded programs stay consistent;
 *    with --soname-synonyms=somalloc=nouserintercepts memcheck leaves the shim's
 *    functions alone and everything works as without valgrind.
 *  - AddressSanitizer: see the asan_* tests. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

/* Scenarios that only check the program's own results (no registration state). */
static const char *const skip_state[] = {"EXPECT_REGISTRATION=skip", NULL};
static const char *const require_shim[] = {"REQUIRE_SHIM=1", NULL};

static bool under_sanitizer(void)
{
    return harness_sanitizer() != NULL;
}

static const char *allocator_or_skip(const char *variable, const char *package)
{
    if (under_sanitizer())
        cr_skip_test("the programs are sanitizer-built: their runtime's allocator and %s would "
                     "both replace malloc",
                     package);
    const char *path = harness_optional_env(variable);
    if (path == NULL || access(path, R_OK) != 0)
        cr_skip_test("%s is not installed (Debian package %s)", variable, package);
    return path;
}

/* The scenarios lock up to about 10 MiB at once (threads, memtester). */
#define SCENARIO_LOCK_BUDGET (16ull << 20)

static void run_scenario(struct harness_run *run, const char *preload, const char *scenario,
                         const char *const *env)
{
    harness_require_lock_budget(SCENARIO_LOCK_BUDGET);
    const char *argv[] = {harness_env("SCENARIOS"), scenario, NULL};
    struct harness_options options = {.preload = preload, .env = env};
    harness_run(run, argv, &options);
}

static void expect_passed(const struct harness_run *run, const char *scenario)
{
    char verdict[128];
    snprintf(verdict, sizeof(verdict), "PASS %s\n", scenario);
    cr_assert_eq(run->result.status, 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s", scenario,
                 run->result.status, run->result.out, run->result.err);
    cr_assert(strstr(run->result.out, verdict) != NULL, "%s", run->result.out);
}

/* Another allocator (or valgrind's) must keep free asking it for block sizes:
 * glibc's chunk header is not there. */
static void expect_sizes_from_the_allocator(const struct harness_run *run)
{
    cr_assert_not_null(run->stats);
    cr_assert(strstr(run->stats, "\"block_size_source\": \"malloc_usable_size\"") != NULL, "%s",
              run->stats);
}

/* ---- jemalloc and tcmalloc ---- */

static void shim_first(const char *allocator)
{
    char preload[2 * HARNESS_PATH_MAX + 2];
    snprintf(preload, sizeof(preload), "%s:%s", harness_env("PINSHIM_LIB"), allocator);
    const char *scenarios[] = {"basic", "threads", "free_locked", "memtester"};
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        struct harness_run run;
        run_scenario(&run, preload, scenarios[i], require_shim);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 0, "%s", run.result.err);
        cr_assert_eq(run.stats_files, 1);
        harness_expect_consistent_stats(&run);
        harness_expect_clean_runtime(&run);
        expect_sizes_from_the_allocator(&run);
        if (strcmp(scenarios[i], "free_locked") == 0 || strcmp(scenarios[i], "memtester") == 0)
            cr_assert_eq(harness_stat(&run, "unregister.free"), 1,
                         "free must reach the shim before %s:\n%s", allocator, run.stats);
        harness_free(&run);
    }
}

static void allocator_first(const char *allocator)
{
    char preload[2 * HARNESS_PATH_MAX + 2];
    snprintf(preload, sizeof(preload), "%s:%s", allocator, harness_env("PINSHIM_LIB"));
    char warning[HARNESS_PATH_MAX + 64];
    snprintf(warning, sizeof(warning), "pinshim: free resolves to %s before libpinshim.so",
             allocator);
    /* "basic" is left out: it checks the shim's page rounding of posix_memalign,
     * which cannot happen when the allocator's posix_memalign comes first. */
    const char *scenarios[] = {"threads", "free_locked", "memtester"};
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        struct harness_run run;
        run_scenario(&run, preload, scenarios[i], skip_state);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 1, "one warning:\n%s",
                     run.result.err);
        cr_assert(strstr(run.result.err, warning) != NULL, "%s", run.result.err);
        cr_assert_gt(harness_stat(&run, "register.ok"), 0, "locks still reach the shim");
        cr_assert_eq(harness_stat(&run, "unregister.free"), 0, "free never reaches the shim");
        cr_assert_eq(harness_stat(&run, "unregister.realloc"), 0);
        if (strcmp(scenarios[i], "threads") != 0)
            /* Freed while locked: registered until exit, as the memory stays locked. */
            cr_assert_eq(harness_stat(&run, "live.ranges"), 1, "%s", run.stats);
        harness_expect_consistent_stats(&run);
        harness_expect_clean_runtime(&run);
        harness_free(&run);
    }
}

Test(coexist, jemalloc_after_the_shim, .timeout = 120)
{
    shim_first(allocator_or_skip("JEMALLOC", "libjemalloc2"));
}

Test(coexist, jemalloc_before_the_shim, .timeout = 120)
{
    allocator_first(allocator_or_skip("JEMALLOC", "libjemalloc2"));
}

Test(coexist, tcmalloc_after_the_shim, .timeout = 120)
{
    shim_first(allocator_or_skip("TCMALLOC", "libtcmalloc-minimal4"));
}

Test(coexist, tcmalloc_before_the_shim, .timeout = 120)
{
    allocator_first(allocator_or_skip("TCMALLOC", "libtcmalloc-minimal4"));
}

/* ---- valgrind ---- */

#define MEMCHECK_ERROR_STATUS 99

static void run_under_valgrind(struct harness_run *run, const char *scenario,
                               const char *soname_synonyms, const char *const *env)
{
    if (under_sanitizer())
        cr_skip_test("valgrind cannot run a sanitizer-built shim (SANITIZE=%s)",
                     harness_optional_env("SANITIZE"));
    SKIP_BUILD_MACHINE_PROGRAM("valgrind");
    const char *valgrind = harness_optional_env("VALGRIND");
    if (valgrind == NULL)
        cr_skip_test("valgrind is not installed (Debian package valgrind)");
    harness_require_lock_budget(SCENARIO_LOCK_BUDGET);
    const char *argv[] = {valgrind,
                          "--tool=memcheck",
                          "--error-exitcode=99",
                          "--quiet",
                          soname_synonyms ? soname_synonyms : "--trace-children=no",
                          harness_env("SCENARIOS"),
                          scenario,
                          NULL};
    /* LD_PRELOAD reaches the program: valgrind adds its own preloads to it. */
    struct harness_options options = {.preload = harness_env("PINSHIM_LIB"), .env = env};
    harness_run(run, argv, &options);
    if (strstr(run->result.err, "Valgrind: debuginfo reader") != NULL)
        cr_skip_test("this valgrind cannot read the shim's debug information (valgrind 3.19 "
                     "and clang 14's DWARF 5); a gcc build runs these tests:\n%.300s",
                     run->result.err);
    cr_assert_neq(run->result.status, MEMCHECK_ERROR_STATUS, "memcheck found errors:\n%s",
                  run->result.err);
}

/* Default memcheck: the shim's free is replaced, so memory freed while locked
 * stays registered until exit; the program and the runtime are unharmed. */
Test(coexist, valgrind_replaces_the_shims_free, .timeout = 120)
{
    const char *scenarios[] = {"free_locked", "memtester"};
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        struct harness_run run;
        run_under_valgrind(&run, scenarios[i], NULL, skip_state);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 0, "%s", run.result.err);
        cr_assert_eq(harness_stat(&run, "register.ok"), 1, "%s", run.stats);
        cr_assert_eq(harness_stat(&run, "unregister.free"), 0,
                     "memcheck's free replaced the shim's:\n%s", run.stats);
        cr_assert_eq(harness_stat(&run, "live.ranges"), 1);
        harness_expect_consistent_stats(&run);
        harness_expect_clean_runtime(&run);
        harness_free(&run);
    }
}

/* Threads under default memcheck: buffers are not page-rounded and may share a
 * page, and a lock of one can race the unlock of its neighbour (the open race
 * of tests/faults, race_lock_during_unlock_of_a_shared_page), so violations
 * are counted, not asserted; the program and memcheck must be unharmed and
 * the stats consistent. */
Test(coexist, valgrind_threads_run_unharmed, .timeout = 180)
{
    struct harness_run run;
    run_under_valgrind(&run, "threads", NULL, skip_state);
    expect_passed(&run, "threads");
    cr_assert_gt(harness_stat(&run, "register.ok"), 0);
    cr_assert_eq(harness_stat(&run, "unregister.free"), 0);
    harness_expect_consistent_stats(&run);
    cr_assert(run.have_log);
    cr_assert_eq(run.log.total.live_count, 0, "the exit unregistrations empty the runtime");
    cr_log_info("violations recorded under memcheck: %llu",
                (unsigned long long)run.log.total.violations);
    harness_free(&run);
}

/* With nouserintercepts memcheck replaces only libc's allocator: the shim's
 * functions run and forward to it, and the invariant holds step by step. */
Test(coexist, valgrind_nouserintercepts_keeps_the_invariant, .timeout = 180)
{
    const char *scenarios[] = {"basic", "free_locked", "threads"};
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        struct harness_run run;
        run_under_valgrind(&run, scenarios[i], "--soname-synonyms=somalloc=nouserintercepts",
                           require_shim);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 0, "%s", run.result.err);
        harness_expect_consistent_stats(&run);
        harness_expect_clean_runtime(&run);
        expect_sizes_from_the_allocator(&run);
        if (strcmp(scenarios[i], "free_locked") == 0)
            cr_assert_eq(harness_stat(&run, "unregister.free"), 1, "%s", run.stats);
        harness_free(&run);
    }
}

/* ---- AddressSanitizer ----
 * SCENARIOS_ASAN is the scenarios program built with -fsanitize=address and the
 * shared ASan runtime ASAN_RUNTIME. Three preload orders: */

static const char *asan_program_or_skip(void)
{
    if (under_sanitizer())
        cr_skip_test("the whole build is sanitized (SANITIZE=%s): see scripts/sanitize",
                     harness_optional_env("SANITIZE"));
    const char *program = harness_optional_env("SCENARIOS_ASAN");
    if (program == NULL)
        cr_skip_test("the compiler cannot build with -fsanitize=address and a shared runtime");
    harness_require_lock_budget(SCENARIO_LOCK_BUDGET);
    return program;
}

/* LD_PRELOAD=libpinshim.so alone: ASan refuses to start, since its runtime must
 * come first in the initial library list. This order does not work. */
Test(coexist, asan_refuses_the_shim_first)
{
    const char *argv[] = {asan_program_or_skip(), "free_locked", NULL};
    const char *env[] = {"ASAN_OPTIONS=detect_leaks=0", NULL};
    struct harness_options options = {.preload = harness_env("PINSHIM_LIB"), .env = env};
    struct harness_run run;
    harness_run(&run, argv, &options);
    cr_assert_neq(run.result.status, 0);
    cr_assert(strstr(run.result.err, "ASan runtime does not come first") != NULL, "%s",
              run.result.err);
    harness_free(&run);
}

/* LD_PRELOAD=<ASan runtime>:libpinshim.so starts, but ASan's mlock and munlock
 * interceptors answer 0 without calling anything (ASan does not lock memory),
 * so the shim never sees a lock, registers nothing, and warns that free
 * resolves to the ASan runtime. The program is unharmed. */
Test(coexist, asan_runtime_first_hides_the_locks)
{
    const char *argv[] = {asan_program_or_skip(), "free_locked", NULL};
    char preload[2 * HARNESS_PATH_MAX + 2];
    snprintf(preload, sizeof(preload), "%s:%s", harness_env("ASAN_RUNTIME"),
             harness_env("PINSHIM_LIB"));
    const char *env[] = {"ASAN_OPTIONS=detect_leaks=0", "EXPECT_REGISTRATION=0", NULL};
    struct harness_options options = {.preload = preload, .env = env};
    struct harness_run run;
    harness_run(&run, argv, &options);
    expect_passed(&run, "free_locked");
    cr_assert_eq(harness_count(run.result.err, "pinshim:"), 1, "%s", run.result.err);
    cr_assert(strstr(run.result.err, "pinshim: free resolves to ") != NULL, "%s", run.result.err);
    cr_assert_eq(harness_stat(&run, "calls.lock"), 0, "ASan answers mlock itself");
    cr_assert_eq(harness_stat(&run, "register.ok"), 0);
    harness_free(&run);
}

/* The order that works: libpinshim.so first with ASAN_OPTIONS=
 * verify_asan_link_order=0. The shim sees every call and forwards to ASan's
 * functions; the invariant holds step by step. ASan's mlock does not lock, so
 * the fake runtime's smaps check (which would report registered memory as not
 * locked) is turned off with FAKE_CUDART_CHECK=0. */
Test(coexist, asan_with_the_shim_first_and_link_order_check_off, .timeout = 120)
{
    const char *program = asan_program_or_skip();
    /* allocator_may_return_null: the realloc scenario checks that an overflowing
     * reallocarray fails with ENOMEM, which ASan otherwise reports and aborts. */
    const char *env[] = {"ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0:"
                         "allocator_may_return_null=1",
                         "FAKE_CUDART_CHECK=0", "REQUIRE_SHIM=1", NULL};
    const char *scenarios[] = {"basic", "free_locked", "threads", "realloc"};
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(*scenarios); i++) {
        const char *argv[] = {program, scenarios[i], NULL};
        struct harness_options options = {.preload = harness_env("PINSHIM_LIB"), .env = env};
        struct harness_run run;
        harness_run(&run, argv, &options);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 0, "%s", run.result.err);
        harness_expect_consistent_stats(&run);
        harness_expect_clean_runtime(&run);
        expect_sizes_from_the_allocator(&run);
        if (strcmp(scenarios[i], "free_locked") == 0)
            cr_assert_eq(harness_stat(&run, "unregister.free"), 1, "%s", run.stats);
        harness_free(&run);
    }
}

/* ---- unchanged runtimes ---- */

/* The interpreter allocates a lot through its own allocator, then through
 * ctypes locks two 1 MiB posix_memalign buffers: one unlocked and freed, one
 * freed while locked. */
static const char python_program[] =
    "import ctypes, zlib\n"
    "chunks = [bytearray(i % 251 for i in range(1 << 16)) for _ in range(64)]\n"
    "table = {str(i): i * i for i in range(100000)}\n"
    "text = ''.join(str(i) for i in range(100000))\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, "
    "ctypes.c_size_t]\n"
    "libc.mlock.argtypes = libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]\n"
    "libc.free.argtypes = [ctypes.c_void_p]\n"
    "size = 1 << 20\n"
    "for unlock in (True, False):\n"
    "    buffer = ctypes.c_void_p()\n"
    "    print('posix_memalign', libc.posix_memalign(ctypes.byref(buffer), 4096, size))\n"
    "    ctypes.memset(buffer, 0x5a, size)\n"
    "    print('mlock', libc.mlock(buffer, size), ctypes.get_errno())\n"
    "    if unlock:\n"
    "        print('munlock', libc.munlock(buffer, size), ctypes.get_errno())\n"
    "    print('crc', zlib.crc32(ctypes.string_at(buffer, size)))\n"
    "    libc.free(buffer)\n"
    "print('checks', sum(map(len, chunks)), len(table), zlib.crc32(text.encode()))\n";

Test(coexist, python_with_ctypes, .timeout = 120)
{
    SKIP_BUILD_MACHINE_PROGRAM("python3");
    const char *python = harness_optional_env("PYTHON3");
    if (python == NULL)
        cr_skip_test("python3 is not installed");
    harness_require_lock_budget(4 << 20);
    const char *argv[] = {python, "-c", python_program, NULL};
    struct harness_options without = {0};
    struct harness_options with = {.preload = harness_env("PINSHIM_LIB")};
    struct harness_run plain, shimmed;
    harness_run(&plain, argv, &without);
    harness_run(&shimmed, argv, &with);
    cr_assert_eq(plain.result.status, 0, "%s", plain.result.err);
    harness_expect_same_result(&plain, &shimmed);
    cr_assert_str_eq(shimmed.result.err, "");
    cr_assert_eq(harness_stat(&shimmed, "calls.lock"), 2, "%s", shimmed.stats);
    cr_assert_eq(harness_stat(&shimmed, "register.ok"), 2);
    cr_assert_eq(harness_stat(&shimmed, "register.bytes"), 2 << 20);
    cr_assert_eq(harness_stat(&shimmed, "unregister.munlock"), 1);
    cr_assert_eq(harness_stat(&shimmed, "unregister.free"), 1);
    harness_expect_consistent_stats(&shimmed);
    harness_expect_clean_runtime(&shimmed);
    harness_free(&plain);
    harness_free(&shimmed);
}

/* The C++ program's buffers are deleted while locked: with libstdc++'s
 * operator delete that reaches free; an allocator that replaces operator
 * delete (tcmalloc, ASan's runtime) frees without calling free, and the shim
 * sees it through its own operator delete. */
static void cxx_threads_with(const char *allocator)
{
    const char *program = harness_optional_env("CXX_THREADS");
    if (program == NULL)
        cr_skip_test("no C++ compiler: the C++ program was not built");
    harness_require_lock_budget(20 << 20); /* 8 threads, up to 2 MiB locked each */
    char preload[2 * HARNESS_PATH_MAX + 2];
    snprintf(preload, sizeof(preload), "%s%s%s", harness_env("PINSHIM_LIB"),
             allocator != NULL ? ":" : "", allocator != NULL ? allocator : "");
    const char *argv[] = {program, NULL};
    struct harness_options without = {.preload = allocator};
    struct harness_options with = {.preload = preload};
    struct harness_run plain, shimmed;
    harness_run(&plain, argv, &without);
    harness_run(&shimmed, argv, &with);
    cr_assert_eq(plain.result.status, 0, "%s", plain.result.err);
    harness_expect_same_result(&plain, &shimmed);
    cr_assert_str_eq(shimmed.result.err, "");
    /* Each of 8 threads locks 40 posix_memalign buffers and 40 aligned-new
     * ones; it unlocks the first and deletes the others still locked. */
    cr_assert_eq(harness_stat(&shimmed, "calls.lock"), 8 * 80, "%s", shimmed.stats);
    cr_assert_eq(harness_stat(&shimmed, "unregister.free"), 8 * 40,
                 "delete[] of locked memory reaches the shim:\n%s", shimmed.stats);
    cr_assert_eq(harness_stat(&shimmed, "live.ranges"), 0, "%s", shimmed.stats);
    if (!under_sanitizer()) {
        /* ASan's allocator lays buffers out its own way: there only the
         * totals above are checked. */
        /* Each lock registers its run; an allocator that packs page-aligned
         * blocks side by side (tcmalloc) makes runs of several buffers,
         * which a release registers again without the buffer it took. */
        cr_assert_geq(harness_stat(&shimmed, "register.ok"), 8 * 80, "%s", shimmed.stats);
        cr_assert_eq(harness_stat(&shimmed, "unregister.munlock"), 8 * 40, "%s", shimmed.stats);
    }
    harness_expect_consistent_stats(&shimmed);
    harness_expect_clean_runtime(&shimmed);
    harness_free(&plain);
    harness_free(&shimmed);
}

Test(coexist, cxx_threads, .timeout = 120)
{
    cxx_threads_with(NULL);
}

Test(coexist, cxx_threads_tcmalloc_after_the_shim, .timeout = 120)
{
    cxx_threads_with(allocator_or_skip("TCMALLOC", "libtcmalloc-minimal4"));
}

Test(coexist, cxx_threads_jemalloc_after_the_shim, .timeout = 120)
{
    cxx_threads_with(allocator_or_skip("JEMALLOC", "libjemalloc2"));
}
