/* lock_latency --deepspeed: DeepSpeed's native pinning (posix_memalign(4096),
 * memory not touched yet, mlock) and what huge pages do to it (issue 36).
 *
 * Arms, each one child process per measurement that allocates one buffer,
 * times mlock with CLOCK_MONOTONIC, reads the buffer's AnonHugePages from
 * /proc/self/smaps, and unlocks and frees it:
 *   none   without the shim;
 *   huge   under the shim, PINSHIM_HUGEPAGES=auto (the default);
 *   small  under the shim, PINSHIM_HUGEPAGES=off.
 * The shim runs with PINSHIM_CONTEXT=program and no GPU runtime in the
 * process, so nothing is registered: the time is the lock's and the huge
 * pages' alone ("registration cost aside").
 *
 * Two states of memory, reported apart:
 *   first  after a pause (--pause, 5 s): on a VM whose balloon reports free
 *          pages, the free huge blocks have been handed back to the host,
 *          and the first touch of them is slow;
 *   warm   right after a warm-up process that faulted in and freed huge
 *          pages of the size measured (MADV_HUGEPAGE), so that free huge
 *          blocks the host has backed come first.
 * The order of the arms alternates between rounds.
 *
 * --fragmented (--fragmented-only: nothing else) measures what the rule
 * against direct compaction is for: a process started afresh before each
 * measurement holds every other page of most of the free memory
 * (MemAvailable less 0.5 GiB), so that free memory is in small pieces, and 1 GiB is locked
 * without the shim, under it (huge), and with MADV_HUGEPAGE on the buffer
 * first (what a shim without the rule would do; the arm "advised"), each
 * with /proc/vmstat's compact_stall before and after. */
#include "bench_util.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lock_latency_deepspeed.h"

#define GIB ((size_t)1 << 30)
#define DS_MAX_SIZES 6
#define DS_MAX_ROUNDS 16

enum ds_arm { DS_NONE, DS_HUGE, DS_SMALL, DS_ADVISED, DS_ARM_COUNT };
static const char *const ds_arm_names[] = {"none", "huge", "small", "advised"};
static const char *const ds_arm_titles[] = {"without the shim", "shim, PINSHIM_HUGEPAGES=auto",
                                            "shim, PINSHIM_HUGEPAGES=off",
                                            "without the shim, MADV_HUGEPAGE before mlock"};
enum ds_state { DS_FIRST, DS_WARM, DS_STATE_COUNT };
static const char *const ds_state_names[] = {"first", "warm"};

/* ---- child: one buffer ---- */

static unsigned long long huge_bytes_of(uintptr_t start, uintptr_t end)
{
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (smaps == NULL)
        return 0;
    char line[1024];
    unsigned long low = 0, high = 0;
    unsigned long long total = 0;
    while (fgets(line, sizeof(line), smaps) != NULL) {
        unsigned long a, b, kib;
        char *space = strchr(line, ' '), *dash = strchr(line, '-');
        if (dash != NULL && space != NULL && dash < space &&
            sscanf(line, "%lx-%lx ", &a, &b) == 2) {
            low = a;
            high = b;
        } else if (low < end && start < high && sscanf(line, "AnonHugePages: %lu kB", &kib) == 1) {
            total += (unsigned long long)kib * 1024;
        }
    }
    fclose(smaps);
    return total;
}

static unsigned long long compact_stalls(void)
{
    FILE *file = fopen("/proc/vmstat", "r");
    unsigned long long value = 0;
    char line[256];
    while (file != NULL && fgets(line, sizeof(line), file) != NULL)
        if (sscanf(line, "compact_stall %llu", &value) == 1)
            break;
    if (file != NULL)
        fclose(file);
    return value;
}

/* "--deepspeed-child BYTES ADVISE": prints "DS lock=S huge=BYTES stalls=N". */
int lock_latency_deepspeed_child(size_t bytes, bool advise)
{
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);
    void *buffer = NULL;
    if (posix_memalign(&buffer, 4096, bytes) != 0) {
        printf("ERROR posix_memalign(4096, %zu) failed\n", bytes);
        return 1;
    }
    if (advise)
        madvise(buffer, bytes, MADV_HUGEPAGE);
    unsigned long long stalls = compact_stalls();
    double began = bench_now_seconds();
    int locked = mlock(buffer, bytes);
    double lock = bench_now_seconds() - began;
    if (locked != 0) {
        printf("ERROR mlock of %zu bytes failed: %s\n", bytes, strerror(errno));
        return 1;
    }
    printf("DS lock=%.9f huge=%llu stalls=%llu\n", lock,
           huge_bytes_of((uintptr_t)buffer, (uintptr_t)buffer + bytes), compact_stalls() - stalls);
    munlock(buffer, bytes);
    free(buffer);
    return 0;
}

static double status_kib(const char *key)
{
    return bench_proc_kib("/proc/self/status", key);
}

/* "--memory-child BYTES": 32 buffers of BYTES from posix_memalign(4096),
 * one byte written in each (sparse use), never locked; prints what they
 * added to the address space and to the resident set. */
int lock_latency_memory_child(size_t bytes)
{
    enum { BUFFERS = 32 };
    double size_before = status_kib("VmSize"), resident_before = status_kib("VmRSS");
    void *buffers[BUFFERS];
    for (int i = 0; i < BUFFERS; i++) {
        if (posix_memalign(&buffers[i], 4096, bytes) != 0)
            return 1;
        ((volatile char *)buffers[i])[bytes / 2] = 1;
    }
    printf("MEM size=%.0f resident=%.0f\n", (status_kib("VmSize") - size_before) * 1024,
           (status_kib("VmRSS") - resident_before) * 1024);
    for (int i = 0; i < BUFFERS; i++)
        free(buffers[i]);
    return 0;
}

/* "--warm-up-child BYTES": faults in huge pages over BYTES and frees them. */
int lock_latency_warm_up_child(size_t bytes)
{
    size_t length = bytes + ((size_t)2 << 20);
    unsigned char *mapping =
        mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED)
        return 1;
    madvise(mapping, length, MADV_HUGEPAGE);
    for (size_t at = 0; at < length; at += 4096)
        mapping[at] = 1;
    munmap(mapping, length);
    return 0;
}

/* ---- parent ---- */

struct ds_cell {
    double lock[DS_MAX_ROUNDS];
    double huge_share[DS_MAX_ROUNDS];
    unsigned long long stalls[DS_MAX_ROUNDS];
    /* From the shim's statistics (huge arm): what it made huge, left small
     * for want of free blocks, and after a slow batch, summed. */
    double made, no_block, stopped;
    int count;
    char message[160];
};

static struct {
    double sizes_gib[DS_MAX_SIZES];
    size_t bytes[DS_MAX_SIZES];
    size_t size_count;
    int rounds;
    double pause;
    const char *shim;
    struct ds_cell cells[DS_MAX_SIZES][DS_STATE_COUNT][DS_ARM_COUNT];
    struct ds_cell fragmented[DS_ARM_COUNT];
    bool fragmented_ran;
    double fragmented_free_blocks_before, fragmented_held_gib;
} ds;

static void run_child(char *const argv[], const struct bench_env *env, struct ds_cell *cell)
{
    struct bench_run run;
    bool ran = bench_run_process(argv, env, true, false, &run);
    double lock;
    unsigned long long huge, stalls;
    const char *line = run.output != NULL ? strstr(run.output, "DS lock=") : NULL;
    if (ran && line != NULL &&
        sscanf(line, "DS lock=%lf huge=%llu stalls=%llu", &lock, &huge, &stalls) == 3 &&
        cell->count < DS_MAX_ROUNDS) {
        cell->lock[cell->count] = lock;
        cell->huge_share[cell->count] = (double)huge / (double)strtoull(argv[2], NULL, 10);
        cell->stalls[cell->count] = stalls;
        cell->count++;
    } else if (run.output != NULL) {
        snprintf(cell->message, sizeof(cell->message), "%.*s", (int)strcspn(run.output, "\n"),
                 run.output);
    }
    bench_run_free(&run);
}

static void run_arm(enum ds_arm arm, size_t bytes, struct ds_cell *cell)
{
    struct bench_env env;
    bench_env_from_current(&env);
    char stats_path[64];
    snprintf(stats_path, sizeof(stats_path), "/tmp/pinshim-deepspeed.%d.json", (int)getpid());
    unlink(stats_path);
    if (arm == DS_HUGE || arm == DS_SMALL) {
        bench_env_set(&env, "LD_PRELOAD", ds.shim);
        bench_env_set(&env, "PINSHIM_CONTEXT", "program");
        bench_env_set(&env, "PINSHIM_HUGEPAGES", arm == DS_HUGE ? "auto" : "off");
        bench_env_set(&env, "PINSHIM_STATS", stats_path);
    }
    char size[32];
    snprintf(size, sizeof(size), "%zu", bytes);
    char *argv[] = {(char *)bench_self_path(), "--deepspeed-child", size,
                    (char *)(arm == DS_ADVISED ? "1" : "0"), NULL};
    run_child(argv, &env, cell);
    bench_env_free(&env);
    char *stats = bench_read_file(stats_path);
    double made = 0, no_block = 0, stopped = 0;
    if (stats != NULL && bench_json_number(stats, "huge_pages", "made_bytes", &made) &&
        bench_json_number(stats, "huge_pages", "no_block_bytes", &no_block) &&
        bench_json_number(stats, "huge_pages", "stopped_bytes", &stopped)) {
        cell->made += made;
        cell->no_block += no_block;
        cell->stopped += stopped;
    }
    free(stats);
    unlink(stats_path);
}

static void warm_up(size_t bytes)
{
    struct bench_env env;
    bench_env_from_current(&env);
    char size[32];
    snprintf(size, sizeof(size), "%zu", bytes);
    char *argv[] = {(char *)bench_self_path(), "--warm-up-child", size, NULL};
    struct bench_run run;
    bench_run_process(argv, &env, true, true, &run);
    bench_run_free(&run);
    bench_env_free(&env);
}

static void pause_for(double seconds)
{
    struct timespec delay = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&delay, NULL);
}

static double median(const double *values, int count)
{
    return count > 0 ? bench_median(values, (size_t)count) : 0;
}

static void format_time(char *out, size_t size, const struct ds_cell *cell)
{
    if (cell->count == 0) {
        snprintf(out, size, "n/a");
        return;
    }
    double lowest = bench_minimum(cell->lock, (size_t)cell->count);
    double highest = cell->lock[0];
    for (int i = 1; i < cell->count; i++)
        highest = cell->lock[i] > highest ? cell->lock[i] : highest;
    snprintf(out, size, "%.1f ms (%.1f-%.1f)", median(cell->lock, cell->count) * 1e3, lowest * 1e3,
             highest * 1e3);
}

static void format_share(char *out, size_t size, const struct ds_cell *cell)
{
    if (cell->count == 0)
        snprintf(out, size, "n/a");
    else
        snprintf(out, size, "%.0f%%", median(cell->huge_share, cell->count) * 100);
}

static void format_ratio(char *out, size_t size, const struct ds_cell *arm,
                         const struct ds_cell *base)
{
    if (arm->count == 0 || base->count == 0 || median(base->lock, base->count) <= 0)
        snprintf(out, size, "n/a");
    else
        snprintf(out, size, "%.2fx",
                 median(arm->lock, arm->count) / median(base->lock, base->count));
}

/* Free blocks of 2 MiB and above, in 2 MiB blocks (x86-64's PMD order, 9). */
static double free_huge_blocks(void)
{
    FILE *file = fopen("/proc/buddyinfo", "r");
    double blocks = 0;
    char line[512];
    while (file != NULL && fgets(line, sizeof(line), file) != NULL) {
        char *cursor = strstr(line, "zone");
        if (cursor == NULL)
            continue;
        cursor += 4;
        while (*cursor == ' ')
            cursor++;
        while (*cursor != ' ' && *cursor != '\0')
            cursor++;
        for (int order = 0;; order++) {
            char *end;
            double count = strtod(cursor, &end);
            if (end == cursor)
                break;
            if (order >= 9)
                blocks += count * (double)(1u << (order - 9));
            cursor = end;
        }
    }
    if (file != NULL)
        fclose(file);
    return blocks;
}

static double mem_available(void)
{
    return bench_proc_kib("/proc/meminfo", "MemAvailable") * 1024;
}

/* In the fragmenter process: holds every other 4 KiB page of hold bytes
 * until killed. */
static void hold_fragments(size_t hold)
{
    unsigned char *mapping =
        mmap(NULL, hold, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED)
        _exit(1);
    madvise(mapping, hold, MADV_NOHUGEPAGE);
    for (size_t at = 0; at < hold; at += 4096)
        mapping[at] = 1;
    for (size_t at = 4096; at < hold; at += 8192)
        madvise(mapping + at, 4096, MADV_DONTNEED);
    printf("held\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* Starts a process that holds every other page of hold bytes; returns its
 * pid once it holds them, or -1. */
static pid_t start_fragmenter(size_t hold)
{
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0)
        return -1;
    fflush(stdout);
    pid_t fragmenter = fork();
    if (fragmenter == 0) {
        dup2(pipe_fds[1], STDOUT_FILENO);
        close(pipe_fds[0]);
        hold_fragments(hold);
        _exit(0);
    }
    close(pipe_fds[1]);
    char ready[16] = "";
    ssize_t got = fragmenter > 0 ? read(pipe_fds[0], ready, sizeof(ready) - 1) : -1;
    close(pipe_fds[0]);
    if (got <= 0) {
        if (fragmenter > 0) {
            kill(fragmenter, SIGKILL);
            waitpid(fragmenter, NULL, 0);
        }
        return -1;
    }
    return fragmenter;
}

/* Each measurement gets a fragmenter of its own: the memory an arm frees
 * comes back as whole blocks, which the next arm would find. */
static void run_fragmented(void)
{
    double available = mem_available();
    double hold = available - 0.5 * (double)GIB;
    if (hold < 4.0 * (double)GIB) {
        printf("fragmented: skipped, MemAvailable %.1f GiB leaves too little to fragment\n",
               available / (double)GIB);
        return;
    }
    ds.fragmented_held_gib = hold / 2 / (double)GIB;
    double blocks[DS_MAX_ROUNDS * 3];
    int measured = 0;
    for (int round = 0; round < ds.rounds; round++) {
        enum ds_arm order[] = {DS_NONE, DS_HUGE, DS_ADVISED};
        for (int k = 0; k < 3; k++) {
            enum ds_arm arm = order[round % 2 == 0 ? k : 2 - k];
            fprintf(stderr, "lock_latency --deepspeed: fragmented, round %d, %s\n", round + 1,
                    ds_arm_names[arm]);
            pid_t fragmenter = start_fragmenter((size_t)hold);
            if (fragmenter < 0) {
                printf("fragmented: the fragmenter failed\n");
                return;
            }
            blocks[measured++] = free_huge_blocks();
            run_arm(arm, GIB, &ds.fragmented[arm]);
            kill(fragmenter, SIGKILL);
            waitpid(fragmenter, NULL, 0);
        }
    }
    ds.fragmented_ran = true;
    ds.fragmented_free_blocks_before = median(blocks, measured);
}

struct ds_memory {
    double size[2], resident[2]; /* none, huge */
    bool ran;
};
static struct ds_memory ds_memory[DS_MAX_SIZES];

static void measure_memory(size_t s)
{
    for (int k = 0; k < 2; k++) {
        struct bench_env env;
        bench_env_from_current(&env);
        if (k == 1) {
            bench_env_set(&env, "LD_PRELOAD", ds.shim);
            bench_env_set(&env, "PINSHIM_CONTEXT", "program");
        }
        char size[32];
        snprintf(size, sizeof(size), "%zu", ds.bytes[s]);
        char *argv[] = {(char *)bench_self_path(), "--memory-child", size, NULL};
        struct bench_run run;
        double added_size, added_resident;
        const char *line = NULL;
        if (bench_run_process(argv, &env, true, false, &run) && run.output != NULL)
            line = strstr(run.output, "MEM size=");
        if (line != NULL &&
            sscanf(line, "MEM size=%lf resident=%lf", &added_size, &added_resident) == 2) {
            ds_memory[s].size[k] = added_size;
            ds_memory[s].resident[k] = added_resident;
            ds_memory[s].ran = true;
        }
        bench_run_free(&run);
        bench_env_free(&env);
    }
}

static void print_tables(void)
{
    printf("\nTime inside mlock (median, min-max of %d rounds) and share of the buffer on "
           "huge pages; ratios of medians against the arm without the shim.\n",
           ds.rounds);
    for (int state = 0; state < DS_STATE_COUNT; state++) {
        printf("\n%s runs (%s):\n\n", ds_state_names[state],
               state == DS_FIRST ? "after a pause" : "right after a warm-up of huge pages");
        printf("| size | without the shim | shim, huge pages (auto) | huge share | ratio | "
               "shim, PINSHIM_HUGEPAGES=off | huge share | ratio |\n");
        printf("|---|---|---|---|---|---|---|---|\n");
        for (size_t s = 0; s < ds.size_count; s++) {
            struct ds_cell *cells = ds.cells[s][state];
            char none[48], huge[48], small[48], huge_share[16], small_share[16], huge_ratio[16],
                small_ratio[16];
            format_time(none, sizeof(none), &cells[DS_NONE]);
            format_time(huge, sizeof(huge), &cells[DS_HUGE]);
            format_time(small, sizeof(small), &cells[DS_SMALL]);
            format_share(huge_share, sizeof(huge_share), &cells[DS_HUGE]);
            format_share(small_share, sizeof(small_share), &cells[DS_SMALL]);
            format_ratio(huge_ratio, sizeof(huge_ratio), &cells[DS_HUGE], &cells[DS_NONE]);
            format_ratio(small_ratio, sizeof(small_ratio), &cells[DS_SMALL], &cells[DS_NONE]);
            printf("| %g GiB | %s | %s | %s | %s | %s | %s | %s |\n", ds.sizes_gib[s], none, huge,
                   huge_share, huge_ratio, small, small_share, small_ratio);
        }
    }
    printf("\nWhat the alignment adds: 32 buffers from posix_memalign(4096, size), one byte "
           "written in each, never locked (address space and resident set added):\n\n");
    printf("| size | address space, without the shim | under it | resident, without | under "
           "it |\n|---|---|---|---|---|\n");
    for (size_t s = 0; s < ds.size_count; s++)
        if (ds_memory[s].ran)
            printf("| %g GiB | %.1f MiB | %.1f MiB | %.2f MiB | %.2f MiB |\n", ds.sizes_gib[s],
                   ds_memory[s].size[0] / 1048576, ds_memory[s].size[1] / 1048576,
                   ds_memory[s].resident[0] / 1048576, ds_memory[s].resident[1] / 1048576);
    if (ds.fragmented_ran) {
        printf("\nFragmented memory: 1 GiB locked while a process holds every other page of "
               "%.1f GiB, started afresh before each (free 2 MiB blocks then, median: %.0f):\n\n",
               ds.fragmented_held_gib * 2, ds.fragmented_free_blocks_before);
        printf(
            "| arm | mlock | huge share | ratio | compact_stall during the lock | the shim: made "
            "huge / left small for want of free blocks / after a slow batch, in all runs "
            "|\n");
        printf("|---|---|---|---|---|---|\n");
        enum ds_arm arms[] = {DS_NONE, DS_HUGE, DS_ADVISED};
        for (int k = 0; k < 3; k++) {
            struct ds_cell *cell = &ds.fragmented[arms[k]];
            char time[48], share[16], ratio[16];
            format_time(time, sizeof(time), cell);
            format_share(share, sizeof(share), cell);
            format_ratio(ratio, sizeof(ratio), cell, &ds.fragmented[DS_NONE]);
            unsigned long long stalls = 0;
            for (int i = 0; i < cell->count; i++)
                stalls += cell->stalls[i];
            char shim[96] = "-";
            if (arms[k] == DS_HUGE)
                snprintf(shim, sizeof(shim), "%.0f / %.0f / %.0f MiB", cell->made / 1048576,
                         cell->no_block / 1048576, cell->stopped / 1048576);
            printf("| %s | %s | %s | %s | %llu in %d runs | %s |\n", ds_arm_titles[arms[k]], time,
                   share, ratio, stalls, cell->count, shim);
        }
    }
    for (size_t s = 0; s < ds.size_count; s++)
        for (int state = 0; state < DS_STATE_COUNT; state++)
            for (int arm = 0; arm < DS_ARM_COUNT; arm++)
                if (ds.cells[s][state][arm].message[0] != '\0')
                    printf("  %g GiB %s %s: %s\n", ds.sizes_gib[s], ds_state_names[state],
                           ds_arm_names[arm], ds.cells[s][state][arm].message);
}

static void json_cell(FILE *out, const struct ds_cell *cell)
{
    fprintf(out, "{\"lock_s\": [");
    for (int i = 0; i < cell->count; i++)
        fprintf(out, "%s%.9f", i ? ", " : "", cell->lock[i]);
    fprintf(out, "], \"huge_share\": [");
    for (int i = 0; i < cell->count; i++)
        fprintf(out, "%s%.4f", i ? ", " : "", cell->huge_share[i]);
    fprintf(out, "], \"compact_stalls\": [");
    for (int i = 0; i < cell->count; i++)
        fprintf(out, "%s%llu", i ? ", " : "", cell->stalls[i]);
    fprintf(out,
            "], \"lock_median_s\": %.9f, \"shim_made_bytes\": %.0f, \"shim_no_block_bytes\": "
            "%.0f, \"shim_stopped_bytes\": %.0f}",
            median(cell->lock, cell->count), cell->made, cell->no_block, cell->stopped);
}

static bool write_json(const char *path, const char *command)
{
    FILE *out = bench_json_open(path, "lock_latency --deepspeed");
    if (out == NULL)
        return false;
    fprintf(out, ", \"command\": ");
    bench_json_string(out, command);
    fprintf(out, ", \"rounds\": %d, \"pause_s\": %g, \"sizes\": [", ds.rounds, ds.pause);
    for (size_t s = 0; s < ds.size_count; s++) {
        fprintf(out, "%s\n  {\"bytes\": %zu", s ? "," : "", ds.bytes[s]);
        for (int state = 0; state < DS_STATE_COUNT; state++) {
            fprintf(out, ", \"%s\": {", ds_state_names[state]);
            for (int arm = DS_NONE; arm <= DS_SMALL; arm++) {
                fprintf(out, "%s\"%s\": ", arm ? ", " : "", ds_arm_names[arm]);
                json_cell(out, &ds.cells[s][state][arm]);
            }
            fprintf(out, "}");
        }
        fprintf(out, "}");
    }
    fprintf(out, "],\n \"alignment_memory\": [");
    bool first = true;
    for (size_t s = 0; s < ds.size_count; s++) {
        if (!ds_memory[s].ran)
            continue;
        fprintf(out,
                "%s{\"bytes\": %zu, \"buffers\": 32, \"address_space_added\": {\"none\": %.0f, "
                "\"huge\": %.0f}, \"resident_added\": {\"none\": %.0f, \"huge\": %.0f}}",
                first ? "" : ", ", ds.bytes[s], ds_memory[s].size[0], ds_memory[s].size[1],
                ds_memory[s].resident[0], ds_memory[s].resident[1]);
        first = false;
    }
    fprintf(out, "]");
    if (ds.fragmented_ran) {
        fprintf(out, ",\n \"fragmented\": {\"held_bytes\": %.0f, \"free_2mib_blocks_before\": %.0f",
                ds.fragmented_held_gib * (double)GIB, ds.fragmented_free_blocks_before);
        enum ds_arm arms[] = {DS_NONE, DS_HUGE, DS_ADVISED};
        for (int k = 0; k < 3; k++) {
            fprintf(out, ", \"%s\": ", ds_arm_names[arms[k]]);
            json_cell(out, &ds.fragmented[arms[k]]);
        }
        fprintf(out, "}");
    }
    fprintf(out, "}\n");
    return fclose(out) == 0;
}

static bool parse_sizes(const char *text)
{
    ds.size_count = 0;
    for (const char *cursor = text; *cursor != '\0';) {
        char *end;
        double gib = strtod(cursor, &end);
        if (end == cursor || gib <= 0 || ds.size_count == DS_MAX_SIZES ||
            (*end != ',' && *end != '\0'))
            return false;
        ds.sizes_gib[ds.size_count] = gib;
        ds.bytes[ds.size_count] = ((size_t)(gib * (double)GIB) + 4095) / 4096 * 4096;
        ds.size_count++;
        cursor = *end == ',' ? end + 1 : end;
    }
    return ds.size_count > 0;
}

int lock_latency_deepspeed_main(int argc, char **argv, const char *shim)
{
    ds.rounds = 3;
    ds.pause = 5;
    ds.shim = shim;
    parse_sizes("0.0625,1,4");
    const char *json_path = NULL;
    bool fragmented = false, fragmented_only = false;
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--deepspeed") == 0 || strcmp(argv[i], "--shim") == 0) {
            i += strcmp(argv[i], "--shim") == 0;
        } else if (strcmp(argv[i], "--fragmented") == 0) {
            fragmented = true;
        } else if (strcmp(argv[i], "--fragmented-only") == 0) {
            fragmented_only = true;
        } else if (value != NULL && strcmp(argv[i], "--sizes") == 0 && parse_sizes(value)) {
            i++;
        } else if (value != NULL && strcmp(argv[i], "--rounds") == 0 && atoi(value) >= 1 &&
                   atoi(value) <= DS_MAX_ROUNDS) {
            ds.rounds = atoi(value), i++;
        } else if (value != NULL && strcmp(argv[i], "--pause") == 0 && strtod(value, NULL) >= 0) {
            ds.pause = strtod(value, NULL), i++;
        } else if (value != NULL && strcmp(argv[i], "--json") == 0) {
            json_path = value, i++;
        } else {
            fprintf(stderr, "lock_latency --deepspeed: bad option or value: %s\n", argv[i]);
            return 64;
        }
    }
    char command[2048] = "";
    for (int i = 0; i < argc; i++)
        snprintf(command + strlen(command), sizeof(command) - strlen(command), "%s%s", i ? " " : "",
                 argv[i]);
    printf("lock_latency --deepspeed: shim %s; posix_memalign(4096, size), untouched, mlock; "
           "%d rounds, pause %g s before first runs\n",
           shim, ds.rounds, ds.pause);
    double began = bench_now_seconds();
    for (int round = 0; round < ds.rounds && !fragmented_only; round++) {
        for (size_t s = 0; s < ds.size_count; s++) {
            for (int k = 0; k < 3; k++) {
                enum ds_arm arm = (enum ds_arm)(round % 2 == 0 ? k : 2 - k);
                fprintf(stderr, "lock_latency --deepspeed: round %d, %g GiB, %s\n", round + 1,
                        ds.sizes_gib[s], ds_arm_names[arm]);
                pause_for(ds.pause);
                run_arm(arm, ds.bytes[s], &ds.cells[s][DS_FIRST][arm]);
                warm_up(ds.bytes[s]);
                run_arm(arm, ds.bytes[s], &ds.cells[s][DS_WARM][arm]);
            }
        }
    }
    for (size_t s = 0; s < ds.size_count; s++)
        if (!fragmented_only && ds.bytes[s] * 32 <= (size_t)(mem_available() / 2))
            measure_memory(s);
    if (fragmented || fragmented_only)
        run_fragmented();
    print_tables();
    printf("\ntotal time %.1f s\n", bench_now_seconds() - began);
    if (json_path != NULL && !write_json(json_path, command)) {
        fprintf(stderr, "lock_latency: cannot write %s: %s\n", json_path, strerror(errno));
        return 1;
    }
    return 0;
}
