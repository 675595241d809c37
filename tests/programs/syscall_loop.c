/* Issue 22: what the shim's lock, unlock and map paths ask of the kernel. A
 * program that never uses CUDA locks a buffer (in program mode the range then
 * waits for a context that never comes, and the shim keeps looking for a
 * driver), writes a marker, runs COUNT rounds of mmap + munmap and of mlock +
 * munlock of another buffer, and writes a second marker. test_syscalls runs it
 * under strace with and without the shim and compares the file system calls
 * between the markers (write(2) to descriptor -1, which fails and changes
 * nothing).
 *
 *   syscall_loop COUNT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BUFFER_BYTES ((size_t)256 << 10)

static void marker(const char *text)
{
    ssize_t ignored = write(-1, text, strlen(text));
    (void)ignored;
}

int main(int argc, char **argv)
{
    int count = argc > 1 ? atoi(argv[1]) : 2000;
    void *waiting = NULL, *cycled = NULL;
    if (posix_memalign(&waiting, 4096, BUFFER_BYTES) != 0 ||
        posix_memalign(&cycled, 4096, BUFFER_BYTES) != 0)
        return 2;
    memset(waiting, 1, BUFFER_BYTES);
    memset(cycled, 1, BUFFER_BYTES);
    if (mlock(waiting, BUFFER_BYTES) != 0)
        return 3;
    marker("pinshim-loop-begin");
    for (int i = 0; i < count; i++) {
        void *mapped =
            mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED || munmap(mapped, BUFFER_BYTES) != 0)
            return 4;
        if (mlock(cycled, BUFFER_BYTES) != 0 || munlock(cycled, BUFFER_BYTES) != 0)
            return 5;
    }
    marker("pinshim-loop-end");
    munlock(waiting, BUFFER_BYTES);
    free(waiting);
    free(cycled);
    return 0;
}
