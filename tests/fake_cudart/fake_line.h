/* fake_line: log lines of the fake CUDA driver and runtime, formatted without
 * stdio (which may allocate) and written with one write(2) each, so that
 * processes and threads appending to one O_APPEND file never interleave.
 * Shared by fake_cuda.c and fake_cudart.c; every function is static inline. */
#ifndef FAKE_LINE_H
#define FAKE_LINE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

struct fake_line {
    char text[512];
    size_t length;
};

static inline void fake_line_string(struct fake_line *line, const char *text)
{
    while (*text && line->length < sizeof line->text - 1)
        line->text[line->length++] = *text++;
}

static inline void fake_line_number(struct fake_line *line, uint64_t value, unsigned radix)
{
    char digits[24];
    size_t count = 0;
    do {
        digits[count++] = "0123456789abcdef"[value % radix];
        value /= radix;
    } while (value);
    while (count && line->length < sizeof line->text - 1)
        line->text[line->length++] = digits[--count];
}

static inline void fake_line_decimal(struct fake_line *line, uint64_t value)
{
    fake_line_string(line, " ");
    fake_line_number(line, value, 10);
}

static inline void fake_line_signed(struct fake_line *line, int64_t value)
{
    fake_line_string(line, value < 0 ? " -" : " ");
    fake_line_number(line, value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value, 10);
}

static inline void fake_line_pointer(struct fake_line *line, uintptr_t value)
{
    fake_line_string(line, " 0x");
    fake_line_number(line, value, 16);
}

/* "<event> <pid>" */
static inline void fake_line_start(struct fake_line *line, const char *event)
{
    line->length = 0;
    fake_line_string(line, event);
    fake_line_decimal(line, (uint64_t)getpid());
}

static inline void fake_line_emit(struct fake_line *line, int fd)
{
    if (fd < 0)
        return;
    line->text[line->length++] = '\n';
    ssize_t written;
    do {
        written = write(fd, line->text, line->length);
    } while (written < 0 && errno == EINTR);
}

#endif /* FAKE_LINE_H */
