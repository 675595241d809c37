/* hip_program: a HIP program as a new user would write it (linked against
 * libamdhip64, here the tests' fake), locking an 8 MiB posix_memalign buffer,
 * run by tests/integration/test_vendors.c with and without the shim. It
 * prints what it saw as key=value lines. The scenario is argv[1]:
 *
 *   started       hipSetDevice + hipMalloc first, then mlock, munlock, free
 *   deferred      mlock before any HIP call; then hipSetDevice; pinshim_drain
 *   last_error    a failing HIP call, then mlock: hipGetLastError still says it
 *   own_exact     the program registers the locked buffer itself, whole, and
 *                 unregisters it (PyTorch's and DeepSpeed's hipHostRegister)
 *   own_part      the same for 64 KiB inside the buffer
 *   own_first     the program registers first, then locks, then unregisters
 *   interior      hipHostUnregister of an address inside the locked buffer
 *   own_unseen    the program registers first through libamdhip64's own handle
 *                 (dlsym on it: a call the shim cannot see), then locks
 *   exit_locked   exits with the buffer locked (the shim unregisters at exit)
 *   read_only     the buffer is made read-only (mprotect), then locked: no
 *                 host registration of this vendor's pins read-only memory
 *   no_device     hipInit, hipGetDeviceCount and its own hipHostRegister, as
 *                 a program on a machine without an AMD GPU sees them fail
 *                 (ROCm 5.2.3: 101, 100, 101), then mlock, pinshim_drain,
 *                 munlock: it goes on with memory it locks (shim_calls: the
 *                 shim's HIP calls from the lock on)
 *   fork_child    hipSetDevice, then a forked child locks a buffer of its
 *                 own and says what the shim called there; then the parent
 *                 locks
 *   capture       a thread captures a graph in the global mode while main
 *                 locks the buffer and unlocks another; then the capture ends
 *   own_unseen_inside  the program registers 64 KiB strictly inside the
 *                 buffer through libamdhip64's own handle, then locks it all */
#define __HIP_PLATFORM_AMD__
#include <hip/hip_runtime_api.h>

#include "fake_hip.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BYTES ((size_t)8 << 20)
#define PART_OFFSET ((size_t)1 << 20)
#define PART_BYTES ((size_t)64 << 10)

static int (*is_registered)(const void *);
static size_t (*drain)(void);
static uint64_t (*calls_by)(int, const char *);
static size_t (*violations)(void);
static int (*started)(void);

static int registered(const void *pointer)
{
    return is_registered != NULL ? is_registered(pointer) : -1;
}

/* What hipPointerGetAttributes says: 1 registered host memory, 0 not. */
static int pinned(const void *pointer)
{
    int version = 0;
    hipRuntimeGetVersion(&version);
    hipPointerAttribute_t attributes;
    if (hipPointerGetAttributes(&attributes, pointer) != hipSuccess) {
        hipGetLastError();
        return 0;
    }
    return (int)attributes.memoryType == (version >= 60000000 ? 1 : 0);
}

/* The calls the shim made (every kind: fake_hip.h). */
static unsigned long long shim_calls(void)
{
    unsigned long long calls = 0;
    for (int kind = 0; kind < FAKE_HIP_CALL_KIND_COUNT; kind++)
        calls += calls_by(kind, "libpinshim");
    return calls;
}

static void fork_child(unsigned char *buffer)
{
    printf("set_device=%d\n", hipSetDevice(0));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        unsigned char *own = NULL;
        if (posix_memalign((void **)&own, 4096, BYTES) != 0)
            _exit(3);
        memset(own, 0x33, BYTES);
        unsigned long long before = shim_calls();
        printf("child_mlock=%d\n", mlock(own, BYTES));
        if (drain != NULL)
            drain();
        printf("child_registered=%d\n", registered(own));
        printf("child_shim_calls=%llu\n", shim_calls() - before);
        printf("child_munlock=%d\n", munlock(own, BYTES));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    printf("child_status=%d\n",
           child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status)
               ? WEXITSTATUS(status)
               : -1);
    printf("mlock=%d\n", mlock(buffer, BYTES));
    printf("registered=%d\n", registered(buffer));
    printf("munlock=%d\n", munlock(buffer, BYTES));
}

static pthread_mutex_t capture_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t capture_cond = PTHREAD_COND_INITIALIZER;
static int capture_step; /* 1: capturing; 2: main's locks are done */

static void step_to(int step)
{
    pthread_mutex_lock(&capture_mutex);
    capture_step = step;
    pthread_cond_broadcast(&capture_cond);
    pthread_mutex_unlock(&capture_mutex);
}

static void wait_for(int step)
{
    pthread_mutex_lock(&capture_mutex);
    while (capture_step < step)
        pthread_cond_wait(&capture_cond, &capture_mutex);
    pthread_mutex_unlock(&capture_mutex);
}

static void *capturer(void *result)
{
    hipStream_t stream = NULL;
    int *ended = result;
    ended[0] = hipStreamCreate(&stream);
    ended[1] = hipStreamBeginCapture(stream, hipStreamCaptureModeGlobal);
    step_to(1);
    wait_for(2);
    hipGraph_t graph = NULL;
    ended[2] = hipStreamEndCapture(stream, &graph);
    ended[3] = graph != NULL;
    hipStreamDestroy(stream);
    return NULL;
}

static void capture(unsigned char *buffer)
{
    printf("set_device=%d\n", hipSetDevice(0));
    unsigned char *other = NULL;
    if (posix_memalign((void **)&other, 4096, BYTES) != 0)
        exit(3);
    memset(other, 0x44, BYTES);
    printf("other_mlock=%d\n", mlock(other, BYTES));
    if (drain != NULL)
        drain();
    int ended[4] = {-1, -1, -1, 0};
    pthread_t thread;
    if (pthread_create(&thread, NULL, capturer, ended) != 0)
        exit(3);
    wait_for(1);
    printf("mlock=%d\n", mlock(buffer, BYTES));
    printf("other_munlock=%d\n", munlock(other, BYTES));
    if (drain != NULL)
        drain();
    step_to(2);
    pthread_join(thread, NULL);
    printf("stream=%d\ncapture_begin=%d\ncapture_end=%d\ngraph=%d\n", ended[0], ended[1], ended[2],
           ended[3]);
    uint64_t (*refusals)(void) = NULL;
    *(void **)&refusals = dlsym(RTLD_DEFAULT, "fake_hip_capture_refusals");
    printf("refusals=%llu\n", refusals != NULL ? (unsigned long long)refusals() : 0ull);
    printf("registered=%d\n", registered(buffer));
    printf("pinned=%d\n", pinned(buffer));
    printf("other_pinned=%d\n", pinned(other));
    printf("munlock=%d\n", munlock(buffer, BYTES));
    free(other);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *scenario = argc > 1 ? argv[1] : "started";
    *(void **)&is_registered = dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    *(void **)&drain = dlsym(RTLD_DEFAULT, "pinshim_drain");
    *(void **)&calls_by = dlsym(RTLD_DEFAULT, "fake_gpu_call_count_by");
    *(void **)&violations = dlsym(RTLD_DEFAULT, "fake_gpu_violation_count");
    *(void **)&started = dlsym(RTLD_DEFAULT, "fake_hip_started");
    unsigned char *buffer = NULL;
    if (posix_memalign((void **)&buffer, 4096, BYTES) != 0)
        return 3;
    memset(buffer, 0x5a, BYTES);

    if (strcmp(scenario, "no_device") == 0) {
        int count = -1;
        printf("init=%d\n", hipInit(0));
        printf("device_count=%d\n", hipGetDeviceCount(&count));
        printf("count=%d\n", count);
        printf("own_register=%d\n", hipHostRegister(buffer, BYTES, 0));
        unsigned long long before = calls_by != NULL ? shim_calls() : 0;
        printf("mlock=%d\n", mlock(buffer, BYTES));
        printf("waiting=%zu\n", drain != NULL ? drain() : 0);
        printf("registered=%d\n", registered(buffer));
        printf("munlock=%d\n", munlock(buffer, BYTES));
        printf("last_error=%d\n", hipGetLastError());
        if (calls_by != NULL) /* the shim's own, from the lock on */
            printf("shim_calls=%llu\n", shim_calls() - before);
        free(buffer);
        return 0;
    }
    if (strcmp(scenario, "fork_child") == 0 || strcmp(scenario, "capture") == 0) {
        if (strcmp(scenario, "fork_child") == 0)
            fork_child(buffer);
        else
            capture(buffer);
        printf("violations=%zu\n", violations());
        free(buffer);
        return 0;
    }
    if (strcmp(scenario, "deferred") == 0) {
        printf("mlock=%d\n", mlock(buffer, BYTES));
        printf("registered_before_start=%d\n", registered(buffer));
        printf("started_by_then=%d\n", started());
        printf("set_device=%d\n", hipSetDevice(0));
        if (drain != NULL)
            drain();
        printf("registered_after_start=%d\n", registered(buffer));
        printf("pinned=%d\n", pinned(buffer));
    } else {
        if (strcmp(scenario, "last_error") == 0) {
            printf("set_device_99=%d\n", hipSetDevice(99));
        } else {
            void *device = NULL;
            printf("set_device=%d\n", hipSetDevice(0));
            printf("malloc=%d\n", hipMalloc(&device, 1 << 20));
        }
        /* Through the library's own handle: not the shim's definition. */
        void *library = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_NOLOAD);
        hipError_t (*unseen_register)(void *, size_t, unsigned) = NULL;
        hipError_t (*unseen_unregister)(void *) = NULL;
        *(void **)&unseen_register = dlsym(library, "hipHostRegister");
        *(void **)&unseen_unregister = dlsym(library, "hipHostUnregister");
        if (strcmp(scenario, "own_first") == 0)
            printf("own_register=%d\n", hipHostRegister(buffer, BYTES, 0));
        if (strcmp(scenario, "own_unseen") == 0)
            printf("own_register=%d\n", unseen_register(buffer, BYTES, 0));
        if (strcmp(scenario, "own_unseen_inside") == 0)
            printf("own_register=%d\n", unseen_register(buffer + PART_OFFSET + 100, PART_BYTES, 0));
        if (strcmp(scenario, "read_only") == 0)
            printf("protect=%d\n", mprotect(buffer, BYTES, PROT_READ));
        printf("mlock=%d\n", mlock(buffer, BYTES));
        /* Before any other HIP call of this thread's (each sets it). */
        if (strcmp(scenario, "last_error") == 0)
            printf("last_error=%d\n", hipGetLastError());
        printf("registered=%d\n", registered(buffer));
        printf("pinned=%d\n", pinned(buffer));
        if (strcmp(scenario, "exit_locked") == 0)
            exit(0);
        if (strcmp(scenario, "own_exact") == 0) {
            printf("own_register=%d\n", hipHostRegister(buffer, BYTES, 0));
            printf("own_unregister=%d\n", hipHostUnregister(buffer));
        } else if (strcmp(scenario, "own_part") == 0) {
            printf("own_register=%d\n", hipHostRegister(buffer + PART_OFFSET, PART_BYTES, 0));
            printf("part_pinned=%d\n", pinned(buffer + PART_OFFSET));
            printf("own_unregister=%d\n", hipHostUnregister(buffer + PART_OFFSET));
        } else if (strcmp(scenario, "own_first") == 0) {
            printf("own_unregister=%d\n", hipHostUnregister(buffer));
        } else if (strcmp(scenario, "own_unseen") == 0) {
            printf("own_unregister=%d\n", unseen_unregister(buffer));
            printf("pinned_between=%d\n", pinned(buffer));
            printf("own_register_again=%d\n", unseen_register(buffer, BYTES, 0));
            printf("own_unregister_again=%d\n", unseen_unregister(buffer));
        } else if (strcmp(scenario, "own_unseen_inside") == 0) {
            printf("part_pinned=%d\n", pinned(buffer + PART_OFFSET + 200));
            printf("own_unregister=%d\n", unseen_unregister(buffer + PART_OFFSET + 100));
        } else if (strcmp(scenario, "interior") == 0) {
            printf("interior_unregister=%d\n", hipHostUnregister(buffer + 4096));
        }
        if (drain != NULL)
            drain();
        printf("registered_after=%d\n", registered(buffer));
        printf("pinned_after=%d\n", pinned(buffer));
    }
    printf("munlock=%d\n", munlock(buffer, BYTES));
    if (strcmp(scenario, "read_only") == 0)
        printf("unprotect=%d\n", mprotect(buffer, BYTES, PROT_READ | PROT_WRITE));
    printf("registered_after_munlock=%d\n", registered(buffer));
    printf("pinned_after_munlock=%d\n", pinned(buffer));
    free(buffer);
    /* The calls the runtime saw from the program itself (register 0,
     * unregister 1: fake_hip.h) and from the shim. */
    printf("program_register_calls=%llu\n", (unsigned long long)calls_by(0, "hip_program"));
    printf("program_unregister_calls=%llu\n", (unsigned long long)calls_by(1, "hip_program"));
    printf("shim_register_calls=%llu\n", (unsigned long long)calls_by(0, "libpinshim"));
    printf("shim_unregister_calls=%llu\n", (unsigned long long)calls_by(1, "libpinshim"));
    printf("violations=%zu\n", violations());
    return 0;
}
