/* Unmodified programs under LD_PRELOAD=libpinshim.so with the fake CUDA runtime:
 * memtester and fio from Debian, and two small programs of our own. Each runs
 * once without and once with the shim. The program must behave the same (exit
 * status, stdout, stderr), the stats must show the registrations its lock calls
 * imply, and the fake runtime must end with nothing registered and no
 * violation. lock_recorder (preloaded in both runs) writes down the lock calls
 * the program really made, and a small model replays them into what the shim
 * should have registered. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child.h"
#include "harness.h"

#define MODEL_MAX_RANGES 256

/* ---- expected registrations, replayed from the recorded calls ----
 *
 * The shim's rule, independent of how it gets there: the pages locked
 * through it (tracked) form runs, cut where a mapping the program made
 * begins or ends; a run in which the program locked at least min_bytes
 * (the bytes its lock calls asked for) is one registration, a smaller one
 * none. After each call the registrations that are no longer so were
 * unregistered (once each) and the new ones registered. */

struct interval {
    uintptr_t start, end;
};

struct interval_set {
    struct interval items[MODEL_MAX_RANGES];
    size_t count;
};

struct model {
    uintptr_t page;
    uint64_t min_bytes;
    struct interval_set tracked, bytes, registered;
    /* Where mappings begin (starts) and end (ends): page addresses. */
    uintptr_t starts[4 * MODEL_MAX_RANGES], ends[4 * MODEL_MAX_RANGES];
    size_t start_count, end_count;
    size_t count; /* registrations now */
    uint64_t register_ok, register_bytes;
    uint64_t lock_calls, unlock_calls, mlockall_calls;
    uint64_t by_munlock, by_munmap, by_join;
};

static void model_init(struct model *model)
{
    memset(model, 0, sizeof(*model));
    model->page = (uintptr_t)sysconf(_SC_PAGESIZE);
    model->min_bytes = 64 * 1024; /* the shim's default PINSHIM_MIN_BYTES */
}

static void set_add(struct interval_set *set, uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return;
    struct interval_set result = {.count = 0};
    size_t i = 0;
    while (i < set->count && set->items[i].end < start)
        result.items[result.count++] = set->items[i++];
    while (i < set->count && set->items[i].start <= end) {
        start = set->items[i].start < start ? set->items[i].start : start;
        end = set->items[i].end > end ? set->items[i].end : end;
        i++;
    }
    cr_assert_lt(result.count, MODEL_MAX_RANGES);
    result.items[result.count++] = (struct interval){start, end};
    while (i < set->count) {
        cr_assert_lt(result.count, MODEL_MAX_RANGES);
        result.items[result.count++] = set->items[i++];
    }
    *set = result;
}

static void set_remove(struct interval_set *set, uintptr_t start, uintptr_t end)
{
    struct interval_set result = {.count = 0};
    for (size_t i = 0; i < set->count; i++) {
        struct interval item = set->items[i];
        if (item.end <= start || item.start >= end) {
            result.items[result.count++] = item;
            continue;
        }
        if (item.start < start)
            result.items[result.count++] = (struct interval){item.start, start};
        if (item.end > end) {
            cr_assert_lt(result.count, MODEL_MAX_RANGES);
            result.items[result.count++] = (struct interval){end, item.end};
        }
    }
    *set = result;
}

static uint64_t set_bytes_in(const struct interval_set *set, uintptr_t start, uintptr_t end)
{
    uint64_t total = 0;
    for (size_t i = 0; i < set->count; i++) {
        uintptr_t from = set->items[i].start > start ? set->items[i].start : start;
        uintptr_t to = set->items[i].end < end ? set->items[i].end : end;
        if (from < to)
            total += to - from;
    }
    return total;
}

static bool list_has(const uintptr_t *list, size_t count, uintptr_t value)
{
    for (size_t i = 0; i < count; i++)
        if (list[i] == value)
            return true;
    return false;
}

/* Drops the entries in [low, high) (high included when through is set). */
static void list_drop(uintptr_t *list, size_t *count, uintptr_t low, uintptr_t high, bool through)
{
    size_t kept = 0;
    for (size_t i = 0; i < *count; i++)
        if (list[i] < low || list[i] > high || (list[i] == high && !through))
            list[kept++] = list[i];
    *count = kept;
}

static void list_put(uintptr_t *list, size_t *count, uintptr_t value)
{
    if (!list_has(list, *count, value)) {
        cr_assert_lt(*count, 4 * MODEL_MAX_RANGES);
        list[(*count)++] = value;
    }
}

static bool model_split_at(const struct model *model, uintptr_t address)
{
    return list_has(model->starts, model->start_count, address) ||
           list_has(model->ends, model->end_count, address);
}

/* The registrations the rule asks for now. */
static void model_expected(const struct model *model, struct interval_set *out)
{
    out->count = 0;
    for (size_t i = 0; i < model->tracked.count; i++) {
        uintptr_t run_start = model->tracked.items[i].start;
        for (uintptr_t page = run_start; page < model->tracked.items[i].end;) {
            uintptr_t next = page + model->page;
            if (next == model->tracked.items[i].end || model_split_at(model, next)) {
                if (set_bytes_in(&model->bytes, run_start, next) >= model->min_bytes) {
                    cr_assert_lt(out->count, MODEL_MAX_RANGES);
                    out->items[out->count++] = (struct interval){run_start, next};
                }
                run_start = next;
            }
            page = next;
        }
    }
}

/* Moves to the registrations the rule asks for now: those that went were
 * unregistered (counted in *reason), the new ones registered. */
static void model_settle(struct model *model, uint64_t *reason)
{
    struct interval_set now;
    model_expected(model, &now);
    for (size_t i = 0; i < model->registered.count; i++) {
        bool stays = false;
        for (size_t j = 0; j < now.count && !stays; j++)
            stays = now.items[j].start == model->registered.items[i].start &&
                    now.items[j].end == model->registered.items[i].end;
        if (!stays)
            (*reason)++;
    }
    for (size_t j = 0; j < now.count; j++) {
        bool was = false;
        for (size_t i = 0; i < model->registered.count && !was; i++)
            was = now.items[j].start == model->registered.items[i].start &&
                  now.items[j].end == model->registered.items[i].end;
        if (!was) {
            model->register_ok++;
            model->register_bytes += now.items[j].end - now.items[j].start;
        }
    }
    model->registered = now;
    model->count = now.count;
}

static uintptr_t page_floor(const struct model *model, uintptr_t address)
{
    return address & ~(model->page - 1);
}

static uintptr_t page_ceil(const struct model *model, uintptr_t address)
{
    return (address + model->page - 1) & ~(model->page - 1);
}

/* Replays the recorder's lines of process pid (every process when pid is -1). */
static void model_replay(struct model *model, const char *recording, long pid)
{
    cr_assert_not_null(recording, "lock_recorder wrote nothing");
    const char *line = recording;
    while (*line != '\0') {
        char call[16];
        long line_pid, result;
        uintptr_t address;
        size_t length;
        int error;
        cr_assert_eq(sscanf(line, "%15s %ld %" SCNxPTR " %zu %ld %d", call, &line_pid, &address,
                            &length, &result, &error),
                     6, "bad recorder line: %.80s", line);
        const char *end = strchr(line, '\n');
        line = end ? end + 1 : line + strlen(line);
        if (pid != -1 && line_pid != pid)
            continue;
        uintptr_t start = page_floor(model, address);
        uintptr_t stop = page_ceil(model, address + length);
        if (strcmp(call, "mlock") == 0 || strcmp(call, "mlock2") == 0) {
            if (result != 0)
                continue; /* the shim counts and registers successful locks only */
            model->lock_calls++;
            set_add(&model->tracked, start, stop);
            set_add(&model->bytes, address, address + length);
            model_settle(model, &model->by_join);
        } else if (strcmp(call, "munlock") == 0) {
            model->unlock_calls++;
            cr_assert_eq(result, 0, "the model covers successful munlock calls only");
            set_remove(&model->tracked, start, stop);
            set_remove(&model->bytes, start, stop);
            model_settle(model, &model->by_munlock);
        } else if (strcmp(call, "munlockall") == 0) {
            model->unlock_calls++;
            model->tracked.count = model->bytes.count = 0;
            model_settle(model, &model->by_munlock);
        } else if (strcmp(call, "mlockall") == 0) {
            model->mlockall_calls++;
        } else if (strcmp(call, "mmap") == 0) {
            list_drop(model->starts, &model->start_count, start + 1, stop, false);
            list_drop(model->ends, &model->end_count, start + 1, stop, false);
            list_put(model->starts, &model->start_count, start);
            list_put(model->ends, &model->end_count, stop);
        } else if (strcmp(call, "munmap") == 0) {
            list_drop(model->starts, &model->start_count, start, stop, false);
            list_drop(model->ends, &model->end_count, start + 1, stop, true);
            if (result != 0)
                continue;
            set_remove(&model->tracked, start, stop);
            set_remove(&model->bytes, start, stop);
            model_settle(model, &model->by_munmap);
        } else {
            cr_assert_fail("unknown recorded call %s", call);
        }
    }
}

static uint64_t model_live_bytes(const struct model *model)
{
    return set_bytes_in(&model->registered, 0, UINTPTR_MAX);
}

/* The stats of a process that made the recorded calls agree with the model. */
static void expect_stats_match_model(const struct harness_run *run, const struct model *model)
{
    const char *stats = run->stats;
    cr_assert_eq(harness_stat(run, "register.ok"), (double)model->register_ok, "%s", stats);
    cr_assert_eq(harness_stat(run, "register.bytes"), (double)model->register_bytes, "%s", stats);
    cr_assert_eq(harness_stat(run, "register.failed"), 0, "%s", stats);
    cr_assert_eq(harness_stat(run, "calls.lock"), (double)model->lock_calls, "%s", stats);
    cr_assert_eq(harness_stat(run, "calls.unlock"), (double)model->unlock_calls, "%s", stats);
    cr_assert_eq(harness_stat(run, "calls.mlockall"), (double)model->mlockall_calls, "%s", stats);
    cr_assert_eq(harness_stat(run, "unregister.munlock"), (double)model->by_munlock, "%s", stats);
    cr_assert_eq(harness_stat(run, "unregister.munmap"), (double)model->by_munmap, "%s", stats);
    cr_assert_eq(harness_stat(run, "unregister.join"), (double)model->by_join, "%s", stats);
    cr_assert_eq(harness_stat(run, "live.ranges"), (double)model->count, "%s", stats);
    cr_assert_eq(harness_stat(run, "live.bytes"), (double)model_live_bytes(model), "%s", stats);
    cr_assert_eq(harness_stat(run, "unregister.failed"), 0, "%s", stats);
}

/* ---- running a program both ways ---- */

struct pair {
    struct harness_run without_shim, with_shim;
    char *recording_without, *recording_with;
};

/* Runs argv without and then with the shim, lock_recorder preloaded both
 * times. fresh_file, when not NULL, is removed before each run so that both
 * start from the same state. */
static void run_both_ways(struct pair *pair, const char *const argv[], const char *fresh_file)
{
    memset(pair, 0, sizeof(*pair));
    const char *recorder = harness_env("LOCK_RECORDER");
    char preload[2 * HARNESS_PATH_MAX + 2];
    snprintf(preload, sizeof(preload), "%s:%s", recorder, harness_env("PINSHIM_LIB"));
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    for (int with = 0; with < 2; with++) {
        char recorder_log[HARNESS_PATH_MAX + 32];
        snprintf(recorder_log, sizeof(recorder_log), "LOCK_RECORDER_LOG=%s/calls.%d", directory,
                 with);
        const char *environment[] = {recorder_log, NULL};
        if (fresh_file != NULL)
            unlink(fresh_file);
        struct harness_options options = {.preload = with ? preload : recorder, .env = environment};
        harness_run(with ? &pair->with_shim : &pair->without_shim, argv, &options);
        char *text = read_file_text(strchr(recorder_log, '=') + 1);
        if (with)
            pair->recording_with = text;
        else
            pair->recording_without = text;
    }
    remove_tree(directory);
    free(directory);
}

static void pair_free(struct pair *pair)
{
    harness_free(&pair->without_shim);
    harness_free(&pair->with_shim);
    free(pair->recording_without);
    free(pair->recording_with);
}

/* The calls, lengths and results the program made, without addresses and pids
 * (which differ between runs), must be the same with and without the shim. */
static void expect_same_calls(const struct pair *pair)
{
    char *texts[2] = {pair->recording_without, pair->recording_with};
    char *reduced[2];
    for (int i = 0; i < 2; i++) {
        cr_assert_not_null(texts[i], "no lock calls were recorded");
        size_t size = strlen(texts[i]) + 1;
        reduced[i] = malloc(size);
        cr_assert_not_null(reduced[i]);
        size_t used = 0;
        for (const char *line = texts[i]; *line;) {
            char call[16];
            long pid, result;
            unsigned long address;
            size_t length;
            int error;
            cr_assert_eq(sscanf(line, "%15s %ld %lx %zu %ld %d", call, &pid, &address, &length,
                                &result, &error),
                         6);
            /* Mappings are the program's and its libraries' alike: only
             * the lock calls are compared. */
            if (strcmp(call, "mmap") != 0)
                used += (size_t)snprintf(reduced[i] + used, size - used, "%s %zu %ld %d\n", call,
                                         length, result, error);
            const char *end = strchr(line, '\n');
            line = end ? end + 1 : line + strlen(line);
        }
    }
    cr_assert_str_eq(reduced[1], reduced[0], "the program's lock calls differ with the shim");
    free(reduced[0]);
    free(reduced[1]);
}

static const char *program_or_skip(const char *variable, const char *package)
{
    SKIP_BUILD_MACHINE_PROGRAM(package);
    const char *path = harness_optional_env(variable);
    if (path == NULL || access(path, X_OK) != 0)
        cr_skip_test("%s is not installed (Debian package %s); scripts/deps installs it", package,
                     package);
    return path;
}

/* ---- memtester ---- */

/* memtester 4.6 mallocs the buffer, locks it from the first page boundary
 * inside and munlocks a shorter length at the end (it subtracts the alignment
 * offset twice), so its last locked page stays locked until exit: the shim
 * re-registers that page after the munlock and unregisters it at exit. The
 * model derives all of this from the recorded calls. */
Test(realprograms, memtester, .timeout = 120)
{
    const char *memtester = program_or_skip("MEMTESTER", "memtester");
    /* 8 MiB, or half of what RLIMIT_MEMLOCK allows an unprivileged user. */
    harness_require_lock_budget(256 << 10);
    unsigned long long budget = harness_lock_budget();
    char size[32] = "8M";
    if (budget < (9ull << 20))
        snprintf(size, sizeof(size), "%lluK", budget / 2 / 4096 * 4);
    const char *argv[] = {memtester, size, "1", NULL};
    struct pair pair;
    run_both_ways(&pair, argv, NULL);

    cr_assert_eq(pair.without_shim.result.status, 0, "memtester failed without the shim:\n%s",
                 pair.without_shim.result.out);
    /* memtester prints no timing: its output is compared byte for byte. */
    harness_expect_same_result(&pair.without_shim, &pair.with_shim);
    cr_assert_str_eq(pair.with_shim.result.err, pair.without_shim.result.err);
    cr_assert(strstr(pair.with_shim.result.out, "trying mlock ...locked.") != NULL,
              "memtester did not lock its buffer (RLIMIT_MEMLOCK allows %llu bytes):\n%.400s",
              budget, pair.with_shim.result.out);
    expect_same_calls(&pair);

    struct model model;
    model_init(&model);
    model_replay(&model, pair.recording_with, -1);
    cr_assert_geq(model.lock_calls, 1);
    cr_assert_eq(pair.with_shim.stats_files, 1);
    expect_stats_match_model(&pair.with_shim, &model);
    /* What memtester says it got ("got  8MB (8388608 bytes)") was all registered. */
    const char *got = strstr(pair.with_shim.result.out, "got ");
    cr_assert_not_null(got);
    got = strchr(got, '(');
    cr_assert_not_null(got);
    cr_assert_geq(harness_stat(&pair.with_shim, "live.peak_bytes"), (double)atoll(got + 1));
    harness_expect_consistent_stats(&pair.with_shim);
    harness_expect_clean_runtime(&pair.with_shim);
    pair_free(&pair);
}

/* ---- fio ---- */

static bool starts_with_word(const char *text, const char *word)
{
    size_t length = strlen(word);
    return strncmp(text, word, length) == 0 &&
           (text[length] == ' ' || text[length] == ':' || text[length] == '(' ||
            text[length] == '\0' || word[length - 1] == ':');
}

/* fio's report with what varies from run to run taken out:
 *  - dropped: the latency, bandwidth, IOPS and CPU lines (first word read:,
 *    write:, trim:, slat, clat, lat, |, cpu, bw, iops);
 *  - the job line keeps "<job>: (groupid=N, jobs=N): err= N" and loses
 *    ": pid=<pid>: <date>";
 *  - the "READ:"/"WRITE:" run summary keeps only its io= field.
 * Everything else (job header, fio version, "Starting", file layout, IO
 * depths, submit/complete, issued rwts, latency target, run status group) is
 * compared as printed. */
static char *normalise_fio(const char *text)
{
    static const char *const varying[] = {"read:", "write:", "trim:", "slat", "clat",
                                          "lat",   "|",      "cpu",   "bw",   "iops"};
    size_t size = strlen(text) + 1;
    char *out = malloc(size);
    cr_assert_not_null(out);
    size_t used = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        const char *word = line;
        while (*word == ' ' || *word == '\t')
            word++;
        bool drop = false;
        for (size_t i = 0; i < sizeof(varying) / sizeof(*varying); i++)
            drop |= (size_t)(word - line) < length && starts_with_word(word, varying[i]);
        if (!drop) {
            size_t keep = length;
            const char *pid = strstr(line, ": pid=");
            const char *io = strstr(line, "io=");
            if (strstr(line, "(groupid=") != NULL && pid != NULL && pid < line + length) {
                keep = (size_t)(pid - line);
            } else if ((starts_with_word(word, "READ:") || starts_with_word(word, "WRITE:")) &&
                       io != NULL && io < line + length) {
                const char *io_end = strstr(io, ", run=");
                size_t io_length = io_end && io_end < line + length ? (size_t)(io_end - io)
                                                                    : (size_t)(line + length - io);
                used += (size_t)snprintf(out + used, size - used, "%.*s%.*s",
                                         (int)(word - line + 6), line, (int)io_length, io);
                keep = 0;
            }
            memcpy(out + used, line, keep);
            used += keep;
            out[used++] = '\n';
        }
        line = end ? end + 1 : line + length;
    }
    out[used] = '\0';
    return out;
}

Test(realprograms, fio_normalisation_keeps_what_is_deterministic)
{
    const char *report = "t: (g=0): rw=read, bs=(R) 4096B-4096B, ioengine=psync, iodepth=1\n"
                         "t: (groupid=0, jobs=1): err= 0: pid=123: Mon Nov 30 12:40:48 2026\n"
                         "  read: IOPS=137k, BW=533MiB/s (559MB/s)(8192KiB/15msec)\n"
                         "    clat (nsec): min=331, max=3359.6k\n"
                         "     lat (nsec): min=350\n"
                         "     | 20.00th=[  430], 30.00th=[  470]\n"
                         "  lat (usec)   : 2=0.93%\n"
                         "  cpu          : usr=0.00%, sys=64.29%, ctx=7, majf=0, minf=0\n"
                         "  IO depths    : 1=100.0%, 2=0.0%\n"
                         "   READ: bw=533MiB/s (559MB/s), io=8192KiB (8389kB), run=15-15msec\n";
    char *normalised = normalise_fio(report);
    cr_assert_str_eq(normalised, "t: (g=0): rw=read, bs=(R) 4096B-4096B, ioengine=psync, "
                                 "iodepth=1\n"
                                 "t: (groupid=0, jobs=1): err= 0\n"
                                 "  IO depths    : 1=100.0%, 2=0.0%\n"
                                 "   READ: io=8192KiB (8389kB)\n");
    free(normalised);
}

/* fio --lockmem maps the size with mmap, mlocks it before the job runs, then
 * munlocks and munmaps it (fio's memory.c: fio_pin_memory/fio_unpin_memory). */
/* The --lockmem size: 16 MiB, or half of what RLIMIT_MEMLOCK allows. */
static unsigned long long fio_lockmem(void)
{
    harness_require_lock_budget(2 << 20);
    unsigned long long budget = harness_lock_budget() / 2 / (1 << 20) * (1 << 20);
    return budget < (16u << 20) ? budget : (16u << 20);
}

static void run_fio(struct pair *pair, bool threads)
{
    const char *fio = program_or_skip("FIO", "fio");
    char lockmem[64];
    snprintf(lockmem, sizeof(lockmem), "--lockmem=%lluM", fio_lockmem() >> 20);
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    char filename[HARNESS_PATH_MAX + 32];
    snprintf(filename, sizeof(filename), "--filename=%s/data", directory);
    const char *argv[] = {fio,
                          "--name=t",
                          filename,
                          "--size=8M",
                          "--rw=read",
                          "--ioengine=psync",
                          lockmem,
                          "--eta=never",
                          "--disk_util=0",
                          threads ? "--thread" : "--thread=0",
                          NULL};
    char data[HARNESS_PATH_MAX + 16];
    snprintf(data, sizeof(data), "%s/data", directory);
    /* The data file is laid out afresh by each run, so both print the same. */
    run_both_ways(pair, argv, data);
    remove_tree(directory);
    free(directory);

    for (int with = 0; with < 2; with++) {
        struct harness_run *run = with ? &pair->with_shim : &pair->without_shim;
        cr_assert_eq(run->result.status, 0, "fio failed (%s the shim):\n%s\n%s",
                     with ? "with" : "without", run->result.out, run->result.err);
    }
    char *normalised[2] = {normalise_fio(pair->without_shim.result.out),
                           normalise_fio(pair->with_shim.result.out)};
    cr_assert_str_eq(normalised[1], normalised[0], "fio's report differs with the shim");
    cr_assert(strstr(normalised[1], "err= 0") != NULL, "%s", normalised[1]);
    free(normalised[0]);
    free(normalised[1]);
    cr_assert_str_eq(pair->with_shim.result.err, pair->without_shim.result.err);
    expect_same_calls(pair);
}

Test(realprograms, fio_lockmem_threads, .timeout = 120)
{
    struct pair pair;
    run_fio(&pair, true);
    struct model model;
    model_init(&model);
    model_replay(&model, pair.recording_with, -1);
    cr_assert_eq(model.lock_calls, 1, "fio --lockmem locks once:\n%s", pair.recording_with);
    cr_assert_eq(model.register_bytes, fio_lockmem());
    cr_assert_eq(pair.with_shim.stats_files, 1);
    expect_stats_match_model(&pair.with_shim, &model);
    harness_expect_consistent_stats(&pair.with_shim);
    harness_expect_clean_runtime(&pair.with_shim);
    pair_free(&pair);
}

/* In fio's default process mode the job runs in a forked child that leaves
 * through _exit (fio's backend.c): the shim writes its stats there (ended_by
 * "_exit"). The parent, which exits normally, locks nothing: with nothing to
 * say it writes no stats. The fake runtime's log tells what the child did. */
Test(realprograms, fio_lockmem_processes, .timeout = 120)
{
    struct pair pair;
    run_fio(&pair, false);
    cr_assert_eq(pair.with_shim.stats_files, 1,
                 "only fio's job child locked; it leaves through _exit and still reports");
    cr_assert(strstr(pair.with_shim.stats, "\"ended_by\": \"_exit\"") != NULL, "%s",
              pair.with_shim.stats);
    harness_expect_clean_runtime(&pair.with_shim);
    cr_assert_eq(pair.with_shim.log.process_count, 1, "only the job process uses CUDA");
    const struct fake_log_process *job = &pair.with_shim.log.processes[0];
    struct model model;
    model_init(&model);
    model_replay(&model, pair.recording_with, job->pid);
    cr_assert_eq(model.lock_calls, 1, "%s", pair.recording_with);
    cr_assert_eq(job->register_calls, model.register_ok);
    cr_assert_eq(job->register_ok, model.register_ok);
    cr_assert_eq(job->unregister_ok, model.by_munlock + model.by_munmap);
    cr_assert_eq(job->unregister_calls, job->unregister_ok);
    cr_assert_eq(harness_stat(&pair.with_shim, "pid"), job->pid);
    expect_stats_match_model(&pair.with_shim, &model);
    pair_free(&pair);
}

/* ---- programs of our own ---- */

/* Sum of the lengths of the "locked <n>" lines a program printed, page-rounded. */
static uint64_t printed_locked_bytes(const char *out, size_t *count)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), total = 0;
    *count = 0;
    for (const char *line = out; line != NULL && *line != '\0';) {
        if (strncmp(line, "locked ", 7) == 0) {
            unsigned long long length = strtoull(line + 7, NULL, 10);
            total += (length + page - 1) / page * page;
            (*count)++;
        }
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    return total;
}

Test(realprograms, freeing_locked_memory_unregisters_it)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("FREE_WITHOUT_UNLOCK"), NULL};
    struct pair pair;
    run_both_ways(&pair, argv, NULL);
    harness_expect_same_result(&pair.without_shim, &pair.with_shim);
    cr_assert_eq(pair.with_shim.result.status, 0, "%s", pair.with_shim.result.err);
    cr_assert_str_eq(pair.with_shim.result.err, "");
    size_t locks;
    uint64_t bytes = printed_locked_bytes(pair.with_shim.result.out, &locks);
    cr_assert_eq(locks, 2);
    cr_assert_eq(harness_stat(&pair.with_shim, "register.ok"), 2);
    cr_assert_eq(harness_stat(&pair.with_shim, "register.bytes"), (double)bytes);
    cr_assert_eq(harness_stat(&pair.with_shim, "unregister.free"), 2,
                 "each free of locked memory unregisters it:\n%s", pair.with_shim.stats);
    cr_assert_eq(harness_stat(&pair.with_shim, "unregister.munlock"), 0);
    cr_assert_eq(harness_stat(&pair.with_shim, "live.ranges"), 0);
    harness_expect_consistent_stats(&pair.with_shim);
    harness_expect_clean_runtime(&pair.with_shim);
    pair_free(&pair);
}

Test(realprograms, exiting_with_live_registrations)
{
    harness_require_lock_budget(8 << 20);
    const char *argv[] = {harness_env("EXIT_WITH_LOCKS"), "3", NULL};
    struct pair pair;
    run_both_ways(&pair, argv, NULL);
    harness_expect_same_result(&pair.without_shim, &pair.with_shim);
    cr_assert_eq(pair.with_shim.result.status, 3, "the program's exit status is kept");
    cr_assert_str_eq(pair.with_shim.result.err, "");
    size_t locks;
    uint64_t bytes = printed_locked_bytes(pair.with_shim.result.out, &locks);
    cr_assert_eq(locks, 3);
    double live = harness_stat(&pair.with_shim, "live.ranges");
    cr_assert_eq(live, 3, "%s", pair.with_shim.stats);
    cr_assert_eq(harness_stat(&pair.with_shim, "live.bytes"), (double)bytes);
    cr_assert_eq(harness_stat(&pair.with_shim, "unregister.exit"), live);
    cr_assert_eq(harness_stat(&pair.with_shim, "unregister.ok"), live);
    harness_expect_consistent_stats(&pair.with_shim);
    /* The exit unregistrations leave the runtime empty. */
    harness_expect_clean_runtime(&pair.with_shim);
    pair_free(&pair);
}

/* ---- vmtouch ---- */

/* vmtouch -l maps each file PROT_READ, MAP_SHARED, locks it and waits to be
 * killed: the lock of a read-only file mapping, registered with READ_ONLY
 * (issue 18). The test waits (at most 20 s) until the fake runtime logs the
 * registration, then ends vmtouch, which unlocks nothing itself: the
 * registration goes with the process. */
/* The flags of the first successful registration in the log text, or -1. */
static long registered_flags_in(const char *log)
{
    for (const char *line = log; line != NULL && *line;) {
        unsigned long pid, size, flags;
        long error;
        uintptr_t address;
        if (sscanf(line, "register %lu 0x%" SCNxPTR " %lu %lu %ld", &pid, &address, &size, &flags,
                   &error) == 5 &&
            error == 0)
            return (long)flags;
        const char *newline = strchr(line, '\n');
        line = newline ? newline + 1 : NULL;
    }
    return -1;
}

Test(realprograms, vmtouch_lock_registers_the_file_read_only, .timeout = 60)
{
    const char *vmtouch = program_or_skip("VMTOUCH", "vmtouch");
    harness_require_lock_budget(16 << 20);
    char *directory = make_temp_dir();
    cr_assert_not_null(directory);
    char file[1200], log[1200], err[1200];
    snprintf(file, sizeof file, "%s/weights.bin", directory);
    snprintf(log, sizeof log, "%s/fake.log", directory);
    snprintf(err, sizeof err, "%s/stderr", directory);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    static char block[1 << 20];
    memset(block, 3, sizeof block);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(write(fd, block, sizeof block), (ssize_t)sizeof block);
    close(fd);

    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        int output = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(output, STDOUT_FILENO);
        dup2(output, STDERR_FILENO);
        setenv("LD_PRELOAD", harness_env("PINSHIM_LIB"), 1);
        setenv("PINSHIM_CUDART", harness_env("FAKE_CUDART"), 1);
        setenv("FAKE_CUDART_LOG", log, 1);
        setenv("FAKE_CUDART_CHECK", "1", 1);
        setenv("PINSHIM_LOG", "info", 1);
        execl(vmtouch, vmtouch, "-l", file, (char *)NULL);
        _exit(127);
    }
    long flags = -1;
    for (int i = 0; i < 2000 && flags < 0; i++) {
        char *text = read_file_text(log);
        flags = text != NULL ? registered_flags_in(text) : -1;
        free(text);
        if (flags < 0)
            usleep(10000);
    }
    kill(child, SIGTERM);
    int status = 0;
    waitpid(child, &status, 0);
    char *output = read_file_text(err);
    char *text = read_file_text(log);
    cr_assert_eq(flags, 11, "READ_ONLY | PORTABLE | DEVICEMAP\nlog:\n%s\nvmtouch:\n%s",
                 text ? text : "", output ? output : "");
    cr_assert(strstr(text, "violation") == NULL, "%s", text);
    cr_assert(strstr(output, "pinshim: registered ") != NULL, "%s", output);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "vmtouch ended with %d:\n%s",
              status, output);
    free(output);
    free(text);
    remove_tree(directory);
    free(directory);
}
