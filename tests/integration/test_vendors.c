/* Issue 27: HIP and Level Zero programs under the shim, against the fake HIP
 * runtime (with its HSA layer) and the fake Level Zero loader and driver.
 * Each scenario of tests/programs/hip_program.c and ze_program.c runs
 * without the shim and with it: every return code the program printed is
 * the same, the shim registers through the program's own runtime when
 * mlock returns and never starts it, it hands its registrations over to
 * the program's own calls and takes them back, and it leaves no violation
 * the fakes record. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "shim_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The return codes a scenario may print: equal with and without the shim. */
static const char *const return_codes[] = {
    "set_device",    "set_device_99",  "malloc",
    "mlock",         "munlock",        "last_error",
    "own_register",  "own_unregister", "interior_unregister",
    "start",         "own_import",     "own_release",
    "inner_release", "protect",        "unprotect",
};

struct vendor_case {
    const char *program; /* HIP_PROGRAM or ZE_PROGRAM */
    const char *scenario;
    const char *version; /* FAKE_HIP_VERSION, or NULL */
    const char *setting; /* one more "K=V", or NULL */
};

static void run_case(struct shim_run *run, const struct vendor_case *c, bool with_shim)
{
    char version[64];
    snprintf(version, sizeof(version), "FAKE_HIP_VERSION=%s", c->version ? c->version : "");
    /* The fakes check every call against /proc/self/smaps unless the suite
     * runs where mlock does not lock (scripts/sanitize: ASan's mlock). */
    const char *outer_check = getenv("FAKE_GPU_CHECK");
    char check[32];
    snprintf(check, sizeof(check), "FAKE_GPU_CHECK=%s",
             outer_check != NULL && *outer_check ? outer_check : "1");
    const char *defaults[] = {"PINSHIM_CUDART=",
                              "PINSHIM_LOG=",
                              check,
                              "FAKE_GPU_LOG=",
                              "FAKE_ZE_DRIVERS=",
                              "FAKE_ZE_IMPORT=",
                              "FAKE_ZE_IMPORT_DRIVERS=",
                              NULL};
    const char *settings[] = {version, c->setting ? c->setting : "PINSHIM_VENDOR=", NULL};
    const char *argv[] = {shim_run_required_env(c->program), c->scenario, NULL};
    shim_run(run, argv, with_shim, defaults, settings);
}

/* Runs both ways and compares what the program's calls returned. */
static void run_both(struct shim_run *without, struct shim_run *with, const struct vendor_case *c)
{
    run_case(without, c, false);
    run_case(with, c, true);
    for (size_t i = 0; i < sizeof(return_codes) / sizeof(*return_codes); i++) {
        const char *key = return_codes[i];
        char line[64];
        snprintf(line, sizeof(line), "\n%s=", key);
        bool printed = strncmp(without->result.out, line + 1, strlen(line + 1)) == 0 ||
                       strstr(without->result.out, line) != NULL;
        if (!printed)
            continue;
        char expected[64];
        snprintf(expected, sizeof(expected), "%s", shim_run_printed(without, key));
        cr_assert_str_eq(shim_run_printed(with, key), expected,
                         "%s %s: %s differs with the shim\nwithout:\n%s\nwith:\n%s%s", c->program,
                         c->scenario, key, without->result.out, with->result.out, with->result.err);
    }
}

static long long printed(const struct shim_run *run, const char *key)
{
    return shim_run_printed_number(run, key);
}

/* ---- HIP ---- */

/* Criterion may run each parameter in a process of its own (addresses
 * differ there): the parameters are indexes into these tables. ROCm 5.2 to 6.1, 6.2 on (a refused
 * call in a capture invalidates it), 7.0 to 7.2 (a second registration still taken silently), and a
 * newer one with rocm-systems #7498's refusal (hipErrorHostMemoryAlreadyRegistered). */
static const char *const hip_versions[] = {"5.2", "6.2", "7.2", "7.3"};
static const int four[] = {0, 1, 2, 3};

ParameterizedTestParameters(vendors, hip_registers_when_mlock_returns)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_registers_when_mlock_returns)
{
    const char *const *version = &hip_versions[*index];
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "started", *version, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned"), 1, "hipPointerGetAttributes: %s", with.result.out);
    cr_assert_eq(printed(&without, "pinned"), 0);
    cr_assert_eq(printed(&with, "registered_after_munlock"), 0);
    cr_assert_eq(printed(&with, "pinned_after_munlock"), 0);
    cr_assert_eq(printed(&with, "shim_register_calls"), 1);
    cr_assert_eq(printed(&with, "shim_unregister_calls"), 1);
    cr_assert_eq(printed(&with, "violations"), 0);
    shim_run_expect_no_warning(&with);
    shim_run_free(&without);
    shim_run_free(&with);
}

ParameterizedTestParameters(vendors, hip_never_started_by_the_shim)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_never_started_by_the_shim)
{
    const char *const *version = &hip_versions[*index];
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "deferred", *version, NULL};
    run_both(&without, &with, &c);
    /* Locked before the program's first HIP call: HIP (and HSA below it)
     * still unstarted, nothing registered; registered once it started. */
    cr_assert_eq(printed(&with, "registered_before_start"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "started_by_then"), 0, "the shim started HIP: %s", with.result.out);
    cr_assert_eq(printed(&with, "registered_after_start"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned"), 1);
    cr_assert_eq(printed(&with, "violations"), 0);
    cr_assert_eq(shim_run_stats_number(&with, "deferred", "registered_later"), 1, "%s", with.stats);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The shim's HIP calls run on a thread of their own: the program's last
 * error (HIP sets it at every call before ROCm 7) stays what its own last
 * call left. */
ParameterizedTestParameters(vendors, hip_last_error_is_the_programs)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_last_error_is_the_programs)
{
    const char *const *version = &hip_versions[*index];
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "last_error", *version, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "last_error"), 101, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered"), 1);
    shim_run_free(&without);
    shim_run_free(&with);
}

struct ownership {
    const char *scenario;
    const char *version;
};

static const struct ownership hip_ownership[] = {
    {"own_exact", "5.2"}, {"own_exact", "6.2"}, {"own_exact", "7.3"}, {"own_part", "5.2"},
    {"own_part", "6.2"},  {"own_part", "7.3"},  {"own_first", "5.2"}, {"own_first", "6.2"},
    {"own_first", "7.3"}, {"interior", "6.2"},
};

static const int hip_ownership_cases[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

ParameterizedTestParameters(vendors, hip_ownership)
{
    return cr_make_param_array(int, hip_ownership_cases,
                               sizeof(hip_ownership_cases) / sizeof(*hip_ownership_cases));
}

/* The program's own hipHostRegister and hipHostUnregister return what they
 * return without the shim; the pages are the program's while it holds them
 * registered and the shim's again after (registered_after). */
ParameterizedTest(const int *index, vendors, hip_ownership)
{
    const struct ownership *o = &hip_ownership[*index];
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", o->scenario, o->version, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered_after"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned_after"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered_after_munlock"), 0);
    /* Violations only where the program registered unlocked memory itself. */
    cr_assert_eq(printed(&with, "violations"), printed(&without, "violations"), "%s",
                 with.result.out);
    if (strcmp(o->scenario, "own_exact") == 0) {
        /* Handed over and kept without a call: the runtime sees as many
         * calls as without the shim. */
        cr_assert_eq(printed(&with, "shim_register_calls") +
                         printed(&with, "program_register_calls"),
                     printed(&without, "program_register_calls"));
        cr_assert_eq(printed(&with, "shim_unregister_calls") +
                         printed(&with, "program_unregister_calls"),
                     printed(&without, "program_unregister_calls"));
        cr_assert_eq(shim_run_stats_number(&with, "program", "handed_over"), 1, "%s", with.stats);
        cr_assert_eq(shim_run_stats_number(&with, "program", "kept"), 1, "%s", with.stats);
    }
    if (strcmp(o->scenario, "own_first") == 0)
        cr_assert_eq(printed(&with, "registered"), 0, "the program's pages: %s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A registration the shim cannot see (the program's call through
 * libamdhip64's own handle): before ROCm 7 HIP would take a second
 * registration of the same memory without a word, and the program's
 * unregistration would then leave the shim's in place. The shim asks
 * hipPointerGetAttributes first in every version (the version with
 * rocm-systems #7498's refusal is not pinned down), and leaves the memory to
 * the program. */
ParameterizedTestParameters(vendors, hip_registration_the_shim_cannot_see)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_registration_the_shim_cannot_see)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "own_unseen", hip_versions[*index], NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned_between"), 0, "a second registration stayed: %s",
                 with.result.out);
    cr_assert_eq(printed(&with, "violations"), printed(&without, "violations"));
    cr_assert_eq(shim_run_stats_number(&with, "register", "already_registered"), 1, "%s",
                 with.stats);
    /* Asked first in every version: no registration call at all. */
    cr_assert_eq(printed(&with, "shim_register_calls"), 0, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Read-only memory: HIP has no read-only registration (0x8 is ignored, or
 * coarse-grained since rocm-systems #6278) and KFD pins for writing, so the
 * shim leaves it locked only, without a warning, in every version. */
ParameterizedTestParameters(vendors, hip_read_only_stays_locked_only)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_read_only_stays_locked_only)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "read_only", hip_versions[*index], NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "protect"), 0);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned"), 0, "%s", with.result.out);
    cr_assert_eq(shim_run_stats_number(&with, "register", "skipped_read_only_unsupported"), 1, "%s",
                 with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "register", "read_only"), 0, "%s", with.stats);
    cr_assert_eq(printed(&with, "shim_unregister_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), 0, "%s", with.result.out);
    shim_run_expect_no_warning(&with);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A registration the shim cannot see, strictly inside the buffer it then
 * locks: the first and last byte say nothing of it, and before ROCm 7.3 a
 * registration over it would be taken and split the program's lookups. The
 * shim asks every page and leaves the buffer to the program. */
ParameterizedTestParameters(vendors, hip_registration_inside_the_range_is_found)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_registration_inside_the_range_is_found)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "own_unseen_inside", hip_versions[*index], NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "own_register"), 0);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "part_pinned"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "own_unregister"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_register_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), printed(&without, "violations"), "%s",
                 with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A thread captures a graph in the global mode while main locks memory and
 * unlocks some: the double refuses hipHostRegister and hipHostUnregister of
 * a thread in the global mode then (and from 6.2 invalidates the capture);
 * the shim's thread takes the relaxed mode, so the capture ends with its
 * graph and the memory is registered, in every version. */
ParameterizedTestParameters(vendors, hip_graph_captured_beside_locks_completes)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_graph_captured_beside_locks_completes)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "capture", hip_versions[*index], NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&without, "capture_end"), 0, "%s", without.result.out);
    cr_assert_eq(printed(&with, "capture_begin"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "capture_end"), 0, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "graph"), 1);
    cr_assert_eq(printed(&with, "refusals"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "pinned"), 1);
    cr_assert_eq(printed(&with, "other_pinned"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), 0);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The parent started HIP and locked nothing (no registration had chosen
 * HIP); its forked child locks: the shim calls HIP not at all there. */
Test(vendors, hip_fork_child_calls_nothing)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "fork_child", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "child_status"), 0, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "child_mlock"), 0);
    cr_assert_eq(printed(&with, "child_registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "child_shim_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* HIP's start failed: with no GPU (HSA stays closed, as ROCm 5.2.3's does
 * without /dev/kfd), or with HSA open and no GPU agent. The program runs as
 * without the shim, and the shim calls HIP not at all. */
static const char *const hip_failed_starts[][2] = {{"5.2", NULL},
                                                   {"6.2", NULL},
                                                   {"5.2", "FAKE_HSA_OPEN_WITHOUT_GPU=1"},
                                                   {"7.3", "FAKE_HSA_OPEN_WITHOUT_GPU=1"}};

ParameterizedTestParameters(vendors, hip_failed_start_is_final)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, hip_failed_start_is_final)
{
    char version[64];
    snprintf(version, sizeof(version), "FAKE_HIP_VERSION=%s", hip_failed_starts[*index][0]);
    const char *settings[] = {"FAKE_HIP_DEVICES=0", version, hip_failed_starts[*index][1], NULL};
    const char *argv[] = {shim_run_required_env("HIP_PROGRAM"), "no_device", NULL};
    const char *defaults[] = {"PINSHIM_CUDART=", "PINSHIM_LOG=info",
                              "FAKE_GPU_LOG=", "FAKE_HSA_OPEN_WITHOUT_GPU=", NULL};
    struct shim_run without, with;
    shim_run(&without, argv, false, defaults, settings);
    shim_run(&with, argv, true, defaults, settings);
    const char *keys[] = {"init", "device_count", "own_register", "mlock", "munlock", "last_error"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(*keys); i++) {
        char expected[64];
        snprintf(expected, sizeof(expected), "%s", shim_run_printed(&without, keys[i]));
        cr_assert_str_eq(shim_run_printed(&with, keys[i]), expected, "%s: %s", keys[i],
                         with.result.out);
    }
    cr_assert_neq(printed(&with, "init"), 0);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_calls"), 0, "%s%s", with.result.out, with.result.err);
    if (hip_failed_starts[*index][1] != NULL)
        cr_assert(strstr(with.result.err, "HIP's start failed") != NULL, "%s", with.result.err);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* At exit the shim unregisters before HIP tears itself down (an exit handler
 * registered once HIP was chosen, after HIP started), and says which vendor
 * and call it used. */
Test(vendors, hip_exit_and_stats)
{
    struct shim_run without, with;
    struct vendor_case c = {"HIP_PROGRAM", "exit_locked", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "exit"), 1, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "ok"), 1, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "exit_unloading"), 0, "%s", with.stats);
    cr_assert(strstr(with.stats, "\"accelerator\": {\"vendor\": \"hip\", \"title\": \"HIP\", "
                                 "\"register_call\": \"hipHostRegister\", \"unregister_call\": "
                                 "\"hipHostUnregister\"") != NULL,
              "%s", with.stats);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* ---- Level Zero ---- */

Test(vendors, ze_registers_when_mlock_returns)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "started", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_base"), 1, "zexDriverGetHostPointerBaseAddress: %s",
                 with.result.out);
    cr_assert_eq(printed(&with, "imported_after_munlock"), 0);
    cr_assert_eq(printed(&with, "shim_import_calls"), 1);
    cr_assert_eq(printed(&with, "shim_release_calls"), 1);
    cr_assert_eq(printed(&with, "violations"), 0, "loader handles, early calls: %s",
                 with.result.out);
    shim_run_expect_no_warning(&with);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Of two drivers (a GPU's and, say, an NPU's without the import), the one
 * that offers it. */
Test(vendors, ze_picks_the_driver_with_the_import)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "started", NULL, "FAKE_ZE_DRIVERS=2"};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_base"), 1);
    cr_assert_eq(printed(&with, "violations"), 0);
    shim_run_free(&without);
    shim_run_free(&with);
}

Test(vendors, ze_never_started_by_the_shim)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "deferred", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered_before_start"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "started_by_then"), 0, "the shim called zeInit: %s",
                 with.result.out);
    cr_assert_eq(printed(&with, "registered_after_start"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_base"), 1);
    /* No call but zeDriverGet before zeInit (the others crash loaders from
     * 1.15.7): the fake records any as "too_early". */
    cr_assert_eq(printed(&with, "violations"), 0, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Loader 1.15.7 crashes on zeDriverGet before zeInit: the shim does not ask
 * it, and learns of the program's zeInit by defining zeInit itself. */
Test(vendors, ze_loader_1_15_7_is_not_asked_before_zeinit)
{
    struct shim_run without, with;
    char path[1100];
    snprintf(path, sizeof(path), "LD_LIBRARY_PATH=%s", shim_run_required_env("FAKE_ZE_1_15_7"));
    struct vendor_case c = {"ZE_PROGRAM", "deferred", NULL, path};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered_before_start"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered_after_start"), 1, "%s%s", with.result.out,
                 with.result.err);
    shim_run_free(&without);
    shim_run_free(&with);
}

static const char *const ze_ownership[] = {"own_exact", "own_inside", "own_first", "release_inner"};

ParameterizedTestParameters(vendors, ze_ownership)
{
    return cr_make_param_array(int, four, 4);
}

/* The program's own imports and releases (SYCL's prepare_for_device_copy
 * and release_from_device_copy) return what they return without the shim;
 * a release of the program's never drops an import of the shim's, nor the
 * other way round. */
ParameterizedTest(const int *index, vendors, ze_ownership)
{
    const char *const *scenario = &ze_ownership[*index];
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", *scenario, NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered_after"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_after"), 1, "the import is gone: %s", with.result.out);
    cr_assert_eq(printed(&with, "imported_after_munlock"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), printed(&without, "violations"), "%s",
                 with.result.out);
    if (strcmp(*scenario, "own_exact") == 0) {
        cr_assert_eq(printed(&with, "shim_import_calls") + printed(&with, "program_import_calls"),
                     printed(&without, "program_import_calls"));
        cr_assert_eq(printed(&with, "shim_release_calls") + printed(&with, "program_release_calls"),
                     printed(&without, "program_release_calls"));
    }
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Read-only memory: compute-runtime's userptr is pinned for writing, and
 * the import takes no flags: locked only, without a warning. */
Test(vendors, ze_read_only_stays_locked_only)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "read_only", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "protect"), 0);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_base"), 0, "%s", with.result.out);
    cr_assert_eq(shim_run_stats_number(&with, "register", "skipped_read_only_unsupported"), 1, "%s",
                 with.stats);
    cr_assert_eq(printed(&with, "shim_release_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), 0, "%s", with.result.out);
    shim_run_expect_no_warning(&with);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A driver whose import is off (EnableHostPointerImport=0): every import
 * fails; the program goes on as without the shim, warned once. */
Test(vendors, ze_import_off)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "started", NULL, "FAKE_ZE_IMPORT=0"};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(shim_run_stats_number(&with, "register", "failed"), 1, "%s", with.stats);
    cr_assert(strstr(with.result.err, "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE") != NULL, "%s",
              with.result.err);
    shim_run_free(&without);
    shim_run_free(&with);
}

Test(vendors, ze_exit_and_stats)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "exit_locked", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "ok"), 1, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "exit_unloading"), 0, "%s", with.stats);
    cr_assert(strstr(with.stats, "\"register_call\": \"zexDriverImportExternalPointer\"") != NULL,
              "%s", with.stats);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Issue 35: a start that fails is final. The driver finds no device; the
 * loader (up to 1.17.28) has unloaded it and jumps into unmapped code at
 * the next driver call, or (later loaders over Intel's drivers before 23.48)
 * answers one driver with a NULL handle that crashes the next call: the
 * double raises SIGSEGV there. The program's zeInit is seen by the shim's
 * definition, or not (called through the loader's handle, as SYCL's own
 * loader front end does): either way the shim asks no driver anything, the
 * program runs as without it, and its memory stays locked only. */
static const char *const failed_starts[][2] = {
    {"start_then_lock", NULL},
    {"start_then_lock_unseen", NULL},
    {"start_then_lock", "FAKE_ZE_LOADER_KEEPS_DRIVERS=1"},
    {"start_then_lock_unseen", "FAKE_ZE_LOADER_KEEPS_DRIVERS=1"},
};

ParameterizedTestParameters(vendors, ze_failed_start_is_final)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, ze_failed_start_is_final)
{
    const char *scenario = failed_starts[*index][0], *loader = failed_starts[*index][1];
    struct shim_run without, with;
    const char *settings[] = {"FAKE_ZE_START=fail", loader, NULL}; /* loader NULL: ends here */
    const char *argv[] = {shim_run_required_env("ZE_PROGRAM"), scenario, NULL};
    const char *defaults[] = {"PINSHIM_CUDART=", "PINSHIM_LOG=", "FAKE_GPU_LOG=", NULL};
    shim_run(&without, argv, false, defaults, settings);
    shim_run(&with, argv, true, defaults, settings);
    cr_assert_eq(without.result.status, 0, "%s%s", without.result.out, without.result.err);
    cr_assert_eq(with.result.status, 0, "%s with the shim: status %d\n%s%s", scenario,
                 with.result.status, with.result.out, with.result.err);
    const char *keys[] = {"start", "mlock", "munlock"};
    for (size_t i = 0; i < 3; i++) {
        char expected[64];
        snprintf(expected, sizeof(expected), "%s", shim_run_printed(&without, keys[i]));
        cr_assert_str_eq(shim_run_printed(&with, keys[i]), expected, "%s", keys[i]);
    }
    cr_assert_str_eq(shim_run_printed(&with, "start"), "0x78000001");
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_driver_get_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_extension_calls"), 0, "%s", with.result.out);
    /* The program's zeInit only: the shim calls none in program mode. */
    cr_assert_eq(printed(&with, "init_calls"), 1, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* SYCL's Level Zero adapter reaches the driver through a loader of its own
 * (the program's unseen functions stand for it): its prepare_for_device_copy
 * inside the shim's import is a no-op and its release_from_device_copy
 * drops the shim's whole import. At the next operation on the range (here
 * the rest of the buffer locked, which joins it) the shim finds its import
 * gone, releases nothing, counts it, and imports the memory again: the
 * program no longer holds it and it is still locked. */
Test(vendors, ze_import_dropped_by_sycl_is_noticed_and_made_again)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "sycl_dropped", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "prepare"), 0);
    cr_assert_eq(printed(&with, "release"), 0);
    cr_assert_eq(printed(&with, "imported_between"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "registered_after"), 1, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "imported_after"), 1, "imported again, whole: %s", with.result.out);
    cr_assert_eq(printed(&with, "imported_after_munlock"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_release_calls"), 1, "only its own import: %s",
                 with.result.out);
    cr_assert_eq(printed(&with, "violations"), 0, "%s", with.result.out);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "failed"), 0, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "gone"), 1, "%s", with.stats);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The same drop, then the program imports at the buffer's base for itself
 * (SYCL's next prepare_for_device_copy): when the shim's range is unlocked,
 * the import at its base is the program's, and the shim leaves it. */
Test(vendors, ze_program_import_at_the_shims_base_is_never_released)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "sycl_at_base", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "own_import"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "munlock_half"), 0);
    cr_assert_eq(printed(&with, "own_import_kept"), 1, "the shim released the program's: %s",
                 with.result.out);
    cr_assert_eq(printed(&with, "own_release"), 0);
    cr_assert_eq(printed(&with, "shim_release_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "violations"), printed(&without, "violations"));
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Two drivers that import: the program's import and release on driver 1
 * leave the shim's import on driver 0 alone (ownership follows the driver). */
Test(vendors, ze_import_on_another_driver_is_not_the_shims_business)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "other_driver", NULL, "FAKE_ZE_IMPORT_DRIVERS=2"};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "other_import"), 0);
    cr_assert_eq(printed(&with, "registered_beside"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_beside"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "other_release"), 0);
    cr_assert_eq(printed(&with, "registered_after"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_after"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "imported_after_munlock"), 0);
    cr_assert_eq(printed(&with, "violations"), 0, "%s", with.result.out);
    /* The shim's own import and release, once each (the double's count by
     * caller would also take the wrappers' forwarding of the program's
     * calls, which a build may or may not make a tail call). */
    cr_assert_eq(shim_run_stats_number(&with, "register", "ok"), 1, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "ok"), 1, "%s", with.stats);
    cr_assert_eq(shim_run_stats_number(&with, "program", "handed_over"), 0, "%s", with.stats);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A start the shim cannot see (zeInit through the loader's handle, as
 * SYCL's adapter reaches it) that succeeded: the shim cannot ask Level Zero
 * about it safely (ze_backend.c says why), so it asks nothing, starts
 * nothing, and the memory stays locked only; the program runs as without
 * it. Create mode registers such a program's memory (PINSHIM_VENDOR=ze). */
Test(vendors, ze_start_the_shim_cannot_see_is_left_alone)
{
    struct shim_run without, with;
    const char *argv[] = {shim_run_required_env("ZE_PROGRAM"), "start_then_lock_unseen", NULL};
    const char *defaults[] = {"PINSHIM_CUDART=",  "PINSHIM_LOG=",    "FAKE_GPU_LOG=",
                              "PINSHIM_CONTEXT=", "PINSHIM_VENDOR=", NULL};
    shim_run(&without, argv, false, defaults, NULL);
    shim_run(&with, argv, true, defaults, NULL);
    cr_assert_eq(with.result.status, 0, "%s%s", with.result.out, with.result.err);
    cr_assert_str_eq(shim_run_printed(&with, "start"), "0");
    cr_assert_eq(printed(&with, "mlock"), printed(&without, "mlock"));
    cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "init_calls"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_driver_get_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_extension_calls"), 0, "%s", with.result.out);
    shim_run_free(&with);
    const char *create[] = {"PINSHIM_CONTEXT=create", "PINSHIM_VENDOR=ze", NULL};
    shim_run(&with, argv, true, defaults, create);
    cr_assert_eq(with.result.status, 0, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "registered"), 1, "%s%s", with.result.out, with.result.err);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* Create mode after the program's failed start, for each vendor setting:
 * the program runs as without the shim, and the shim asks Level Zero's
 * driver nothing (with auto, or cuda, the fake CUDA runtime may register). */
static const char *const create_vendors[] = {"PINSHIM_VENDOR=ze", "PINSHIM_VENDOR=auto",
                                             "PINSHIM_VENDOR=cuda", "PINSHIM_VENDOR=hip"};

ParameterizedTestParameters(vendors, ze_failed_start_in_create_mode)
{
    return cr_make_param_array(int, four, 4);
}

ParameterizedTest(const int *index, vendors, ze_failed_start_in_create_mode)
{
    struct shim_run without, with;
    const char *settings[] = {"FAKE_ZE_START=fail", "PINSHIM_CONTEXT=create",
                              create_vendors[*index], NULL};
    const char *argv[] = {shim_run_required_env("ZE_PROGRAM"), "start_then_lock", NULL};
    const char *defaults[] = {"PINSHIM_CUDART=", "PINSHIM_LOG=", "FAKE_GPU_LOG=", NULL};
    shim_run(&without, argv, false, defaults, settings);
    shim_run(&with, argv, true, defaults, settings);
    cr_assert_eq(with.result.status, 0, "status %d\n%s%s", with.result.status, with.result.out,
                 with.result.err);
    cr_assert_eq(printed(&with, "mlock"), printed(&without, "mlock"));
    cr_assert_eq(printed(&with, "munlock"), printed(&without, "munlock"));
    if (*index == 0)
        cr_assert_eq(printed(&with, "registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_driver_get_calls"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "shim_extension_calls"), 0, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}

/* A child of a process that started Level Zero calls it not at all: its
 * locks stay locked only, and the parent's registration is untouched. */
Test(vendors, ze_fork_child_calls_nothing)
{
    struct shim_run without, with;
    struct vendor_case c = {"ZE_PROGRAM", "fork_child", NULL, NULL};
    run_both(&without, &with, &c);
    cr_assert_eq(printed(&with, "registered"), 1, "%s", with.result.out);
    cr_assert_eq(printed(&with, "child_status"), 0, "%s%s", with.result.out, with.result.err);
    cr_assert_eq(printed(&with, "child_mlock"), 0);
    cr_assert_eq(printed(&with, "child_registered"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "child_imported"), 0, "%s", with.result.out);
    cr_assert_eq(printed(&with, "child_shim_calls"), 0, "%s", with.result.out);
    shim_run_free(&without);
    shim_run_free(&with);
}
