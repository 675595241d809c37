/* Locks and unlocks CYCLES (argv[1], default 12) distinct 256 KiB buffers one
 * after the other, then frees them all: every lock and every unlock is one
 * runtime call, at addresses that are never reused within the run. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_CYCLES 64

int main(int argc, char **argv)
{
    int cycles = argc > 1 ? atoi(argv[1]) : 12;
    if (cycles < 1 || cycles > MAX_CYCLES)
        return 2;
    size_t size = (size_t)256 << 10;
    void *buffers[MAX_CYCLES];
    for (int i = 0; i < cycles; i++)
        if (posix_memalign(&buffers[i], 4096, size) != 0)
            return 1;
    int failures = 0;
    for (int i = 0; i < cycles; i++) {
        memset(buffers[i], i, size);
        failures += mlock(buffers[i], size) != 0;
        failures += munlock(buffers[i], size) != 0;
    }
    for (int i = 0; i < cycles; i++)
        free(buffers[i]);
    printf("%d lock cycles, %d failed calls\n", cycles, failures);
    return failures == 0 ? 0 : 1;
}
