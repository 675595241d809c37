/* gpu_contexts: on a real GPU machine, under LD_PRELOAD=libpinshim.so, shows
 * that the shim registers into the context the program made and creates none
 * of its own (PINSHIM_CONTEXT=program, the default). Run by gpu-check.sh.
 *
 * main selects the LAST device (N-1) and initialises it; a worker thread that
 * never chose a device (so a runtime call from it would land on device 0)
 * locks a buffer and calls pinshim_drain(). Then it prints and checks:
 *   - pinshim_is_registered(buffer);
 *   - cudaPointerGetAttributes(buffer): type 1 (host, registered); its device
 *     is printed;
 *   - cuDevicePrimaryCtxGetState for every device, through the driver the
 *     runtime loaded (dlopen("libcuda.so.1", RTLD_NOLOAD)): only N-1 active;
 *   - nvidia-smi --query-compute-apps, the lines of this pid: only N-1's UUID.
 * With one GPU, N-1 is device 0, the device a thread that chose none uses too,
 * so the check cannot tell a wrong context from the right one; it says so and
 * runs anyway. Exits 0 when all pass, 1 when one fails, 2 without a usable
 * GPU, 3 when not run under the shim. */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "bench_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define BUFFER_BYTES ((size_t)64 << 20)
#define MAX_DEVICES 64

/* ---- the worker: a thread that never calls CUDA ---- */

struct worker_result {
    unsigned char *buffer;
    int locked;           /* mlock's result */
    size_t still_waiting; /* pinshim_drain: ranges waiting for a context */
    int registered;
};

static void *lock_from_worker(void *argument)
{
    struct worker_result *result = argument;
    size_t (*drain)(void) = (size_t(*)(void))dlsym(RTLD_DEFAULT, "pinshim_drain");
    int (*is_registered)(const void *) =
        (int (*)(const void *))dlsym(RTLD_DEFAULT, "pinshim_is_registered");
    if (posix_memalign((void **)&result->buffer, 4096, BUFFER_BYTES) != 0) {
        result->buffer = NULL;
        return NULL;
    }
    memset(result->buffer, 0x5a, BUFFER_BYTES);
    result->locked = mlock(result->buffer, BUFFER_BYTES);
    result->still_waiting = drain();
    result->registered = is_registered(result->buffer);
    return NULL;
}

/* ---- the driver the runtime loaded ---- */

typedef CUresult (*primary_state_function)(CUdevice, unsigned int *, int *);
typedef CUresult (*device_get_function)(CUdevice *, int);
typedef CUresult (*uuid_function)(CUuuid *, CUdevice);

static void *driver_symbol(const char *name)
{
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL)
        return NULL;
    void *symbol = dlsym(driver, name);
    dlclose(driver);
    return symbol;
}

/* nvidia-smi's spelling of a UUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
static void format_uuid(const CUuuid *uuid, char *out, size_t size)
{
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    snprintf(out, size, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Active primary contexts, one PASS/FAIL line; fills uuids when it can. */
static void check_primary_contexts(int devices, int chosen, char uuids[][48], const char *when)
{
    primary_state_function get_state =
        (primary_state_function)driver_symbol("cuDevicePrimaryCtxGetState");
    device_get_function device_get = (device_get_function)driver_symbol("cuDeviceGet");
    uuid_function get_uuid = (uuid_function)driver_symbol("cuDeviceGetUuid_v2");
    if (get_uuid == NULL)
        get_uuid = (uuid_function)driver_symbol("cuDeviceGetUuid");
    char detail[512] = "", what[128];
    snprintf(what, sizeof(what), "only device %d has an active primary context (%s)", chosen, when);
    if (get_state == NULL || device_get == NULL) {
        bench_check(false, what, "libcuda.so.1 not loaded or without cuDevicePrimaryCtxGetState");
        return;
    }
    bool only_chosen = true;
    for (int ordinal = 0; ordinal < devices; ordinal++) {
        CUdevice device;
        unsigned int flags = 0;
        int active = -1;
        CUresult error = device_get(&device, ordinal);
        if (error == CUDA_SUCCESS)
            error = get_state(device, &flags, &active);
        if (get_uuid != NULL && uuids != NULL) {
            CUuuid uuid;
            if (get_uuid(&uuid, device) == CUDA_SUCCESS)
                format_uuid(&uuid, uuids[ordinal], sizeof(uuids[ordinal]));
        }
        const char *uuid = uuids != NULL ? uuids[ordinal] : "";
        printf("  device %d: %s%s%s\n", ordinal,
               error != CUDA_SUCCESS ? "error" : (active ? "ACTIVE" : "inactive"),
               uuid[0] ? " " : "", uuid);
        if (error != CUDA_SUCCESS || (active != 0) != (ordinal == chosen))
            only_chosen = false;
        size_t used = strlen(detail);
        snprintf(detail + used, sizeof(detail) - used, "%s%d:%s", used ? " " : "", ordinal,
                 error != CUDA_SUCCESS ? "error" : (active ? "active" : "inactive"));
    }
    bench_check(only_chosen, what, detail);
}

/* The compute-apps lines of this pid, while the buffer is registered. */
static void check_nvidia_smi(int chosen, const char *chosen_uuid)
{
    FILE *smi = popen("timeout 30 nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory "
                      "--format=csv 2>&1",
                      "r");
    if (smi == NULL) {
        printf("SKIP nvidia-smi could not be started\n");
        return;
    }
    char line[512];
    int lines = 0, ours = 0, other_gpu = 0;
    char pid_prefix[32];
    snprintf(pid_prefix, sizeof(pid_prefix), "%d,", (int)getpid());
    printf("  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv, lines of pid "
           "%d:\n",
           (int)getpid());
    while (fgets(line, sizeof(line), smi) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (lines++ == 0)
            printf("    %s\n", line); /* the header, or an error */
        if (strncmp(line, pid_prefix, strlen(pid_prefix)) != 0)
            continue;
        printf("    %s\n", line);
        ours++;
        if (strstr(line, chosen_uuid) == NULL)
            other_gpu++;
    }
    int status = pclose(smi);
    char detail[160];
    if (status != 0 && ours == 0) {
        printf("SKIP nvidia-smi failed (status %d)\n", status);
        return;
    }
    if (ours == 0) {
        printf("SKIP nvidia-smi lists no line for pid %d (in a container it may list host "
               "pids)\n",
               (int)getpid());
        return;
    }
    if (chosen_uuid[0] == '\0') {
        printf("SKIP the UUID of device %d is unknown (cuDeviceGetUuid), nothing to compare\n",
               chosen);
        return;
    }
    snprintf(detail, sizeof(detail), "%d line(s) for this pid, %d naming another GPU than %s", ours,
             other_gpu, chosen_uuid);
    char what[96];
    snprintf(what, sizeof(what), "nvidia-smi lists this process on device %d only", chosen);
    bench_check(other_gpu == 0, what, detail);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int devices = bench_device_count();
    if (devices == 0)
        return 2;
    cudaError_t error;
    if (dlsym(RTLD_DEFAULT, "pinshim_drain") == NULL) {
        printf("FAIL not running under LD_PRELOAD=libpinshim.so (pinshim_drain not found)\n");
        return 3;
    }
    if (devices > MAX_DEVICES)
        devices = MAX_DEVICES;
    int chosen = devices - 1;
    printf("%d device(s); main selects device %d (the last); PINSHIM_CONTEXT=%s, "
           "PINSHIM_ASYNC=%s\n",
           devices, chosen, getenv("PINSHIM_CONTEXT") ? getenv("PINSHIM_CONTEXT") : "(default)",
           getenv("PINSHIM_ASYNC") ? getenv("PINSHIM_ASYNC") : "(default)");
    if (devices == 1)
        printf("NOTE one GPU: device N-1 is device 0, which a thread that never chose a device "
               "uses as well, so this cannot tell the program's context from one the shim "
               "would make; it runs anyway\n");
    struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &unlimited);

    error = cudaSetDevice(chosen);
    if (error == cudaSuccess)
        error = cudaFree(NULL); /* the program's context on device N-1 */
    if (error != cudaSuccess) {
        printf("FAIL cudaSetDevice(%d) + cudaFree(NULL): %s\n", chosen, cudaGetErrorName(error));
        return 1;
    }
    struct cudaDeviceProp properties;
    if (cudaGetDeviceProperties(&properties, chosen) == cudaSuccess)
        printf("device %d: %s\n", chosen, properties.name);

    struct worker_result worker;
    memset(&worker, 0, sizeof(worker));
    pthread_t thread;
    if (pthread_create(&thread, NULL, lock_from_worker, &worker) != 0) {
        printf("FAIL pthread_create\n");
        return 1;
    }
    pthread_join(thread, NULL);
    char detail[200];
    if (worker.buffer == NULL) {
        printf("FAIL posix_memalign of 64 MiB\n");
        return 1;
    }
    snprintf(detail, sizeof(detail), "mlock %d, pinshim_drain left %zu range(s) waiting",
             worker.locked, worker.still_waiting);
    bench_check(worker.locked == 0 && worker.registered == 1,
                "a worker that never chose a device locked 64 MiB and the shim registered it",
                detail);

    static char uuids[MAX_DEVICES][48];
    printf("primary contexts after the worker's lock and drain:\n");
    check_primary_contexts(devices, chosen, uuids, "after the lock");

    struct cudaPointerAttributes attributes;
    memset(&attributes, 0, sizeof(attributes));
    error = cudaPointerGetAttributes(&attributes, worker.buffer);
    snprintf(detail, sizeof(detail), "%s, type %d, device %d", cudaGetErrorName(error),
             (int)attributes.type, attributes.device);
    printf("cudaPointerGetAttributes(buffer): %s\n", detail);
    bench_check(error == cudaSuccess && attributes.type == cudaMemoryTypeHost,
                "cudaPointerGetAttributes says registered host memory (type 1)", detail);
    /* Printed, not checked: what the runtime reports as the device of portable
     * registered memory is not documented beyond "registered against". */
    printf("INFO cudaPointerGetAttributes device %d; the program's device is %d\n",
           attributes.device, chosen);

    check_nvidia_smi(chosen, uuids[chosen]);

    munlock(worker.buffer, BUFFER_BYTES);
    free(worker.buffer);
    printf("primary contexts at the end:\n");
    check_primary_contexts(devices, chosen, NULL, "at the end");
    printf("%s: %d check(s) failed\n", bench_failures ? "FAIL" : "PASS", bench_failures);
    return bench_failures ? 1 : 0;
}
