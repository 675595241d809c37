/* Logging: one line per message on stderr, each starting "pinshim: ".
 * Formats into a stack buffer and writes with write(2), so it never allocates
 * through the interposed functions and is safe inside the shim's own paths. */
#ifndef PINSHIM_LOG_H
#define PINSHIM_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_QUIET = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* Redirects output to another descriptor (tests); -1 restores stderr. */
void log_set_fd(int fd);
bool log_enabled(enum log_level level);

void log_message(enum log_level level, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* Warnings this process raised (log_message at LOG_WARN), printed or not:
 * PINSHIM_LOG=quiet hides them from stderr, not from the count. A fork child
 * starts from zero, as its other counters do. */
uint64_t log_warning_count(void);

/* A byte count as people read it: "512 B", "8.0 MiB" (powers of 1024), for
 * messages, the stats summary and NVTX ranges. */
void log_format_bytes(uint64_t bytes, char *out, size_t out_size);

#define log_warn(...) log_message(LOG_WARN, __VA_ARGS__)
#define log_info(...)                                                                              \
    do {                                                                                           \
        if (log_enabled(LOG_INFO))                                                                 \
            log_message(LOG_INFO, __VA_ARGS__);                                                    \
    } while (0)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG))                                                                \
            log_message(LOG_DEBUG, __VA_ARGS__);                                                   \
    } while (0)

#endif
