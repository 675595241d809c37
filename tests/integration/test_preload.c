/* Integration: unmodified programs under LD_PRELOAD=libpinshim.so with the fake
 * CUDA runtime (and the real one, which has no driver here). Each run checks the
 * program's own verdict (it compares the runtime's registrations with what it
 * locked after every step), the shim's JSON stats and the fake runtime's log. */
#include "block_extent.h"

#include <criterion/criterion.h>

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "fake_log.h"
#include "json_lite.h"

static const char *required_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert_not_null(value, "%s is not set (run through meson test)", name);
    return value;
}

static bool create_mode(void)
{
    const char *mode = getenv("PRELOAD_MODE");
    return mode != NULL && strcmp(mode, "create") == 0;
}

struct run {
    struct child_result result;
    char *directory;
    char stats_path[512];
    char log_path[512];
    char *stats; /* JSON text, NULL when none was written */
    struct fake_log_summary log;
    bool have_log;
};

/* Runs a scenario with the shim preloaded and extra "K=V" settings. */
static void run_scenario(struct run *run, const char *scenario, const char *const *settings)
{
    memset(run, 0, sizeof(*run));
    run->directory = make_temp_dir();
    cr_assert_not_null(run->directory);
    snprintf(run->stats_path, sizeof(run->stats_path), "%s/stats.json", run->directory);
    snprintf(run->log_path, sizeof(run->log_path), "%s/fake.log", run->directory);
    char preload[1024], cudart[1024], stats[600], log[600];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s", required_env("PINSHIM_LIB"));
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", required_env("FAKE_CUDART"));
    snprintf(stats, sizeof(stats), "PINSHIM_STATS=%s", run->stats_path);
    snprintf(log, sizeof(log), "FAKE_CUDART_LOG=%s", run->log_path);
    /* PRELOAD_MODE=create: the shim loads the runtime itself at the first
     * lock; otherwise (the default) the program is a GPU program that
     * initialises CUDA first, and the shim registers into its context. */
    bool create = create_mode();
    const char *defaults[] = {preload,
                              cudart,
                              stats,
                              log,
                              create ? "PINSHIM_CONTEXT=create" : "PINSHIM_CONTEXT=",
                              create ? "SCENARIOS_USE_CUDA=" : "SCENARIOS_USE_CUDA=1",
                              "PINSHIM_ASYNC=",
                              "REQUIRE_SHIM=1",
                              "PINSHIM_LOG=",
                              "PINSHIM_MIN_BYTES=",
                              "PINSHIM_REGISTER=",
                              "PINSHIM_FLAGS=",
                              "PINSHIM_BLOCK_SIZE="};
    /* A setting replaces the default of the same name. */
    const char *environment[32];
    size_t count = 0;
    for (size_t i = 0; settings && settings[i] && count < 16; i++)
        environment[count++] = settings[i];
    for (size_t i = 0; i < sizeof(defaults) / sizeof(*defaults); i++) {
        size_t name_length = (size_t)(strchr(defaults[i], '=') - defaults[i]) + 1;
        bool overridden = false;
        for (size_t j = 0; settings && settings[j]; j++)
            overridden |= strncmp(settings[j], defaults[i], name_length) == 0;
        if (!overridden)
            environment[count++] = defaults[i];
    }
    environment[count] = NULL;
    const char *argv[] = {required_env("SCENARIOS"), scenario, NULL};
    child_run(argv, environment, NULL, &run->result);
    run->stats = read_file_text(run->stats_path);
    run->have_log = access(run->log_path, R_OK) == 0 && fake_log_load(run->log_path, -1, &run->log);
}

static void run_free(struct run *run)
{
    child_result_free(&run->result);
    free(run->stats);
    if (run->have_log)
        fake_log_free(&run->log);
    remove_tree(run->directory);
    free(run->directory);
}

static double stat_number(const struct run *run, const char *key)
{
    double value = -1;
    cr_assert_not_null(run->stats, "no stats file was written");
    cr_assert(json_lite_get_number(run->stats, key, &value), "stats lack %s:\n%s", key, run->stats);
    return value;
}

static void expect_passed(const struct run *run, const char *scenario)
{
    char verdict[128];
    snprintf(verdict, sizeof(verdict), "PASS %s\n", scenario);
    cr_assert_eq(run->result.status, 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s", scenario,
                 run->result.status, run->result.out, run->result.err);
    cr_assert(strstr(run->result.out, verdict) != NULL, "%s", run->result.out);
    char why[256];
    cr_assert_not_null(run->stats, "no stats written; stderr:\n%s", run->result.err);
    cr_assert(json_lite_valid(run->stats, why, sizeof(why)), "%s\n%s", why, run->stats);
}

/* Nothing left registered in the runtime, nothing broken, no stray CUDA error. */
static void expect_clean_runtime(const struct run *run)
{
    cr_assert(run->have_log, "the fake runtime wrote no log");
    cr_assert_eq(run->log.total.violations, 0, "violations recorded, first: %s",
                 run->log.total.violations ? run->log.total.violation_lines[0] : "");
    cr_assert_eq(run->log.total.live_count, 0, "%zu registrations left in the runtime",
                 run->log.total.live_count);
    cr_assert_eq(run->log.malformed_lines, 0);
}

static size_t count_lines_with(const char *text, const char *needle)
{
    size_t count = 0;
    for (const char *at = text; (at = strstr(at, needle)) != NULL; at += strlen(needle))
        count++;
    return count;
}

/* The unregistration call the shim makes, by mode (the driver's in the
 * program's context, or the runtime's it loaded), and the name of
 * cudaErrorMemoryAllocation there. */
static const char *unregister_call(void)
{
    return create_mode() ? "cudaHostUnregister" : "cuMemHostUnregister";
}

static const char *out_of_memory_name(void)
{
    return create_mode() ? "cudaErrorMemoryAllocation" : "CUDA_ERROR_OUT_OF_MEMORY";
}

/* Program mode, when the program could not initialise CUDA (no runtime, no
 * driver, no device): it runs as without the shim, nothing is registered,
 * the shim says nothing and holds the locked ranges waiting for a context. */
static void run_scenario(struct run *run, const char *scenario, const char *const *settings);
static void expect_passed(const struct run *run, const char *scenario);
static double stat_number(const struct run *run, const char *key);
static void expect_no_context(const char *const *settings)
{
    const char *scenarios[] = {"basic", "threads", "mremap", "mremap_dontunmap", "fork"};
    for (size_t i = 0; i < 5; i++) {
        struct run run;
        run_scenario(&run, scenarios[i], settings);
        expect_passed(&run, scenarios[i]);
        cr_assert(strstr(run.result.out, "NOTE the program's CUDA initialisation returned 0") ==
                      NULL,
                  "%s", run.result.out);
        cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 0, "%s", run.result.err);
        cr_assert_eq(stat_number(&run, "register.ok"), 0);
        cr_assert_geq(stat_number(&run, "deferred.ranges"), 1, "%s", run.stats);
        cr_assert_eq(stat_number(&run, "deferred.registered_later"), 0);
        run_free(&run);
    }
}

static const char *const scenario_names[] = {"basic",
                                             "small",
                                             "free_locked",
                                             "exit_live",
                                             "memtester",
                                             "partial_munlock",
                                             "overlapping_locks",
                                             "mmap_locked",
                                             "mmap_fixed",
                                             "mremap",
                                             "mremap_dontunmap",
                                             "realloc",
                                             "munlockall",
                                             "mlock2_and_mlockall",
                                             "future_locked",
                                             "errno",
                                             "munlock_hole",
                                             "already_registered",
                                             "fork",
                                             "threads",
                                             "single_threaded"};

/* Both ways free learns a block's size: auto (glibc's chunk header where the
 * checks pass, as they do on this test's own allocator unless something such
 * as memory tagging stops them) and malloc_usable_size. */
static const struct {
    const char *setting;
    const char *source; /* NULL: what the checks choose here */
} block_size_sources[] = {{"PINSHIM_BLOCK_SIZE=auto", NULL},
                          {"PINSHIM_BLOCK_SIZE=allocator", "malloc_usable_size"}};

static void *libc_malloc(size_t size)
{
    return malloc(size);
}
static int libc_posix_memalign(void **out, size_t alignment, size_t size)
{
    return posix_memalign(out, alignment, size);
}
static void libc_free(void *block)
{
    free(block);
}
static size_t libc_usable_size(void *block)
{
    return malloc_usable_size(block);
}

static const char *auto_block_size_source(void)
{
    static const struct block_extent_allocator libc = {libc_malloc, libc_posix_memalign, libc_free,
                                                       libc_usable_size};
    return block_extent_source_name(block_extent_choose(&libc));
}

static void expect_block_size_source(const struct run *run, const char *source)
{
    char used[64] = "";
    cr_assert(json_lite_get_string(run->stats, "block_size_source", used, sizeof(used)), "%s",
              run->stats);
    cr_assert_str_eq(used, source);
}

Test(preload, every_scenario_keeps_the_invariant, .timeout = 240)
{
    for (size_t k = 0; k < 2 * sizeof(scenario_names) / sizeof(*scenario_names); k++) {
        size_t i = k / 2;
        const char *settings[] = {block_size_sources[k % 2].setting, NULL};
        struct run run;
        run_scenario(&run, scenario_names[i], settings);
        expect_passed(&run, scenario_names[i]);
        /* What a scenario could not test here (an emulator's missing calls),
         * once per scenario. */
        for (const char *note = run.result.out;
             k % 2 == 0 && (note = strstr(note, "NOTE ")) != NULL; note++)
            cr_log_info("%s: %.*s", scenario_names[i], (int)strcspn(note, "\n"), note);
        /* Chosen at the first lock that may register, when the runtime is
         * loaded too; never needed before. Under mlockall(MCL_FUTURE) the
         * checks would lock their 40 MiB block: the call is kept. */
        const char *source = block_size_sources[k % 2].source ? block_size_sources[k % 2].source
                                                              : auto_block_size_source();
        if (strcmp(scenario_names[i], "future_locked") == 0 &&
            strstr(run.result.out, "NOTE mlockall failed") == NULL)
            source = "malloc_usable_size";
        /* Something reached the driver: a lock that may register. */
        bool used = run.have_log && run.log.total.register_calls > 0;
        expect_block_size_source(&run, used ? source : "unused");
        if (used)
            expect_clean_runtime(&run);
        else /* the runtime was never loaded: nothing reached PINSHIM_MIN_BYTES */
            cr_assert_eq(stat_number(&run, "register.ok"), 0, "%s", scenario_names[i]);
        /* Quiet when all is well: no line on stderr. */
        cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 0, "%s: %s", scenario_names[i],
                     run.result.err);
        double ok = stat_number(&run, "unregister.ok");
        double by_reason =
            stat_number(&run, "unregister.munlock") + stat_number(&run, "unregister.free") +
            stat_number(&run, "unregister.realloc") + stat_number(&run, "unregister.munmap") +
            stat_number(&run, "unregister.mremap") + stat_number(&run, "unregister.mmap_fixed") +
            stat_number(&run, "unregister.exit") + stat_number(&run, "unregister.join");
        cr_assert_eq(ok + stat_number(&run, "unregister.failed"), by_reason, "%s", run.stats);
        /* Every successful call the runtime saw came from the shim, except the
         * one registration the already_registered program makes itself. */
        double own = strcmp(scenario_names[i], "already_registered") == 0;
        if (run.have_log) {
            cr_assert_eq(stat_number(&run, "register.ok") + own, (double)run.log.total.register_ok,
                         "%s", scenario_names[i]);
            cr_assert_eq(ok + own, (double)run.log.total.unregister_ok, "%s", scenario_names[i]);
        }
        run_free(&run);
    }
}

Test(preload, stats_count_what_happened)
{
    struct run run;
    run_scenario(&run, "basic", NULL);
    expect_passed(&run, "basic");
    cr_assert_eq(stat_number(&run, "register.ok"), 1);
    cr_assert_eq(stat_number(&run, "unregister.munlock"), 1);
    cr_assert_eq(stat_number(&run, "live.ranges"), 0);
    cr_assert_gt(stat_number(&run, "register.bytes"), 1 << 20);
    cr_assert_eq(stat_number(&run, "pid"), (double)run.log.processes[0].pid);
    if (create_mode()) {
        bool loaded = false;
        cr_assert(json_lite_get_bool(run.stats, "cudart.loaded", &loaded) && loaded);
    } else {
        char driver[512] = "";
        cr_assert(json_lite_get_string(run.stats, "context.driver", driver, sizeof(driver)) &&
                      strstr(driver, "libcuda.so.1") != NULL,
                  "%s", run.stats);
    }
    run_free(&run);

    run_scenario(&run, "free_locked", NULL);
    expect_passed(&run, "free_locked");
    cr_assert_eq(stat_number(&run, "unregister.free"), 1);
    run_free(&run);
}

Test(preload, exit_with_live_registrations)
{
    struct run run;
    run_scenario(&run, "exit_live", NULL);
    expect_passed(&run, "exit_live");
    cr_assert_eq(stat_number(&run, "live.ranges"), 2);
    cr_assert_eq(stat_number(&run, "live.bytes"), 4 << 20);
    cr_assert_eq(stat_number(&run, "unregister.exit"), 2);
    expect_clean_runtime(&run);
    run_free(&run);
}

Test(preload, small_locks_never_load_cuda)
{
    struct run run;
    run_scenario(&run, "small", NULL);
    expect_passed(&run, "small");
    bool loaded = true;
    cr_assert(json_lite_get_bool(run.stats, "cudart.loaded", &loaded));
    cr_assert_not(loaded, "the runtime was loaded for locks below PINSHIM_MIN_BYTES");
    cr_assert_geq(stat_number(&run, "register.skipped_small"), 1);
    cr_assert_not(run.have_log && run.log.total.register_calls > 0);
    run_free(&run);
}

Test(preload, min_bytes_lowers_the_threshold)
{
    const char *settings[] = {"PINSHIM_MIN_BYTES=4K", "EXPECT_REGISTRATION=skip", NULL};
    struct run run;
    run_scenario(&run, "small", settings);
    expect_passed(&run, "small");
    cr_assert_eq(stat_number(&run, "register.ok"), 1);
    cr_assert_eq(stat_number(&run, "config.MIN_BYTES"), 4096);
    expect_clean_runtime(&run);
    run_free(&run);
}

Test(preload, runtime_exporting_only_the_two_required_calls)
{
    char cudart[1024];
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", required_env("FAKE_CUDART_MINIMAL"));
    /* The shim loads this runtime itself: create mode, whatever the suite. */
    const char *settings[] = {cudart, "EXPECT_REGISTRATION=skip", "PINSHIM_CONTEXT=create",
                              "SCENARIOS_USE_CUDA=", NULL};
    struct run run;
    run_scenario(&run, "basic", settings);
    expect_passed(&run, "basic");
    cr_assert_eq(stat_number(&run, "register.ok"), 1);
    cr_assert_eq(stat_number(&run, "unregister.ok"), 1);
    expect_clean_runtime(&run);
    run_free(&run);
}

/* Each broken-CUDA case: the program runs as without the shim. In create
 * mode the shim tried to load and use the runtime itself: one warning. In
 * program mode the program's own CUDA initialisation failed, so it has no
 * context: the shim holds its locks waiting for one, quietly. */
static void expect_mlock_only(const char *const *settings, const char *warning_part)
{
    if (!create_mode()) {
        expect_no_context(settings);
        return;
    }
    const char *scenarios[] = {"basic", "threads", "mremap", "mremap_dontunmap", "fork"};
    for (size_t i = 0; i < 4; i++) {
        struct run run;
        run_scenario(&run, scenarios[i], settings);
        expect_passed(&run, scenarios[i]);
        cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 1, "%s", run.result.err);
        cr_assert(strstr(run.result.err, warning_part) != NULL, "%s", run.result.err);
        cr_assert(strstr(run.result.err, "continuing with mlock only") != NULL);
        cr_assert_eq(stat_number(&run, "register.ok"), 0);
        cr_assert_geq(stat_number(&run, "register.skipped_no_runtime"), 1);
        cr_assert_eq(json_lite_type(run.stats, "cudart.error"), JSON_LITE_STRING);
        run_free(&run);
    }
}

Test(faults, runtime_without_driver, .timeout = 120)
{
    const char *settings[] = {"FAKE_CUDART_NO_DRIVER=1", "EXPECT_REGISTRATION=0", NULL};
    expect_mlock_only(settings, "cudaErrorInsufficientDriver");
}

Test(faults, runtime_without_device, .timeout = 120)
{
    const char *settings[] = {"FAKE_CUDART_DEVICES=0", "EXPECT_REGISTRATION=0", NULL};
    expect_mlock_only(settings, "cudaErrorNoDevice");
}

Test(faults, runtime_missing, .timeout = 120)
{
    const char *settings[] = {"PINSHIM_CUDART=/nonexistent/libcudart.so.13",
                              "EXPECT_REGISTRATION=0", NULL};
    expect_mlock_only(settings, "cannot load PINSHIM_CUDART=/nonexistent/libcudart.so.13");
}

/* The real runtime of the CUDA Toolkit, which has no driver on this machine. */
Test(faults, real_cudart_without_driver, .timeout = 120)
{
    const char *real = getenv("REAL_CUDART");
    if (real == NULL || real[0] == '\0' || access(real, R_OK) != 0)
        cr_skip_test("no CUDA Toolkit runtime of this architecture here (REAL_CUDART unset)");
    char cudart[1024];
    snprintf(cudart, sizeof(cudart), "PINSHIM_CUDART=%s", real);
    const char *settings[] = {cudart, "EXPECT_REGISTRATION=0", NULL};
    expect_mlock_only(settings, "cudaError");
}

Test(faults, register_off_loads_nothing)
{
    const char *settings[] = {"PINSHIM_REGISTER=off", "EXPECT_REGISTRATION=0", NULL};
    struct run run;
    run_scenario(&run, "threads", settings);
    expect_passed(&run, "threads");
    cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 0, "%s", run.result.err);
    bool loaded = true;
    cr_assert(json_lite_get_bool(run.stats, "cudart.loaded", &loaded));
    cr_assert_not(loaded);
    cr_assert_not(run.have_log && run.log.total.register_calls > 0,
                  "the shim called the driver or the runtime");
    run_free(&run);
}

Test(faults, every_third_registration_fails, .timeout = 120)
{
    const char *settings[] = {"FAKE_CUDART_FAIL_REGISTER_EVERY=3", "EXPECT_REGISTRATION=skip",
                              NULL};
    struct run run;
    run_scenario(&run, "threads", settings);
    expect_passed(&run, "threads");
    double failed = stat_number(&run, "register.failed");
    cr_assert_gt(failed, 0);
    char error_key[64];
    snprintf(error_key, sizeof(error_key), "errors.%s", out_of_memory_name());
    cr_assert_eq(stat_number(&run, error_key), failed);
    cr_assert_eq(failed, (double)fake_log_register_errors(&run.log.total, 2));
    /* The same failure warns once, not per call. */
    cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 1, "%s", run.result.err);
    expect_clean_runtime(&run);
    run_free(&run);
}

Test(faults, every_fourth_unregistration_fails, .timeout = 120)
{
    const char *settings[] = {"FAKE_CUDART_FAIL_UNREGISTER_EVERY=4", "EXPECT_REGISTRATION=skip",
                              NULL};
    struct run run;
    run_scenario(&run, "threads", settings);
    expect_passed(&run, "threads");
    double failed = stat_number(&run, "unregister.failed");
    cr_assert_gt(failed, 0);
    cr_assert_eq(failed, (double)fake_log_unregister_errors(&run.log.total, 2));
    cr_assert_eq(count_lines_with(run.result.err, unregister_call()), 1, "%s", run.result.err);
    run_free(&run);
}

Test(faults, unwritable_stats_path_warns_and_prints_the_summary)
{
    const char *settings[] = {"PINSHIM_STATS=/nonexistent/dir/stats.%p.json", NULL};
    struct run run;
    run_scenario(&run, "basic", settings);
    cr_assert_eq(run.result.status, 0);
    cr_assert(strstr(run.result.err, "pinshim: cannot write stats to /nonexistent/dir/stats.") !=
                  NULL,
              "%s", run.result.err);
    cr_assert(strstr(run.result.err, "No such file or directory") != NULL);
    cr_assert(strstr(run.result.err, "pinshim: pid ") != NULL, "%s", run.result.err);
    run_free(&run);
}

Test(faults, bad_environment_values_warn_and_run)
{
    const char *settings[] = {"PINSHIM_MIN_BYTES=lots", "PINSHIM_LOG=loud", "PINSHIM_FLAGS=pinned",
                              NULL};
    struct run run;
    run_scenario(&run, "basic", settings);
    expect_passed(&run, "basic");
    cr_assert_eq(count_lines_with(run.result.err, "pinshim:"), 3, "%s", run.result.err);
    cr_assert(strstr(run.result.err, "PINSHIM_MIN_BYTES=\"lots\" is not valid") != NULL);
    cr_assert(strstr(run.result.err, "PINSHIM_LOG=\"loud\" is not valid") != NULL);
    cr_assert(strstr(run.result.err, "PINSHIM_FLAGS=\"pinned\" is not valid") != NULL);
    cr_assert_eq(stat_number(&run, "config.MIN_BYTES"), 65536);
    run_free(&run);
}

Test(observability, info_logs_each_registration_with_size_and_time)
{
    const char *settings[] = {"PINSHIM_LOG=info", NULL};
    struct run run;
    run_scenario(&run, "basic", settings);
    expect_passed(&run, "basic");
    cr_assert(strstr(run.result.err, "pinshim: registered 0x") != NULL, "%s", run.result.err);
    cr_assert(strstr(run.result.err, " ms\n") != NULL);
    cr_assert(strstr(run.result.err, "pinshim: unregistered 0x") != NULL);
    cr_assert(strstr(run.result.err, create_mode() ? "pinshim: using CUDA runtime "
                                                   : "pinshim: registering into the program's "
                                                     "CUDA context") != NULL,
              "%s", run.result.err);
    run_free(&run);
}

Test(observability, stats_to_stderr)
{
    const char *settings[] = {"PINSHIM_STATS=1", NULL};
    struct run run;
    run_scenario(&run, "basic", settings);
    cr_assert_eq(run.result.status, 0);
    cr_assert(strstr(run.result.err, "pinshim: pid ") != NULL, "%s", run.result.err);
    cr_assert(strstr(run.result.err, "registered 1 (") != NULL, "%s", run.result.err);
    cr_assert_null(run.stats);
    run_free(&run);
}
