/* Issue 17: registered when mlock returns, and a buffer shared with the
 * program costs the runtime nothing extra. tests/programs/sharing.c, a GPU
 * program linked against the fake runtime, runs each scenario without the
 * shim and with it in every mode (program and create, registration inside
 * the lock call and on the shim's thread); the driver double counts every
 * cuMemHostRegister and cuMemHostUnregister it sees, whoever makes them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child.h"
#include "shim_run.h"

/* Runs sharing with arguments; with the shim when settings is not NULL. */
static void run_sharing(struct shim_run *run, const char *scenario, const char *argument,
                        const char *const *settings)
{
    static const char *const defaults[] = {
        "PINSHIM_LOG=",     "PINSHIM_FLAGS=",      "PINSHIM_MIN_BYTES=",
        "PINSHIM_CONTEXT=", "PINSHIM_ASYNC=",      "FAKE_CUDART_LOG=",
        "FAKE_CUDA_LOG=",   "FAKE_CUDART_CHECK=1", NULL};
    const char *argv[] = {shim_run_required_env("SHARING"), scenario, argument, NULL};
    shim_run(run, argv, settings != NULL, defaults, settings);
}

/* Every mode the shim has: where registrations go, and when. */
static const char *const modes[][3] = {
    {"PINSHIM_CONTEXT=program", "PINSHIM_ASYNC=off", NULL},
    {"PINSHIM_CONTEXT=program", "PINSHIM_ASYNC=on", NULL},
    {"PINSHIM_CONTEXT=create", "PINSHIM_ASYNC=off", NULL},
    {"PINSHIM_CONTEXT=create", "PINSHIM_ASYNC=on", NULL},
};
#define MODE_COUNT (sizeof modes / sizeof modes[0])

/* Each count with the shim equals the one without (exactly), or is no
 * larger (at_most). */
static void expect_same_counts(const char *scenario, const char *argument, const char *const *keys,
                               bool at_most)
{
    struct shim_run without;
    run_sharing(&without, scenario, argument, NULL);
    for (size_t m = 0; m < MODE_COUNT; m++) {
        struct shim_run with;
        run_sharing(&with, scenario, argument, modes[m]);
        for (size_t k = 0; keys[k] != NULL; k++) {
            long long got = shim_run_printed_number(&with, keys[k]),
                      expected = shim_run_printed_number(&without, keys[k]);
            cr_assert(at_most ? got <= expected : got == expected,
                      "%s with %s %s: %s is %lld, without the shim %lld\nwithout the shim:\n%s\n"
                      "with it:\n%s",
                      scenario, modes[m][0], modes[m][1], keys[k], got, expected,
                      without.result.out, with.result.out);
        }
        shim_run_expect_no_warning(&with);
        cr_assert_eq(shim_run_stats_number(&with, "live", "ranges"), 0);
        shim_run_free(&with);
    }
    shim_run_free(&without);
}

/* DeepSpeed's native pinned buffers: 20 registrations and 20
 * unregistrations without the shim, and the same with it, in every mode
 * (before issue 17: 60 and 60 synchronously, 20 to 24 with the thread). */
Test(sharing, deepspeed_order_costs_the_runtime_nothing_extra)
{
    const char *keys[] = {"runtime_registers", "runtime_unregisters", "live_at_end", NULL};
    expect_same_counts("deepspeed", "20", keys, false);
}

/* The other orders: the same calls, except that a buffer the program
 * registers and unregisters again and again while it stays locked is
 * registered once (the shim keeps it between the program's registrations),
 * fewer calls than without the shim. */
Test(sharing, every_order_costs_the_runtime_nothing_extra)
{
    const char *exactly[] = {"register_first_registers",
                             "register_first_unregisters",
                             "unregister_while_locked_registers",
                             "unregister_while_locked_unregisters",
                             "unlock_while_registered_registers",
                             "unlock_while_registered_unregisters",
                             "pinned_after_unlock",
                             "pinned_at_end",
                             NULL};
    expect_same_counts("orders", NULL, exactly, false);
    const char *at_most[] = {"again_and_again_registers", "again_and_again_unregisters", NULL};
    expect_same_counts("orders", NULL, at_most, true);
    struct shim_run run;
    run_sharing(&run, "orders", NULL, modes[0]);
    cr_assert_eq(shim_run_printed_number(&run, "again_and_again_registers"), 1, "%s",
                 run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "again_and_again_unregisters"), 1);
    shim_run_free(&run);
}

/* By default the buffer is pinned when mlock returns (no pinshim_drain),
 * the program's register takes the shim's registration over and its
 * unregister leaves it with the shim: no call for either. */
Test(sharing, pinned_when_mlock_returns_and_handed_over_without_a_call)
{
    for (size_t m = 0; m < MODE_COUNT; m += 2) { /* PINSHIM_ASYNC=off: program, create */
        struct shim_run run;
        run_sharing(&run, "deepspeed", "20", m == 0 ? (const char *const[]){NULL} : modes[m]);
        cr_assert_eq(shim_run_printed_number(&run, "pinned_at_return"), 20, "%s\n%s", modes[m][0],
                     run.result.out);
        cr_assert_eq(shim_run_printed_number(&run, "runtime_registers"), 20);
        cr_assert_eq(shim_run_stats_number(&run, "register", "ok"), 20, "%s", run.stats);
        cr_assert_eq(shim_run_stats_number(&run, "program", "handed_over"), 20, "%s", run.stats);
        cr_assert_eq(shim_run_stats_number(&run, "program", "kept"), 20, "%s", run.stats);
        cr_assert_eq(shim_run_stats_number(&run, "unregister", "program"), 0, "%s", run.stats);
        cr_assert_eq(shim_run_stats_number(&run, "unregister", "munlock"), 20, "%s", run.stats);
        shim_run_free(&run);
    }
    /* Without the shim, nothing is pinned by mlock. */
    struct shim_run without;
    run_sharing(&without, "deepspeed", "20", NULL);
    cr_assert_eq(shim_run_printed_number(&without, "pinned_at_return"), 0);
    shim_run_free(&without);
}

/* Flags that do not mean the same (portable only, without mapped): not
 * the shim's registration, so the shim gives its own up first, as before. */
Test(sharing, other_flags_keep_the_protocol)
{
    struct shim_run without, with;
    run_sharing(&without, "other-flags", NULL, NULL);
    run_sharing(&with, "other-flags", NULL, modes[0]);
    cr_assert_eq(shim_run_printed_number(&without, "other_flags_registers"), 1);
    cr_assert_eq(shim_run_printed_number(&with, "other_flags_registers"), 3,
                 "the shim's, the program's, the shim's again\n%s", with.result.out);
    cr_assert_eq(shim_run_stats_number(&with, "program", "handed_over"), 0);
    cr_assert_eq(shim_run_stats_number(&with, "unregister", "program"), 1);
    cr_assert_eq(shim_run_stats_number(&with, "program", "taken_back"), 1);
    cr_assert_eq(shim_run_printed_number(&with, "pinned_after_unregister"), 1, "the shim's again");
    shim_run_free(&without);
    shim_run_free(&with);
}

/* The driver locks and unlocks memory for itself while it holds its own
 * lock (cudaHostAlloc, cudaFreeHost): the shim passes those calls through
 * and never calls back into the driver from inside it. Before issue 17 it
 * registered inside that mlock and waited for the driver's lock forever. */
Test(sharing, locks_made_by_the_driver_itself_pass_through, .timeout = 60)
{
    for (size_t m = 0; m < MODE_COUNT; m++) {
        struct shim_run run;
        run_sharing(&run, "host-alloc", NULL, modes[m]);
        cr_assert_eq(shim_run_printed_number(&run, "host_alloc_pinned"), 1);
        cr_assert_eq(shim_run_printed_number(&run, "host_alloc_registers"), 0, "%s",
                     run.result.out);
        cr_assert_eq(shim_run_printed_number(&run, "host_alloc_unregisters"), 0);
        cr_assert_eq(shim_run_stats_number(&run, "register", "skipped_runtime_library"), 1, "%s",
                     run.stats);
        cr_assert_eq(shim_run_stats_number(&run, "register", "ok"), 0);
        shim_run_free(&run);
    }
}
