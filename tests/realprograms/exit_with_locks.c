/* Exits with locked memory it never unlocks: a posix_memalign'ed buffer, an
 * mmap'ed region locked with mlock and one mapped with MAP_LOCKED. The exit
 * status is argv[1] (default 0), given to exit(), so destructors run as
 * usual. Prints the lengths it locked. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
    int status = argc > 1 ? atoi(argv[1]) : 0;

    size_t buffer_length = (size_t)1 << 20;
    void *buffer = NULL;
    if (posix_memalign(&buffer, 4096, buffer_length) != 0 || mlock(buffer, buffer_length) != 0) {
        fprintf(stderr, "locking the buffer failed: %s\n", strerror(errno));
        return 1;
    }
    printf("locked %zu\n", buffer_length);

    size_t mapped_length = (size_t)3 << 20;
    void *mapped =
        mmap(NULL, mapped_length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED || mlock(mapped, mapped_length) != 0) {
        fprintf(stderr, "locking the mapping failed: %s\n", strerror(errno));
        return 1;
    }
    printf("locked %zu\n", mapped_length);

    size_t locked_length = (size_t)2 << 20;
    void *locked = mmap(NULL, locked_length, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    if (locked == MAP_FAILED) {
        fprintf(stderr, "mmap MAP_LOCKED failed: %s\n", strerror(errno));
        return 1;
    }
    printf("locked %zu\n", locked_length);

    memset(buffer, 1, buffer_length);
    fflush(stdout);
    exit(status); /* everything still locked */
}
