/* A program that registers memory itself, as DeepSpeed's native pinned
 * buffers (DS_PIN_MEMORY_BACKEND=native), PyTorch with
 * pinned_use_cuda_host_register and vLLM do: it is linked against the (fake)
 * CUDA runtime, so its cudaHostRegister goes through the global symbol scope,
 * where a preloaded shim comes first. It prints one line per step with what
 * its calls returned and what cudaGetLastError said; test_ownership runs it
 * with and without the shim and compares the lines (they must be the same),
 * then checks what the shim did through pinshim_is_registered.
 *
 *   steps: lock (1 MiB), register, query, unlock, query, unregister, query,
 *          lock again, unregister what only the shim registered (713),
 *          register, unregister while locked (the shim takes it back),
 *          unlock, free. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cudart.h"

static int (*shim_is_registered)(const void *);
static size_t (*shim_drain)(void);

static int memory_type(const void *ptr)
{
    int type = -1;
    int error = cudaPointerGetAttributes(&type, ptr);
    return error != 0 ? -error : type;
}

/* "state:" and "shim:" lines say what is registered and what the shim holds;
 * they differ with and without it and are left out of the comparison. */
static void step(const char *name, int result)
{
    int last = cudaGetLastError();
    printf("%s: returned %d, last error %d\n", name, result, last);
    fflush(stdout);
}

static void query(const char *name, const void *buffer)
{
    if (shim_drain != NULL)
        shim_drain();
    printf("%s: last error %d\n", name, cudaPeekAtLastError());
    printf("state: %s: pointer type %d\n", name, memory_type(buffer));
    if (shim_is_registered != NULL)
        printf("shim: %s: the shim holds it: %d\n", name, shim_is_registered(buffer));
    fflush(stdout);
}

/* While the program holds its registration, what its other calls answer
 * must not depend on the shim: cudaHostGetDevicePointer and the last error
 * it leaves (compared with and without the shim). */
static void program_holds(const char *name, void *buffer)
{
    void *device = NULL;
    int result = cudaHostGetDevicePointer(&device, buffer, 0);
    int last = cudaGetLastError();
    printf("%s: device pointer returned %d (the host pointer: %d), last error %d\n", name, result,
           device == buffer, last);
    fflush(stdout);
}

int main(void)
{
    shim_is_registered = (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    shim_drain = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    const size_t size = 1 << 20;
    void *buffer = NULL;
    if (posix_memalign(&buffer, 4096, size) != 0)
        return 1;
    memset(buffer, 1, size);

    step("lock", mlock(buffer, size));
    query("after lock", buffer);
    step("program registers", cudaHostRegister(buffer, size, 0));
    query("after the program's register", buffer);
    program_holds("while the program holds it", buffer);
    step("unlock", munlock(buffer, size));
    query("after unlock", buffer);
    program_holds("while the program holds it unlocked", buffer);
    step("program unregisters", cudaHostUnregister(buffer));
    query("after the program's unregister", buffer);

    step("lock again", mlock(buffer, size));
    query("after the second lock", buffer);
    step("program unregisters what it never registered", cudaHostUnregister(buffer));
    query("after that", buffer);
    step("program registers again", cudaHostRegister(buffer, size, 0));
    step("program registers twice", cudaHostRegister(buffer, size, 0));
    program_holds("while the program holds it again", buffer);
    step("program unregisters while locked", cudaHostUnregister(buffer));
    query("after the program's unregister while locked", buffer);
    step("unlock", munlock(buffer, size));
    query("at the end", buffer);
    free(buffer);
    return 0;
}
