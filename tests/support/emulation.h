/* emulation: what the tests must know when a cross build's programs run
 * under an emulator (qemu-user, scripts/test-aarch64). tests/meson.build then
 * sets PINSHIM_TEST_EMULATOR to the cross file's 'emulator' property. Under
 * it the build machine's programs (sh, env, true, python3, memtester, fio,
 * valgrind, the CUDA Toolkit's runtime) are another architecture's than the
 * shim and cannot load it, and a few calls do not behave as on Linux: the
 * probes below find those where a program can. */
#ifndef EMULATION_H
#define EMULATION_H

#include <stdbool.h>
#include <stdio.h>

/* The emulator's name, or NULL when the tests run natively. */
const char *test_emulator(void);

/* In a Criterion test: skips it under an emulator, saying which and why
 * (printf's arguments). */
#define SKIP_UNDER_EMULATOR(...)                                                                   \
    do {                                                                                           \
        const char *emulator_ = test_emulator();                                                   \
        if (emulator_ != NULL) {                                                                   \
            char why_[512];                                                                        \
            snprintf(why_, sizeof(why_), __VA_ARGS__);                                             \
            cr_skip_test("under %s: %s", emulator_, why_);                                         \
        }                                                                                          \
    } while (0)

/* Skips a test that runs program, one of the build machine's, under the shim. */
#define SKIP_BUILD_MACHINE_PROGRAM(program)                                                        \
    SKIP_UNDER_EMULATOR("%s is the build machine's program, of another architecture than the "     \
                        "shim, and cannot load it",                                                \
                        program)

/* Whether the kernel has the mlock2 system call. Without it (qemu-user 7.2
 * answers ENOSYS) glibc's mlock2 locks with flags 0 through mlock and fails
 * every MLOCK_ONFAULT lock with EINVAL. */
bool test_kernel_has_mlock2(void);

/* Whether /proc/self/maps still lists the source of an MREMAP_DONTUNMAP move,
 * which stays mapped (qemu-user 7.2 drops it from its emulated maps). */
bool test_kernel_lists_dontunmap_source(void);

/* Whether madvise(MADV_DONTFORK) keeps a mapping out of fork's children
 * (qemu-user answers 0 to madvise and does nothing). */
bool test_kernel_honours_dontfork(void);

/* A writable directory of ., /var/tmp and /tmp on a file system that writes
 * back (not tmpfs, ramfs or hugetlbfs: the kernel's vma_needs_dirty_tracking),
 * for shared file mappings that need dirty tracking; NULL when none is. */
const char *test_writeback_directory(void);

#endif /* EMULATION_H */
