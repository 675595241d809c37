/* fake_cuda: a test double for the part of the CUDA *driver* API (libcuda.so.1)
 * that pinshim and the fake runtime (fake_cudart.h) use. Never shipped.
 *
 * Built as a shared library whose file name and DT_SONAME are libcuda.so.1, in
 * a build directory of its own (tests/fake_cudart/driver/), so that once it is
 * loaded by absolute path, dlopen("libcuda.so.1", RTLD_NOLOAD) finds it (glibc
 * matches sonames of loaded objects). It exports the driver entry points below
 * and a fake-only query/control API (fake_cuda_*); the fake runtime finds the
 * latter to tell a real libcuda from this one and never uses a real one.
 *
 * What is modelled (numbers from cuda.h; "documented" means cuda.h says so,
 * "inferred" means the real driver is believed to behave so but cuda.h does
 * not say, "chosen" means the double had to pick):
 *
 *  - Initialisation. Every call but cuDriverGetVersion, cuGetErrorName and
 *    cuGetErrorString returns CUDA_ERROR_NOT_INITIALIZED (3) before cuInit(0)
 *    succeeded (documented). cuInit with flags != 0: INVALID_VALUE (1); with no
 *    device (FAKE_CUDA_DEVICES=0): CUDA_ERROR_NO_DEVICE (100), and the driver
 *    stays uninitialised (so later calls still give 3).
 *  - Devices: FAKE_CUDA_DEVICES of them (default 1, at most 16); CUdevice is
 *    the ordinal. A bad ordinal or device: CUDA_ERROR_INVALID_DEVICE (101).
 *  - Primary contexts, one per device, with a reference count and an active
 *    flag. cuDevicePrimaryCtxRetain activates an inactive one (a context
 *    CREATION) and never pushes it (documented); Release drops a reference and
 *    at zero destroys it, Release with none held is INVALID_CONTEXT (201)
 *    (documented); Reset destroys it whatever its count and keeps the count
 *    (documented: "does not release it"). Chosen: every activation gets a new
 *    CUcontext handle, so a handle kept from before a Release-to-zero or a
 *    Reset stays destroyed (the real driver may hand out the same address).
 *    Handles are non-canonical addresses: dereferencing one faults.
 *  - Non-primary contexts: cuCtxCreate_v2 creates one (a CREATION) and pushes
 *    it on the calling thread's stack; cuCtxDestroy_v2 destroys it and pops it
 *    when it is the top of the calling thread's stack (documented). At most 64
 *    live at once (chosen; more: OUT_OF_MEMORY 2). cuCtxDestroy_v2 of a primary
 *    context, of NULL-like garbage or of a destroyed one: INVALID_CONTEXT (201,
 *    chosen; NULL: INVALID_VALUE 1).
 *  - Destroying a context (any of the three ways) drops every host
 *    registration made in it. INFERRED: the real driver frees a context's
 *    resources with it; cuda.h says so of allocations, not of registrations.
 *    Handles still current on other threads (and, for primary contexts, on
 *    the calling thread: Release and Reset never pop) become destroyed:
 *    cuCtxGetDevice and the registration calls there return
 *    CUDA_ERROR_CONTEXT_IS_DESTROYED (709, documented for cuCtxDestroy);
 *    cuCtxGetCurrent still returns the stale handle, and cuCtxSetCurrent /
 *    cuCtxPushCurrent refuse it with INVALID_CONTEXT (201).
 *  - Per thread, a context stack of at most 32 entries (chosen; a push beyond
 *    that: OUT_OF_MEMORY 2): cuCtxGetCurrent (top or NULL), cuCtxSetCurrent
 *    (replace the top; NULL pops, a no-op on an empty stack), cuCtxPushCurrent,
 *    cuCtxPopCurrent (INVALID_CONTEXT 201 when empty), cuCtxGetDevice (201 when
 *    no context is current).
 *  - Context creations are counted, in total, per device and per CREATOR: the
 *    shared object that called the public entry point (dladdr of its return
 *    address; the main program under its /proc/self/exe path, not argv[0]).
 *    The fake runtime creates primary contexts on behalf of its own caller through
 *    fake_cuda_internal_primary_ctx_retain, which takes that caller's address,
 *    so a context the runtime creates because libpinshim.so called
 *    cudaHostRegister is attributed to libpinshim.so. A caller that reaches an
 *    entry point by a tail call is attributed to its own caller (a limit of
 *    return addresses).
 *  - cuMemHostRegister_v2 (and the unversioned alias): needs a live current
 *    context (none: 201, destroyed: 709); injected failures
 *    (FAKE_CUDART_FAIL_*) come next; NULL, size 0, wrap-around or flags beyond
 *    0x0F (PORTABLE|DEVICEMAP|IOMEMORY|READ_ONLY): INVALID_VALUE (1); larger
 *    than FAKE_CUDA_MAX_REGISTER_BYTES: OUT_OF_MEMORY (2) (real R580+ drivers
 *    refuse 512 GiB and more); overlapping any registration of any context,
 *    in flight or not: HOST_MEMORY_ALREADY_REGISTERED (712); READ_ONLY with a
 *    context whose device lacks READ_ONLY_HOST_REGISTER_SUPPORTED:
 *    NOT_SUPPORTED (801, documented in cuda.h); then the pages are "pinned"
 *    as the open kernel modules pin them (pin_user_pages, FOLL_WRITE unless
 *    READ_ONLY, FOLL_LONGTERM on x86; any failure is NV_ERR_INVALID_ADDRESS,
 *    which libcuda reports as INVALID_VALUE, 1, as seen for read-only memory
 *    and remap_pfn_range pages): a hole, a mapping without read access,
 *    VM_IO or VM_PFNMAP (VmFlags io, pf), secretmem, a mapping without write
 *    access unless READ_ONLY, and with long-term pins (FAKE_CUDA_LONGTERM_PINS)
 *    a writable shared file mapping that needs dirty tracking (not shmem,
 *    memfd, SysV, hugetlbfs, ramfs: Linux 6.5's writable_file_mapping_allowed)
 *    are refused with 1. With FAKE_CUDA_HOST_PAGE_TABLES=1 (ATS, Grace) the
 *    driver only populates: no long-term pin, and read-only memory needs no
 *    READ_ONLY. The mappings are looked up with PROCMAP_QUERY (Linux 6.11;
 *    smaps for device and special mappings, and where the kernel lacks it),
 *    never touched. Each registration records its context, device and flags.
 *    Bookkeeping is one tree node per registration (never per page), so a
 *    200 GiB locked reservation registers in O(log n).
 *  - cuDeviceGetAttribute: HOST_REGISTER_SUPPORTED (99) is 1,
 *    PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES (100) is
 *    FAKE_CUDA_HOST_PAGE_TABLES, READ_ONLY_HOST_REGISTER_SUPPORTED (113) is
 *    FAKE_CUDA_READ_ONLY_REGISTER's for the device, HOST_NUMA_ID (134) is
 *    FAKE_CUDA_HOST_NUMA's for the device (INVALID_VALUE from a driver older
 *    than 12.2, which does not know it); other attributes below 150 are 0;
 *    others INVALID_VALUE (1). cuDeviceGetPCIBusId: "0000:17:00.0" for
 *    device 0, 18 for 1, ... (no such device in sysfs).
 *  - cuMemHostAlloc / cuMemFreeHost: the driver's own pinned memory. It maps
 *    it and calls mlock (munlock) through libc WHILE IT HOLDS ITS OWN LOCK,
 *    as a driver doing its own work may: a preloaded shim that calls back
 *    into the driver from there deadlocks. The memory counts as a live
 *    registration (PORTABLE|DEVICEMAP); cuMemHostRegister over it is 712,
 *    cuMemHostUnregister of it INVALID_VALUE.
 *  - cuMemHostGetDevicePointer_v2: the host pointer itself (unified
 *    addressing) inside a live registration made with DEVICEMAP; otherwise,
 *    or with flags, INVALID_VALUE.
 *  - Device memory: cuMemAlloc_v2 / cuMemFree_v2 need a live current context
 *    (201 / 709). cuMemAlloc_v2 of 0 bytes or to NULL: INVALID_VALUE
 *    (documented); beyond 4096 live allocations, or when the backing cannot
 *    be mapped: OUT_OF_MEMORY (2, chosen). An allocation is backed by raw
 *    mmap memory (MAP_NORESERVE, zeroed) and known by an address in fake
 *    device space, 0xDE00 << 48 upwards (chosen): non-canonical, so it is
 *    never a host address and dereferencing it faults, as a device pointer
 *    does on the host; each starts on a 2 MiB boundary with at least 2 MiB
 *    unallocated after it, and addresses are never reused (a stale pointer
 *    stays invalid). cuMemFree_v2 takes only the address cuMemAlloc_v2
 *    returned, from any live context (chosen); 0, an interior, freed or
 *    unknown address: INVALID_VALUE. Destroying a context (any of the three
 *    ways) frees its allocations (documented for cuDevicePrimaryCtxReset:
 *    "destroy all allocations"); so do a reset and fork (the child starts
 *    with none).
 *  - Copies: cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2, cuMemcpy
 *    and their Async forms (cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2,
 *    cuMemcpyDtoDAsync_v2, cuMemcpyAsync). In order: the state and a live
 *    current context (3, 4, 201, 709; not counted); 0 bytes: success, nothing
 *    looked at (chosen); the device side(s) must lie wholly inside one live
 *    allocation, of any context (chosen), and a host side must be non-NULL,
 *    not wrap and not lie in device space: else INVALID_VALUE (inferred; the
 *    real driver refuses pointers it does not know); then THE MEMCPY RULE
 *    for the host side of a host <-> device copy:
 *      documented (cuda.h's \note_memcpy on every cuMemcpy* and cudaMemcpy*,
 *      in NVIDIA's CUDA Driver/Runtime API documentation): "Memory regions
 *      requested must be either entirely registered with CUDA, or in the
 *      case of host pageable transfers, not registered at all. Memory
 *      regions spanning over allocations that are both registered and not
 *      registered with CUDA are not supported and will return
 *      CUDA_ERROR_INVALID_VALUE."
 *      measured (H200, driver 580, cudaMemcpy and cudaMemcpyAsync, both
 *      directions): a host range that starts in one registration and runs
 *      into the next (two separate cuMemHostRegister calls on adjacent
 *      pages) fails with 1; inside one registration it works (pinned); from
 *      memory registered nowhere it works (pageable).
 *    So [host, host + size) must lie inside ONE registration (a
 *    cuMemHostRegister range or cuMemHostAlloc memory: PINNED) or overlap
 *    NONE (PAGEABLE); anything else -- spanning two registrations, adjacent
 *    or not, or mixing registered and unregistered bytes, whichever comes
 *    first -- is REFUSED: INVALID_VALUE (1), nothing copied, a copy_refused
 *    line in FAKE_CUDA_LOG. Registrations of every context count, and so do
 *    ranges in flight ("registering" / "unregistering"; chosen: the real
 *    driver serialises a copy with a registration in progress, the fake
 *    treats the range as registered and never waits). Device to device and
 *    host to host (cuMemcpy with two host addresses; chosen: no rule) are
 *    plain copies. cuMemcpy / cuMemcpyAsync tell device from host by the
 *    address (unified addressing): fake device space is device memory,
 *    anything else host (chosen). The copy is done before the call returns,
 *    Async or not (chosen), with the state lock held; the stream is never
 *    looked at (any handle, NULL included, is accepted), and
 *    cuStreamSynchronize only checks the state and context. Host memory is
 *    read and written with process_vm_readv on the process itself (plain
 *    memcpy where the system refuses that call, as qemu-user does): a host
 *    range that faults (unmapped, or read-only as a destination) is
 *    INVALID_VALUE, part of it maybe copied (chosen: the real driver would
 *    fault in its staging copy, or DMA to the pages it pinned). Each copy
 *    past the context check is counted by what became of it
 *    (fake_cuda_copy_count, enum fake_cuda_copy_kind).
 *  - cuMemHostUnregister: needs a live current context (201 / 709); an
 *    unknown base: HOST_MEMORY_NOT_REGISTERED (713); a pointer inside a
 *    registration but not its base, or cuMemHostAlloc's memory:
 *    INVALID_VALUE (1). A registration can be
 *    unregistered from ANY live context, not only the one that made it:
 *    INFERRED from portable memory (CU_MEMHOSTREGISTER_PORTABLE, which the
 *    runtime's default flags include on UVA systems).
 *  - Latency: a registration sleeps FAKE_CUDA_REGISTER_SECONDS_PER_GIB x its
 *    size in GiB (decimal, default 0; a real H200 takes about 0.1), an
 *    unregistration FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB (default: a tenth of
 *    the register rate), both with the double's lock NOT held, so concurrent
 *    calls overlap in time. Meanwhile the range is reserved ("registering" /
 *    "unregistering" in fake_cuda_snapshot): it blocks overlapping
 *    registrations, is not live, and an unregistration of it gets 713. A
 *    registration whose context is destroyed while it sleeps returns 709.
 *    fake_cuda_wake_sleepers() ends every sleep early.
 *  - Invariant checks (FAKE_CUDART_CHECK, default on), at register and at
 *    unregister time: every page of the range mapped and every VMA under it
 *    locked (read from /proc/self/smaps, page-granular, streamed through a
 *    stack buffer; hugetlb VMAs count as locked: mlock leaves VM_LOCKED off
 *    them), and no other registration on its first or last page. Violations
 *    never change a result by themselves (a hole is refused, as above); they
 *    are counted and logged.
 *  - fork: a child of a process whose driver had been initialised gets
 *    CUDA_ERROR_NOT_INITIALIZED (3) from every call, cuInit included, and
 *    starts with no registrations, no contexts and zeroed counters (the
 *    parent's are not the child's). INFERRED: NVIDIA documents only that a
 *    child cannot use CUDA state made before fork; 3 is what the driver is
 *    reported to answer there. A child of a process that never initialised
 *    can initialise normally.
 *  - Teardown: with FAKE_CUDA_UNLOAD_AT_EXIT=1, once the driver's exit handler
 *    has run (registered when the driver is loaded, so it runs before exit
 *    handlers registered earlier and before library destructors), every call
 *    returns CUDA_ERROR_DEINITIALIZED (4), except cuDriverGetVersion,
 *    cuGetErrorName and cuGetErrorString (chosen: cuda.h lists no
 *    DEINITIALIZED for them). Registrations stay in the table, for queries.
 *  - Nothing here calls malloc; the registration table and device memory
 *    live in raw mmap memory; per-thread state is initial-exec TLS.
 *
 * Environment variables, read when the driver is loaded and again by
 * fake_cuda_reset() / fake_cuda_reload_config():
 *
 *   FAKE_CUDA_DEVICES=N                    devices (default 1, at most 16; 0: cuInit
 *                                          returns 100). FAKE_CUDART_DEVICES is read
 *                                          when it is unset (the runtime double's
 *                                          older name).
 *   FAKE_CUDA_MAX_REGISTER_BYTES=N[K|M|G|T] larger registrations fail with 2
 *                                          (default: unlimited; suffixes are powers
 *                                          of 1024)
 *   FAKE_CUDA_REGISTER_SECONDS_PER_GIB=S   simulated registration latency (decimal)
 *   FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB=S unregistration latency (default S/10)
 *   FAKE_CUDA_UNLOAD_AT_EXIT=1             DEINITIALIZED (4) after the exit handler
 *   FAKE_CUDA_DRIVER_VERSION=N             what cuDriverGetVersion reports (13000)
 *   FAKE_CUDA_READ_ONLY_REGISTER=1|0|L     attribute 113: for every device, or a list
 *                                          of 0/1 per device ("1,0"; the last repeats);
 *                                          default 1
 *   FAKE_CUDA_HOST_PAGE_TABLES=1           attribute 100 (ATS): populate, never pin
 *   FAKE_CUDA_HOST_NUMA=N|L                attribute 134: the host NUMA node of every
 *                                          device, or a list ("0,1"; the last repeats;
 *                                          -1: no NUMA); default 0
 *   FAKE_CUDA_LONGTERM_PINS=auto|0|1       long-term pins (default auto: on x86-64
 *                                          with Linux 6.5 or later)
 *   FAKE_CUDA_PIN_RULES=0                  pin any memory without looking at its
 *                                          mapping (default 1: the rules above). The
 *                                          look is an ioctl on Linux 6.11+ but reads
 *                                          /proc/self/smaps on older kernels and under
 *                                          qemu-user: for tests that count the shim's
 *                                          file system calls, or a million calls
 *   FAKE_CUDA_LOG=path                     driver events, see below
 *   FAKE_CUDART_FAIL_REGISTER_EVERY=N      cuMemHostRegister calls N, 2N, ... fail
 *                                          without effect (counted among calls that
 *                                          pass the state and context checks)
 *   FAKE_CUDART_FAIL_UNREGISTER_EVERY=N    the same for cuMemHostUnregister
 *   FAKE_CUDART_FAIL_ERROR=E               their error (default 2)
 *   FAKE_CUDART_CHECK=0                    skip the invariant checks
 *   FAKE_CUDART_LOG=path                   the runtime double's log format, below
 *
 * Log lines, one write(2) each on an O_APPEND descriptor.
 * FAKE_CUDART_LOG gets, for every cuMemHostRegister / cuMemHostUnregister call
 * (through the fake runtime or not) and every violation, the runtime double's
 * lines, which tests/support/fake_log.c parses (flags are the driver's, error
 * the driver's CUresult, which the fake runtime returns unchanged):
 *   register <pid> 0x<ptr> <size> <flags> <err>
 *   unregister <pid> 0x<ptr> <err>
 *   violation <pid> <kind> 0x<ptr> <size>
 * FAKE_CUDA_LOG gets the driver's own events:
 *   ctx_create <pid> 0x<ctx> <device> primary|created <creator object>
 *   ctx_destroy <pid> 0x<ctx> <device> release|reset|destroy <registrations dropped>
 *   cu_register <pid> 0x<ptr> <size> <flags> <err> <device> 0x<ctx>
 *   cu_unregister <pid> 0x<ptr> <err> <device> 0x<ctx>
 *   copy_refused <pid> 0x<host ptr> <size> htod|dtoh <device> 0x<ctx>
 * (device -1 and ctx 0x0 when no live context was current; the creator is the
 * rest of the line). copy_refused is a copy the memcpy rule refused; nothing
 * else about copies is logged, and nothing about them in FAKE_CUDART_LOG.
 * Registrations dropped with their context leave no unregister line, only
 * the count on ctx_destroy. Point the two variables at different files:
 * fake_log.c counts driver-only lines as malformed.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CUresult values the double returns (same numbers as cuda.h). */
enum fake_cu_result {
    FAKE_CU_SUCCESS = 0,
    FAKE_CU_ERROR_INVALID_VALUE = 1,
    FAKE_CU_ERROR_OUT_OF_MEMORY = 2,
    FAKE_CU_ERROR_NOT_INITIALIZED = 3,
    FAKE_CU_ERROR_DEINITIALIZED = 4,
    FAKE_CU_ERROR_STUB_LIBRARY = 34,
    FAKE_CU_ERROR_NO_DEVICE = 100,
    FAKE_CU_ERROR_INVALID_DEVICE = 101,
    FAKE_CU_ERROR_INVALID_CONTEXT = 201,
    FAKE_CU_ERROR_CONTEXT_IS_DESTROYED = 709,
    FAKE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    FAKE_CU_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    FAKE_CU_ERROR_NOT_PERMITTED = 800,
    FAKE_CU_ERROR_NOT_SUPPORTED = 801,
    FAKE_CU_ERROR_ILLEGAL_STATE = 401,
    FAKE_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    FAKE_CU_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    FAKE_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    FAKE_CU_ERROR_UNKNOWN = 999,
};

/* Device attributes the double answers (cuda.h CU_DEVICE_ATTRIBUTE_*). */
#define FAKE_CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED 99
#define FAKE_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 100
#define FAKE_CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED 113
#define FAKE_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID 134
#define FAKE_CU_DEVICE_ATTRIBUTE_MAX 150

/* cuMemHostAlloc flags (cuda.h CU_MEMHOSTALLOC_*). */
#define FAKE_CU_MEMHOSTALLOC_PORTABLE 0x01u
#define FAKE_CU_MEMHOSTALLOC_DEVICEMAP 0x02u
#define FAKE_CU_MEMHOSTALLOC_WRITECOMBINED 0x04u

/* cuMemHostRegister flags (cuda.h CU_MEMHOSTREGISTER_*). */
#define FAKE_CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define FAKE_CU_MEMHOSTREGISTER_DEVICEMAP 0x02u
#define FAKE_CU_MEMHOSTREGISTER_IOMEMORY 0x04u
#define FAKE_CU_MEMHOSTREGISTER_READ_ONLY 0x08u
#define FAKE_CU_MEMHOSTREGISTER_VALID_FLAGS 0x0Fu

#define FAKE_CUDA_MAX_DEVICES 16
#define FAKE_CUDA_STACK_DEPTH 32
#define FAKE_CUDA_MAX_CREATED_CONTEXTS 64

/* The exported entry points, one counter each (aliases apart), for
 * fake_cuda_call_count(). */
enum fake_cu_call {
    FAKE_CU_CALL_INIT,
    FAKE_CU_CALL_DRIVER_GET_VERSION,
    FAKE_CU_CALL_GET_ERROR_NAME,
    FAKE_CU_CALL_GET_ERROR_STRING,
    FAKE_CU_CALL_DEVICE_GET_COUNT,
    FAKE_CU_CALL_DEVICE_GET,
    FAKE_CU_CALL_PRIMARY_CTX_GET_STATE,
    FAKE_CU_CALL_PRIMARY_CTX_RETAIN,
    FAKE_CU_CALL_PRIMARY_CTX_RELEASE,    /* cuDevicePrimaryCtxRelease */
    FAKE_CU_CALL_PRIMARY_CTX_RELEASE_V2, /* cuDevicePrimaryCtxRelease_v2 */
    FAKE_CU_CALL_PRIMARY_CTX_RESET,
    FAKE_CU_CALL_PRIMARY_CTX_RESET_V2,
    FAKE_CU_CALL_CTX_CREATE_V2,
    FAKE_CU_CALL_CTX_DESTROY_V2,
    FAKE_CU_CALL_CTX_GET_CURRENT,
    FAKE_CU_CALL_CTX_SET_CURRENT,
    FAKE_CU_CALL_CTX_PUSH_CURRENT,
    FAKE_CU_CALL_CTX_PUSH_CURRENT_V2,
    FAKE_CU_CALL_CTX_POP_CURRENT,
    FAKE_CU_CALL_CTX_POP_CURRENT_V2,
    FAKE_CU_CALL_CTX_GET_DEVICE,
    FAKE_CU_CALL_MEM_HOST_REGISTER,
    FAKE_CU_CALL_MEM_HOST_REGISTER_V2,
    FAKE_CU_CALL_MEM_HOST_UNREGISTER,
    /* fake_cuda_internal_primary_ctx_retain (the fake runtime's retain) */
    FAKE_CU_CALL_INTERNAL_PRIMARY_CTX_RETAIN,
    FAKE_CU_CALL_DEVICE_GET_ATTRIBUTE,
    FAKE_CU_CALL_MEM_HOST_ALLOC,
    FAKE_CU_CALL_MEM_FREE_HOST,
    FAKE_CU_CALL_MEM_HOST_GET_DEVICE_POINTER_V2,
    FAKE_CU_CALL_DEVICE_GET_PCI_BUS_ID,
    FAKE_CU_CALL_MEM_ALLOC_V2,
    FAKE_CU_CALL_MEM_FREE_V2,
    FAKE_CU_CALL_MEMCPY_HTOD_V2,
    FAKE_CU_CALL_MEMCPY_DTOH_V2,
    FAKE_CU_CALL_MEMCPY_DTOD_V2,
    FAKE_CU_CALL_MEMCPY, /* cuMemcpy (unified) */
    FAKE_CU_CALL_MEMCPY_HTOD_ASYNC_V2,
    FAKE_CU_CALL_MEMCPY_DTOH_ASYNC_V2,
    FAKE_CU_CALL_MEMCPY_DTOD_ASYNC_V2,
    FAKE_CU_CALL_MEMCPY_ASYNC, /* cuMemcpyAsync (unified) */
    FAKE_CU_CALL_STREAM_SYNCHRONIZE,
    FAKE_CU_CALL_THREAD_EXCHANGE_STREAM_CAPTURE_MODE,
    FAKE_CU_CALL_STREAM_BEGIN_CAPTURE_V2,
    FAKE_CU_CALL_STREAM_END_CAPTURE,
    FAKE_CU_CALL_KIND_COUNT
};

/* CUstreamCaptureMode (cuda.h). */
enum fake_cu_stream_capture_mode {
    FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    FAKE_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    FAKE_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};

/* What became of a copy (fake_cuda_copy_count, fake_cuda_copy_bytes). Copies
 * that fail the state or context checks (3, 4, 201, 709) and copies of 0
 * bytes are counted nowhere. */
enum fake_cuda_copy_kind {
    /* host <-> device, the host range inside ONE registration: done */
    FAKE_CUDA_COPY_PINNED,
    /* host <-> device, the host range overlapping no registration: done */
    FAKE_CUDA_COPY_PAGEABLE,
    /* host <-> device, the host range spanning registrations or mixing
     * registered and unregistered bytes: INVALID_VALUE, nothing copied */
    FAKE_CUDA_COPY_REFUSED,
    /* device -> device: done */
    FAKE_CUDA_COPY_DEVICE,
    /* host -> host through cuMemcpy / cuMemcpyAsync: done, no rule */
    FAKE_CUDA_COPY_HOST,
    /* INVALID_VALUE for any other reason: a device range outside every live
     * allocation, a NULL, wrapping or device-space host range, a host range
     * that faults */
    FAKE_CUDA_COPY_INVALID,
    FAKE_CUDA_COPY_KIND_COUNT
};

/* Broken invariants (same numbers and log names as enum fake_cudart_violation
 * of fake_cudart.h). */
enum fake_cuda_violation {
    FAKE_CU_VIOLATION_REGISTER_UNMAPPED,     /* "register_unmapped" */
    FAKE_CU_VIOLATION_REGISTER_NOT_LOCKED,   /* "register_not_locked" */
    FAKE_CU_VIOLATION_PAGE_SHARED,           /* "page_shared" */
    FAKE_CU_VIOLATION_UNREGISTER_UNMAPPED,   /* "unregister_unmapped" */
    FAKE_CU_VIOLATION_UNREGISTER_NOT_LOCKED, /* "unregister_not_locked" */
    FAKE_CU_VIOLATION_KIND_COUNT
};

/* What a registration is doing (only a sleeping call leaves the middle two). */
enum fake_cuda_registration_state {
    FAKE_CUDA_REGISTRATION_LIVE,
    FAKE_CUDA_REGISTRATION_REGISTERING,
    FAKE_CUDA_REGISTRATION_UNREGISTERING,
};

struct fake_cuda_registration {
    uintptr_t base;
    size_t size;
    unsigned flags; /* as cuMemHostRegister received them */
    int device;
    void *context; /* the CUcontext current when it was made */
    int state;     /* enum fake_cuda_registration_state */
};

struct fake_cuda_primary_state {
    int active;        /* 1 while the primary context exists */
    unsigned refcount; /* references held (Retain minus Release) */
    void *context;     /* its handle while active, else NULL */
};

/* One shared object that called the driver: its path (dladdr's dli_fname;
 * /proc/self/exe for the main program; "(unknown)" outside any object; at
 * most 255 bytes, the tail kept) and what it did. */
struct fake_cuda_caller {
    char object[256];
    uint64_t calls;            /* all entry points */
    uint64_t contexts_created; /* creations attributed to it */
};

/* The driver entry points (CUresult is int, CUcontext an opaque pointer,
 * CUdevice an int). Define FAKE_CUDA_NO_CUDA_PROTOTYPES when the real cuda.h
 * is in scope. */
#ifndef FAKE_CUDA_NO_CUDA_PROTOTYPES
typedef struct CUctx_st *CUcontext;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st *CUstream;
int cuInit(unsigned int flags);
int cuDriverGetVersion(int *driver_version);
int cuGetErrorName(int error, const char **name);
int cuGetErrorString(int error, const char **text);
int cuDeviceGetCount(int *count);
int cuDeviceGet(CUdevice *device, int ordinal);
int cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active);
int cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device);
int cuDevicePrimaryCtxRelease(CUdevice device);
int cuDevicePrimaryCtxRelease_v2(CUdevice device);
int cuDevicePrimaryCtxReset(CUdevice device);
int cuDevicePrimaryCtxReset_v2(CUdevice device);
int cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device);
int cuCtxDestroy_v2(CUcontext context);
int cuCtxGetCurrent(CUcontext *context);
int cuCtxSetCurrent(CUcontext context);
int cuCtxPushCurrent(CUcontext context);
int cuCtxPushCurrent_v2(CUcontext context);
int cuCtxPopCurrent(CUcontext *context);
int cuCtxPopCurrent_v2(CUcontext *context);
int cuCtxGetDevice(CUdevice *device);
int cuMemHostRegister(void *pointer, size_t size, unsigned int flags);
int cuMemHostRegister_v2(void *pointer, size_t size, unsigned int flags);
int cuMemHostUnregister(void *pointer);
int cuDeviceGetAttribute(int *value, int attribute, CUdevice device);
int cuMemHostAlloc(void **pointer, size_t size, unsigned int flags);
int cuMemFreeHost(void *pointer);
int cuMemHostGetDevicePointer_v2(unsigned long long *device_pointer, void *pointer,
                                 unsigned int flags);
int cuMemAlloc_v2(CUdeviceptr *device_pointer, size_t size);
int cuMemFree_v2(CUdeviceptr device_pointer);
int cuMemcpyHtoD_v2(CUdeviceptr destination, const void *source, size_t size);
int cuMemcpyDtoH_v2(void *destination, CUdeviceptr source, size_t size);
int cuMemcpyDtoD_v2(CUdeviceptr destination, CUdeviceptr source, size_t size);
int cuMemcpy(CUdeviceptr destination, CUdeviceptr source, size_t size);
int cuMemcpyHtoDAsync_v2(CUdeviceptr destination, const void *source, size_t size, CUstream stream);
int cuMemcpyDtoHAsync_v2(void *destination, CUdeviceptr source, size_t size, CUstream stream);
int cuMemcpyDtoDAsync_v2(CUdeviceptr destination, CUdeviceptr source, size_t size, CUstream stream);
int cuMemcpyAsync(CUdeviceptr destination, CUdeviceptr source, size_t size, CUstream stream);
int cuStreamSynchronize(CUstream stream);
#endif

/* ---- The fake-only API (exported by the driver double only). ---- */

/* Internal, for the fake runtime: cuDevicePrimaryCtxRetain with the creation
 * (if any) attributed to the shared object containing caller. */
int fake_cuda_internal_primary_ctx_retain(void **context, int device, const void *caller);

/* Live registrations (state LIVE), in all contexts. */
size_t fake_cuda_live_count(void);

/* Copies up to max registrations (every state) with base >= first_base, sorted
 * by base, into out; returns how many it copied. */
size_t fake_cuda_snapshot_from(uintptr_t first_base, struct fake_cuda_registration *out,
                               size_t max);
size_t fake_cuda_snapshot(struct fake_cuda_registration *out, size_t max);

/* Copies up to max LIVE registrations, sorted by base, into out, in one
 * atomic step (the fake runtime's fake_cudart_snapshot; the layout is that of
 * struct fake_cudart_range). */
struct fake_cuda_range {
    uintptr_t base;
    size_t size;
    unsigned flags;
};
size_t fake_cuda_snapshot_live(struct fake_cuda_range *out, size_t max);

/* 1 and *out (may be NULL) when address lies inside a LIVE registration. */
int fake_cuda_lookup(const void *address, struct fake_cuda_registration *out);

/* Live registrations made on one device / in one context. */
size_t fake_cuda_registrations_on_device(int device);
size_t fake_cuda_registrations_in_context(const void *context);

/* Calls sleeping in simulated latency right now (registrations,
 * unregistrations), and how many registration calls have completed with
 * success since load or the last reset. */
size_t fake_cuda_registrations_in_flight(void);
size_t fake_cuda_unregistrations_in_flight(void);
uint64_t fake_cuda_registrations_completed(void);

/* Copies since load or the last reset (enum fake_cuda_copy_kind): how many,
 * and how many bytes they asked to copy. 0 for an unknown kind. */
uint64_t fake_cuda_copy_count(int kind);
uint64_t fake_cuda_copy_bytes(int kind);

/* Live device allocations (cuMemAlloc_v2), in all contexts. */
size_t fake_cuda_device_allocations(void);

/* 1 when address lies in fake device address space (whether or not an
 * allocation holds it; cuMemcpy's inference), else 0. */
int fake_cuda_is_device_pointer(unsigned long long address);

/* Ends every latency sleep now (those that start later sleep normally). */
void fake_cuda_wake_sleepers(void);

/* Violations since load or the last reset: all, or one kind. */
size_t fake_cuda_violation_count(void);
size_t fake_cuda_violation_count_of(int kind);

/* Calls to one entry point (enum fake_cu_call): all of them, or those made by
 * shared objects whose path contains object_substring. */
uint64_t fake_cuda_call_count(int which);
uint64_t fake_cuda_call_count_by(int which, const char *object_substring);

/* Context creations (primary activations and cuCtxCreate_v2): all, by the
 * objects whose path contains object_substring, or on one device. */
uint64_t fake_cuda_contexts_created(void);
uint64_t fake_cuda_contexts_created_by(const char *object_substring);
uint64_t fake_cuda_contexts_created_on(int device);

/* Copies up to max callers seen since load or the last reset, in order of
 * first call. At most 32 distinct objects are told apart; later ones share
 * "(other)" (listed last, when it has calls). */
size_t fake_cuda_callers(struct fake_cuda_caller *out, size_t max);

/* The primary context of device: 0 and *out, or -1 for a bad device. */
int fake_cuda_primary_state(int device, struct fake_cuda_primary_state *out);

/* The calling thread's context stack: depth, and top (NULL when empty). */
unsigned fake_cuda_context_stack_depth(void);
void *fake_cuda_context_stack_top(void);

/* 1 once cuInit succeeded (and no reset or fork since). */
int fake_cuda_initialized(void);

/* Back to a freshly loaded driver in a process that never initialised:
 * drops registrations, contexts (every thread's stack), counters, violations,
 * the fork and teardown states, and re-reads the environment. */
void fake_cuda_reset(void);

/* Re-reads the environment, keeping registrations, contexts and counters. */
void fake_cuda_reload_config(void);

/* Overrides FAKE_CUDART_FAIL_*: register calls reg, 2*reg, ... and unregister
 * calls unreg, 2*unreg, ... (counted from now) fail with error; 0 disables.
 * An error <= 0 means OUT_OF_MEMORY (2). */
void fake_cuda_set_fail_every(unsigned reg, unsigned unreg, int error);

/* Overrides FAKE_CUDART_CHECK. */
void fake_cuda_set_check(int on);

/* Does what the driver's exit handler does (enter the DEINITIALIZED state
 * when FAKE_CUDA_UNLOAD_AT_EXIT=1), so a test can observe it in-process. */
void fake_cuda_simulate_exit(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_CUDA_H */
