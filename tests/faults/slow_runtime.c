/* A CUDA runtime that is slow where the test wants it: it links the fake
 * runtime and forwards to it, after a delay.
 *   SLOW_RUNTIME_LOAD_MS        sleep this long in the constructor (the shim
 *                               loads its runtime inside the first large lock,
 *                               after the mlock system call)
 *   SLOW_RUNTIME_UNREGISTER_MS  sleep this long in each cudaHostUnregister (the
 *                               shim unregisters inside munlock, before the
 *                               munlock system call)
 *   SLOW_RUNTIME_REGISTER_MS    sleep this long in each cudaHostRegister
 * This holds a thread inside the shim long enough for another thread to act
 * in between (see shared_page_race.c). Everything else of the runtime (device
 * count, error names) is the fake's, found through this library's
 * dependency. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#define FAKE_CUDART_NO_CUDA_PROTOTYPES
#include "fake_cudart.h"

#define SLOW_EXPORT __attribute__((visibility("default")))

static int (*fake_register)(void *, size_t, unsigned int);
static int (*fake_unregister)(void *);

static void sleep_ms(const char *variable)
{
    const char *text = getenv(variable);
    long milliseconds = text ? atol(text) : 0;
    struct timespec delay = {.tv_sec = milliseconds / 1000,
                             .tv_nsec = (milliseconds % 1000) * 1000 * 1000};
    while (milliseconds > 0 && nanosleep(&delay, &delay) != 0) {
    }
}

__attribute__((constructor)) static void load_slowly(void)
{
    /* A call into the fake keeps it a needed library under --as-needed. */
    (void)fake_cudart_live_count();
    void *fake = dlopen("libfake_cudart.so", RTLD_NOW | RTLD_NOLOAD);
    if (fake != NULL) {
        fake_register = (int (*)(void *, size_t, unsigned int))dlsym(fake, "cudaHostRegister");
        fake_unregister = (int (*)(void *))dlsym(fake, "cudaHostUnregister");
    }
    sleep_ms("SLOW_RUNTIME_LOAD_MS");
}

SLOW_EXPORT int cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    sleep_ms("SLOW_RUNTIME_REGISTER_MS");
    return fake_register ? fake_register(ptr, size, flags) : 3;
}

SLOW_EXPORT int cudaHostUnregister(void *ptr)
{
    sleep_ms("SLOW_RUNTIME_UNREGISTER_MS");
    return fake_unregister ? fake_unregister(ptr) : 3;
}
