/* emulation: see emulation.h. */
#include "emulation.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

const char *test_emulator(void)
{
    const char *name = getenv("PINSHIM_TEST_EMULATOR");
    return name != NULL && name[0] != '\0' ? name : NULL;
}

bool test_kernel_has_mlock2(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *probe = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED)
        return true; /* cannot tell: let the test find out */
    /* The system call itself: glibc's wrapper hides ENOSYS behind EINVAL. */
    bool has = syscall(SYS_mlock2, probe, page, MLOCK_ONFAULT) == 0 || errno != ENOSYS;
    munmap(probe, page);
    return has;
}

bool test_kernel_lists_dontunmap_source(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *source = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (source == MAP_FAILED)
        return true;
    bool listed = true;
    void *moved = mremap(source, page, page, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
    if (moved != MAP_FAILED) {
        listed = false;
        FILE *maps = fopen("/proc/self/maps", "r");
        char line[512];
        while (maps != NULL && !listed && fgets(line, sizeof(line), maps) != NULL) {
            unsigned long start, end;
            listed = sscanf(line, "%lx-%lx", &start, &end) == 2 && start <= (uintptr_t)source &&
                     (uintptr_t)source < end;
        }
        if (maps != NULL)
            fclose(maps);
        munmap(moved, page);
    }
    munmap(source, page);
    return listed;
}

bool test_kernel_honours_dontfork(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile char *probe =
        mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED)
        return true;
    probe[0] = 1;
    bool honoured = true;
    if (madvise((void *)probe, page, MADV_DONTFORK) == 0) {
        pid_t child = fork();
        if (child == 0)
            _exit(probe[0] == 1 ? 0 : 1); /* the page is absent: SIGSEGV */
        int status = 0;
        if (child > 0 && waitpid(child, &status, 0) == child)
            honoured = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    munmap((void *)probe, page);
    return honoured;
}

const char *test_writeback_directory(void)
{
    static const char *const candidates[] = {".", "/var/tmp", "/tmp"};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++) {
        struct statfs fs;
        if (statfs(candidates[i], &fs) != 0 || access(candidates[i], W_OK) != 0)
            continue;
        unsigned long type = (unsigned long)fs.f_type;
        if (type != 0x01021994ul /* tmpfs */ && type != 0x858458f6ul /* ramfs */ &&
            type != 0x958458f6ul /* hugetlbfs */)
            return candidates[i];
    }
    return NULL;
}
