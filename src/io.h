/* Writing whole buffers to a descriptor with write(2), reading small files
 * whole with read(2), finding fields of /proc's stat files: no stdio, no
 * allocation. */
#ifndef PINSHIM_IO_H
#define PINSHIM_IO_H

#include <stdbool.h>
#include <stddef.h>

/* Writes all of data, retrying on EINTR and short writes. False on error. */
bool write_fully(int fd, const void *data, size_t length);

/* Up to out_size - 1 bytes of a small file (a /proc or sysfs entry),
 * NUL-terminated, the last newline cut. False when it cannot be opened or
 * is empty. */
bool read_small_file(const char *path, char *out, size_t out_size);

/* Where field number field (3 or more, counted from 1) of a /proc/<pid>/stat
 * text starts, or NULL when the text has fewer. Field 2, the command name,
 * may hold spaces and parentheses: counting starts after its last ')'. */
const char *proc_stat_field(const char *stat, int field);

#endif
