/* fake_hsa: a test double for the part of ROCr, the HSA runtime
 * (libhsa-runtime64.so.1), that HIP starts and the shim asks. Never shipped.
 *
 * Modelled from ROCR-Runtime (runtime/hsa-runtime/core/runtime/hsa.cpp and
 * runtime.cpp):
 *  - hsa_init is reference counted (Runtime::Acquire); hsa_shut_down drops a
 *    reference and the last one closes the runtime (Runtime::Release); a
 *    shut-down with none held answers HSA_STATUS_ERROR_NOT_INITIALIZED.
 *  - Every call with IS_OPEN, hsa_system_get_info among them, answers
 *    HSA_STATUS_ERROR_NOT_INITIALIZED (0x100B) while the runtime is closed;
 *    hsa_system_get_info with a NULL value: HSA_STATUS_ERROR_INVALID_ARGUMENT
 *    (IS_BAD_PTR). hsa_status_string has no IS_OPEN.
 *  - With no GPU (FAKE_HIP_DEVICES=0) hsa_init fails with
 *    HSA_STATUS_ERROR_OUT_OF_RESOURCES (0x1008) and the runtime stays
 *    closed: ROCm 5.2.3's, run here without /dev/kfd. With
 *    FAKE_HSA_OPEN_WITHOUT_GPU=1 it opens all the same with a CPU agent only
 *    (a machine whose GPUs are hidden from ROCr), and HIP's start fails.
 *  - hsa_iterate_agents: a CPU agent, then one GPU agent per device;
 *    hsa_agent_get_info(HSA_AGENT_INFO_DEVICE) tells them apart.
 * Built against ROCm's own hsa/hsa.h (the Debian package the tests fetch). */
#include <hsa/hsa.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_EXPORT __attribute__((visibility("default"), noinline))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned reference_count;
static uint64_t init_calls;

static int gpu_count(void)
{
    const char *devices = getenv("FAKE_HIP_DEVICES");
    return devices != NULL && *devices ? atoi(devices) : 1;
}

static bool open_without_gpu(void)
{
    const char *open = getenv("FAKE_HSA_OPEN_WITHOUT_GPU");
    return open != NULL && strcmp(open, "1") == 0;
}

FAKE_EXPORT hsa_status_t hsa_init(void)
{
    if (gpu_count() <= 0 && !open_without_gpu()) {
        __atomic_add_fetch(&init_calls, 1, __ATOMIC_RELAXED);
        return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    }
    pthread_mutex_lock(&lock);
    __atomic_add_fetch(&reference_count, 1, __ATOMIC_RELEASE);
    init_calls++;
    pthread_mutex_unlock(&lock);
    return HSA_STATUS_SUCCESS;
}

FAKE_EXPORT hsa_status_t hsa_shut_down(void)
{
    pthread_mutex_lock(&lock);
    hsa_status_t status = HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (reference_count > 0) {
        __atomic_sub_fetch(&reference_count, 1, __ATOMIC_RELEASE);
        status = HSA_STATUS_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

FAKE_EXPORT hsa_status_t hsa_system_get_info(hsa_system_info_t attribute, void *value)
{
    /* IS_OPEN reads the runtime's count without a lock (the shim asks in a
     * fork child): so does the double. */
    if (__atomic_load_n(&reference_count, __ATOMIC_ACQUIRE) == 0)
        return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (value == NULL)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    switch (attribute) {
    case HSA_SYSTEM_INFO_VERSION_MAJOR:
    case HSA_SYSTEM_INFO_VERSION_MINOR:
        *(uint16_t *)value = 1;
        return HSA_STATUS_SUCCESS;
    default:
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
}

enum { CPU_AGENT = 0x1000, GPU_AGENT_BASE = 0x2000 };

FAKE_EXPORT hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t agent, void *data),
                                            void *data)
{
    if (__atomic_load_n(&reference_count, __ATOMIC_ACQUIRE) == 0)
        return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (callback == NULL)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    int gpus = open_without_gpu() ? 0 : gpu_count();
    hsa_status_t status = callback((hsa_agent_t){CPU_AGENT}, data);
    for (int i = 0; status == HSA_STATUS_SUCCESS && i < gpus; i++)
        status = callback((hsa_agent_t){GPU_AGENT_BASE + (uint64_t)i}, data);
    return status == HSA_STATUS_INFO_BREAK ? HSA_STATUS_SUCCESS : status;
}

FAKE_EXPORT hsa_status_t hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute,
                                            void *value)
{
    if (__atomic_load_n(&reference_count, __ATOMIC_ACQUIRE) == 0)
        return HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (value == NULL)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    if (agent.handle != CPU_AGENT && agent.handle < GPU_AGENT_BASE)
        return HSA_STATUS_ERROR_INVALID_AGENT;
    if (attribute != HSA_AGENT_INFO_DEVICE)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    *(hsa_device_type_t *)value =
        agent.handle == CPU_AGENT ? HSA_DEVICE_TYPE_CPU : HSA_DEVICE_TYPE_GPU;
    return HSA_STATUS_SUCCESS;
}

FAKE_EXPORT hsa_status_t hsa_status_string(hsa_status_t status, const char **status_string)
{
    if (status_string == NULL)
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    *status_string = status == HSA_STATUS_SUCCESS ? "HSA_STATUS_SUCCESS"
                     : status == HSA_STATUS_ERROR_NOT_INITIALIZED
                         ? "HSA_STATUS_ERROR_NOT_INITIALIZED"
                         : "HSA_STATUS_ERROR";
    return HSA_STATUS_SUCCESS;
}

/* The double's own: how many hsa_init calls were made, and whether the
 * runtime is open now. */
FAKE_EXPORT uint64_t fake_hsa_init_calls(void)
{
    pthread_mutex_lock(&lock);
    uint64_t calls = init_calls;
    pthread_mutex_unlock(&lock);
    return calls;
}

FAKE_EXPORT int fake_hsa_is_open(void)
{
    pthread_mutex_lock(&lock);
    int open = reference_count > 0;
    pthread_mutex_unlock(&lock);
    return open;
}
