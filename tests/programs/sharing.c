/* Issue 17: a buffer the program shares with the shim costs the runtime
 * nothing extra. A GPU program linked against the (fake) CUDA runtime, so its
 * cudaHostRegister goes through the global scope as DeepSpeed's and
 * PyTorch's do; it initialises CUDA first, then runs one scenario and prints
 * "key=value" lines that test_sharing compares with and without the shim.
 *
 *   sharing deepspeed N      N buffers in DeepSpeed's native order: posix_memalign,
 *                            mlock, cudaHostRegister, cudaHostUnregister, munlock,
 *                            free; how many were pinned when mlock returned
 *   sharing orders           the other orders a program may use (register
 *                            before the lock, unregister while locked, unlock
 *                            while registered)
 *   sharing other-flags      the program registers with other flags (portable
 *                            only): not the shim's registration
 *   sharing host-alloc       cudaHostAlloc and cudaFreeHost: the driver locks and
 *                            unlocks its own memory while it holds its lock
 *
 * Counts are the driver double's: every cuMemHostRegister and
 * cuMemHostUnregister call it saw, from the program's runtime or the shim. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_CUDA_NO_CUDA_PROTOTYPES
#include "fake_cuda.h"
#include "fake_cudart.h"

#define MIB ((size_t)1 << 20)

static void die(const char *what)
{
    printf("harness: %s\n", what);
    fflush(stdout);
    _exit(2);
}

static void *driver_symbol(const char *name)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *symbol = driver != NULL ? dlsym(driver, name) : NULL;
    if (symbol == NULL)
        die(name);
    return symbol;
}

struct counts {
    unsigned long long registers, unregisters;
};

static struct counts runtime_counts(void)
{
    uint64_t (*count)(int) = (uint64_t(*)(int))driver_symbol("fake_cuda_call_count");
    return (struct counts){count(FAKE_CU_CALL_MEM_HOST_REGISTER_V2) +
                               count(FAKE_CU_CALL_MEM_HOST_REGISTER),
                           count(FAKE_CU_CALL_MEM_HOST_UNREGISTER)};
}

static bool pinned(const void *address)
{
    int (*lookup)(const void *, struct fake_cuda_registration *) =
        (int (*)(const void *, struct fake_cuda_registration *))driver_symbol("fake_cuda_lookup");
    return lookup(address, NULL) == 1;
}

static void print_counts(const char *prefix, struct counts before)
{
    struct counts now = runtime_counts();
    printf("%s_registers=%llu\n%s_unregisters=%llu\n", prefix, now.registers - before.registers,
           prefix, now.unregisters - before.unregisters);
}

static char *buffer(size_t size)
{
    void *memory = NULL;
    if (posix_memalign(&memory, (size_t)sysconf(_SC_PAGESIZE), size) != 0)
        die("posix_memalign");
    memset(memory, 1, size);
    return memory;
}

static void expect(int result, const char *what)
{
    if (result != 0) {
        printf("harness: %s returned %d\n", what, result);
        fflush(stdout);
        _exit(2);
    }
}

static void deepspeed(int count)
{
    struct counts before = runtime_counts();
    int pinned_at_return = 0;
    for (int i = 0; i < count; i++) {
        size_t size = 4 * MIB + (size_t)i * 4096;
        char *p = buffer(size);
        expect(mlock(p, size), "mlock");
        pinned_at_return += pinned(p) && pinned(p + size - 1);
        expect(cudaHostRegister(p, size, 0), "cudaHostRegister");
        expect(cudaHostUnregister(p), "cudaHostUnregister");
        expect(munlock(p, size), "munlock");
        free(p);
    }
    print_counts("runtime", before);
    printf("pinned_at_return=%d\n", pinned_at_return);
    printf("live_at_end=%zu\n", ((size_t(*)(void))driver_symbol("fake_cuda_live_count"))());
}

static void orders(void)
{
    const size_t size = 4 * MIB;
    /* The program registers before it locks, unlocks, then unregisters. */
    struct counts before = runtime_counts();
    char *p = buffer(size);
    expect(cudaHostRegister(p, size, 0), "register first");
    expect(mlock(p, size), "mlock");
    expect(munlock(p, size), "munlock");
    expect(cudaHostUnregister(p), "unregister");
    free(p);
    print_counts("register_first", before);
    /* Registers before it locks, unregisters while locked, unlocks. */
    before = runtime_counts();
    p = buffer(size);
    expect(cudaHostRegister(p, size, 0), "register first");
    expect(mlock(p, size), "mlock");
    expect(cudaHostUnregister(p), "unregister while locked");
    printf("pinned_after_unregister_while_locked=%d\n", pinned(p));
    expect(munlock(p, size), "munlock");
    free(p);
    print_counts("unregister_while_locked", before);
    /* Locks, registers, unlocks (the registration outlives the lock), then
     * unregisters. */
    before = runtime_counts();
    p = buffer(size);
    expect(mlock(p, size), "mlock");
    expect(cudaHostRegister(p, size, 0), "register");
    expect(munlock(p, size), "munlock while registered");
    printf("pinned_after_unlock=%d\n", pinned(p));
    expect(cudaHostUnregister(p), "unregister after the unlock");
    printf("pinned_at_end=%d\n", pinned(p));
    free(p);
    print_counts("unlock_while_registered", before);
    /* Locks, registers, unregisters, registers again, unregisters, unlocks. */
    before = runtime_counts();
    p = buffer(size);
    expect(mlock(p, size), "mlock");
    for (int i = 0; i < 3; i++) {
        expect(cudaHostRegister(p, size, 0), "register again");
        expect(cudaHostUnregister(p), "unregister again");
    }
    expect(munlock(p, size), "munlock");
    free(p);
    print_counts("again_and_again", before);
}

static void other_flags(void)
{
    const size_t size = 4 * MIB;
    struct counts before = runtime_counts();
    char *p = buffer(size);
    expect(mlock(p, size), "mlock");
    expect(cudaHostRegister(p, size, 0x01 /* cudaHostRegisterPortable */), "register portable");
    expect(cudaHostUnregister(p), "unregister");
    printf("pinned_after_unregister=%d\n", pinned(p));
    expect(munlock(p, size), "munlock");
    free(p);
    print_counts("other_flags", before);
}

static void on_alarm(int signal)
{
    (void)signal;
    static const char message[] = "harness: cudaHostAlloc hung (a deadlock)\n";
    ssize_t ignored = write(STDOUT_FILENO, message, sizeof message - 1);
    (void)ignored;
    _exit(3);
}

static void host_alloc(void)
{
    signal(SIGALRM, on_alarm);
    alarm(20);
    struct counts before = runtime_counts();
    void *memory = NULL;
    expect(cudaHostAlloc(&memory, 8 * MIB, 0), "cudaHostAlloc");
    printf("host_alloc_pinned=%d\n", pinned(memory));
    expect(cudaFreeHost(memory), "cudaFreeHost");
    alarm(0);
    print_counts("host_alloc", before);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* A GPU program: CUDA first, on device 0 of the fake driver. */
    expect(cudaFree(NULL), "cudaFree(NULL)");
    const char *scenario = argc > 1 ? argv[1] : "";
    if (strcmp(scenario, "deepspeed") == 0)
        deepspeed(argc > 2 ? atoi(argv[2]) : 20);
    else if (strcmp(scenario, "orders") == 0)
        orders();
    else if (strcmp(scenario, "other-flags") == 0)
        other_flags();
    else if (strcmp(scenario, "host-alloc") == 0)
        host_alloc();
    else
        die("unknown scenario");
    return 0;
}
