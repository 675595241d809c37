/* The copy calls of the fake HIP runtime and the fake Level Zero driver
 * (tests/fake_hip/fake_hip.h, tests/fake_ze/fake_ze.h), each loaded by path
 * without the shim: which copies go through a registration (an import),
 * which are staged, which are refused with the vendor's code, and that the
 * bytes really move. FAKE_HIP_LIB and FAKE_ZE_LIB name the libraries. */
#define __HIP_PLATFORM_AMD__
#include <hip/hip_runtime_api.h>
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include "fake_pins.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096

static void *load(const char *variable)
{
    const char *path = getenv(variable);
    cr_assert(path != NULL && *path, "%s is not set", variable);
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert(handle != NULL, "dlopen %s: %s", path, dlerror());
    return handle;
}

static void *symbol(void *handle, const char *name)
{
    void *found = dlsym(handle, name);
    cr_assert(found != NULL, "no %s", name);
    return found;
}

/* Host memory of its own, pages filled with a pattern. */
static unsigned char *host_pages(size_t pages, unsigned char seed)
{
    unsigned char *memory =
        mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(memory != MAP_FAILED);
    for (size_t i = 0; i < pages * PAGE; i++)
        memory[i] = (unsigned char)(seed + i * 7);
    return memory;
}

static bool all_bytes(const unsigned char *memory, size_t size, unsigned char value)
{
    for (size_t i = 0; i < size; i++)
        if (memory[i] != value)
            return false;
    return true;
}

/* The vendor-neutral counts (fake_pins.h). */
static uint64_t (*copy_count)(int);
static uint64_t (*copy_bytes)(int);
static void (*set_check)(int);

static void load_counts(void *handle)
{
    copy_count = (uint64_t(*)(int))symbol(handle, "fake_gpu_copy_count");
    copy_bytes = (uint64_t(*)(int))symbol(handle, "fake_gpu_copy_bytes");
    set_check = (void (*)(int))symbol(handle, "fake_gpu_set_check");
    set_check(0); /* the buffers here are not locked: no invariant is tested */
}

static void expect_counts(uint64_t pinned, uint64_t staged, uint64_t refused, uint64_t host,
                          uint64_t device)
{
    cr_expect_eq(copy_count(FAKE_GPU_COPY_PINNED), pinned, "pinned %llu, not %llu",
                 (unsigned long long)copy_count(FAKE_GPU_COPY_PINNED), (unsigned long long)pinned);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_STAGED), staged, "staged %llu, not %llu",
                 (unsigned long long)copy_count(FAKE_GPU_COPY_STAGED), (unsigned long long)staged);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_REFUSED), refused, "refused %llu, not %llu",
                 (unsigned long long)copy_count(FAKE_GPU_COPY_REFUSED),
                 (unsigned long long)refused);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_HOST), host, "host %llu, not %llu",
                 (unsigned long long)copy_count(FAKE_GPU_COPY_HOST), (unsigned long long)host);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_DEVICE), device, "device %llu, not %llu",
                 (unsigned long long)copy_count(FAKE_GPU_COPY_DEVICE), (unsigned long long)device);
}

/* ---- HIP ---- */

static struct {
    hipError_t (*host_register)(void *, size_t, unsigned);
    hipError_t (*host_unregister)(void *);
    hipError_t (*device_malloc)(void **, size_t);
    hipError_t (*device_free)(void *);
    hipError_t (*copy)(void *, const void *, size_t, hipMemcpyKind);
    hipError_t (*copy_async)(void *, const void *, size_t, hipMemcpyKind, hipStream_t);
    hipError_t (*stream_create)(hipStream_t *);
    hipError_t (*stream_destroy)(hipStream_t);
    hipError_t (*stream_synchronize)(hipStream_t);
    hipError_t (*get_last_error)(void);
} hip;

static void load_hip(void)
{
    void *handle = load("FAKE_HIP_LIB");
    hip.host_register = (hipError_t(*)(void *, size_t, unsigned))symbol(handle, "hipHostRegister");
    hip.host_unregister = (hipError_t(*)(void *))symbol(handle, "hipHostUnregister");
    hip.device_malloc = (hipError_t(*)(void **, size_t))symbol(handle, "hipMalloc");
    hip.device_free = (hipError_t(*)(void *))symbol(handle, "hipFree");
    hip.copy =
        (hipError_t(*)(void *, const void *, size_t, hipMemcpyKind))symbol(handle, "hipMemcpy");
    hip.copy_async = (hipError_t(*)(void *, const void *, size_t, hipMemcpyKind,
                                    hipStream_t))symbol(handle, "hipMemcpyAsync");
    hip.stream_create = (hipError_t(*)(hipStream_t *))symbol(handle, "hipStreamCreate");
    hip.stream_destroy = (hipError_t(*)(hipStream_t))symbol(handle, "hipStreamDestroy");
    hip.stream_synchronize = (hipError_t(*)(hipStream_t))symbol(handle, "hipStreamSynchronize");
    hip.get_last_error = (hipError_t(*)(void))symbol(handle, "hipGetLastError");
    load_counts(handle);
}

static unsigned char *hip_device(size_t size)
{
    void *device = NULL;
    cr_assert_eq(hip.device_malloc(&device, size), hipSuccess);
    cr_assert(device != NULL);
    return device;
}

/* Reads device memory back through a copy into fresh pageable memory. */
static void hip_read_back(unsigned char *out, const unsigned char *device, size_t size)
{
    cr_assert_eq(hip.copy(out, device, size, hipMemcpyDeviceToHost), hipSuccess);
}

Test(hip, copy_inside_one_registration_is_pinned_and_moves_bytes)
{
    load_hip();
    unsigned char *buffer = host_pages(4, 1);
    cr_assert_eq(hip.host_register(buffer, 4 * PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(2 * PAGE);

    /* Host to device from inside the registration, ending at its end. */
    cr_expect_eq(hip.copy(device, buffer + 2 * PAGE, 2 * PAGE, hipMemcpyHostToDevice), hipSuccess);
    /* Device to host into another part of it, kind Default. */
    memset(buffer, 0, PAGE);
    cr_expect_eq(hip.copy(buffer + 100, device + 5, 3000, hipMemcpyDefault), hipSuccess);
    cr_expect(memcmp(buffer + 100, buffer + 2 * PAGE + 5, 3000) == 0);
    cr_expect(all_bytes(buffer, 100, 0));
    expect_counts(2, 0, 0, 0, 0);
    cr_expect_eq(copy_bytes(FAKE_GPU_COPY_PINNED), 2 * PAGE + 3000);
}

Test(hip, async_copies_inside_a_registration_are_pinned)
{
    load_hip();
    unsigned char *buffer = host_pages(2, 3);
    unsigned char *expected = host_pages(2, 3);
    cr_assert_eq(hip.host_register(buffer, 2 * PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(2 * PAGE);
    hipStream_t stream;
    cr_assert_eq(hip.stream_create(&stream), hipSuccess);

    cr_expect_eq(hip.copy_async(device, buffer, 2 * PAGE, hipMemcpyHostToDevice, stream),
                 hipSuccess);
    cr_expect_eq(hip.stream_synchronize(stream), hipSuccess);
    memset(buffer, 0, 2 * PAGE);
    cr_expect_eq(hip.copy_async(buffer, device, 2 * PAGE, hipMemcpyDeviceToHost, stream),
                 hipSuccess);
    cr_expect_eq(hip.stream_synchronize(stream), hipSuccess);
    cr_expect(memcmp(buffer, expected, 2 * PAGE) == 0);
    /* The null stream and the per-thread stream are streams too. */
    cr_expect_eq(hip.copy_async(device, buffer, 16, hipMemcpyHostToDevice, NULL), hipSuccess);
    cr_expect_eq(hip.copy_async(device, buffer, 16, hipMemcpyHostToDevice, hipStreamPerThread),
                 hipSuccess);
    expect_counts(4, 0, 0, 0, 0);
    cr_expect_eq(hip.stream_destroy(stream), hipSuccess);
}

Test(hip, unregistered_host_memory_is_staged)
{
    load_hip();
    unsigned char *buffer = host_pages(2, 5);
    unsigned char *back = host_pages(2, 0);
    unsigned char *device = hip_device(2 * PAGE);
    cr_expect_eq(hip.copy(device, buffer, 2 * PAGE, hipMemcpyHostToDevice), hipSuccess);
    cr_expect_eq(hip.copy_async(back, device, 2 * PAGE, hipMemcpyDeviceToHost, NULL), hipSuccess);
    cr_expect_eq(hip.stream_synchronize(NULL), hipSuccess);
    cr_expect(memcmp(back, buffer, 2 * PAGE) == 0);
    expect_counts(0, 2, 0, 0, 0);
}

Test(hip, range_leaving_its_registration_is_refused_both_ways)
{
    load_hip();
    unsigned char *buffer = host_pages(4, 7);
    cr_assert_eq(hip.host_register(buffer, 2 * PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(4 * PAGE);
    unsigned char *back = host_pages(4, 9);

    /* Starts in the last page of the registration, ends a page past it. */
    cr_expect_eq(hip.copy(device, buffer + PAGE, 2 * PAGE, hipMemcpyHostToDevice),
                 hipErrorInvalidValue);
    cr_expect_eq(hip.get_last_error(), hipErrorInvalidValue);
    cr_expect_eq(hip.copy(buffer + PAGE, device, 2 * PAGE, hipMemcpyDeviceToHost),
                 hipErrorInvalidValue);
    /* The asynchronous call answers it itself. */
    cr_expect_eq(hip.copy_async(device, buffer + PAGE, PAGE + 1, hipMemcpyHostToDevice, NULL),
                 hipErrorInvalidValue);
    /* One byte less fits. */
    cr_expect_eq(hip.copy(device, buffer + PAGE, PAGE, hipMemcpyHostToDevice), hipSuccess);
    expect_counts(1, 0, 3, 0, 0);
    cr_expect_eq(copy_bytes(FAKE_GPU_COPY_REFUSED), 2 * PAGE + 2 * PAGE + PAGE + 1);

    /* Nothing moved by the refused ones: the device holds the one copy. */
    hip_read_back(back, device, 4 * PAGE);
    cr_expect(memcmp(back, buffer + PAGE, PAGE) == 0);
    cr_expect(all_bytes(back + PAGE, 3 * PAGE, 0));
    unsigned char *original = host_pages(4, 7);
    cr_expect(memcmp(buffer, original, 4 * PAGE) == 0);
}

Test(hip, range_over_two_adjacent_registrations_is_refused)
{
    load_hip();
    unsigned char *buffer = host_pages(2, 11);
    cr_assert_eq(hip.host_register(buffer, PAGE, 0), hipSuccess);
    cr_assert_eq(hip.host_register(buffer + PAGE, PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(2 * PAGE);
    cr_expect_eq(hip.copy(device, buffer + PAGE / 2, PAGE, hipMemcpyHostToDevice),
                 hipErrorInvalidValue);
    cr_expect_eq(hip.copy(buffer + PAGE / 2, device, PAGE, hipMemcpyDeviceToHost),
                 hipErrorInvalidValue);
    /* Each half alone goes. */
    cr_expect_eq(hip.copy(device, buffer + PAGE / 2, PAGE / 2, hipMemcpyHostToDevice), hipSuccess);
    cr_expect_eq(hip.copy(device, buffer + PAGE, PAGE, hipMemcpyHostToDevice), hipSuccess);
    expect_counts(2, 0, 2, 0, 0);
}

Test(hip, range_starting_before_a_registration_is_staged)
{
    load_hip();
    unsigned char *buffer = host_pages(3, 13);
    cr_assert_eq(hip.host_register(buffer + PAGE, PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(3 * PAGE);
    unsigned char *back = host_pages(3, 0);
    /* From the unregistered first page into and past the registration. */
    cr_expect_eq(hip.copy(device, buffer, 3 * PAGE, hipMemcpyHostToDevice), hipSuccess);
    hip_read_back(back, device, 3 * PAGE);
    cr_expect(memcmp(back, buffer, 3 * PAGE) == 0);
    memset(buffer, 0, 3 * PAGE);
    cr_expect_eq(hip.copy(buffer, device, 3 * PAGE, hipMemcpyDeviceToHost), hipSuccess);
    cr_expect(memcmp(back, buffer, 3 * PAGE) == 0);
    expect_counts(0, 3, 0, 0, 0);
}

Test(hip, unregistered_memory_is_staged_again)
{
    load_hip();
    unsigned char *buffer = host_pages(1, 15);
    unsigned char *device = hip_device(PAGE);
    cr_assert_eq(hip.host_register(buffer, PAGE, 0), hipSuccess);
    cr_expect_eq(hip.copy(device, buffer, PAGE, hipMemcpyHostToDevice), hipSuccess);
    cr_assert_eq(hip.host_unregister(buffer), hipSuccess);
    cr_expect_eq(hip.copy(device, buffer, PAGE, hipMemcpyHostToDevice), hipSuccess);
    expect_counts(1, 1, 0, 0, 0);
}

Test(hip, device_ranges_and_device_to_device)
{
    load_hip();
    unsigned char *first = hip_device(PAGE), *second = hip_device(PAGE);
    unsigned char *buffer = host_pages(2, 17);
    unsigned char *back = host_pages(1, 0);
    cr_assert_eq(hip.host_register(buffer, 2 * PAGE, 0), hipSuccess);
    /* A device range that leaves its block, also into the next block. */
    cr_expect_eq(hip.copy(first, buffer, 2 * PAGE, hipMemcpyHostToDevice), hipErrorInvalidValue);
    cr_expect_eq(hip.copy(buffer, first + PAGE / 2, PAGE, hipMemcpyDeviceToHost),
                 hipErrorInvalidValue);
    /* Device to device, kind ignored but for the host-only check. */
    cr_expect_eq(hip.copy(first, buffer, PAGE, hipMemcpyHostToDevice), hipSuccess);
    cr_expect_eq(hip.copy(second, first, PAGE, hipMemcpyDeviceToDevice), hipSuccess);
    cr_expect_eq(hip.copy(back, second, PAGE, hipMemcpyDeviceToHost), hipSuccess);
    cr_expect(memcmp(back, buffer, PAGE) == 0);
    expect_counts(1, 1, 2, 0, 1);
    cr_expect_eq(hip.device_free(first), hipSuccess);
    cr_expect_eq(hip.device_free(first), hipErrorInvalidValue);
}

Test(hip, host_to_host_by_the_cpu_only_with_a_host_kind)
{
    load_hip();
    unsigned char *from = host_pages(1, 19), *to = host_pages(1, 0);
    memset(to, 0, PAGE);
    cr_expect_eq(hip.copy(to, from, PAGE, hipMemcpyHostToDevice), hipErrorInvalidValue);
    cr_expect(all_bytes(to, PAGE, 0));
    cr_expect_eq(hip.copy(to, from, PAGE, hipMemcpyHostToHost), hipSuccess);
    cr_expect(memcmp(to, from, PAGE) == 0);
    memset(to, 0, PAGE);
    cr_expect_eq(hip.copy(to, from, PAGE, hipMemcpyDefault), hipSuccess);
    cr_expect(memcmp(to, from, PAGE) == 0);
    expect_counts(0, 0, 1, 2, 0);
    /* One end registered: through the device, the other end staged. */
    cr_assert_eq(hip.host_register(from, PAGE, 0), hipSuccess);
    cr_expect_eq(hip.copy(to, from, PAGE, hipMemcpyHostToDevice), hipSuccess);
    expect_counts(0, 1, 1, 2, 0);
    /* Both registered: pinned. */
    cr_assert_eq(hip.host_register(to, PAGE, 0), hipSuccess);
    cr_expect_eq(hip.copy(to, from, PAGE, hipMemcpyHostToHost), hipSuccess);
    expect_counts(1, 1, 1, 2, 0);
}

Test(hip, size_zero_null_and_self_copies)
{
    load_hip();
    unsigned char *buffer = host_pages(1, 21);
    cr_expect_eq(hip.copy(NULL, NULL, 0, hipMemcpyHostToDevice), hipSuccess);
    cr_expect_eq(hip.copy(NULL, buffer, 1, hipMemcpyHostToHost), hipErrorInvalidValue);
    cr_expect_eq(hip.copy(buffer, NULL, 1, hipMemcpyHostToHost), hipErrorInvalidValue);
    cr_expect_eq(hip.copy(buffer, buffer, PAGE, hipMemcpyDefault), hipSuccess);
    expect_counts(0, 0, 2, 0, 0);
    void *none = buffer;
    cr_expect_eq(hip.device_malloc(&none, 0), hipSuccess);
    cr_expect_eq(none, NULL);
}

Test(hip, direction_refused_from_6_1)
{
    load_hip(); /* FAKE_HIP_VERSION unset: 6.2 */
    unsigned char *buffer = host_pages(1, 23);
    unsigned char *device = hip_device(PAGE);
    cr_expect_eq(hip.copy(device, buffer, PAGE, (hipMemcpyKind)7), hipErrorInvalidMemcpyDirection);
    cr_expect_eq(hip.copy_async(device, buffer, PAGE, (hipMemcpyKind)7, NULL),
                 hipErrorInvalidMemcpyDirection);
    expect_counts(0, 0, 2, 0, 0);
}

Test(hip, direction_not_checked_before_6_1)
{
    setenv("FAKE_HIP_VERSION", "5.2", 1);
    load_hip();
    unsigned char *buffer = host_pages(1, 25);
    unsigned char *device = hip_device(PAGE);
    cr_expect_eq(hip.copy(device, buffer, PAGE, (hipMemcpyKind)7), hipSuccess);
    /* The host-only check stands in 5.2 (in ihipMemcpy). */
    unsigned char *to = host_pages(1, 0);
    cr_expect_eq(hip.copy(to, buffer, PAGE, hipMemcpyDeviceToHost), hipErrorInvalidValue);
    /* No early return for a copy onto itself before 5.3: a host copy. */
    cr_expect_eq(hip.copy(buffer, buffer, PAGE, hipMemcpyDefault), hipSuccess);
    expect_counts(0, 1, 1, 1, 0);
}

Test(hip, streams_that_are_not_live)
{
    load_hip();
    unsigned char *buffer = host_pages(1, 27);
    unsigned char *device = hip_device(PAGE);
    hipStream_t stream;
    cr_assert_eq(hip.stream_create(&stream), hipSuccess);
    cr_assert_eq(hip.stream_destroy(stream), hipSuccess);
    cr_expect_eq(hip.copy_async(device, buffer, PAGE, hipMemcpyHostToDevice, stream),
                 hipErrorContextIsDestroyed);
    cr_expect_eq(hip.stream_synchronize(stream), hipErrorContextIsDestroyed);
    cr_expect_eq(hip.stream_destroy(stream), hipErrorContextIsDestroyed);
    cr_expect_eq(hip.stream_destroy(NULL), hipErrorInvalidHandle);
    cr_expect_eq(hip.stream_create(NULL), hipErrorInvalidValue);
    expect_counts(0, 0, 1, 0, 0);
}

/* ---- Level Zero ---- */

typedef ze_result_t (*import_fn)(ze_driver_handle_t, void *, size_t);
typedef ze_result_t (*release_fn)(ze_driver_handle_t, void *);

static struct {
    ze_result_t (*append_copy)(ze_command_list_handle_t, void *, const void *, size_t,
                               ze_event_handle_t, uint32_t, ze_event_handle_t *);
    ze_result_t (*list_create)(ze_context_handle_t, ze_device_handle_t,
                               const ze_command_queue_desc_t *, ze_command_list_handle_t *);
    ze_result_t (*list_destroy)(ze_command_list_handle_t);
    ze_result_t (*list_synchronize)(ze_command_list_handle_t, uint64_t);
    ze_result_t (*alloc_device)(ze_context_handle_t, const ze_device_mem_alloc_desc_t *, size_t,
                                size_t, ze_device_handle_t, void **);
    ze_result_t (*mem_free)(ze_context_handle_t, void *);
    ze_result_t (*alloc_properties)(ze_context_handle_t, const void *,
                                    ze_memory_allocation_properties_t *, ze_device_handle_t *);
    import_fn import;
    release_fn release;
    ze_driver_handle_t driver; /* the driver's own, for the zex calls */
    ze_context_handle_t context;
    ze_device_handle_t device;
    ze_command_list_handle_t list;
} ze;

static void load_ze(ze_command_queue_mode_t mode)
{
    void *handle = load("FAKE_ZE_LIB");
    ze_result_t (*init)(ze_init_flags_t) =
        (ze_result_t(*)(ze_init_flags_t))symbol(handle, "zeInit");
    ze_result_t (*driver_get)(uint32_t *, ze_driver_handle_t *) =
        (ze_result_t(*)(uint32_t *, ze_driver_handle_t *))symbol(handle, "zeDriverGet");
    ze_result_t (*device_get)(ze_driver_handle_t, uint32_t *, ze_device_handle_t *) =
        (ze_result_t(*)(ze_driver_handle_t, uint32_t *, ze_device_handle_t *))symbol(handle,
                                                                                     "zeDeviceGet");
    ze_result_t (*context_create)(ze_driver_handle_t, const ze_context_desc_t *,
                                  ze_context_handle_t *) =
        (ze_result_t(*)(ze_driver_handle_t, const ze_context_desc_t *,
                        ze_context_handle_t *))symbol(handle, "zeContextCreate");
    ze_result_t (*extension)(ze_driver_handle_t, const char *, void **) =
        (ze_result_t(*)(ze_driver_handle_t, const char *, void **))symbol(
            handle, "zeDriverGetExtensionFunctionAddress");
    ze_result_t (*translate)(zel_handle_type_t, void *, void **) =
        (ze_result_t(*)(zel_handle_type_t, void *, void **))symbol(handle,
                                                                   "zelLoaderTranslateHandle");
    ze.append_copy =
        (ze_result_t(*)(ze_command_list_handle_t, void *, const void *, size_t, ze_event_handle_t,
                        uint32_t, ze_event_handle_t *))symbol(handle,
                                                              "zeCommandListAppendMemoryCopy");
    ze.list_create =
        (ze_result_t(*)(ze_context_handle_t, ze_device_handle_t, const ze_command_queue_desc_t *,
                        ze_command_list_handle_t *))symbol(handle, "zeCommandListCreateImmediate");
    ze.list_destroy =
        (ze_result_t(*)(ze_command_list_handle_t))symbol(handle, "zeCommandListDestroy");
    ze.list_synchronize = (ze_result_t(*)(ze_command_list_handle_t, uint64_t))symbol(
        handle, "zeCommandListHostSynchronize");
    ze.alloc_device =
        (ze_result_t(*)(ze_context_handle_t, const ze_device_mem_alloc_desc_t *, size_t, size_t,
                        ze_device_handle_t, void **))symbol(handle, "zeMemAllocDevice");
    ze.mem_free = (ze_result_t(*)(ze_context_handle_t, void *))symbol(handle, "zeMemFree");
    ze.alloc_properties =
        (ze_result_t(*)(ze_context_handle_t, const void *, ze_memory_allocation_properties_t *,
                        ze_device_handle_t *))symbol(handle, "zeMemGetAllocProperties");
    load_counts(handle);

    cr_assert_eq(init(0), ZE_RESULT_SUCCESS);
    uint32_t count = 1;
    ze_driver_handle_t loader_driver;
    cr_assert_eq(driver_get(&count, &loader_driver), ZE_RESULT_SUCCESS);
    cr_assert_eq(extension(loader_driver, "zexDriverImportExternalPointer", (void **)&ze.import),
                 ZE_RESULT_SUCCESS);
    cr_assert_eq(extension(loader_driver, "zexDriverReleaseImportedPointer", (void **)&ze.release),
                 ZE_RESULT_SUCCESS);
    cr_assert_eq(translate(ZEL_HANDLE_DRIVER, loader_driver, (void **)&ze.driver),
                 ZE_RESULT_SUCCESS);
    count = 1;
    cr_assert_eq(device_get(loader_driver, &count, &ze.device), ZE_RESULT_SUCCESS);
    ze_context_desc_t context_desc = {ZE_STRUCTURE_TYPE_CONTEXT_DESC, NULL, 0};
    cr_assert_eq(context_create(loader_driver, &context_desc, &ze.context), ZE_RESULT_SUCCESS);
    ze_command_queue_desc_t queue_desc = {ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, NULL, 0, 0, 0, mode,
                                          ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
    cr_assert_eq(ze.list_create(ze.context, ze.device, &queue_desc, &ze.list), ZE_RESULT_SUCCESS);
}

static unsigned char *ze_device(size_t size)
{
    ze_device_mem_alloc_desc_t desc = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
    void *device = NULL;
    cr_assert_eq(ze.alloc_device(ze.context, &desc, size, 0, ze.device, &device),
                 ZE_RESULT_SUCCESS);
    cr_assert(device != NULL);
    return device;
}

static ze_result_t ze_copy(void *dst, const void *src, size_t size)
{
    return ze.append_copy(ze.list, dst, src, size, NULL, 0, NULL);
}

static void ze_read_back(unsigned char *out, const unsigned char *device, size_t size)
{
    cr_assert_eq(ze_copy(out, device, size), ZE_RESULT_SUCCESS);
}

Test(ze, copy_inside_one_import_is_pinned_and_moves_bytes)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS);
    unsigned char *buffer = host_pages(4, 31);
    cr_assert_eq(ze.import(ze.driver, buffer, 4 * PAGE), ZE_RESULT_SUCCESS);
    unsigned char *device = ze_device(2 * PAGE);
    cr_expect_eq(ze_copy(device, buffer + 2 * PAGE, 2 * PAGE), ZE_RESULT_SUCCESS);
    memset(buffer, 0, PAGE);
    cr_expect_eq(ze_copy(buffer + 100, device + 5, 3000), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(buffer + 100, buffer + 2 * PAGE + 5, 3000) == 0);
    cr_expect(all_bytes(buffer, 100, 0));
    expect_counts(2, 0, 0, 0, 0);
    cr_expect_eq(copy_bytes(FAKE_GPU_COPY_PINNED), 2 * PAGE + 3000);
}

Test(ze, asynchronous_list_copies_inside_an_import_are_pinned)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS);
    unsigned char *buffer = host_pages(2, 33);
    unsigned char *expected = host_pages(2, 33);
    cr_assert_eq(ze.import(ze.driver, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    unsigned char *device = ze_device(2 * PAGE);
    cr_expect_eq(ze_copy(device, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze.list_synchronize(ze.list, UINT64_MAX), ZE_RESULT_SUCCESS);
    memset(buffer, 0, 2 * PAGE);
    cr_expect_eq(ze_copy(buffer, device, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze.list_synchronize(ze.list, UINT64_MAX), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(buffer, expected, 2 * PAGE) == 0);
    expect_counts(2, 0, 0, 0, 0);
    cr_expect_eq(ze.list_destroy(ze.list), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze.list_synchronize(ze.list, 0), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    cr_expect_eq(ze_copy(device, buffer, 1), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    expect_counts(2, 0, 1, 0, 0);
}

Test(ze, unimported_host_memory_is_staged)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(2, 35);
    unsigned char *back = host_pages(2, 0);
    unsigned char *device = ze_device(2 * PAGE);
    cr_expect_eq(ze_copy(device, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(back, device, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(back, buffer, 2 * PAGE) == 0);
    /* Host to host: both ends through temporary allocations. */
    memset(back, 0, 2 * PAGE);
    cr_expect_eq(ze_copy(back, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(back, buffer, 2 * PAGE) == 0);
    expect_counts(0, 3, 0, 0, 0);
}

Test(ze, range_leaving_its_import_is_staged_both_ways)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(4, 37);
    cr_assert_eq(ze.import(ze.driver, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    unsigned char *device = ze_device(4 * PAGE);
    unsigned char *back = host_pages(2, 0);
    cr_expect_eq(ze_copy(device, buffer + PAGE, 2 * PAGE), ZE_RESULT_SUCCESS);
    ze_read_back(back, device, 2 * PAGE);
    cr_expect(memcmp(back, buffer + PAGE, 2 * PAGE) == 0);
    memset(buffer + PAGE, 0, 2 * PAGE);
    cr_expect_eq(ze_copy(buffer + PAGE, device, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(back, buffer + PAGE, 2 * PAGE) == 0);
    /* One byte less is inside: pinned. */
    cr_expect_eq(ze_copy(device, buffer + PAGE, PAGE), ZE_RESULT_SUCCESS);
    expect_counts(1, 3, 0, 0, 0);
}

Test(ze, range_over_two_adjacent_imports_is_staged)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(2, 39);
    cr_assert_eq(ze.import(ze.driver, buffer, PAGE), ZE_RESULT_SUCCESS);
    cr_assert_eq(ze.import(ze.driver, buffer + PAGE, PAGE), ZE_RESULT_SUCCESS);
    unsigned char *device = ze_device(PAGE);
    unsigned char *back = host_pages(1, 0);
    cr_expect_eq(ze_copy(device, buffer + PAGE / 2, PAGE), ZE_RESULT_SUCCESS);
    ze_read_back(back, device, PAGE);
    cr_expect(memcmp(back, buffer + PAGE / 2, PAGE) == 0);
    cr_expect_eq(ze_copy(buffer + PAGE / 2, device, PAGE), ZE_RESULT_SUCCESS);
    /* Each import alone is used. */
    cr_expect_eq(ze_copy(device, buffer, PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(device, buffer + PAGE, PAGE), ZE_RESULT_SUCCESS);
    expect_counts(2, 3, 0, 0, 0);
}

Test(ze, range_starting_before_an_import_is_staged)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(3, 41);
    cr_assert_eq(ze.import(ze.driver, buffer + PAGE, PAGE), ZE_RESULT_SUCCESS);
    unsigned char *device = ze_device(3 * PAGE);
    unsigned char *back = host_pages(3, 0);
    cr_expect_eq(ze_copy(device, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(device, buffer, 3 * PAGE), ZE_RESULT_SUCCESS);
    ze_read_back(back, device, 3 * PAGE);
    cr_expect(memcmp(back, buffer, 3 * PAGE) == 0);
    expect_counts(0, 3, 0, 0, 0);
}

Test(ze, released_memory_is_staged_again)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(1, 43);
    unsigned char *device = ze_device(PAGE);
    cr_assert_eq(ze.import(ze.driver, buffer, PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(device, buffer, PAGE), ZE_RESULT_SUCCESS);
    cr_assert_eq(ze.release(ze.driver, buffer + 10), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(device, buffer, PAGE), ZE_RESULT_SUCCESS);
    expect_counts(1, 1, 0, 0, 0);
}

Test(ze, device_ranges_and_device_to_device)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *first = ze_device(PAGE), *second = ze_device(PAGE);
    unsigned char *buffer = host_pages(2, 45);
    unsigned char *back = host_pages(1, 0);
    cr_assert_eq(ze.import(ze.driver, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    /* A device range that leaves its block: no allocation for that end. */
    cr_expect_eq(ze_copy(first, buffer, 2 * PAGE), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    cr_expect_eq(ze_copy(buffer, first + PAGE / 2, PAGE), ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    /* One byte is never range-checked. */
    cr_expect_eq(ze_copy(first + PAGE - 1, buffer, 1), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(first, buffer, PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(second, first, PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(back, second, PAGE), ZE_RESULT_SUCCESS);
    cr_expect(memcmp(back, buffer, PAGE) == 0);
    expect_counts(2, 1, 2, 0, 1);
    ze_memory_allocation_properties_t properties = {ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES,
                                                    NULL, 0, 0, 0};
    ze_device_handle_t owner = NULL;
    cr_expect_eq(ze.alloc_properties(ze.context, second + 7, &properties, &owner),
                 ZE_RESULT_SUCCESS);
    cr_expect_eq(properties.type, ZE_MEMORY_TYPE_DEVICE);
    cr_expect_eq(owner, ze.device);
    cr_expect_eq(ze.alloc_properties(ze.context, buffer, &properties, &owner), ZE_RESULT_SUCCESS);
    cr_expect_eq(properties.type, ZE_MEMORY_TYPE_UNKNOWN);
    cr_expect_eq(ze.mem_free(ze.context, second + 7), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    cr_expect_eq(ze.mem_free(ze.context, second), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze.mem_free(ze.context, second), ZE_RESULT_ERROR_INVALID_ARGUMENT);
}

Test(ze, size_zero_null_and_arguments)
{
    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    unsigned char *buffer = host_pages(1, 47);
    cr_expect_eq(ze_copy(buffer, buffer + 1, 0), ZE_RESULT_SUCCESS);
    cr_expect_eq(ze_copy(NULL, buffer, 1), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    cr_expect_eq(ze_copy(buffer, NULL, 1), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    cr_expect_eq(ze.append_copy(ze.list, buffer, buffer + 1, 1, NULL, 1, NULL),
                 ZE_RESULT_ERROR_INVALID_SIZE);
    cr_expect_eq(ze.append_copy(NULL, buffer, buffer + 1, 1, NULL, 0, NULL),
                 ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    expect_counts(0, 0, 4, 0, 0);
    ze_device_mem_alloc_desc_t desc = {ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
    void *device = buffer;
    cr_expect_eq(ze.alloc_device(ze.context, &desc, 0, 0, ze.device, &device),
                 ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    cr_expect_eq(device, NULL);
    cr_expect_eq(ze.alloc_device(ze.context, &desc, PAGE, 3, ze.device, &device),
                 ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);
}

/* The same geometry, the two vendors' rules: HIP refuses a range that
 * leaves its registration, Level Zero stages it. */
Test(vendors, a_range_leaving_its_registration)
{
    load_hip();
    unsigned char *buffer = host_pages(2, 49);
    cr_assert_eq(hip.host_register(buffer, PAGE, 0), hipSuccess);
    unsigned char *device = hip_device(2 * PAGE);
    cr_expect_eq(hip.copy(device, buffer, 2 * PAGE, hipMemcpyHostToDevice), hipErrorInvalidValue);
    uint64_t (*hip_refused)(int) = copy_count;

    load_ze(ZE_COMMAND_QUEUE_MODE_DEFAULT);
    cr_assert_eq(ze.import(ze.driver, buffer, PAGE), ZE_RESULT_SUCCESS);
    unsigned char *ze_block = ze_device(2 * PAGE);
    cr_expect_eq(ze_copy(ze_block, buffer, 2 * PAGE), ZE_RESULT_SUCCESS);
    cr_expect_eq(hip_refused(FAKE_GPU_COPY_REFUSED), 1);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_REFUSED), 0);
    cr_expect_eq(copy_count(FAKE_GPU_COPY_STAGED), 1);
}
