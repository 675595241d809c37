/* fake_cudart_probe SCENARIO: a program that links the fake runtime only (not
 * the driver), for tests of the double that need a process of their own.
 * Prints key=value lines on stdout; tests/test_fake_cudart.c runs it.
 *
 *   lazy       is the driver loaded before and after the first calls, found
 *              by its soname, and the very object at FAKE_CUDA_DRIVER_PATH?
 *   no_driver  calls with FAKE_CUDART_NO_DRIVER=1, then: is the driver loaded?
 *   exit       registers an exit handler, then registers memory: the handler
 *              runs after the driver's own (FAKE_CUDA_UNLOAD_AT_EXIT=1 is
 *              expected) and before the runtime's, and unregisters through
 *              the driver and through the runtime.
 */
#include "fake_cudart.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A page the driver double can pin (it refuses unmapped memory, as the
 * real driver does). */
static char probe_page[4096] __attribute__((aligned(4096)));
static void *const probe_address = probe_page;

static int driver_loaded(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver)
        dlclose(driver);
    return driver != NULL;
}

static void at_exit_unregister(void)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*unregister)(void *) = NULL;
    if (driver)
        *(void **)&unregister = dlsym(driver, "cuMemHostUnregister");
    printf("exit_driver=%d\n", unregister ? unregister(probe_address) : -1);
    printf("exit_runtime=%d\n", cudaHostUnregister(probe_address));
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const char *scenario = argc > 1 ? argv[1] : "";
    if (strcmp(scenario, "lazy") == 0) {
        printf("loaded_at_start=%d\n", driver_loaded());
        printf("get_last_error=%d\n", cudaGetLastError());
        printf("loaded_after_get_last_error=%d\n", driver_loaded());
        int count = -1;
        int error = cudaGetDeviceCount(&count);
        printf("get_device_count=%d count=%d\n", error, count);
        printf("loaded_after_get_device_count=%d\n", driver_loaded());
        void *by_soname = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        const char *path = getenv("FAKE_CUDA_DRIVER_PATH");
        void *by_path = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
        printf("soname_is_fake=%d\n", by_soname && dlsym(by_soname, "fake_cuda_reset") != NULL);
        printf("soname_is_path=%d\n", by_soname && by_soname == by_path);
        return 0;
    }
    if (strcmp(scenario, "no_driver") == 0) {
        int count = -7;
        printf("register=%d\n", cudaHostRegister(probe_address, 4096, 0));
        printf("unregister=%d\n", cudaHostUnregister(probe_address));
        int error = cudaGetDeviceCount(&count);
        printf("get_device_count=%d count=%d\n", error, count);
        printf("set_device=%d\n", cudaSetDevice(0));
        printf("free=%d\n", cudaFree(NULL));
        printf("get_last_error=%d\n", cudaGetLastError());
        printf("loaded=%d\n", driver_loaded());
        return 0;
    }
    if (strcmp(scenario, "exit") == 0) {
        atexit(at_exit_unregister);
        printf("register=%d\n", cudaHostRegister(probe_address, 4096, 0));
        printf("loaded=%d\n", driver_loaded());
        fflush(stdout);
        return 0;
    }
    fprintf(stderr, "usage: fake_cudart_probe lazy|no_driver|exit\n");
    return 2;
}
