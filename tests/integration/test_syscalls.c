/* Issue 22: no file system work per call. tests/programs/syscall_loop.c runs
 * 2,000 rounds of mmap + munmap and mlock + munlock while a locked range
 * waits for a CUDA context (program mode, no CUDA in the process), and in
 * create mode with the fake runtime registering every lock; strace counts
 * the file system calls (strace's %file class) between the program's two
 * markers, with and without the shim. The shim may add none: asking whether
 * a driver is loaded reads the dynamic loader's list, not the file system
 * (before issue 22, dlopen("libcuda.so.1", RTLD_NOLOAD) searched every
 * library directory at each look). Counts, never times. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "child.h"
#include "shim_run.h"

static const char *strace_or_skip(void)
{
    static const char *const candidates[] = {"/usr/bin/strace", "/bin/strace"};
    for (size_t i = 0; i < 2; i++)
        if (access(candidates[i], X_OK) == 0)
            return candidates[i];
    cr_skip_test("strace is not installed (Debian package strace); scripts/deps installs it");
    return NULL;
}

/* File system calls between the markers, and all calls there (so that the
 * loop is known to have run). */
struct counts {
    long file_calls, calls;
    char first_file_call[256];
};

static struct counts count_in_loop(const char *trace)
{
    struct counts counts = {0, 0, ""};
    const char *begin = strstr(trace, "pinshim-loop-begin");
    const char *end = begin ? strstr(begin, "pinshim-loop-end") : NULL;
    cr_assert(begin != NULL && end != NULL, "no markers in the trace:\n%.2000s", trace);
    /* Lines after the begin marker's line, before the end marker's. */
    const char *line = strchr(begin, '\n');
    while (line != NULL && line < end) {
        line++;
        const char *next = strchr(line, '\n');
        if (next == NULL || next > end)
            break;
        counts.calls++;
        /* strace -e trace=%file,... marks nothing; the test asks for %file
         * calls and the loop's own, and tells them apart by name. */
        static const char *const loop_calls[] = {"mmap(",  "munmap(", "mlock(", "munlock(",
                                                 "write(", "+++",     "---",    "<... "};
        bool loop_call = false;
        const char *call = line;
        while (*call == '[' || (*call >= '0' && *call <= '9') || *call == ' ' || *call == 'p' ||
               *call == 'i' || *call == 'd' || *call == ']')
            call++;
        for (size_t i = 0; i < sizeof loop_calls / sizeof loop_calls[0]; i++)
            loop_call = loop_call || strncmp(call, loop_calls[i], strlen(loop_calls[i])) == 0;
        if (!loop_call) {
            if (counts.file_calls++ == 0)
                snprintf(counts.first_file_call, sizeof counts.first_file_call, "%.*s",
                         (int)(next - line), line);
        }
        line = next;
    }
    return counts;
}

static struct counts run_traced(bool with_shim, const char *mode)
{
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    char trace_path[1024], output_option[1100];
    snprintf(trace_path, sizeof trace_path, "%s/trace", directory);
    snprintf(output_option, sizeof output_option, "-o%s", trace_path);
    static char preload[1200], cudart[1200], context[64];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s",
             with_shim ? shim_run_required_env("PINSHIM_LIB") : "");
    snprintf(cudart, sizeof cudart, "PINSHIM_CUDART=%s", shim_run_required_env("FAKE_CUDART"));
    snprintf(context, sizeof context, "PINSHIM_CONTEXT=%s", mode);
    const char *env[] = {preload, cudart, context,
                         "PINSHIM_STATS=", "PINSHIM_LOG=", "PINSHIM_ASYNC=", "FAKE_CUDART_CHECK=0",
                         /* The double's own look at each mapping reads
                          * /proc/self/smaps where the kernel lacks
                          * PROCMAP_QUERY (before 6.11, qemu-user): not the
                          * shim's calls. */
                         "FAKE_CUDA_PIN_RULES=0", "FAKE_CUDART_LOG=", NULL};
    const char *argv[] = {strace_or_skip(),
                          "-f",
                          "-qq",
                          "-e",
                          "trace=%file,mmap,munmap,mlock,munlock,write",
                          "-e",
                          "signal=none",
                          output_option,
                          shim_run_required_env("SYSCALL_LOOP"),
                          "2000",
                          NULL};
    struct child_result result;
    child_run(argv, env, NULL, &result);
    cr_assert_eq(result.status, 0, "strace of syscall_loop exited %d:\n%s%s", result.status,
                 result.out, result.err);
    char *trace = read_file_text(trace_path);
    cr_assert_not_null(trace);
    struct counts counts = count_in_loop(trace);
    free(trace);
    child_result_free(&result);
    remove_tree(directory);
    free(directory);
    return counts;
}

static void expect_no_file_calls_added(const char *mode)
{
    struct counts without = run_traced(false, mode), with = run_traced(true, mode);
    cr_assert_geq(without.calls, 4 * 2000, "the loop did not run: %ld calls", without.calls);
    cr_assert_eq(with.file_calls, without.file_calls,
                 "%s mode: %ld file system calls in the loop under the shim, %ld without (the "
                 "first: %s)",
                 mode, with.file_calls, without.file_calls, with.first_file_call);
}

Test(syscalls, a_range_waiting_for_a_context_costs_no_file_system_call, .timeout = 120)
{
    expect_no_file_calls_added("program");
}

Test(syscalls, create_mode_locks_cost_no_file_system_call, .timeout = 120)
{
    expect_no_file_calls_added("create");
}
