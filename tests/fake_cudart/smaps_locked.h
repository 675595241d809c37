/* smaps_locked: whether pages are mapped and locked, read from
 * /proc/self/smaps, streamed through a stack buffer (smaps can be megabytes,
 * and the fakes may not allocate: the shim under test interposes the
 * allocator). Shared by the test doubles of every vendor (fake_cuda.c,
 * tests/fake_gpu/fake_pins.c); every function is static inline. */
#ifndef FAKE_SMAPS_LOCKED_H
#define FAKE_SMAPS_LOCKED_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Invariant checks against /proc/self/smaps, streamed through a stack      */
/* buffer: smaps can be megabytes and we may not allocate.                  */

struct line_reader {
    int fd;
    bool at_eof;
    bool discarding; /* skipping the rest of an over-long line */
    size_t start;
    size_t end;
    char buffer[4096];
};

/* The next line without its newline, or NULL at end of file. An over-long
 * line is returned truncated (we only look at the start of lines). */
static inline char *line_reader_next(struct line_reader *reader)
{
    for (;;) {
        char *chunk = reader->buffer + reader->start;
        char *newline = memchr(chunk, '\n', reader->end - reader->start);
        if (newline) {
            *newline = '\0';
            reader->start = (size_t)(newline + 1 - reader->buffer);
            if (reader->discarding) {
                reader->discarding = false;
                continue;
            }
            return chunk;
        }
        if (reader->discarding) {
            reader->start = reader->end = 0;
        } else if (reader->start > 0) {
            memmove(reader->buffer, chunk, reader->end - reader->start);
            reader->end -= reader->start;
            reader->start = 0;
        }
        if (reader->end == sizeof reader->buffer - 1 || (reader->at_eof && reader->end > 0)) {
            reader->buffer[reader->end] = '\0';
            reader->discarding = !reader->at_eof;
            reader->start = reader->end = 0;
            return reader->buffer;
        }
        if (reader->at_eof)
            return NULL;
        ssize_t got =
            read(reader->fd, reader->buffer + reader->end, sizeof reader->buffer - 1 - reader->end);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            reader->at_eof = true;
        else
            reader->end += (size_t)got;
    }
}

static inline bool parse_hex(const char **cursor, uintptr_t *value)
{
    const char *text = *cursor;
    uintptr_t result = 0;
    int digits = 0;
    for (;; text++, digits++) {
        char c = *text;
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else
            break;
        result = result * 16 + digit;
    }
    *cursor = text;
    *value = result;
    return digits > 0;
}

/* "start-end perms ..." starts every VMA block; other lines start with a
 * capitalised key, never a lowercase hex digit. */
static inline bool parse_vma_header(const char *line, uintptr_t *start, uintptr_t *end)
{
    return parse_hex(&line, start) && *line++ == '-' && parse_hex(&line, end) && *line == ' ';
}

/* Whether the VmFlags line (after "VmFlags:") names flag, two letters. */
static inline bool vm_flags_has(const char *flags, const char *flag)
{
    for (const char *at = flags; (at = strstr(at, flag)) != NULL; at += 2) {
        if (at > flags && at[-1] == ' ' && (at[2] == ' ' || at[2] == '\0'))
            return true;
    }
    return false;
}

/* Locked, or a hugetlb mapping: mlock leaves VM_LOCKED off hugetlb VMAs
 * (mm/mlock.c), whose pages are never swapped out anyway. */
static inline bool vm_flags_has_locked(const char *flags)
{
    return vm_flags_has(flags, "lo") || vm_flags_has(flags, "ht");
}

struct lock_check {
    bool unmapped;
    bool not_locked;
};

/* Is every page of [first_page, end_page) mapped, and is every VMA touching
 * it locked? VMAs are listed in address order, so one pass suffices. */
static inline struct lock_check check_range_locked(uintptr_t first_page, uintptr_t end_page)
{
    struct lock_check result = {false, false};
    struct line_reader reader;
    reader.fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
    if (reader.fd < 0)
        return result; /* cannot tell: record nothing */
    reader.at_eof = false;
    reader.discarding = false;
    reader.start = reader.end = 0;

    uintptr_t covered_up_to = first_page;
    bool in_touching_vma = false;
    bool finished = false;
    const char *line;
    while (!finished && (line = line_reader_next(&reader)) != NULL) {
        uintptr_t vma_start, vma_end;
        if (parse_vma_header(line, &vma_start, &vma_end)) {
            in_touching_vma = false;
            if (vma_end <= covered_up_to)
                continue;
            if (vma_start > covered_up_to) {
                result.unmapped = true;
                finished = true;
                continue;
            }
            in_touching_vma = true;
            covered_up_to = vma_end;
        } else if (in_touching_vma && strncmp(line, "VmFlags:", 8) == 0) {
            if (!vm_flags_has_locked(line + 7))
                result.not_locked = true;
            in_touching_vma = false;
            finished = covered_up_to >= end_page;
        }
    }
    if (!finished && covered_up_to < end_page)
        result.unmapped = true;
    close(reader.fd);
    return result;
}

#endif
