/* Issue 29, watching a job: NVTX ranges and NUMA placement, seen from a real
 * process under the shim in create mode with the fake CUDA runtime.
 *
 * NVTX: the tests' own tool (tests/nvtx_recorder), loaded by NVTX through
 * NVTX_INJECTION64_PATH as Nsight Systems' is, records every range of the
 * domain "pinshim": each registration and unregistration with its size and
 * the call that led to it, on the thread that made it, and the wait of one
 * thread's munlock for another's registration in flight.
 *
 * NUMA: this machine has one node, so the fake driver says which node each
 * device sits nearest (FAKE_CUDA_HOST_NUMA); the pages are where the kernel
 * put them (node 0), found by move_pages(2). */
#include <criterion/criterion.h>

#include "child.h"
#include "shim_run.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct traced_run {
    struct shim_run run;
    char log_path[1024];
    char *log; /* the recorder's lines, or NULL when it never wrote */
};

/* Runs TRACE_PROGRAM scenario under the shim with the tests' NVTX tool and
 * one more setting; with the named system calls refused (refuse_syscalls)
 * when refused is not NULL. */
static void run_traced_refusing(struct traced_run *traced, const char *scenario,
                                const char *setting, const char *refused)
{
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    snprintf(traced->log_path, sizeof(traced->log_path), "%s/nvtx.log", directory);
    free(directory);
    static char injection[1200], log[1200];
    snprintf(injection, sizeof(injection), "NVTX_INJECTION64_PATH=%s",
             shim_run_required_env("NVTX_RECORDER"));
    snprintf(log, sizeof(log), "NVTX_RECORDER_LOG=%s", traced->log_path);
    const char *defaults[] = {"PINSHIM_CONTEXT=create",
                              "PINSHIM_LOG=",
                              "PINSHIM_NVTX=",
                              "PINSHIM_NUMA=",
                              "FAKE_CUDA_REGISTER_SECONDS_PER_GIB=",
                              "FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB=0",
                              "FAKE_CUDA_HOST_NUMA=",
                              "FAKE_CUDA_DRIVER_VERSION=",
                              injection,
                              log,
                              NULL};
    const char *settings[] = {setting, NULL};
    const char *plain[] = {shim_run_required_env("TRACE_PROGRAM"), scenario, NULL};
    const char *refusing[] = {shim_run_required_env("REFUSE_SYSCALLS"), refused,
                              shim_run_required_env("TRACE_PROGRAM"), scenario, NULL};
    shim_run(&traced->run, refused != NULL ? refusing : plain, true, defaults, settings);
    traced->log = read_file_text(traced->log_path);
}

static void run_traced(struct traced_run *traced, const char *scenario, const char *setting)
{
    run_traced_refusing(traced, scenario, setting, NULL);
}

static void free_traced(struct traced_run *traced)
{
    unlink(traced->log_path);
    free(traced->log);
    shim_run_free(&traced->run);
}

/* The line after the given start of the log (NULL: from the beginning) that
 * begins with prefix; fails the test when there is none. */
static const char *line_after(const struct traced_run *traced, const char *start,
                              const char *prefix)
{
    cr_assert_not_null(traced->log, "the NVTX tool wrote nothing\nstderr:\n%s",
                       traced->run.result.err);
    const char *at = start != NULL ? start : traced->log;
    for (; at != NULL && *at != '\0'; at = strchr(at, '\n') ? strchr(at, '\n') + 1 : NULL)
        if (strncmp(at, prefix, strlen(prefix)) == 0)
            return at;
    cr_assert_fail("no line \"%s...\" in the NVTX log:\n%s", prefix, traced->log);
    return NULL;
}

/* "push pinshim <tid> <message>" and then "pop pinshim <tid>", on one
 * thread; returns the line after the pop. */
static const char *expect_range(const struct traced_run *traced, const char *start,
                                const char *message, long *tid_out)
{
    const char *push = line_after(traced, start, "push pinshim ");
    long tid = strtol(push + strlen("push pinshim "), NULL, 10);
    const char *text = strchr(push + strlen("push pinshim "), ' ');
    cr_assert(text != NULL && strncmp(text + 1, message, strlen(message)) == 0 &&
                  text[1 + strlen(message)] == '\n',
              "expected the range \"%s\", got: %.*s\nlog:\n%s", message,
              (int)(strchr(push, '\n') - push), push, traced->log);
    char pop[64];
    snprintf(pop, sizeof(pop), "pop pinshim %ld\n", tid);
    const char *next = strchr(push, '\n') + 1;
    cr_assert(strncmp(next, pop, strlen(pop)) == 0, "\"%s\" not closed on its thread:\n%s", message,
              traced->log);
    if (tid_out != NULL)
        *tid_out = tid;
    return next + strlen(pop);
}

Test(watching, nvtx_ranges_name_size_and_cause)
{
    struct traced_run traced;
    run_traced(&traced, "basic", NULL);
    cr_assert_eq(shim_run_printed_number(&traced.run, "mlock"), 0);
    line_after(&traced, NULL, "domain pinshim\n");
    const char *at = expect_range(&traced, NULL, "register 8.0 MiB (mlock)", NULL);
    at = expect_range(&traced, at, "unregister 8.0 MiB (munlock)", NULL);
    at = expect_range(&traced, at, "register 8.0 MiB (mlock)", NULL);
    at = expect_range(&traced, at, "unregister 8.0 MiB (free)", NULL);
    cr_assert_null(strstr(at, "push "), "more ranges than calls:\n%s", traced.log);
    free_traced(&traced);
}

/* One thread's munlock waits for another's registration in flight: the wait
 * is a range on the waiting thread, the registration one on the locking
 * thread. The fake driver holds the registration until the waiter sleeps. */
Test(watching, nvtx_range_for_a_wait, .timeout = 120)
{
    struct traced_run traced;
    run_traced(&traced, "wait", "FAKE_CUDA_REGISTER_SECONDS_PER_GIB=1000");
    long locker = shim_run_printed_number(&traced.run, "locker_tid");
    long unlocker = shim_run_printed_number(&traced.run, "unlocker_tid");
    char line[128];
    snprintf(line, sizeof(line),
             "push pinshim %ld wait for another registration over 64.0 MiB "
             "(munlock)\n",
             unlocker);
    cr_assert_not_null(traced.log);
    cr_assert_not_null(strstr(traced.log, line), "no wait on the unlocking thread:\n%s",
                       traced.log);
    snprintf(line, sizeof(line), "push pinshim %ld register 64.0 MiB (mlock)\n", locker);
    cr_assert_not_null(strstr(traced.log, line), "%s", traced.log);
    snprintf(line, sizeof(line), "push pinshim %ld unregister 64.0 MiB (munlock)\n", unlocker);
    cr_assert_not_null(strstr(traced.log, line), "%s", traced.log);
    /* Balanced on each thread. */
    size_t pushes = 0, pops = 0;
    for (const char *at = traced.log; (at = strstr(at, "push pinshim ")) != NULL; at++)
        pushes++;
    for (const char *at = traced.log; (at = strstr(at, "pop pinshim ")) != NULL; at++)
        pops++;
    cr_assert_eq(pushes, pops, "%s", traced.log);
    free_traced(&traced);
}

/* PINSHIM_NVTX=0: NVTX is never asked, so the tool is never loaded. */
Test(watching, nvtx_off_loads_no_tool)
{
    struct traced_run traced;
    run_traced(&traced, "basic", "PINSHIM_NVTX=0");
    cr_assert_eq(shim_run_stats_number(&traced.run, "register", "ok"), 2);
    cr_assert_null(traced.log, "the tool was loaded:\n%s", traced.log);
    free_traced(&traced);
}

/* ---- NUMA ---- */

/* The node of one page of this process as the kernel says, by move_pages or
 * by get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR), the shim's two questions; -1
 * where the kernel does not answer. */
static int page_node(void *page, bool by_get_mempolicy)
{
    if (!by_get_mempolicy) {
        void *pages[1] = {page};
        int status[1] = {-1};
        if (syscall(SYS_move_pages, 0, 1UL, pages, NULL, status, 0) != 0)
            return -1;
        return status[0] >= 0 ? status[0] : -1;
    }
    int node = -1;
    if (syscall(SYS_get_mempolicy, &node, NULL, 0UL, page, 3UL /* MPOL_F_NODE | MPOL_F_ADDR */) !=
        0)
        return -1;
    return node;
}

/* The expectations name node 0 and need the kernel's answer. Where there are
 * several nodes, this test's children are held to node 0 (a task's memory
 * policy passes through fork and exec). Skips, saying why, where the kernel
 * answers neither question (qemu-user emulates neither system call; a
 * container's seccomp profile may refuse both), or only the one the test
 * refuses itself, or where the pages cannot be held to node 0. */
static void require_pages_on_node_zero(bool only_get_mempolicy)
{
    if (access("/sys/devices/system/node/node1", F_OK) == 0) {
        unsigned long node_zero = 1;
        if (syscall(SYS_set_mempolicy, 2 /* MPOL_BIND */, &node_zero, 8 * sizeof(node_zero)) != 0)
            cr_skip_test("several NUMA nodes here, and set_mempolicy(MPOL_BIND, node 0) failed "
                         "(%s): the pages' node cannot be chosen",
                         strerror(errno));
    }
    long page_size = sysconf(_SC_PAGESIZE);
    char *page = aligned_alloc((size_t)page_size, (size_t)page_size);
    cr_assert_not_null(page);
    page[0] = 1;
    int node = page_node(page, only_get_mempolicy);
    if (node < 0 && !only_get_mempolicy)
        node = page_node(page, true);
    free(page);
    if (node < 0)
        cr_skip_test("the kernel answers %s here (under qemu-user, or a seccomp profile that "
                     "refuses them): no page's node can be found",
                     only_get_mempolicy ? "no get_mempolicy"
                                        : "neither move_pages nor get_mempolicy");
    cr_assert_eq(node, 0, "a touched page of this test lies on node %d, not on node 0", node);
}

/* The numa object's text (up to its closing "}}"), from the JSON stats. */
static const char *numa_json(const struct traced_run *traced)
{
    cr_assert_not_null(traced->run.stats);
    const char *numa = strstr(traced->run.stats, "\"numa\": ");
    cr_assert_not_null(numa, "no numa key:\n%s", traced->run.stats);
    return numa;
}

Test(watching, numa_local_memory)
{
    require_pages_on_node_zero(false);
    struct traced_run traced;
    run_traced(&traced, "basic", "FAKE_CUDA_HOST_NUMA=0");
    const char *numa = numa_json(&traced);
    /* Two registrations of 8 MiB, both on node 0, the device's node. */
    cr_assert(strncmp(numa,
                      "\"numa\": {\"nodes\": {\"0\": {\"bytes\": 16777216, \"local_bytes\": "
                      "16777216}}, \"remote_bytes\": 0, \"unknown_bytes\": 0, \"device_nodes\": "
                      "{\"0\": 0}}",
                      strlen("\"numa\": {\"nodes\": {\"0\": {\"bytes\": 16777216, "
                             "\"local_bytes\": 16777216}}, \"remote_bytes\": 0, "
                             "\"unknown_bytes\": 0, \"device_nodes\": {\"0\": 0}}")) == 0,
              "%s", traced.run.stats);
    shim_run_expect_no_warning(&traced.run);
    free_traced(&traced);
}

Test(watching, numa_remote_memory_warns_once)
{
    require_pages_on_node_zero(false);
    struct traced_run traced;
    run_traced(&traced, "basic", "FAKE_CUDA_HOST_NUMA=1");
    const char *numa = numa_json(&traced);
    const char *expected = "\"numa\": {\"nodes\": {\"0\": {\"bytes\": 16777216, \"local_bytes\": "
                           "0}}, \"remote_bytes\": 16777216, \"unknown_bytes\": 0, "
                           "\"device_nodes\": {\"0\": 1}}";
    cr_assert(strncmp(numa, expected, strlen(expected)) == 0, "%s", traced.run.stats);
    const char *warning = strstr(traced.run.result.err, "pinshim: 8.0 MiB of 8.0 MiB registered "
                                                        "for device 0 lies on NUMA node 0, but the "
                                                        "device is nearest node 1");
    cr_assert_not_null(warning, "%s", traced.run.result.err);
    cr_assert_not_null(strstr(warning, "numactl --cpunodebind=1 --membind=1"));
    const char *after = strchr(warning, '\n');
    cr_assert(after == NULL || strstr(after, "lies on NUMA node") == NULL, "warned twice:\n%s",
              traced.run.result.err);
    free_traced(&traced);
}

/* A driver older than CUDA 12.2 lacks the attribute; the device's PCI node
 * is then read from sysfs, where the fake's device is not: unknown, so
 * nothing is local or remote, and nothing is warned. */
Test(watching, numa_device_node_unknown)
{
    require_pages_on_node_zero(false);
    struct traced_run traced;
    run_traced(&traced, "basic", "FAKE_CUDA_DRIVER_VERSION=12000");
    const char *numa = numa_json(&traced);
    const char *expected = "\"numa\": {\"nodes\": {\"0\": {\"bytes\": 16777216, \"local_bytes\": "
                           "0}}, \"remote_bytes\": 0, \"unknown_bytes\": 0, \"device_nodes\": "
                           "{\"0\": -1}}";
    cr_assert(strncmp(numa, expected, strlen(expected)) == 0, "%s", traced.run.stats);
    shim_run_expect_no_warning(&traced.run);
    free_traced(&traced);
}

Test(watching, numa_off)
{
    struct traced_run traced;
    run_traced(&traced, "basic", "PINSHIM_NUMA=0");
    cr_assert_not_null(traced.run.stats);
    cr_assert_null(strstr(traced.run.stats, "\"numa\""), "%s", traced.run.stats);
    free_traced(&traced);
}

/* Skips the test where no seccomp filter can refuse the calls (qemu-user). */
static void require_refusal(const char *refused)
{
    const char *argv[] = {shim_run_required_env("REFUSE_SYSCALLS"), refused, "/bin/true", NULL};
    const char *environment[] = {"LD_PRELOAD=", NULL};
    struct child_result result;
    child_run(argv, environment, NULL, &result);
    int status = result.status;
    char why[256];
    snprintf(why, sizeof(why), "%s", result.err != NULL ? result.err : "");
    child_result_free(&result);
    if (status == 77)
        cr_skip_test("%s", why);
    cr_assert_eq(status, 0, "refuse_syscalls %s: %s", refused, why);
}

/* Docker's default seccomp profile refuses move_pages; with CAP_SYS_NICE
 * (and in older profiles) it allows get_mempolicy, which then finds the
 * pages: the same bytes on node 0 as with move_pages, none unknown. */
Test(watching, numa_where_move_pages_is_refused)
{
    require_refusal("move_pages");
    require_pages_on_node_zero(true);
    struct traced_run traced;
    run_traced_refusing(&traced, "basic", "FAKE_CUDA_HOST_NUMA=0", "move_pages");
    const char *numa = numa_json(&traced);
    const char *expected = "\"numa\": {\"nodes\": {\"0\": {\"bytes\": 16777216, \"local_bytes\": "
                           "16777216}}, \"remote_bytes\": 0, \"unknown_bytes\": 0, "
                           "\"device_nodes\": {\"0\": 0}}";
    cr_assert(strncmp(numa, expected, strlen(expected)) == 0, "%s", traced.run.stats);
    cr_assert_eq(shim_run_stats_number(&traced.run, "register", "ok"), 2);
    shim_run_expect_no_warning(&traced.run);
    free_traced(&traced);
}

/* Docker's default profile without CAP_SYS_NICE refuses both: the bytes are
 * unknown, nothing is called local or remote or warned about, and the
 * registrations are as without the question. */
Test(watching, numa_where_both_questions_are_refused)
{
    require_refusal("move_pages,get_mempolicy");
    struct traced_run traced;
    run_traced_refusing(&traced, "basic", "FAKE_CUDA_HOST_NUMA=1", "move_pages,get_mempolicy");
    const char *numa = numa_json(&traced);
    const char *expected = "\"numa\": {\"nodes\": {}, \"remote_bytes\": 0, \"unknown_bytes\": "
                           "16777216, \"device_nodes\": {\"0\": 1}}";
    cr_assert(strncmp(numa, expected, strlen(expected)) == 0, "%s", traced.run.stats);
    cr_assert_eq(shim_run_stats_number(&traced.run, "register", "ok"), 2);
    cr_assert_eq(shim_run_stats_number(&traced.run, "unregister", "ok"), 2);
    shim_run_expect_no_warning(&traced.run);
    free_traced(&traced);
}
