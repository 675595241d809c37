/* fork_copy: what fork() costs when the parent holds a large DMA-pinned
 * buffer. Since Linux 5.9 (commit 70e806e4e645, "mm: Do early cow for pinned
 * pages during fork() for ptes"; folio_needs_cow_for_dma today) the kernel
 * copies private anonymous pages that may be DMA-pinned (pin_user_pages,
 * FOLL_PIN) into the child at fork instead of sharing them copy-on-write, so
 * that the parent's pinned pages stay the parent's. A CUDA registration pins
 * that way (recent open NVIDIA kernel modules: NV_PIN_USER_PAGES with
 * FOLL_LONGTERM); there is no GPU here, so io_uring fixed buffers
 * (IORING_REGISTER_BUFFERS, which pins with FOLL_PIN | FOLL_LONGTERM) stand in,
 * through raw system calls (no liburing).
 *
 * One buffer (1 GiB by default), every page written, mlocked, then:
 *   (a) only mlocked;
 *   (b) mlocked and registered with io_uring (pinned);
 *   (c) pinned and madvise(MADV_DONTFORK);
 * for each, --forks forks: the parent times fork() until it returns in the
 * parent; the child reads its own /proc/self/smaps for the buffer's address
 * range (Private_Dirty there: pages that are the child's alone, i.e. copied;
 * Shared_Dirty: pages still shared copy-on-write with the parent), reports,
 * and leaves with _exit. As a cross-check from the other side, the parent
 * reads its own smaps for the buffer while the child still exists
 * (Shared_Dirty there: pages it shares with the child). MemFree is no use
 * here: on this VM it did not move while a child held a 256 MiB copy. Then one more
 * child writes to the buffer: it works in (a) and (b), and is killed by
 * SIGSEGV in (c), where the child has no mapping there at all.
 *   (d) what PINSHIM_FORK=dontfork does under the shim (MADV_DONTFORK on each
 * registered range), shown with the shim and the fake runtime: the same lock,
 * drain, fork, and a child that touches the buffer, with PINSHIM_FORK=copy
 * and =dontfork. The fake driver pins nothing, so (d) shows what children see,
 * not what the copy costs; (b) measures that. */
#include "bench_util.h"

#include "pinshim.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/io_uring.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef BENCH_SHIM_PATH
#define BENCH_SHIM_PATH ""
#endif
#ifndef BENCH_FAKE_CUDART_PATH
#define BENCH_FAKE_CUDART_PATH ""
#endif

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define MAX_FORKS 32
#define FILL_BYTE 0x5a

/* What the child finds in its smaps for the buffer's address range. */
struct range_smaps {
    int vmas; /* 0: the child has no mapping there */
    long rss_kb, anonymous_kb, private_dirty_kb, shared_dirty_kb;
};

struct condition_result {
    const char *name;
    const char *title;
    bool ran;
    char skipped[200];
    int forks;
    double fork_s[MAX_FORKS];
    double exit_s[MAX_FORKS]; /* from telling the child to leave until it is reaped */
    struct range_smaps child_smaps[MAX_FORKS];  /* the child's smaps over the buffer */
    struct range_smaps parent_smaps[MAX_FORKS]; /* the parent's, while the child exists */
    int touch_status;                           /* the touching child: exit code, or 128 + signal */
};

static struct {
    size_t bytes;
    int forks;
    const char *json_path;
    bool shim_demo;
} options = {.bytes = GIB, .forks = 5, .shim_demo = true};

/* ---- /proc readers ---- */

static long status_kb(const char *key)
{
    FILE *file = fopen("/proc/self/status", "r");
    if (file == NULL)
        return -1;
    char line[256];
    long value = -1;
    size_t key_length = strlen(key);
    while (fgets(line, sizeof(line), file) != NULL)
        if (strncmp(line, key, key_length) == 0 && line[key_length] == ':') {
            value = strtol(line + key_length + 1, NULL, 10);
            break;
        }
    fclose(file);
    return value;
}

/* Whether this process holds a capability (CapEff of /proc/self/status). */
static bool has_capability(int capability)
{
    FILE *file = fopen("/proc/self/status", "r");
    if (file == NULL)
        return false;
    char line[256];
    unsigned long long effective = 0;
    while (fgets(line, sizeof(line), file) != NULL)
        if (sscanf(line, "CapEff: %llx", &effective) == 1)
            break;
    fclose(file);
    return (effective >> capability) & 1;
}

static void read_text_file(const char *path, char *out, size_t size)
{
    snprintf(out, size, "?");
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return;
    if (fgets(out, (int)size, file) == NULL)
        snprintf(out, size, "?");
    out[strcspn(out, "\n")] = '\0';
    fclose(file);
}

/* Sums the smaps fields of every VMA of this process overlapping [start, end). */
static struct range_smaps read_range_smaps(uintptr_t start, uintptr_t end)
{
    struct range_smaps smaps = {0, 0, 0, 0, 0};
    FILE *file = fopen("/proc/self/smaps", "r");
    if (file == NULL)
        return smaps;
    char line[512];
    bool inside = false;
    while (fgets(line, sizeof(line), file) != NULL) {
        uintptr_t vma_start, vma_end;
        long kb;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &vma_start, &vma_end) == 2 &&
            strchr(line, '-') < strchr(line, ' ')) {
            inside = vma_start < end && vma_end > start;
            smaps.vmas += inside;
        } else if (!inside) {
            continue;
        } else if (sscanf(line, "Rss: %ld kB", &kb) == 1) {
            smaps.rss_kb += kb;
        } else if (sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
            smaps.anonymous_kb += kb;
        } else if (sscanf(line, "Private_Dirty: %ld kB", &kb) == 1) {
            smaps.private_dirty_kb += kb;
        } else if (sscanf(line, "Shared_Dirty: %ld kB", &kb) == 1) {
            smaps.shared_dirty_kb += kb;
        }
    }
    fclose(file);
    return smaps;
}

static int status_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

static void describe_status(int code, char *out, size_t size)
{
    if (code > 128)
        snprintf(out, size, "killed by signal %d (%s)", code - 128, strsignal(code - 128));
    else if (code >= 0)
        snprintf(out, size, "exit %d", code);
    else
        snprintf(out, size, "unknown");
}

/* ---- the forks ---- */

/* One fork: the parent's time in fork(), what the child sees, what the
 * parent sees while the child exists, and how long the child takes to leave. */
static bool measure_one_fork(unsigned char *buffer, size_t bytes, struct condition_result *result,
                             int index)
{
    int report[2], go[2];
    if (pipe(report) != 0 || pipe(go) != 0)
        return false;
    fflush(NULL);
    double began = bench_now_seconds();
    pid_t pid = fork();
    double forked = bench_now_seconds();
    if (pid < 0) {
        close(report[0]);
        close(report[1]);
        close(go[0]);
        close(go[1]);
        return false;
    }
    if (pid == 0) {
        close(report[0]);
        close(go[1]); /* else the child never sees the parent's EOF */
        struct range_smaps view = read_range_smaps((uintptr_t)buffer, (uintptr_t)buffer + bytes);
        char byte;
        if (write(report[1], &view, sizeof(view)) != (ssize_t)sizeof(view))
            _exit(1);
        if (read(go[0], &byte, 1) < 0)
            _exit(1);
        _exit(0);
    }
    close(report[1]);
    close(go[0]);
    struct range_smaps view;
    memset(&view, 0, sizeof(view));
    bool ok = read(report[0], &view, sizeof(view)) == (ssize_t)sizeof(view);
    struct range_smaps parent = read_range_smaps((uintptr_t)buffer, (uintptr_t)buffer + bytes);
    double leave = bench_now_seconds();
    close(go[1]); /* EOF: the child leaves */
    int status = 0;
    waitpid(pid, &status, 0);
    double reaped = bench_now_seconds();
    close(report[0]);
    result->fork_s[index] = forked - began;
    result->exit_s[index] = reaped - leave;
    result->child_smaps[index] = view;
    result->parent_smaps[index] = parent;
    return ok && status_code(status) == 0;
}

/* A child that writes to the buffer and checks it saw the parent's data. */
static int touching_child(unsigned char *buffer, size_t bytes)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        volatile unsigned char *memory = buffer;
        unsigned char seen = memory[bytes / 2];
        memory[bytes / 2] = (unsigned char)(seen + 1);
        _exit(seen == FILL_BYTE ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status_code(status);
}

static void run_condition(unsigned char *buffer, size_t bytes, struct condition_result *result)
{
    fprintf(stderr, "fork_copy: %s\n", result->title);
    result->ran = true;
    result->forks = 0;
    for (int i = 0; i < options.forks; i++) {
        if (!measure_one_fork(buffer, bytes, result, i)) {
            snprintf(result->skipped, sizeof(result->skipped), "fork %d failed: %s", i,
                     strerror(errno));
            break;
        }
        result->forks = i + 1;
    }
    result->touch_status = touching_child(buffer, bytes);
}

/* ---- io_uring, by raw system calls ---- */

static int io_uring_setup_raw(unsigned entries, struct io_uring_params *params)
{
    return (int)syscall(__NR_io_uring_setup, entries, params);
}

static int io_uring_register_raw(int fd, unsigned opcode, const void *arg, unsigned count)
{
    return (int)syscall(__NR_io_uring_register, fd, opcode, arg, count);
}

/* Registers [buffer, buffer + bytes) as fixed buffers (at most 1 GiB each,
 * the kernel's limit per buffer): the kernel pins every page. Returns the
 * ring's descriptor, or -1 with why filled in. */
static int pin_with_io_uring(unsigned char *buffer, size_t bytes, double *seconds, char *why,
                             size_t why_size)
{
    struct io_uring_params params;
    memset(&params, 0, sizeof(params));
    int ring = io_uring_setup_raw(1, &params);
    if (ring < 0) {
        snprintf(why, why_size, "io_uring_setup: %s", strerror(errno));
        return -1;
    }
    size_t count = (bytes + GIB - 1) / GIB;
    struct iovec *vectors = calloc(count, sizeof(*vectors));
    if (vectors == NULL) {
        close(ring);
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        vectors[i].iov_base = buffer + i * GIB;
        vectors[i].iov_len = bytes - i * GIB < GIB ? bytes - i * GIB : GIB;
    }
    double began = bench_now_seconds();
    int registered = io_uring_register_raw(ring, IORING_REGISTER_BUFFERS, vectors, (unsigned)count);
    *seconds = bench_now_seconds() - began;
    free(vectors);
    if (registered < 0) {
        snprintf(why, why_size, "io_uring_register(IORING_REGISTER_BUFFERS): %s%s", strerror(errno),
                 errno == ENOMEM ? " (RLIMIT_MEMLOCK? the ring accounts pinned pages to it "
                                   "without CAP_IPC_LOCK)"
                                 : "");
        close(ring);
        return -1;
    }
    return ring;
}

/* ---- (d): the shim's PINSHIM_FORK, in a child process under LD_PRELOAD ---- */

static int shim_demo_child(size_t bytes, const char *runtime_path)
{
    dup2(STDOUT_FILENO, STDERR_FILENO); /* the shim's fork warning into our report */
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);
    void *runtime = dlopen(runtime_path, RTLD_NOW | RTLD_LOCAL);
    int (*cuda_free)(void *) = NULL;
    if (runtime != NULL)
        *(void **)&cuda_free = dlsym(runtime, "cudaFree");
    if (cuda_free == NULL || cuda_free(NULL) != 0) {
        printf("ERROR cannot load or initialise %s\n", runtime_path);
        return 1;
    }
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (drain == NULL || is_registered == NULL) {
        printf("ERROR not under the shim\n");
        return 1;
    }
    unsigned char *buffer =
        mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED) {
        printf("ERROR mmap: %s\n", strerror(errno));
        return 1;
    }
    memset(buffer, FILL_BYTE, bytes);
    if (mlock(buffer, bytes) != 0) {
        printf("ERROR mlock: %s\n", strerror(errno));
        return 1;
    }
    drain();
    struct condition_result result;
    memset(&result, 0, sizeof(result));
    bool ok = measure_one_fork(buffer, bytes, &result, 0);
    int touch = touching_child(buffer, bytes);
    printf("SHIM registered=%d fork_ok=%d fork_s=%.6f vmas_in_child=%d child_private_dirty_kb=%ld "
           "child_shared_dirty_kb=%ld touch=%d\n",
           is_registered(buffer), ok, result.fork_s[0], result.child_smaps[0].vmas,
           result.child_smaps[0].private_dirty_kb, result.child_smaps[0].shared_dirty_kb, touch);
    munlock(buffer, bytes);
    munmap(buffer, bytes);
    return 0;
}

struct shim_demo_result {
    const char *mode;
    bool ran;
    int exit_code;
    int registered, vmas_in_child, touch;
    double fork_s;
    long private_dirty_kb, shared_dirty_kb;
    char warning[400]; /* the shim's own lines (its fork warning) */
    char error[200];
};

static void run_shim_demo(const char *shim, const char *runtime, struct shim_demo_result *result)
{
    struct bench_env env;
    bench_env_from_current(&env);
    bench_env_set(&env, "LD_PRELOAD", shim);
    bench_env_set(&env, "PINSHIM_CUDART", runtime);
    bench_env_set(&env, "PINSHIM_FORK", result->mode);
    bench_env_set(&env, "FAKE_CUDART_CHECK", "0");
    char size[32];
    snprintf(size, sizeof(size), "%zu", options.bytes);
    char *argv[] = {(char *)bench_self_path(), "--child-shim", size, (char *)runtime, NULL};
    fprintf(stderr, "fork_copy: (d) under the shim, PINSHIM_FORK=%s\n", result->mode);
    struct bench_run run;
    result->ran = bench_run_process(argv, &env, true, false, &run);
    result->exit_code = run.exit_code;
    for (const char *line = run.output; line != NULL && *line != '\0';) {
        const char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        if (sscanf(line,
                   "SHIM registered=%d fork_ok=%*d fork_s=%lf vmas_in_child=%d "
                   "child_private_dirty_kb=%ld child_shared_dirty_kb=%ld touch=%d",
                   &result->registered, &result->fork_s, &result->vmas_in_child,
                   &result->private_dirty_kb, &result->shared_dirty_kb, &result->touch) == 6) {
        } else if (strncmp(line, "pinshim:", 8) == 0) {
            size_t used = strlen(result->warning);
            snprintf(result->warning + used, sizeof(result->warning) - used, "%s%.*s",
                     used ? " / " : "", (int)length, line);
        } else if (strncmp(line, "ERROR", 5) == 0) {
            snprintf(result->error, sizeof(result->error), "%.*s", (int)length, line);
        }
        line = end ? end + 1 : NULL;
    }
    bench_run_free(&run);
    bench_env_free(&env);
}

/* ---- output ---- */

static double median_of(const double *values, int count)
{
    return bench_median(values, (size_t)count);
}

/* The median over the forks of one smaps field, in MiB. */
static double median_mib(const struct range_smaps *views, int count,
                         long (*field)(const struct range_smaps *))
{
    double values[MAX_FORKS];
    for (int i = 0; i < count; i++)
        values[i] = (double)field(&views[i]) / 1024;
    return median_of(values, count);
}

static long private_dirty(const struct range_smaps *view)
{
    return view->private_dirty_kb;
}

static long shared_dirty(const struct range_smaps *view)
{
    return view->shared_dirty_kb;
}

static void print_condition_row(const struct condition_result *r)
{
    char touch[64];
    describe_status(r->touch_status, touch, sizeof(touch));
    if (!r->ran || r->forks == 0) {
        printf("| %s | not run: %s | | | | | | |\n", r->title, r->skipped);
        return;
    }
    int vmas = r->child_smaps[0].vmas;
    printf("| %s | %.2f ms (%.2f ms) | %.0f MiB | %.0f MiB | %s | %.0f MiB | %.2f ms | %s |\n",
           r->title, median_of(r->fork_s, r->forks) * 1e3,
           bench_minimum(r->fork_s, (size_t)r->forks) * 1e3,
           median_mib(r->child_smaps, r->forks, private_dirty),
           median_mib(r->child_smaps, r->forks, shared_dirty), vmas ? "yes" : "no (absent)",
           median_mib(r->parent_smaps, r->forks, shared_dirty),
           median_of(r->exit_s, r->forks) * 1e3, touch);
}

static void json_views(FILE *out, const char *name, const struct range_smaps *views, int count)
{
    fprintf(out, ", \"%s\": [", name);
    for (int i = 0; i < count; i++)
        fprintf(out,
                "%s{\"vmas\": %d, \"rss_kb\": %ld, \"anonymous_kb\": %ld, "
                "\"private_dirty_kb\": %ld, \"shared_dirty_kb\": %ld}",
                i ? ", " : "", views[i].vmas, views[i].rss_kb, views[i].anonymous_kb,
                views[i].private_dirty_kb, views[i].shared_dirty_kb);
    fprintf(out, "]");
}

static void json_condition(FILE *out, const struct condition_result *r)
{
    fprintf(out, "{\"name\": \"%s\", \"title\": ", r->name);
    bench_json_string(out, r->title);
    fprintf(out, ", \"ran\": %s, \"skipped\": ", r->ran ? "true" : "false");
    bench_json_string(out, r->skipped[0] ? r->skipped : NULL);
    fprintf(out, ", \"forks\": %d, \"touch_status\": %d", r->forks, r->touch_status);
    const double *series[] = {r->fork_s, r->exit_s};
    static const char *const names[] = {"fork_s", "child_exit_s"};
    for (size_t k = 0; k < 2; k++) {
        fprintf(out, ", \"%s\": [", names[k]);
        for (int i = 0; i < r->forks; i++)
            fprintf(out, "%s%.9g", i ? ", " : "", series[k][i]);
        fprintf(out, "], \"%s_median\": %.9g", names[k],
                r->forks ? median_of(series[k], r->forks) : 0.0);
    }
    json_views(out, "child_smaps", r->child_smaps, r->forks);
    json_views(out, "parent_smaps", r->parent_smaps, r->forks);
    fprintf(out, "}");
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: fork_copy [--size-mib N] [--forks N] [--no-shim-demo] [--shim LIB]\n"
            "                 [--cudart LIB] [--json FILE]\n"
            "fork() of a parent holding an mlocked buffer: (a) locked only, (b) also pinned\n"
            "by io_uring fixed buffers (the kernel copies pinned pages into the child since\n"
            "Linux 5.9), (c) pinned + MADV_DONTFORK; (d) PINSHIM_FORK=copy|dontfork under the\n"
            "shim with the fake runtime (a child touching the buffer).\n"
            "  --size-mib  buffer size (default 1024)\n"
            "  --forks     forks per condition (default 5, at most 32; medians reported)\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && strcmp(argv[1], "--child-shim") == 0)
        return shim_demo_child((size_t)strtoull(argv[2], NULL, 10), argv[3]);

    const char *shim_option = NULL, *cudart_option = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--no-shim-demo") == 0) {
            options.shim_demo = false;
        } else if (value == NULL) {
            fprintf(stderr, "fork_copy: unknown option or missing value: %s\n", arg);
            usage(stderr);
            return 64;
        } else if (strcmp(arg, "--size-mib") == 0 && strtoull(value, NULL, 10) > 0) {
            options.bytes = (size_t)strtoull(value, NULL, 10) * MIB, i++;
        } else if (strcmp(arg, "--forks") == 0 && atoi(value) >= 1 && atoi(value) <= MAX_FORKS) {
            options.forks = atoi(value), i++;
        } else if (strcmp(arg, "--shim") == 0) {
            shim_option = value, i++;
        } else if (strcmp(arg, "--cudart") == 0) {
            cudart_option = value, i++;
        } else if (strcmp(arg, "--json") == 0) {
            options.json_path = value, i++;
        } else {
            fprintf(stderr, "fork_copy: bad option or value: %s %s\n", arg, value);
            usage(stderr);
            return 64;
        }
    }

    /* ---- the machine ---- */
    struct utsname system;
    uname(&system);
    char io_uring_disabled[32], thp[128];
    read_text_file("/proc/sys/kernel/io_uring_disabled", io_uring_disabled,
                   sizeof(io_uring_disabled));
    read_text_file("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof(thp));
    struct rlimit memlock_before, memlock_after;
    getrlimit(RLIMIT_MEMLOCK, &memlock_before);
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    bool raised = setrlimit(RLIMIT_MEMLOCK, &unlimited) == 0;
    getrlimit(RLIMIT_MEMLOCK, &memlock_after);
    char before_text[32], after_text[32];
    if (memlock_before.rlim_cur == RLIM_INFINITY)
        snprintf(before_text, sizeof(before_text), "unlimited");
    else
        snprintf(before_text, sizeof(before_text), "%llu KiB",
                 (unsigned long long)memlock_before.rlim_cur / 1024);
    if (memlock_after.rlim_cur == RLIM_INFINITY)
        snprintf(after_text, sizeof(after_text), "unlimited");
    else
        snprintf(after_text, sizeof(after_text), "%llu KiB",
                 (unsigned long long)memlock_after.rlim_cur / 1024);
    printf("fork_copy: Linux %s, kernel.io_uring_disabled=%s, transparent_hugepage %s\n",
           system.release, io_uring_disabled, thp);
    int raise_error = raised ? 0 : errno;
    /* CAP_IPC_LOCK (14) lifts RLIMIT_MEMLOCK for mlock and for io_uring's
     * accounting of pinned pages; raising the limit needs CAP_SYS_RESOURCE (24). */
    bool ipc_lock = has_capability(14);
    printf("RLIMIT_MEMLOCK %s -> %s (%s%s); CAP_IPC_LOCK %s\n", before_text, after_text,
           raised ? "raised" : "could not raise it: ", raised ? "" : strerror(raise_error),
           ipc_lock ? "held: mlock and io_uring ignore the limit"
                    : "not held: mlock and io_uring are bound by the limit");
    printf("buffer: %zu MiB, private anonymous, every page written (0x%02x), mlocked; %d forks "
           "per condition\n",
           options.bytes / MIB, FILL_BYTE, options.forks);

    unsigned char *buffer =
        mmap(NULL, options.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buffer == MAP_FAILED) {
        fprintf(stderr, "fork_copy: mmap of %zu MiB: %s\n", options.bytes / MIB, strerror(errno));
        return 1;
    }
    memset(buffer, FILL_BYTE, options.bytes);
    if (mlock(buffer, options.bytes) != 0) {
        fprintf(stderr, "fork_copy: mlock of %zu MiB: %s\n", options.bytes / MIB, strerror(errno));
        return 1;
    }

    static struct condition_result conditions[3] = {
        {.name = "locked", .title = "(a) mlocked only"},
        {.name = "pinned", .title = "(b) mlocked + io_uring fixed buffer (pinned)"},
        {.name = "pinned_dontfork", .title = "(c) pinned + MADV_DONTFORK"},
    };
    run_condition(buffer, options.bytes, &conditions[0]);

    long vmpin_before = status_kb("VmPin");
    double pin_seconds = 0;
    char why[200] = "";
    int ring = pin_with_io_uring(buffer, options.bytes, &pin_seconds, why, sizeof(why));
    long vmpin_after = status_kb("VmPin");
    if (ring >= 0) {
        printf("io_uring: %zu MiB registered as fixed buffers in %.1f ms; VmPin %ld -> %ld kB\n",
               options.bytes / MIB, pin_seconds * 1e3, vmpin_before, vmpin_after);
        run_condition(buffer, options.bytes, &conditions[1]);
        if (madvise(buffer, options.bytes, MADV_DONTFORK) == 0) {
            run_condition(buffer, options.bytes, &conditions[2]);
        } else {
            snprintf(conditions[2].skipped, sizeof(conditions[2].skipped),
                     "madvise(MADV_DONTFORK): %s", strerror(errno));
        }
        close(ring); /* unpins */
    } else {
        printf("io_uring: not available: %s (kernel.io_uring_disabled=%s)\n", why,
               io_uring_disabled);
        snprintf(conditions[1].skipped, sizeof(conditions[1].skipped), "%s", why);
        snprintf(conditions[2].skipped, sizeof(conditions[2].skipped), "%s", why);
    }
    munlock(buffer, options.bytes);
    munmap(buffer, options.bytes);

    printf("\nMedians of %d forks (min in brackets). Child's copy: Private_Dirty in the child's "
           "/proc/self/smaps over the buffer (pages that are the child's alone); shared: "
           "Shared_Dirty there (still copy-on-write with the parent).\n\n",
           options.forks);
    printf("| condition | fork() in the parent | child's copy (Private_Dirty) | shared with the "
           "parent (Shared_Dirty) | buffer mapped in the child | the parent's view: Shared_Dirty "
           "in its smaps while the child exists | child exit until reaped | a child writing to the "
           "buffer |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < 3; i++)
        print_condition_row(&conditions[i]);

    struct shim_demo_result demos[2] = {{.mode = "copy"}, {.mode = "dontfork"}};
    static char shim[PATH_MAX], runtime[PATH_MAX];
    if (options.shim_demo) {
        const char *found =
            bench_find_library(shim_option, BENCH_SHIM_PATH, "../src/libpinshim.so");
        if (found != NULL)
            snprintf(shim, sizeof(shim), "%s", found);
        if (cudart_option == NULL)
            cudart_option = getenv("PINSHIM_CUDART");
        found = bench_find_library(cudart_option, BENCH_FAKE_CUDART_PATH,
                                   "../tests/fake_cudart/libfake_cudart.so");
        if (found != NULL)
            snprintf(runtime, sizeof(runtime), "%s", found);
        if (shim[0] == '\0' || runtime[0] == '\0') {
            printf("\n(d) not run: %s not found\n",
                   shim[0] == '\0' ? "libpinshim.so" : "the fake runtime");
            options.shim_demo = false;
        }
    }
    if (options.shim_demo) {
        for (int i = 0; i < 2; i++)
            run_shim_demo(shim, runtime, &demos[i]);
        printf("\n(d) under the shim (LD_PRELOAD=%s, fake runtime, PINSHIM_FORK=copy|dontfork):"
               " %zu MiB written, mlock, pinshim_drain, fork. The fake driver pins nothing, so "
               "this shows what children see, not what the copy costs.\n\n",
               shim, options.bytes / MIB);
        printf("| PINSHIM_FORK | registered by the shim | fork() in the parent | buffer mapped "
               "in the child | a child writing to the buffer | the shim said |\n");
        printf("|---|---|---|---|---|---|\n");
        for (int i = 0; i < 2; i++) {
            const struct shim_demo_result *d = &demos[i];
            if (!d->ran || d->exit_code != 0) {
                printf("| %s | failed (exit %d) %s | | | | |\n", d->mode, d->exit_code, d->error);
                continue;
            }
            char touch[64];
            describe_status(d->touch, touch, sizeof(touch));
            printf("| %s | %s | %.2f ms | %s | %s | %s |\n", d->mode,
                   d->registered == 1 ? "yes" : "no", d->fork_s * 1e3,
                   d->vmas_in_child ? "yes" : "no (absent)", touch,
                   d->warning[0] ? d->warning : "nothing");
        }
    }

    if (options.json_path != NULL) {
        FILE *out = bench_json_open(options.json_path, "fork_copy");
        if (out == NULL) {
            fprintf(stderr, "fork_copy: cannot write %s: %s\n", options.json_path, strerror(errno));
            return 1;
        }
        char command[2048] = "";
        for (int i = 0; i < argc; i++)
            snprintf(command + strlen(command), sizeof(command) - strlen(command), "%s%s",
                     i ? " " : "", argv[i]);
        fprintf(out, ", \"command\": ");
        bench_json_string(out, command);
        fprintf(out, ", \"kernel\": ");
        bench_json_string(out, system.release);
        fprintf(out, ", \"io_uring_disabled\": ");
        bench_json_string(out, io_uring_disabled);
        fprintf(out, ", \"transparent_hugepage\": ");
        bench_json_string(out, thp);
        fprintf(out,
                ", \"memlock_before\": \"%s\", \"memlock_after\": \"%s\", "
                "\"cap_ipc_lock\": %s, \"bytes\": %zu, "
                "\"io_uring_register_s\": %.6f, \"vmpin_kb_before\": %ld, \"vmpin_kb_after\": "
                "%ld,\n \"conditions\": [",
                before_text, after_text, ipc_lock ? "true" : "false", options.bytes, pin_seconds,
                vmpin_before, vmpin_after);
        for (int i = 0; i < 3; i++) {
            fprintf(out, "%s\n  ", i ? "," : "");
            json_condition(out, &conditions[i]);
        }
        fprintf(out, "],\n \"shim_demo\": [");
        for (int i = 0; i < 2 && options.shim_demo; i++) {
            const struct shim_demo_result *d = &demos[i];
            fprintf(out,
                    "%s\n  {\"fork_mode\": \"%s\", \"exit_code\": %d, \"registered\": %d, "
                    "\"fork_s\": %.9f, \"vmas_in_child\": %d, \"child_private_dirty_kb\": %ld, "
                    "\"child_shared_dirty_kb\": %ld, \"touch_status\": %d, \"shim_said\": ",
                    i ? "," : "", d->mode, d->exit_code, d->registered, d->fork_s, d->vmas_in_child,
                    d->private_dirty_kb, d->shared_dirty_kb, d->touch);
            bench_json_string(out, d->warning[0] ? d->warning : NULL);
            fprintf(out, "}");
        }
        fprintf(out, "]}\n");
        if (fclose(out) != 0)
            return 1;
    }
    for (int i = 0; i < 3; i++)
        if (!conditions[i].ran || conditions[i].forks != options.forks)
            return 1;
    return 0;
}
