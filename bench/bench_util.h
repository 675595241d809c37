/* Helpers shared by the benchmark programs: clocks, order statistics, child
 * processes with a chosen environment (the "with the shim" arms re-execute the
 * benchmark under LD_PRELOAD), finding the shim next to the build, and reading
 * numbers out of the shim's JSON statistics. Benchmarks only: no error here is
 * fatal to anything but the benchmark. */
#ifndef PINSHIM_BENCH_UTIL_H
#define PINSHIM_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

double bench_now_seconds(void);
double bench_thread_cpu_seconds(void);

/* Order statistics of values[0..count); the array is left unchanged. 0 for count 0. */
double bench_median(const double *values, size_t count);
double bench_minimum(const double *values, size_t count);

/* A growable environment for a child process. */
struct bench_env {
    char **vars; /* NULL-terminated */
    size_t count;
    size_t capacity;
};

/* The current environment less LD_PRELOAD and the PINSHIM_* / FAKE_CUDART_*
 * variables, so each arm states exactly what it runs with. */
void bench_env_from_current(struct bench_env *env);
void bench_env_set(struct bench_env *env, const char *name, const char *value);
void bench_env_free(struct bench_env *env);

struct bench_run {
    int exit_code; /* exit status, 128+signal when killed, -1 when it did not start */
    double wall;   /* seconds from fork to reaping */
    double cpu;    /* user + system seconds of the child */
    char *output;  /* captured stdout (NUL-terminated), or NULL when not captured */
};

/* Runs argv[0] (a path, or a name searched in PATH) with env. With capture,
 * stdout is collected into run->output; otherwise it goes to /dev/null when
 * quiet, else to ours. stderr is always ours. Returns false if it could not start. */
bool bench_run_process(char *const argv[], const struct bench_env *env, bool capture, bool quiet,
                       struct bench_run *run);
void bench_run_free(struct bench_run *run);

/* The path of this program (for re-executing itself). */
const char *bench_self_path(void);

/* A library to preload: explicit if given, else the compiled-in default when
 * it exists, else relative_to_self resolved against this program's directory.
 * Returns a static buffer or NULL when none exists. */
const char *bench_find_library(const char *explicit_path, const char *compiled_default,
                               const char *relative_to_self);

/* The CUDA runtime, opened RTLD_LOCAL for dlsym: explicit_path when given,
 * else the first of libcudart.so.13, .12 and libcudart.so the loader finds;
 * NULL when none loads (dlerror says why). */
void *bench_open_cudart(const char *explicit_path);

/* The number after "key": inside the JSON object that follows "section":
 * in text (the shim's stats layout: one level of nesting). */
bool bench_json_number(const char *text, const char *section, const char *key, double *out);
/* Reads a whole file into a malloc'ed NUL-terminated string, or NULL. */
char *bench_read_file(const char *path);
/* The number after "key:" in a /proc file of "Key:  N kB" lines
 * (/proc/meminfo, /proc/self/status), in KiB; 0 when it is not there. */
double bench_proc_kib(const char *path, const char *key);

/* Writes s as a JSON string literal (quotes included). */
void bench_json_string(FILE *out, const char *s);

/* "YYYY-MM-DD" and the host name, for reports. */
void bench_today(char *buffer, size_t size);
void bench_host(char *buffer, size_t size);

/* Opens path and writes the head every result file shares,
 * {"benchmark": name, "date": ..., "host": ...  (the object left open);
 * NULL when the file cannot be opened. */
FILE *bench_json_open(const char *path, const char *name);

#endif
