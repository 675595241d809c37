/* gpu_check: the short correctness check on a real GPU, run under
 * LD_PRELOAD=libpinshim.so by bench/gpu-check.sh. It locks a buffer the way a
 * program does (posix_memalign + mlock) and checks that the shim registered it
 * (pinshim_is_registered, after pinshim_drain: registration is asynchronous by
 * default), that CUDA sees it pinned (cudaPointerGetAttributes type 1), that
 * the program's own cudaHostRegister of it succeeds as without the shim (the
 * pages become the program's) and its cudaHostUnregister gives them back to
 * the shim, that data survives a round trip through the device, and that
 * munlock and free undo the registration.
 * Prints PASS/FAIL lines; exits 0 when all pass, 1 when one fails, 2 without
 * a GPU, 3 when not run under the shim. */
#include <cuda_runtime_api.h>

#include "bench_cuda.h"
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define BUFFER_BYTES ((size_t)64 << 20)

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int devices = bench_device_count();
    if (devices == 0)
        return 2;
    cudaError_t error;
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (is_registered == NULL) {
        printf("FAIL not running under LD_PRELOAD=libpinshim.so (pinshim_is_registered not "
               "found)\n");
        return 3;
    }
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);
    cudaFree(NULL); /* initialise the context first, as a framework does */

    char detail[200];
    unsigned char *buffer = NULL, *back = malloc(BUFFER_BYTES);
    void *device = NULL;
    if (posix_memalign((void **)&buffer, 4096, BUFFER_BYTES) != 0 || back == NULL ||
        cudaMalloc(&device, BUFFER_BYTES) != cudaSuccess) {
        printf("FAIL allocating the buffers\n");
        return 1;
    }
    for (size_t i = 0; i < BUFFER_BYTES; i++)
        buffer[i] = (unsigned char)(i * 131 + 7);

    int locked = mlock(buffer, BUFFER_BYTES);
    snprintf(detail, sizeof(detail), "mlock returned %d", locked);
    bench_check(locked == 0, "mlock of 64 MiB", locked == 0 ? "" : detail);
    if (drain != NULL)
        drain();
    bench_check(is_registered(buffer) == 1 && is_registered(buffer + BUFFER_BYTES - 1) == 1,
                "pinshim_is_registered after mlock and pinshim_drain", "");
    int type = bench_pointer_type(buffer);
    snprintf(detail, sizeof(detail), "type %d", type);
    bench_check(type == 1, "cudaPointerGetAttributes says host (pinned) after mlock", detail);
    error = cudaHostRegister(buffer, BUFFER_BYTES, cudaHostRegisterDefault);
    snprintf(detail, sizeof(detail), "%s, last error %s", cudaGetErrorName(error),
             cudaGetErrorName(cudaGetLastError()));
    bench_check(error == cudaSuccess && is_registered(buffer) == 0,
                "the program's own cudaHostRegister succeeds and the pages become its own", detail);
    error = cudaHostUnregister(buffer);
    if (drain != NULL)
        drain();
    snprintf(detail, sizeof(detail), "%s", cudaGetErrorName(error));
    bench_check(
        error == cudaSuccess && is_registered(buffer) == 1 && bench_pointer_type(buffer) == 1,
        "the program's cudaHostUnregister gives the still-locked pages back to the shim", detail);

    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    error = cudaMemcpyAsync(device, buffer, BUFFER_BYTES, cudaMemcpyHostToDevice, stream);
    if (error == cudaSuccess)
        error = cudaMemcpyAsync(back, device, BUFFER_BYTES, cudaMemcpyDeviceToHost, stream);
    if (error == cudaSuccess)
        error = cudaStreamSynchronize(stream);
    snprintf(detail, sizeof(detail), "%s", cudaGetErrorName(error));
    bench_check(error == cudaSuccess && memcmp(buffer, back, BUFFER_BYTES) == 0,
                "round trip host->device->host keeps the data", error == cudaSuccess ? "" : detail);

    munlock(buffer, BUFFER_BYTES);
    bench_check(is_registered(buffer) == 0, "pinshim_is_registered is 0 after munlock", "");
    type = bench_pointer_type(buffer);
    snprintf(detail, sizeof(detail), "type %d", type);
    bench_check(type != 1, "CUDA no longer sees it pinned after munlock", detail);

    mlock(buffer, BUFFER_BYTES);
    if (drain != NULL)
        drain();
    bench_check(is_registered(buffer) == 1, "registered again after a second mlock", "");
    /* Only the address is used after free: the shim looks it up, nothing reads it. */
    volatile uintptr_t address = (uintptr_t)buffer;
    free(buffer); /* freed while locked: the shim must unregister it */
    bench_check(is_registered((const void *)address) == 0, "free of a locked buffer unregisters it",
                "");

    cudaStreamDestroy(stream);
    cudaFree(device);
    free(back);
    printf("%s: %d check(s) failed\n", bench_failures ? "FAIL" : "PASS", bench_failures);
    return bench_failures ? 1 : 0;
}
