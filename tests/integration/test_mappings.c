/* Issue 18: every kind of locked mapping is registered with the flags the
 * real driver needs, piece by piece where a lock spans several, and what no
 * driver pins is left out, counted and named once. tests/programs/mappings.c
 * (a GPU program on the fake runtime and driver, which refuse what the real
 * ones refuse) runs each kind under the shim's defaults. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "emulation.h"
#include "shim_run.h"

#define DEFAULT_FLAGS 3    /* PORTABLE | DEVICEMAP: cudaHostRegisterDefault */
#define READ_ONLY_FLAGS 11 /* ... | READ_ONLY */

static void run_mappings(struct shim_run *run, const char *scenario, const char *argument,
                         const char *const *settings)
{
    static const char *const defaults[] = {"PINSHIM_LOG=",
                                           "PINSHIM_FLAGS=",
                                           "PINSHIM_MIN_BYTES=4K",
                                           "PINSHIM_CONTEXT=",
                                           "PINSHIM_ASYNC=",
                                           "FAKE_CUDART_LOG=",
                                           "FAKE_CUDART_CHECK=1",
                                           "FAKE_CUDA_READ_ONLY_REGISTER=",
                                           "FAKE_CUDA_LONGTERM_PINS=1",
                                           "FAKE_CUDA_HOST_PAGE_TABLES=",
                                           NULL};
    const char *argv[] = {shim_run_required_env("MAPPINGS"), scenario, argument, NULL};
    shim_run(run, argv, true, defaults, settings);
}

static void expect_quiet(const struct shim_run *run)
{
    shim_run_expect_no_warning(run);
    cr_assert_eq(shim_run_stats_number(run, "register", "failed"), 0, "%s", run->stats);
    cr_assert_eq(shim_run_stats_number(run, "live", "ranges"), 0, "%s", run->stats);
}

Test(mappings, a_read_only_file_mapping_is_registered_read_only)
{
    const char *modes[][2] = {{NULL, NULL}, {"PINSHIM_CONTEXT=create", NULL}};
    for (size_t m = 0; m < 2; m++) {
        struct shim_run run;
        run_mappings(&run, "read-only-file", NULL, modes[m]);
        cr_assert_eq(shim_run_printed_number(&run, "flags"), READ_ONLY_FLAGS, "%s\n%s",
                     run.result.out, run.stats);
        cr_assert_eq(shim_run_printed_number(&run, "flags_at_end"), READ_ONLY_FLAGS);
        cr_assert_eq(shim_run_printed_number(&run, "after_unlock"), -1);
        cr_assert_eq(shim_run_stats_number(&run, "register", "read_only"), 1);
        cr_assert_eq(shim_run_stats_number(&run, "register", "by_pieces"), 1);
        expect_quiet(&run);
        shim_run_free(&run);
    }
}

Test(mappings, read_only_private_memory_is_registered_read_only)
{
    struct shim_run run;
    run_mappings(&run, "read-only-private", NULL, NULL);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), READ_ONLY_FLAGS, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "after_unlock"), -1);
    expect_quiet(&run);
    shim_run_free(&run);
}

/* Linux 6.5 refuses long-term write pins of shared file mappings that need
 * dirty tracking, and the open kernel modules pin long-term on x86: left
 * out, counted; the program goes on. Without long-term pins (aarch64, older
 * drivers) it registers as any memory. */
Test(mappings, a_writable_shared_file_mapping_is_left_out_where_it_cannot_be_pinned)
{
    const char *directory = test_writeback_directory();
    if (directory == NULL)
        cr_skip_test("no writable directory on a disk file system (., /var/tmp, /tmp)");
    struct shim_run run;
    run_mappings(&run, "shared-file", directory, NULL);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), -1, "%s", run.result.out);
    cr_assert_eq(shim_run_stats_number(&run, "register", "skipped_shared_file"), 1, "%s",
                 run.stats);
    expect_quiet(&run);
    shim_run_free(&run);
    const char *short_term[] = {"FAKE_CUDA_LONGTERM_PINS=0", NULL};
    run_mappings(&run, "shared-file", directory, short_term);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), DEFAULT_FLAGS, "%s", run.result.out);
    cr_assert_eq(shim_run_stats_number(&run, "register", "by_pieces"), 0);
    expect_quiet(&run);
    shim_run_free(&run);
}

Test(mappings, shmem_registers_as_any_memory)
{
    struct shim_run run;
    run_mappings(&run, "shmem", NULL, NULL);
    cr_assert_eq(shim_run_printed_number(&run, "memfd_flags"), DEFAULT_FLAGS, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "shared_anonymous_flags"), DEFAULT_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "memfd_after_unlock"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "by_pieces"), 0);
    expect_quiet(&run);
    shim_run_free(&run);
}

Test(mappings, a_lock_over_two_protections_is_registered_piece_by_piece)
{
    struct shim_run run;
    run_mappings(&run, "two-protections", NULL, NULL);
    cr_assert_eq(shim_run_printed_number(&run, "writable_half"), DEFAULT_FLAGS, "%s",
                 run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "read_only_half"), READ_ONLY_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "read_only_end"), READ_ONLY_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "writable_after_unlock"), -1);
    cr_assert_eq(shim_run_printed_number(&run, "read_only_after_unlock"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "ok"), 2, "%s", run.stats);
    cr_assert_eq(shim_run_stats_number(&run, "unregister", "ok"), 2);
    expect_quiet(&run);
    shim_run_free(&run);
}

/* Made writable: registered again without READ_ONLY (the device may write
 * it, as any writable locked buffer). Made read-only: left as it is (the
 * registration stays valid). */
Test(mappings, mprotect_after_the_lock)
{
    struct shim_run run;
    run_mappings(&run, "mprotect", NULL, NULL);
    cr_assert_eq(shim_run_printed_number(&run, "read_only"), READ_ONLY_FLAGS, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "made_writable"), DEFAULT_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "writable"), DEFAULT_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "made_read_only"), DEFAULT_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "one_page_back_and_forth"), DEFAULT_FLAGS);
    cr_assert_eq(shim_run_printed_number(&run, "made_writable_after_unlock"), -1);
    cr_assert_eq(shim_run_printed_number(&run, "made_read_only_after_unlock"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "unregister", "mprotect"), 1, "%s", run.stats);
    expect_quiet(&run);
    shim_run_free(&run);
}

/* A device that takes no READ_ONLY registrations (attribute 113 is 0):
 * read-only pieces are not tried, counted and named once at info level, and
 * the run they are in stays unregistered whole (its writable half too): a
 * copy across the two halves works unregistered and would fail half
 * registered. */
Test(mappings, read_only_memory_on_a_device_without_support_stays_mlocked_only)
{
    const char *settings[] = {"FAKE_CUDA_READ_ONLY_REGISTER=0", "PINSHIM_LOG=info", NULL};
    struct shim_run run;
    run_mappings(&run, "two-protections", NULL, settings);
    cr_assert_eq(shim_run_printed_number(&run, "writable_half"), -1, "%s", run.result.out);
    cr_assert_eq(shim_run_printed_number(&run, "read_only_half"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "skipped_read_only_unsupported"), 1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "read_only"), 0);
    cr_assert(strstr(run.result.err, "takes no READ_ONLY registrations") != NULL, "%s",
              run.result.err);
    cr_assert_eq(shim_run_stats_number(&run, "register", "failed"), 0);
    shim_run_free(&run);
}

/* mlock succeeds on VM_IO / VM_PFNMAP mappings without locking them; no
 * driver pins them: left out, counted. So is PROT_NONE memory. */
Test(mappings, io_and_no_access_mappings_are_left_out)
{
    struct shim_run run;
    run_mappings(&run, "vvar", NULL, NULL);
    if (strstr(run.result.out, "skipped=") != NULL) {
        shim_run_free(&run);
        cr_skip_test("no [vvar] mapping in this process");
    }
    cr_assert_eq(shim_run_printed_number(&run, "vvar_lock"), 0);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "skipped_io"), 1, "%s", run.stats);
    expect_quiet(&run);
    shim_run_free(&run);
    const char *whole[] = {"PINSHIM_ONFAULT=all", NULL};
    run_mappings(&run, "no-access", NULL, whole);
    cr_assert_eq(shim_run_printed_number(&run, "lock"), 0);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), -1);
    cr_assert_eq(shim_run_stats_number(&run, "register", "skipped_no_access"), 1, "%s", run.stats);
    expect_quiet(&run);
    shim_run_free(&run);
}

/* With ATS (Grace Hopper), registration only populates: read-only memory
 * registers without the flag, the first time. */
Test(mappings, with_host_page_tables_read_only_memory_needs_no_flag)
{
    const char *settings[] = {"FAKE_CUDA_HOST_PAGE_TABLES=1", NULL};
    struct shim_run run;
    run_mappings(&run, "read-only-file", NULL, settings);
    cr_assert_eq(shim_run_printed_number(&run, "flags"), DEFAULT_FLAGS, "%s", run.result.out);
    cr_assert_eq(shim_run_stats_number(&run, "register", "by_pieces"), 0);
    expect_quiet(&run);
    shim_run_free(&run);
}
