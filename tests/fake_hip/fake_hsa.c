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
 * Built against ROCm's own hsa/hsa.h (the Debian package the tests fetch). */
#include <hsa/hsa.h>

#include <pthread.h>
#include <stdint.h>

#define FAKE_EXPORT __attribute__((visibility("default"), noinline))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned reference_count;
static uint64_t init_calls;

FAKE_EXPORT hsa_status_t hsa_init(void)
{
    pthread_mutex_lock(&lock);
    reference_count++;
    init_calls++;
    pthread_mutex_unlock(&lock);
    return HSA_STATUS_SUCCESS;
}

FAKE_EXPORT hsa_status_t hsa_shut_down(void)
{
    pthread_mutex_lock(&lock);
    hsa_status_t status = HSA_STATUS_ERROR_NOT_INITIALIZED;
    if (reference_count > 0) {
        reference_count--;
        status = HSA_STATUS_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

FAKE_EXPORT hsa_status_t hsa_system_get_info(hsa_system_info_t attribute, void *value)
{
    pthread_mutex_lock(&lock);
    bool open = reference_count > 0;
    pthread_mutex_unlock(&lock);
    if (!open)
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
