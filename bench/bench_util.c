#include "bench_util.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

double bench_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double bench_thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(const double *values, size_t count)
{
    if (count == 0)
        return 0.0;
    double *sorted = malloc(count * sizeof(*sorted));
    if (sorted == NULL)
        return values[0];
    memcpy(sorted, values, count * sizeof(*sorted));
    qsort(sorted, count, sizeof(*sorted), compare_doubles);
    double result =
        count % 2 ? sorted[count / 2] : (sorted[count / 2 - 1] + sorted[count / 2]) / 2.0;
    free(sorted);
    return result;
}

double bench_minimum(const double *values, size_t count)
{
    double result = count ? values[0] : 0.0;
    for (size_t i = 1; i < count; i++)
        if (values[i] < result)
            result = values[i];
    return result;
}

/* ---- environment ---- */

static bool dropped_variable(const char *entry)
{
    return strncmp(entry, "LD_PRELOAD=", 11) == 0 || strncmp(entry, "PINSHIM_", 8) == 0 ||
           strncmp(entry, "FAKE_CUDART_", 12) == 0;
}

static void env_push(struct bench_env *env, char *entry)
{
    if (env->count + 2 > env->capacity) {
        size_t capacity = env->capacity ? env->capacity * 2 : 64;
        char **vars = realloc(env->vars, capacity * sizeof(*vars));
        if (vars == NULL) {
            perror("bench: out of memory");
            exit(1);
        }
        env->vars = vars;
        env->capacity = capacity;
    }
    env->vars[env->count++] = entry;
    env->vars[env->count] = NULL;
}

void bench_env_from_current(struct bench_env *env)
{
    memset(env, 0, sizeof(*env));
    for (char **entry = environ; *entry != NULL; entry++)
        if (!dropped_variable(*entry))
            env_push(env, strdup(*entry));
    if (env->vars == NULL)
        env_push(env, strdup("BENCH_EMPTY_ENV=1"));
}

void bench_env_set(struct bench_env *env, const char *name, const char *value)
{
    size_t name_length = strlen(name);
    char *entry = malloc(name_length + strlen(value) + 2);
    if (entry == NULL) {
        perror("bench: out of memory");
        exit(1);
    }
    sprintf(entry, "%s=%s", name, value);
    for (size_t i = 0; i < env->count; i++) {
        if (strncmp(env->vars[i], name, name_length) == 0 && env->vars[i][name_length] == '=') {
            free(env->vars[i]);
            env->vars[i] = entry;
            return;
        }
    }
    env_push(env, entry);
}

void bench_env_free(struct bench_env *env)
{
    for (size_t i = 0; i < env->count; i++)
        free(env->vars[i]);
    free(env->vars);
    memset(env, 0, sizeof(*env));
}

/* ---- child processes ---- */

bool bench_run_process(char *const argv[], const struct bench_env *env, bool capture, bool quiet,
                       struct bench_run *run)
{
    memset(run, 0, sizeof(*run));
    run->exit_code = -1;
    int pipe_fds[2] = {-1, -1};
    if (capture && pipe(pipe_fds) != 0)
        return false;
    fflush(NULL);
    double began = bench_now_seconds();
    pid_t pid = fork();
    if (pid < 0) {
        if (capture) {
            close(pipe_fds[0]);
            close(pipe_fds[1]);
        }
        return false;
    }
    if (pid == 0) {
        if (capture) {
            dup2(pipe_fds[1], STDOUT_FILENO);
            close(pipe_fds[0]);
            close(pipe_fds[1]);
        } else if (quiet) {
            int null_fd = open("/dev/null", O_WRONLY);
            if (null_fd >= 0)
                dup2(null_fd, STDOUT_FILENO);
        }
        execvpe(argv[0], argv, env->vars);
        fprintf(stderr, "bench: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    size_t used = 0, capacity = 0;
    if (capture) {
        close(pipe_fds[1]);
        capacity = 4096;
        run->output = malloc(capacity);
        for (;;) {
            if (run->output == NULL)
                break;
            if (capacity - used < 2048) {
                char *grown = realloc(run->output, capacity * 2);
                if (grown == NULL)
                    break;
                run->output = grown;
                capacity *= 2;
            }
            ssize_t n = read(pipe_fds[0], run->output + used, capacity - used - 1);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            used += (size_t)n;
        }
        if (run->output != NULL)
            run->output[used] = '\0';
        close(pipe_fds[0]);
    }
    int status = 0;
    struct rusage usage;
    while (wait4(pid, &status, 0, &usage) < 0) {
        if (errno != EINTR)
            return false;
    }
    run->wall = bench_now_seconds() - began;
    run->cpu = (double)usage.ru_utime.tv_sec + (double)usage.ru_utime.tv_usec / 1e6 +
               (double)usage.ru_stime.tv_sec + (double)usage.ru_stime.tv_usec / 1e6;
    if (WIFEXITED(status))
        run->exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        run->exit_code = 128 + WTERMSIG(status);
    return true;
}

void bench_run_free(struct bench_run *run)
{
    free(run->output);
    run->output = NULL;
}

/* ---- paths ---- */

const char *bench_self_path(void)
{
    static char path[PATH_MAX];
    if (path[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
        path[n > 0 ? n : 0] = '\0';
    }
    return path;
}

const char *bench_find_library(const char *explicit_path, const char *compiled_default,
                               const char *relative_to_self)
{
    static char found[PATH_MAX];
    if (explicit_path != NULL && explicit_path[0] != '\0') {
        if (realpath(explicit_path, found) == NULL)
            return NULL;
        return found;
    }
    if (compiled_default != NULL && compiled_default[0] != '\0' &&
        realpath(compiled_default, found) != NULL)
        return found;
    char candidate[PATH_MAX];
    snprintf(candidate, sizeof(candidate), "%s", bench_self_path());
    char *slash = strrchr(candidate, '/');
    if (slash == NULL)
        return NULL;
    snprintf(slash + 1, sizeof(candidate) - (size_t)(slash + 1 - candidate), "%s",
             relative_to_self);
    if (realpath(candidate, found) == NULL)
        return NULL;
    return found;
}

/* ---- the shim's JSON statistics ---- */

bool bench_json_number(const char *text, const char *section, const char *key, double *out)
{
    if (text == NULL)
        return false;
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "\"%s\":", section);
    const char *object = strstr(text, pattern);
    if (object == NULL)
        return false;
    const char *close = strchr(object, '}');
    snprintf(pattern, sizeof(pattern), "\"%s\":", key);
    const char *field = strstr(object, pattern);
    if (field == NULL || (close != NULL && field > close))
        return false;
    char *end;
    double value = strtod(field + strlen(pattern), &end);
    if (end == field + strlen(pattern))
        return false;
    *out = value;
    return true;
}

char *bench_read_file(const char *path)
{
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return NULL;
    size_t used = 0, capacity = 4096;
    char *text = malloc(capacity);
    while (text != NULL) {
        if (capacity - used < 1024) {
            char *grown = realloc(text, capacity * 2);
            if (grown == NULL) {
                free(text);
                text = NULL;
                break;
            }
            text = grown;
            capacity *= 2;
        }
        size_t n = fread(text + used, 1, capacity - used - 1, file);
        if (n == 0)
            break;
        used += n;
    }
    if (text != NULL)
        text[used] = '\0';
    fclose(file);
    return text;
}

void bench_json_string(FILE *out, const char *s)
{
    if (s == NULL) {
        fputs("null", out);
        return;
    }
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

void bench_today(char *buffer, size_t size)
{
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(buffer, size, "%Y-%m-%d", &local);
}

void bench_host(char *buffer, size_t size)
{
    if (gethostname(buffer, size) != 0 || buffer[0] == '\0')
        snprintf(buffer, size, "unknown");
    buffer[size - 1] = '\0';
}

FILE *bench_json_open(const char *path, const char *name)
{
    FILE *out = fopen(path, "w");
    if (out == NULL)
        return NULL;
    char date[32], host[256];
    bench_today(date, sizeof(date));
    bench_host(host, sizeof(host));
    fprintf(out, "{\"benchmark\": ");
    bench_json_string(out, name);
    fprintf(out, ", \"date\": ");
    bench_json_string(out, date);
    fprintf(out, ", \"host\": ");
    bench_json_string(out, host);
    return out;
}

void *bench_open_cudart(const char *explicit_path)
{
    if (explicit_path != NULL)
        return dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (handle != NULL)
            return handle;
    }
    return NULL;
}

double bench_proc_kib(const char *path, const char *key)
{
    FILE *file = fopen(path, "r");
    double kib = 0;
    char line[256];
    size_t length = strlen(key);
    while (file != NULL && fgets(line, sizeof(line), file) != NULL)
        if (strncmp(line, key, length) == 0 && line[length] == ':') {
            kib = strtod(line + length + 1, NULL);
            break;
        }
    if (file != NULL)
        fclose(file);
    return kib;
}
