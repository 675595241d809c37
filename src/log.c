#include "log.h"

#include "io.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int log_level_current = LOG_WARN;
static int log_fd = STDERR_FILENO;
/* The count belongs to the process that raised the warnings: a fork child
 * sees another pid and starts again from zero. */
static uint64_t warning_count;
static int warning_pid;

void log_set_level(enum log_level level)
{
    __atomic_store_n(&log_level_current, (int)level, __ATOMIC_RELAXED);
}

enum log_level log_get_level(void)
{
    return (enum log_level)__atomic_load_n(&log_level_current, __ATOMIC_RELAXED);
}

void log_set_fd(int fd)
{
    __atomic_store_n(&log_fd, fd < 0 ? STDERR_FILENO : fd, __ATOMIC_RELAXED);
}

bool log_enabled(enum log_level level)
{
    return level != LOG_QUIET &&
           (int)level <= __atomic_load_n(&log_level_current, __ATOMIC_RELAXED);
}

static void count_warning(void)
{
    int pid = (int)getpid();
    if (__atomic_load_n(&warning_pid, __ATOMIC_RELAXED) != pid) {
        __atomic_store_n(&warning_count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&warning_pid, pid, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&warning_count, 1, __ATOMIC_RELAXED);
}

uint64_t log_warning_count(void)
{
    if (__atomic_load_n(&warning_pid, __ATOMIC_RELAXED) != (int)getpid())
        return 0;
    return __atomic_load_n(&warning_count, __ATOMIC_RELAXED);
}

void log_message(enum log_level level, const char *format, ...)
{
    if (level == LOG_WARN)
        count_warning(); /* getpid cannot fail: errno is untouched */
    if (!log_enabled(level))
        return;
    int saved_errno = errno;
    /* One write(2) per line keeps lines from different threads and processes whole. */
    char line[1024];
    static const char prefix[] = "pinshim: ";
    size_t used = sizeof(prefix) - 1;
    memcpy(line, prefix, used);
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line + used, sizeof(line) - used - 1, format, args);
    va_end(args);
    if (n < 0)
        n = 0;
    used += (size_t)n < sizeof(line) - used - 1 ? (size_t)n : sizeof(line) - used - 2;
    line[used++] = '\n';
    write_fully(__atomic_load_n(&log_fd, __ATOMIC_RELAXED), line, used);
    errno = saved_errno;
}

void log_format_bytes(uint64_t bytes, char *out, size_t out_size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024 && unit < 4) {
        value /= 1024;
        unit++;
    }
    if (unit == 0)
        snprintf(out, out_size, "%llu B", (unsigned long long)bytes);
    else
        snprintf(out, out_size, "%.1f %s", value, units[unit]);
}
