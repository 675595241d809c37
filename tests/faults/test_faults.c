/* Faults around the shim: a runtime that fails some calls, mlock refused by
 * RLIMIT_MEMLOCK for an unprivileged user, allocation calls that fail, a stats
 * file that cannot be written, runtimes that cannot be used, and a runtime
 * that is gone at exit. In each case the program's own behaviour (exit status,
 * stdout with the errno values it prints) is what it is without the shim, and
 * the stats say what happened. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cudart.h"
#include "harness.h"
#include "json_lite.h"

/* Runs argv without and with the shim (same environment) and checks that the
 * program ended the same way and printed the same on stdout. */
static void run_both(struct harness_run *without_shim, struct harness_run *with_shim,
                     const char *const argv[], const char *const *env)
{
    struct harness_options without = {.env = env};
    struct harness_options with = {.preload = harness_env("PINSHIM_LIB"), .env = env};
    harness_run(without_shim, argv, &without);
    harness_run(with_shim, argv, &with);
    harness_expect_same_result(without_shim, with_shim);
}

/* ---- (a) the fake runtime fails every Nth call ---- */

#define CYCLES 12

/* The stats key of an error code: the shim names the codes it knows itself
 * and asks the runtime's cudaGetErrorName for the others. */
static void error_key(int code, char *key, size_t size)
{
    static const struct {
        int code;
        const char *name;
    } known[] = {{1, "cudaErrorInvalidValue"},
                 {2, "cudaErrorMemoryAllocation"},
                 {712, "cudaErrorHostMemoryAlreadyRegistered"},
                 {713, "cudaErrorHostMemoryNotRegistered"},
                 {801, "cudaErrorNotSupported"},
                 {999, "cudaErrorUnknown"}};
    for (size_t i = 0; i < sizeof(known) / sizeof(*known); i++) {
        if (known[i].code == code) {
            snprintf(key, size, "errors.%s", known[i].name);
            return;
        }
    }
    const char *name = cudaGetErrorName(code);
    snprintf(key, size, "errors.%s",
             name != NULL && strncmp(name, "cuda", 4) == 0 ? name : "cudaErrorUnrecognized");
}

static void run_cycles(struct harness_run *run, const char *const *env)
{
    harness_require_lock_budget(1 << 20);
    char cycles[16];
    snprintf(cycles, sizeof(cycles), "%d", CYCLES);
    const char *argv[] = {harness_env("LOCK_CYCLES"), cycles, NULL};
    struct harness_options with = {.preload = harness_env("PINSHIM_LIB"), .env = env};
    harness_run(run, argv, &with);
    cr_assert_eq(run->result.status, 0, "%s%s", run->result.out, run->result.err);
    char expected[64];
    snprintf(expected, sizeof(expected), "%d lock cycles, 0 failed calls\n", CYCLES);
    cr_assert_str_eq(run->result.out, expected, "the program saw a failure");
}

/* Register calls every, 2*every, ... fail with error (0: the fake's default,
 * cudaErrorMemoryAllocation). Each of the CYCLES locks is one register call and
 * each registered range one unregister call at its munlock. */
static void expect_register_failures(unsigned every, int error)
{
    char every_setting[64], error_setting[64];
    snprintf(every_setting, sizeof(every_setting), "FAKE_CUDART_FAIL_REGISTER_EVERY=%u", every);
    snprintf(error_setting, sizeof(error_setting), "FAKE_CUDART_FAIL_ERROR=%d", error);
    const char *env[] = {every_setting, error ? error_setting : NULL, NULL};
    int code = error ? error : 2;
    struct harness_run run;
    run_cycles(&run, env);

    double failed = CYCLES / every, registered = CYCLES - failed;
    char key[128];
    error_key(code, key, sizeof(key));
    const char *stats = run.stats;
    cr_assert_eq(harness_stat(&run, "register.ok"), registered, "every %u, error %d:\n%s", every,
                 code, stats);
    cr_assert_eq(harness_stat(&run, key), failed, "every %u, error %d:\n%s", every, code, stats);
    cr_assert_eq(json_lite_count(stats, "errors"), 1, "%s", stats);
    if (code == 712) {
        /* "Already registered" means the program registered it: left alone, no warning. */
        cr_assert_eq(harness_stat(&run, "register.already_registered"), failed, "%s", stats);
        cr_assert_eq(harness_stat(&run, "register.failed"), 0, "%s", stats);
        cr_assert_eq(harness_count(run.result.err, "pinshim:"), 0, "%s", run.result.err);
    } else {
        cr_assert_eq(harness_stat(&run, "register.failed"), failed, "%s", stats);
        cr_assert_eq(harness_stat(&run, "register.already_registered"), 0, "%s", stats);
        /* One warning for the first failure; the others are counted, not logged. */
        cr_assert_eq(harness_count_lines(run.result.err, "pinshim:"), 1, "%s", run.result.err);
        cr_assert_eq(harness_count_lines(run.result.err, "cudaHostRegister("), 1, "%s",
                     run.result.err);
    }
    cr_assert_eq(harness_stat(&run, "unregister.ok"), registered, "%s", stats);
    cr_assert_eq(harness_stat(&run, "unregister.munlock"), registered, "%s", stats);
    cr_assert_eq(harness_stat(&run, "unregister.failed"), 0, "%s", stats);
    cr_assert_eq(run.log.total.register_calls, CYCLES);
    cr_assert_eq(fake_log_register_errors(&run.log.total, code), failed);
    harness_expect_consistent_stats(&run);
    harness_expect_clean_runtime(&run);
    harness_free(&run);
}

Test(faults, register_failures_every_nth_call, .timeout = 120)
{
    expect_register_failures(1, 0); /* every call: nothing is ever registered */
    expect_register_failures(2, 0);
    expect_register_failures(5, 0);
    expect_register_failures(3, 1);     /* cudaErrorInvalidValue */
    expect_register_failures(4, 801);   /* cudaErrorNotSupported */
    expect_register_failures(5, 999);   /* cudaErrorUnknown */
    expect_register_failures(3, 712);   /* cudaErrorHostMemoryAlreadyRegistered */
    expect_register_failures(6, 12345); /* a code the shim does not know */
}

/* Unregister calls every, 2*every, ... fail; the range was munlocked anyway,
 * so the shim forgets it, counts the failure and warns once. The runtime keeps
 * what it failed to drop. 713 (not registered) is no failure to the shim: the
 * registration is gone already (its context was destroyed, or the program
 * unregistered it itself), counted as unregister.gone and logged at info. */
static void expect_unregister_failures(unsigned every, int error)
{
    char every_setting[64], error_setting[64];
    snprintf(every_setting, sizeof(every_setting), "FAKE_CUDART_FAIL_UNREGISTER_EVERY=%u", every);
    snprintf(error_setting, sizeof(error_setting), "FAKE_CUDART_FAIL_ERROR=%d", error);
    const char *env[] = {every_setting, error ? error_setting : NULL, NULL};
    int code = error ? error : 2;
    struct harness_run run;
    run_cycles(&run, env);

    double failed = CYCLES / every;
    char key[128];
    error_key(code, key, sizeof(key));
    const char *stats = run.stats;
    cr_assert_eq(harness_stat(&run, "register.ok"), CYCLES, "%s", stats);
    bool gone = code == 713;
    cr_assert_eq(harness_stat(&run, "unregister.ok"), CYCLES - failed, "%s", stats);
    cr_assert_eq(harness_stat(&run, "unregister.failed"), gone ? 0 : failed, "%s", stats);
    cr_assert_eq(harness_stat(&run, "unregister.gone"), gone ? failed : 0, "%s", stats);
    cr_assert_eq(harness_stat(&run, "unregister.munlock"), CYCLES, "%s", stats);
    cr_assert_eq(harness_stat(&run, key), failed, "%s", stats);
    cr_assert_eq(harness_stat(&run, "live.ranges"), 0, "%s", stats);
    cr_assert_eq(harness_count_lines(run.result.err, "pinshim:"), gone ? 0 : 1, "%s",
                 run.result.err);
    cr_assert_eq(harness_count_lines(run.result.err, "cudaHostUnregister("), gone ? 0 : 1, "%s",
                 run.result.err);
    harness_expect_consistent_stats(&run);
    cr_assert_eq(fake_log_unregister_errors(&run.log.total, code), failed);
    cr_assert_eq(run.log.total.live_count, failed, "the runtime keeps what it failed to drop");
    cr_assert_eq(run.log.total.violations, 0);
    harness_free(&run);
}

Test(faults, unregister_failures_every_nth_call, .timeout = 120)
{
    expect_unregister_failures(1, 0);
    expect_unregister_failures(3, 0);
    expect_unregister_failures(4, 713); /* cudaErrorHostMemoryNotRegistered */
    expect_unregister_failures(5, 999);
}

/* ---- (b) mlock refused by RLIMIT_MEMLOCK, as an unprivileged user ---- */

/* Everything the unprivileged user loads or runs (the program, the shim, the
 * fake runtime and the fake driver it loads) is copied to a directory that
 * user can reach: the build tree may sit in a directory it cannot enter (a
 * 0700 home). run_limited itself starts as root and needs no copy. */
struct unprivileged_copy {
    char *directory;
    char program[HARNESS_PATH_MAX], shim[HARNESS_PATH_MAX];
    char cudart[HARNESS_PATH_MAX + 32], driver[HARNESS_PATH_MAX + 32]; /* settings */
};

static void copy_for_everyone(struct unprivileged_copy *copy)
{
    char why[2 * HARNESS_PATH_MAX];
    copy->directory = make_shared_temp_dir(why, sizeof(why));
    if (copy->directory == NULL)
        cr_skip_test("cannot hand the programs to the unprivileged user: %s", why);
    const char *directory = copy->directory;
    cr_assert(harness_copy_file(harness_env("LOCK_ERRORS"), directory, "lock_errors", 0755));
    cr_assert(harness_copy_file(harness_env("PINSHIM_LIB"), directory, "libpinshim.so", 0755));
    cr_assert(harness_copy_file(harness_env("FAKE_CUDART"), directory, "libfake_cudart.so", 0755));
    cr_assert(
        harness_copy_file(harness_env("FAKE_CUDA_DRIVER_PATH"), directory, "libcuda.so.1", 0755));
    snprintf(copy->program, sizeof(copy->program), "%s/lock_errors", directory);
    snprintf(copy->shim, sizeof(copy->shim), "%s/libpinshim.so", directory);
    snprintf(copy->cudart, sizeof(copy->cudart), "PINSHIM_CUDART=%s/libfake_cudart.so", directory);
    /* The fake runtime loads its driver by the build tree's path unless told. */
    snprintf(copy->driver, sizeof(copy->driver), "FAKE_CUDA_DRIVER=%s/libcuda.so.1", directory);
}

static void run_limited(struct harness_run *run, const struct unprivileged_copy *copy,
                        const char *limit, bool with_shim, const char *min_bytes)
{
    const char *argv[] = {harness_env("RUN_LIMITED"), limit, copy->program, NULL};
    const char *env[] = {copy->cudart, copy->driver, min_bytes, NULL};
    struct harness_options options = {
        .preload = with_shim ? copy->shim : NULL, .env = env, .shared_directory = true};
    harness_run(run, argv, &options);
    cr_assert_neq(run->result.status, 125, "run_limited could not set up: %s", run->result.err);
}

static void expect_refused_locks(const char *limit, const char *refusal, const char *min_bytes,
                                 bool expect_small_lock)
{
    if (harness_sanitizer() != NULL && strstr(harness_sanitizer(), "address") != NULL)
        cr_skip_test("the program is ASan-built: ASan's mlock answers 0 without asking the "
                     "kernel, so no limit can refuse it");
    struct unprivileged_copy copy;
    copy_for_everyone(&copy);
    struct harness_run without_shim, with_shim;
    run_limited(&without_shim, &copy, limit, false, min_bytes);
    run_limited(&with_shim, &copy, limit, true, min_bytes);
    const char *out = without_shim.result.out;
    cr_assert_eq(without_shim.result.status, 0, "%s%s", out, without_shim.result.err);
    const char *first_lock = strstr(out, "mlock 1 MiB");
    cr_assert_not_null(first_lock, "%s", out);
    const char *line_end = strchr(first_lock, '\n');
    const char *refused = strstr(first_lock, refusal);
    if (refused == NULL || (line_end != NULL && refused > line_end))
        cr_skip_test("mlock is not limited here (CAP_IPC_LOCK without root?):\n%s", out);
    /* Same results and the same errno values, call by call. */
    harness_expect_same_result(&without_shim, &with_shim);
    cr_assert_str_eq(with_shim.result.err, "", "the shim stays quiet");
    cr_assert_eq(harness_stat(&with_shim, "calls.lock"), expect_small_lock ? 1 : 0,
                 "only successful locks are counted:\n%s", with_shim.stats);
    cr_assert_eq(harness_stat(&with_shim, "calls.mlockall"), 1);
    cr_assert_eq(harness_stat(&with_shim, "register.failed"), 0);
    bool registers_small = expect_small_lock && min_bytes != NULL;
    cr_assert_eq(harness_stat(&with_shim, "register.ok"), registers_small ? 1 : 0, "%s",
                 with_shim.stats);
    if (registers_small) {
        cr_assert_eq(harness_stat(&with_shim, "register.bytes"), 32 << 10);
        cr_assert_eq(harness_stat(&with_shim, "unregister.munlock"), 1);
        harness_expect_clean_runtime(&with_shim);
    } else {
        cr_assert_not(with_shim.have_log, "nothing reached the runtime");
    }
    harness_expect_consistent_stats(&with_shim);
    harness_free(&without_shim);
    harness_free(&with_shim);
    remove_tree(copy.directory);
    free(copy.directory);
}

Test(faults, rlimit_memlock_refuses_locks_as_without_the_shim, .timeout = 60)
{
    /* 64 KiB: the 1 MiB locks fail with ENOMEM (mmap MAP_LOCKED with EAGAIN), 32 KiB fits. */
    expect_refused_locks("65536", "ENOMEM", NULL, true);
    /* The same with the 32 KiB lock large enough to be registered. */
    expect_refused_locks("65536", "ENOMEM", "PINSHIM_MIN_BYTES=16K", true);
    /* No allowance at all: every lock fails with EPERM. */
    expect_refused_locks("0", "EPERM", "PINSHIM_MIN_BYTES=16K", false);
}

static size_t count_lines_with(const char *text, const char *needle)
{
    size_t count = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
        count++;
    return count;
}

/* ---- (c) allocation calls that fail ---- */

Test(faults, failing_allocations_as_without_the_shim)
{
    harness_require_lock_budget(2 << 20);
    const char *argv[] = {harness_env("ALLOC_ERRORS"), NULL};
    struct harness_run without_shim, with_shim;
    run_both(&without_shim, &with_shim, argv, NULL);
    const char *out = with_shim.result.out;
    cr_assert_eq(with_shim.result.status, 0, "%s", with_shim.result.err);
    if (harness_sanitizer() == NULL) /* ASan warns about each failed allocation */
        cr_assert_str_eq(with_shim.result.err, "");
    cr_assert(strstr(out, "(64, SIZE_MAX / 2)         -> 12 (Cannot allocate memory), memptr "
                          "untouched") != NULL,
              "%s", out);
    cr_assert(strstr(out, "(3, 1 MiB)                 -> 22 (Invalid argument), memptr "
                          "untouched") != NULL,
              "%s", out);
    /* aligned_alloc, memalign, valloc: the same answers as without the shim
     * (run_both compares the whole output); glibc's, as here (ASan's refuses
     * more, with EINVAL, and the shim passes those requests unchanged). */
    if (harness_sanitizer() == NULL) {
        cr_assert(strstr(out, "aligned_alloc (64, SIZE_MAX / 2)     -> NULL, errno 12") != NULL,
                  "%s", out);
        cr_assert_eq(count_lines_with(out, "-> block, errno 0, alignment honoured 1"), 9, "%s",
                     out);
    }
    cr_assert(strstr(out, "valloc (SIZE_MAX / 2)         -> NULL, errno 12") != NULL, "%s", out);
    cr_assert(strstr(out, "realloc huge -> NULL, errno ENOMEM") != NULL, "%s", out);
    cr_assert(strstr(out, "block intact yes") != NULL, "%s", out);
    /* The failed realloc released the locked block's registration and, since
     * the block stayed as it was, registered it again. */
    cr_assert_eq(harness_stat(&with_shim, "unregister.realloc"), 1, "%s", with_shim.stats);
    cr_assert_eq(harness_stat(&with_shim, "register.ok"), 2, "%s", with_shim.stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.munlock"), 1, "%s", with_shim.stats);
    harness_expect_consistent_stats(&with_shim);
    harness_expect_clean_runtime(&with_shim);
    harness_free(&without_shim);
    harness_free(&with_shim);
}

/* ---- (d) stats that cannot be written ---- */

static void expect_summary_instead(const char *stats_setting, const char *warning,
                                   bool needs_three_digit_pid)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("EXIT_WITH_LOCKS"), "5", NULL};
    const char *env[] = {stats_setting, NULL};
    struct harness_run without_shim, with_shim;
    run_both(&without_shim, &with_shim, argv, env);
    cr_assert_eq(with_shim.result.status, 5, "the exit status is the program's");
    cr_assert_eq(with_shim.stats_files, 0);
    const char *err = with_shim.result.err;
    const char *pid = strstr(err, "pinshim: pid ");
    if (needs_three_digit_pid && pid != NULL && atol(pid + strlen("pinshim: pid ")) < 100)
        cr_skip_test("the pid has fewer than three digits: the template fits when expanded");
    cr_assert_eq(harness_count_lines(err, warning), 1, "one warning:\n%s", err);
    cr_assert_eq(harness_count_lines(err, "writing the summary to stderr instead"), 1, "%s", err);
    cr_assert_eq(harness_count_lines(err, "pinshim: pid "), 1, "the summary follows:\n%s", err);
    cr_assert(strstr(err, "registered 3 (") != NULL, "%s", err);
    cr_assert(strstr(err, "live at exit 3 (") != NULL, "%s", err);
    harness_expect_clean_runtime(&with_shim);
    harness_free(&without_shim);
    harness_free(&with_shim);
}

Test(faults, stats_directory_missing)
{
    expect_summary_instead("PINSHIM_STATS=/nonexistent-pinshim-dir/sub/stats.%p.json",
                           "pinshim: cannot write stats to /nonexistent-pinshim-dir/sub/stats.",
                           false);
}

Test(faults, stats_path_expanding_too_long)
{
    /* 450 times %p: accepted, and too long for the shim's 1024-byte path once
     * expanded with a pid of three digits or more. (At 1023 characters the
     * warning was cut before its reason: see regressions.c.) */
    char setting[32 + 2 * 450] = "PINSHIM_STATS=/tmp/";
    for (int i = 0; i < 450; i++)
        strcat(setting, "%p");
    expect_summary_instead(setting, "expands to a path that is too long", true);
}

/* ---- (e) (f) runtimes the shim cannot use: one warning, mlock only ---- */

static void expect_mlock_only(const char *cudart_setting, const char *warning_part)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("FREE_WITHOUT_UNLOCK"), NULL};
    const char *env[] = {cudart_setting, NULL};
    struct harness_run without_shim, with_shim;
    run_both(&without_shim, &with_shim, argv, env);
    if (with_shim.stats != NULL && strstr(with_shim.stats, "\"usable\": true") != NULL)
        cr_skip_test("this runtime works here (a CUDA driver is present)");
    cr_assert_eq(with_shim.result.status, 0, "%s", with_shim.result.err);
    const char *err = with_shim.result.err;
    cr_assert_eq(harness_count_lines(err, "pinshim:"), 1, "exactly one line:\n%s", err);
    cr_assert(strstr(err, warning_part) != NULL, "%s", err);
    cr_assert(strstr(err, "continuing with mlock only") != NULL, "%s", err);
    cr_assert_eq(harness_stat(&with_shim, "register.ok"), 0);
    cr_assert_eq(harness_stat(&with_shim, "calls.lock"), 2);
    cr_assert_eq(harness_stat(&with_shim, "register.skipped_no_runtime"), 2, "%s", with_shim.stats);
    cr_assert_eq(json_lite_type(with_shim.stats, "cudart.error"), JSON_LITE_STRING);
    harness_expect_consistent_stats(&with_shim);
    harness_free(&without_shim);
    harness_free(&with_shim);
}

Test(faults, real_cudart_without_a_driver, .timeout = 60)
{
    const char *real = harness_optional_env("REAL_CUDART");
    if (real == NULL || access(real, R_OK) != 0)
        cr_skip_test("no CUDA Toolkit runtime of this architecture here (REAL_CUDART is empty)");
    char setting[HARNESS_PATH_MAX + 32];
    snprintf(setting, sizeof(setting), "PINSHIM_CUDART=%s", real);
    expect_mlock_only(setting, "cudaError");
}

Test(faults, runtime_without_the_register_functions)
{
    expect_mlock_only("PINSHIM_CUDART=libm.so.6",
                      "libm.so.6 does not export cudaHostRegister and cudaHostUnregister");
}

/* ---- (g) a runtime that is gone by the time the shim unregisters at exit ---- */

/* The runtime tears itself down from an exit handler registered when it
 * starts; the shim's own, registered once it chose the runtime (after the
 * start), runs first: the last unregistrations meet the runtime whole. */
Test(faults, exit_unregisters_before_the_runtime_tears_down)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("EXIT_WITH_LOCKS"), "4", NULL};
    const char *env[] = {"FAKE_CUDART_UNLOAD_AT_EXIT=1", NULL};
    struct harness_run without_shim, with_shim;
    run_both(&without_shim, &with_shim, argv, env);
    cr_assert_eq(with_shim.result.status, 4);
    const char *stats = with_shim.stats;
    double live = harness_stat(&with_shim, "live.ranges");
    cr_assert_eq(live, 3, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.exit"), live, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.ok"), live, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.exit_unloading"), 0, "%s", stats);
    harness_expect_consistent_stats(&with_shim);
    harness_expect_clean_runtime(&with_shim);
    harness_free(&without_shim);
    harness_free(&with_shim);
}

/* A runtime whose teardown handler comes after the shim's (registered
 * lazily, at its first registration): it has torn down first. */
Test(faults, runtime_unloading_at_exit)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("EXIT_WITH_LOCKS"), "4", NULL};
    const char *env[] = {"FAKE_CUDART_UNLOAD_AT_EXIT=late", NULL};
    struct harness_run without_shim, with_shim;
    run_both(&without_shim, &with_shim, argv, env);
    cr_assert_eq(with_shim.result.status, 4);
    const char *stats = with_shim.stats;
    cr_assert_eq(harness_count(with_shim.result.err, "pinshim:"), 0,
                 "unregistrations after the runtime's teardown are not warned about:\n%s",
                 with_shim.result.err);
    double live = harness_stat(&with_shim, "live.ranges");
    cr_assert_eq(live, 3, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.exit"), live, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.exit_unloading"), live, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.failed"), 0, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "unregister.ok"), 0, "%s", stats);
    cr_assert_eq(harness_stat(&with_shim, "errors.cudaErrorCudartUnloading"), live, "%s", stats);
    harness_expect_consistent_stats(&with_shim);
    /* The runtime answered 4 to each exit unregistration; the kernel drops the pins. */
    cr_assert(with_shim.have_log);
    cr_assert_eq(fake_log_unregister_errors(&with_shim.log.total, 4), live);
    cr_assert_eq(with_shim.log.total.violations, 0);
    harness_free(&without_shim);
    harness_free(&with_shim);
}
