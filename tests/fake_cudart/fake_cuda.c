/* fake_cuda: the fake CUDA driver (libcuda.so.1). See fake_cuda.h for what it
 * models and how it is configured.
 *
 * The shim under test interposes the allocator and the mapping functions, so
 * nothing here calls malloc/free: the registration table lives in memory
 * obtained with raw mmap/mremap system calls (the libc wrappers could be the
 * shim's, which would call back into us), per-thread state is initial-exec TLS
 * (a dlopen'ed library's dynamic TLS is allocated with malloc on a thread's
 * first access), and log lines are formatted without stdio.
 *
 * Locks: state_lock guards everything but the caller table (object_lock) and
 * the latency sleeps (sleep_lock, taken under state_lock at most, never the
 * other way round). dladdr, which takes the dynamic loader's
 * lock, is only ever called with none of them held, so a thread inside
 * dlopen (holding the loader's lock) that calls in cannot deadlock with us.
 */
#include "fake_cuda.h"
#include "fake_line.h"
#include "procmap_query.h"
#include "smaps_locked.h"

#include <dlfcn.h>
#include <link.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(uintptr_t) == 8, "context handles are built for 64-bit addresses");

/* Built with -fvisibility=hidden: only what is marked here is exported.
 * noinline keeps __builtin_return_address(0) the caller's. */
#define FAKE_EXPORT __attribute__((visibility("default"), noinline))
#define CALLER() __builtin_extract_return_addr(__builtin_return_address(0))

enum { MAX_OBJECTS = 32, CALLER_CACHE_SLOTS = 256 };

/* ------------------------------------------------------------------------ */
/* Configuration and global state (all guarded by state_lock).              */

struct fake_config {
    unsigned device_count;
    unsigned fail_register_every;
    unsigned fail_unregister_every;
    int fail_error;
    bool unload_at_exit;
    bool check;
    uint64_t max_register_bytes;
    double register_seconds_per_gib;
    double unregister_seconds_per_gib;
    int driver_version;
    /* CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, per device. */
    bool read_only_register[FAKE_CUDA_MAX_DEVICES];
    /* CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES (ATS). */
    bool host_page_tables;
    /* CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, per device (-1: no NUMA). */
    int host_numa_id[FAKE_CUDA_MAX_DEVICES];
    /* Whether pins are long-term (FOLL_LONGTERM): the open kernel modules on
     * x86 since 550.67; then kernels from 6.5 refuse writable shared file
     * mappings that need dirty tracking. */
    bool longterm_pins;
    bool pin_rules; /* FAKE_CUDA_PIN_RULES: look at the mapping before pinning */
};

/* One node of the AVL tree of registrations. Nodes live in one array
 * (node_pool) and refer to each other by index; index 0 means "none". */
struct registration_node {
    uintptr_t base;
    size_t size;
    uint64_t id; /* never reused: a sleeping call finds its own node again */
    uint32_t context;
    int32_t device;
    unsigned flags;
    uint32_t left;
    uint32_t right;
    int32_t height;
    uint8_t state;      /* enum fake_cuda_registration_state */
    uint8_t host_alloc; /* made by cuMemHostAlloc: freed with cuMemFreeHost only */
};

struct primary_context {
    unsigned refcount;
    uint32_t serial; /* 0 while inactive */
};

struct created_context {
    uint32_t serial; /* 0: free slot */
    int device;
};

/* The calling thread's context stack. It is valid only while generation
 * equals stack_generation: a reset or a fork empties every thread's stack at
 * once by moving stack_generation on. */
struct thread_stack {
    uint32_t generation;
    uint32_t depth;
    uint32_t serials[FAKE_CUDA_STACK_DEPTH];
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static bool config_loaded;
static struct fake_config config;
static int cudart_log_fd = -1; /* FAKE_CUDART_LOG */
static int cuda_log_fd = -1;   /* FAKE_CUDA_LOG */
static uintptr_t page_size = 4096;

static bool initialized;
static bool fork_poisoned;
static bool deinitialized;
static uint64_t state_epoch; /* moves on at every reset and fork */

static struct primary_context primaries[FAKE_CUDA_MAX_DEVICES];
static struct created_context created[FAKE_CUDA_MAX_CREATED_CONTEXTS];
static uint32_t last_serial; /* handles 1..last_serial were handed out */
static uint32_t stack_generation = 1;
static uint64_t contexts_created_total;
static uint64_t contexts_created_on_device[FAKE_CUDA_MAX_DEVICES];

static struct registration_node *node_pool;
static uint32_t node_pool_capacity;
static uint32_t node_pool_used; /* next never-used index; 0 is reserved */
static uint32_t free_node_head;
static uint32_t tree_root;
static size_t live_count;
static uint64_t last_registration_id;
static size_t registrations_in_flight;
static size_t unregistrations_in_flight;
static uint64_t registrations_completed;

static size_t violation_counts[FAKE_CU_VIOLATION_KIND_COUNT];
static uint64_t copy_counts[FAKE_CUDA_COPY_KIND_COUNT];
static uint64_t copy_byte_counts[FAKE_CUDA_COPY_KIND_COUNT];
static uint64_t register_fail_counter;
static uint64_t unregister_fail_counter;

static _Thread_local struct thread_stack thread_stack __attribute__((tls_model("initial-exec")));

static const char *const violation_names[FAKE_CU_VIOLATION_KIND_COUNT] = {
    [FAKE_CU_VIOLATION_REGISTER_UNMAPPED] = "register_unmapped",
    [FAKE_CU_VIOLATION_REGISTER_NOT_LOCKED] = "register_not_locked",
    [FAKE_CU_VIOLATION_PAGE_SHARED] = "page_shared",
    [FAKE_CU_VIOLATION_UNREGISTER_UNMAPPED] = "unregister_unmapped",
    [FAKE_CU_VIOLATION_UNREGISTER_NOT_LOCKED] = "unregister_not_locked",
};

static const char *env_text(const char *name)
{
    const char *text = getenv(name);
    return text && *text ? text : NULL;
}

static unsigned env_unsigned(const char *name, unsigned fallback)
{
    const char *text = env_text(name);
    if (!text)
        return fallback;
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno || *end || text[0] == '-' || value > UINT32_MAX)
        return fallback;
    return (unsigned)value;
}

/* N with an optional K/M/G/T suffix (powers of 1024). */
static uint64_t env_bytes(const char *name, uint64_t fallback)
{
    const char *text = env_text(name);
    if (!text || text[0] < '0' || text[0] > '9')
        return fallback;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno)
        return fallback;
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    default:
        return fallback;
    }
    if (*end && end[1])
        return fallback;
    if (shift && value > (UINT64_MAX >> shift))
        return fallback;
    return (uint64_t)value << shift;
}

/* "digits[.digits]", parsed by hand: strtod follows the program's locale. */
static double env_decimal(const char *name, double fallback)
{
    const char *text = env_text(name);
    if (!text)
        return fallback;
    double value = 0, scale = 1;
    bool digits = false, fraction = false;
    for (const char *at = text; *at; at++) {
        if (*at == '.' && !fraction) {
            fraction = true;
        } else if (*at >= '0' && *at <= '9') {
            digits = true;
            if (fraction) {
                scale /= 10;
                value += (*at - '0') * scale;
            } else {
                value = value * 10 + (*at - '0');
            }
        } else {
            return fallback;
        }
    }
    return digits ? value : fallback;
}

static int open_log(const char *variable)
{
    const char *path = env_text(variable);
    return path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
}

/* "1", "0", or one digit per device ("1,0,1,1"; the last one repeats). */
static void load_read_only_register(const char *text)
{
    bool value = true;
    for (unsigned device = 0; device < FAKE_CUDA_MAX_DEVICES; device++) {
        if (text != NULL && (*text == '0' || *text == '1')) {
            value = *text == '1';
            text++;
            if (*text == ',')
                text++;
        }
        config.read_only_register[device] = value;
    }
}

/* "0", "-1", or one node per device ("0,1,1"; the last one repeats). */
static void load_host_numa_id(const char *text)
{
    int value = 0;
    for (unsigned device = 0; device < FAKE_CUDA_MAX_DEVICES; device++) {
        if (text != NULL && *text != '\0') {
            char *end = NULL;
            long parsed = strtol(text, &end, 10);
            if (end != text) {
                value = (int)parsed;
                text = *end == ',' ? end + 1 : end;
            }
        }
        config.host_numa_id[device] = value;
    }
}

/* What the open kernel modules and the kernel do on this machine: long-term
 * pins on x86-64 (kernel-open/nvidia/os-mlock.c, FOLL_LONGTERM), and Linux
 * 6.5 or later refusing them on writable shared file mappings. */
static bool longterm_pins_here(void)
{
#if defined(__x86_64__)
    struct utsname name;
    unsigned major = 0, minor = 0;
    if (uname(&name) != 0)
        return false;
    const char *at = name.release;
    while (*at >= '0' && *at <= '9')
        major = major * 10 + (unsigned)(*at++ - '0');
    if (*at == '.')
        at++;
    while (*at >= '0' && *at <= '9')
        minor = minor * 10 + (unsigned)(*at++ - '0');
    return major > 6 || (major == 6 && minor >= 5);
#else
    return false;
#endif
}

static void load_config_locked(void)
{
    unsigned devices = env_unsigned("FAKE_CUDART_DEVICES", 1);
    devices = env_unsigned("FAKE_CUDA_DEVICES", devices);
    config.device_count = devices > FAKE_CUDA_MAX_DEVICES ? FAKE_CUDA_MAX_DEVICES : devices;
    config.fail_register_every = env_unsigned("FAKE_CUDART_FAIL_REGISTER_EVERY", 0);
    config.fail_unregister_every = env_unsigned("FAKE_CUDART_FAIL_UNREGISTER_EVERY", 0);
    config.fail_error = (int)env_unsigned("FAKE_CUDART_FAIL_ERROR", 0);
    if (config.fail_error <= 0)
        config.fail_error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    config.unload_at_exit = env_unsigned("FAKE_CUDA_UNLOAD_AT_EXIT", 0) != 0;
    config.check = env_unsigned("FAKE_CUDART_CHECK", 1) != 0;
    config.max_register_bytes = env_bytes("FAKE_CUDA_MAX_REGISTER_BYTES", UINT64_MAX);
    config.register_seconds_per_gib = env_decimal("FAKE_CUDA_REGISTER_SECONDS_PER_GIB", 0);
    config.unregister_seconds_per_gib =
        env_decimal("FAKE_CUDA_UNREGISTER_SECONDS_PER_GIB", config.register_seconds_per_gib / 10);
    config.driver_version = (int)env_unsigned("FAKE_CUDA_DRIVER_VERSION", 13000);
    load_read_only_register(env_text("FAKE_CUDA_READ_ONLY_REGISTER"));
    load_host_numa_id(env_text("FAKE_CUDA_HOST_NUMA"));
    config.host_page_tables = env_unsigned("FAKE_CUDA_HOST_PAGE_TABLES", 0) != 0;
    const char *longterm = env_text("FAKE_CUDA_LONGTERM_PINS");
    config.longterm_pins = longterm == NULL || strcmp(longterm, "auto") == 0
                               ? longterm_pins_here()
                               : env_unsigned("FAKE_CUDA_LONGTERM_PINS", 0) != 0;
    config.pin_rules = env_unsigned("FAKE_CUDA_PIN_RULES", 1) != 0;
    register_fail_counter = 0;
    unregister_fail_counter = 0;

    if (cudart_log_fd >= 0)
        close(cudart_log_fd);
    if (cuda_log_fd >= 0)
        close(cuda_log_fd);
    cudart_log_fd = open_log("FAKE_CUDART_LOG");
    cuda_log_fd = open_log("FAKE_CUDA_LOG");

    long page = sysconf(_SC_PAGESIZE);
    if (page > 0)
        page_size = (uintptr_t)page;
    config_loaded = true;
}

static void lock_state(void)
{
    pthread_mutex_lock(&state_lock);
    if (!config_loaded)
        load_config_locked();
}

static void unlock_state(void)
{
    pthread_mutex_unlock(&state_lock);
}

/* ------------------------------------------------------------------------ */
/* Who calls: the shared object containing each public entry point's return */
/* address, found with dladdr once per call site (a small cache).          */

struct object_entry {
    char name[256];
    uint64_t calls[FAKE_CU_CALL_KIND_COUNT];
    uint64_t contexts_created;
};

struct caller_cache_slot {
    uintptr_t address;
    unsigned object_plus_one;
};

static pthread_mutex_t object_lock = PTHREAD_MUTEX_INITIALIZER;
static struct object_entry objects[MAX_OBJECTS + 1]; /* the last is "(other)" */
static unsigned object_count;
static struct caller_cache_slot caller_cache[CALLER_CACHE_SLOTS];

static size_t cache_slot_of(uintptr_t address)
{
    return (size_t)((address ^ (address >> 9) ^ (address >> 17)) % CALLER_CACHE_SLOTS);
}

static unsigned object_find_or_add_locked(const char *name)
{
    for (unsigned i = 0; i < object_count; i++) {
        if (strcmp(objects[i].name, name) == 0)
            return i;
    }
    if (object_count == MAX_OBJECTS)
        return MAX_OBJECTS;
    size_t length = strlen(name);
    size_t room = sizeof objects[0].name - 1;
    const char *kept = length > room ? name + (length - room) : name; /* the tail names it */
    memcpy(objects[object_count].name, kept, strlen(kept) + 1);
    return object_count++;
}

static void objects_clear_locked(void)
{
    memset(objects, 0, sizeof objects);
    memcpy(objects[MAX_OBJECTS].name, "(other)", sizeof "(other)");
    object_count = 0;
    memset(caller_cache, 0, sizeof caller_cache);
}

/* The main program by its real path: dladdr would give argv[0], which a
 * launcher may have set to anything ("boxfort-worker" under Criterion). */
static const char *main_program_path(const char *fallback)
{
    static char path[256];
    static bool known;
    if (!__atomic_load_n(&known, __ATOMIC_ACQUIRE)) {
        char buffer[sizeof path];
        ssize_t length = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
        if (length <= 0)
            return fallback && *fallback ? fallback : "(main program)";
        buffer[length] = '\0';
        pthread_mutex_lock(&object_lock);
        memcpy(path, buffer, (size_t)length + 1);
        __atomic_store_n(&known, true, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&object_lock);
    }
    return path;
}

/* Returns the object index of address; counts one call to `which` for it
 * unless which is negative. Never holds a lock across dladdr. */
static unsigned caller_object(int which, const void *address)
{
    uintptr_t key = (uintptr_t)address;
    size_t slot = cache_slot_of(key);
    pthread_mutex_lock(&object_lock);
    if (caller_cache[slot].object_plus_one && caller_cache[slot].address == key) {
        unsigned object = caller_cache[slot].object_plus_one - 1;
        if (which >= 0)
            objects[object].calls[which]++;
        pthread_mutex_unlock(&object_lock);
        return object;
    }
    pthread_mutex_unlock(&object_lock);

    const char *name = "(unknown)";
    Dl_info info;
    struct link_map *map = NULL;
    if (address && dladdr1(address, &info, (void **)&map, RTLD_DL_LINKMAP)) {
        if (map && map->l_name && !map->l_name[0])
            name = main_program_path(info.dli_fname);
        else if (info.dli_fname && *info.dli_fname)
            name = info.dli_fname;
    }

    pthread_mutex_lock(&object_lock);
    unsigned object = object_find_or_add_locked(name);
    caller_cache[slot] = (struct caller_cache_slot){key, object + 1};
    if (which >= 0)
        objects[object].calls[which]++;
    pthread_mutex_unlock(&object_lock);
    return object;
}

/* ------------------------------------------------------------------------ */
/* Fork, load, exit.                                                        */

static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cond;
static uint64_t wake_generation;

static void sleep_cond_init(void)
{
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&sleep_cond, &attributes);
    pthread_condattr_destroy(&attributes);
}

static void tree_drop_all(void);
static void device_drop_all(void);

static void forget_contexts_and_counters_locked(void)
{
    memset(primaries, 0, sizeof primaries);
    memset(created, 0, sizeof created);
    stack_generation++;
    state_epoch++;
    contexts_created_total = 0;
    memset(contexts_created_on_device, 0, sizeof contexts_created_on_device);
    memset(violation_counts, 0, sizeof violation_counts);
    registrations_in_flight = 0;
    unregistrations_in_flight = 0;
    registrations_completed = 0;
    memset(copy_counts, 0, sizeof copy_counts);
    memset(copy_byte_counts, 0, sizeof copy_byte_counts);
    tree_drop_all();
    device_drop_all();
}

/* A fork while another thread holds a lock would leave it locked forever in
 * the child; the shim's tests fork. */
static void before_fork(void)
{
    pthread_mutex_lock(&state_lock);
    pthread_mutex_lock(&object_lock);
    pthread_mutex_lock(&sleep_lock);
}

static void after_fork_in_parent(void)
{
    pthread_mutex_unlock(&sleep_lock);
    pthread_mutex_unlock(&object_lock);
    pthread_mutex_unlock(&state_lock);
}

/* The child of an initialised process cannot use CUDA; neither the parent's
 * registrations nor its contexts are the child's. Threads sleeping in the
 * parent do not exist here, so the condition variable starts afresh. */
static void after_fork_in_child(void)
{
    fork_poisoned = initialized || fork_poisoned;
    initialized = false;
    forget_contexts_and_counters_locked();
    for (unsigned i = 0; i <= MAX_OBJECTS; i++) {
        memset(objects[i].calls, 0, sizeof objects[i].calls);
        objects[i].contexts_created = 0;
    }
    sleep_cond_init();
    after_fork_in_parent();
}

static void enter_deinitialized_if_configured(void)
{
    lock_state();
    if (config.unload_at_exit)
        deinitialized = true;
    unlock_state();
}

/* Registered when the driver is loaded: it runs before exit handlers
 * registered earlier and before every library destructor. The destructor is a
 * backstop for dlclose. */
static void at_exit_teardown(void)
{
    enter_deinitialized_if_configured();
}

__attribute__((constructor)) static void fake_cuda_load(void)
{
    sleep_cond_init();
    pthread_mutex_lock(&object_lock);
    objects_clear_locked();
    pthread_mutex_unlock(&object_lock);
    lock_state();
    unlock_state();
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
    atexit(at_exit_teardown);
}

__attribute__((destructor)) static void fake_cuda_unload(void)
{
    enter_deinitialized_if_configured();
}

/* ------------------------------------------------------------------------ */
/* Log lines.                                                               */

static void record_violation_locked(enum fake_cuda_violation kind, uintptr_t base, size_t size)
{
    violation_counts[kind]++;
    if (cudart_log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "violation");
    fake_line_string(&line, " ");
    fake_line_string(&line, violation_names[kind]);
    fake_line_pointer(&line, base);
    fake_line_decimal(&line, size);
    fake_line_emit(&line, cudart_log_fd);
}

/* ------------------------------------------------------------------------ */
/* Context handles: opaque, never dereferenceable (non-canonical addresses), */
/* one per context ever created, so a stale one is told from a live one.    */

#define HANDLE_TAG ((uintptr_t)0xC7C0u << 48)
#define HANDLE_TAG_MASK ((uintptr_t)0xFFFFu << 48)

static void *handle_of(uint32_t serial)
{
    return serial ? (void *)(HANDLE_TAG | ((uintptr_t)serial << 4)) : NULL;
}

static uint32_t serial_of(const void *handle)
{
    uintptr_t value = (uintptr_t)handle;
    if ((value & HANDLE_TAG_MASK) != HANDLE_TAG || (value & 15))
        return 0;
    uintptr_t serial = (value & ~HANDLE_TAG_MASK) >> 4;
    return serial <= last_serial ? (uint32_t)serial : 0;
}

enum context_status { CONTEXT_INVALID, CONTEXT_DESTROYED, CONTEXT_LIVE };

static enum context_status context_status_locked(uint32_t serial, int *device, bool *primary)
{
    if (!serial)
        return CONTEXT_INVALID;
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
        if (primaries[d].serial == serial) {
            *device = d;
            *primary = true;
            return CONTEXT_LIVE;
        }
    }
    for (int i = 0; i < FAKE_CUDA_MAX_CREATED_CONTEXTS; i++) {
        if (created[i].serial == serial) {
            *device = created[i].device;
            *primary = false;
            return CONTEXT_LIVE;
        }
    }
    return CONTEXT_DESTROYED;
}

static struct thread_stack *stack_locked(void)
{
    if (thread_stack.generation != stack_generation) {
        thread_stack.generation = stack_generation;
        thread_stack.depth = 0;
    }
    return &thread_stack;
}

static uint32_t stack_top_locked(void)
{
    struct thread_stack *stack = stack_locked();
    return stack->depth ? stack->serials[stack->depth - 1] : 0;
}

/* The live context current on the calling thread: 0, or 201 (none) / 709. */
static int current_context_locked(uint32_t *serial, int *device)
{
    uint32_t top = stack_top_locked();
    bool primary;
    *serial = 0;
    *device = -1;
    if (!top)
        return FAKE_CU_ERROR_INVALID_CONTEXT;
    int found_device = -1;
    if (context_status_locked(top, &found_device, &primary) != CONTEXT_LIVE)
        return FAKE_CU_ERROR_CONTEXT_IS_DESTROYED;
    *serial = top;
    *device = found_device;
    return FAKE_CU_SUCCESS;
}

static bool device_valid(int device)
{
    return device >= 0 && (unsigned)device < config.device_count;
}

static uint32_t context_create_locked(int device, bool primary, unsigned creator)
{
    uint32_t serial = ++last_serial;
    contexts_created_total++;
    contexts_created_on_device[device]++;
    char name[sizeof objects[0].name];
    pthread_mutex_lock(&object_lock);
    objects[creator].contexts_created++;
    memcpy(name, objects[creator].name, sizeof name);
    pthread_mutex_unlock(&object_lock);
    if (cuda_log_fd >= 0) {
        struct fake_line line;
        fake_line_start(&line, "ctx_create");
        fake_line_pointer(&line, (uintptr_t)handle_of(serial));
        fake_line_signed(&line, device);
        fake_line_string(&line, primary ? " primary " : " created ");
        fake_line_string(&line, name);
        fake_line_emit(&line, cuda_log_fd);
    }
    return serial;
}

static size_t registrations_drop_context_locked(uint32_t serial);
static void device_drop_context_locked(uint32_t serial);

static void context_destroy_locked(uint32_t serial, int device, const char *reason)
{
    size_t dropped = registrations_drop_context_locked(serial);
    device_drop_context_locked(serial);
    if (cuda_log_fd >= 0) {
        struct fake_line line;
        fake_line_start(&line, "ctx_destroy");
        fake_line_pointer(&line, (uintptr_t)handle_of(serial));
        fake_line_signed(&line, device);
        fake_line_string(&line, " ");
        fake_line_string(&line, reason);
        fake_line_decimal(&line, dropped);
        fake_line_emit(&line, cuda_log_fd);
    }
}

/* ------------------------------------------------------------------------ */
/* The registration table: an AVL tree keyed by base address. Lookups and   */
/* updates are O(log n) whatever order ranges arrive in (mmap hands out     */
/* addresses top-down, which would make a sorted array O(n) per insert).   */

static void *raw_mmap(size_t bytes)
{
    long result =
        syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0L);
    return result == -1 ? NULL : (void *)result;
}

static void *raw_mremap(void *old, size_t old_bytes, size_t new_bytes)
{
    long result = syscall(SYS_mremap, old, old_bytes, new_bytes, MREMAP_MAYMOVE);
    return result == -1 ? NULL : (void *)result;
}

static void raw_munmap(void *address, size_t bytes)
{
    syscall(SYS_munmap, address, bytes);
}

/* Returns a free node index, or 0 when the pool cannot grow. */
static uint32_t node_alloc(void)
{
    if (free_node_head) {
        uint32_t node = free_node_head;
        free_node_head = node_pool[node].left;
        return node;
    }
    if (node_pool_used == node_pool_capacity) {
        uint32_t new_capacity = node_pool_capacity ? node_pool_capacity * 2 : 4096;
        if (new_capacity <= node_pool_capacity)
            return 0;
        size_t new_bytes = (size_t)new_capacity * sizeof *node_pool;
        void *grown = node_pool
                          ? raw_mremap(node_pool, node_pool_capacity * sizeof *node_pool, new_bytes)
                          : raw_mmap(new_bytes);
        if (!grown)
            return 0;
        node_pool = grown;
        node_pool_capacity = new_capacity;
        if (node_pool_used == 0)
            node_pool_used = 1;
    }
    return node_pool_used++;
}

static void node_release(uint32_t node)
{
    node_pool[node].left = free_node_head;
    free_node_head = node;
}

static int32_t node_height(uint32_t node)
{
    return node ? node_pool[node].height : 0;
}

static void node_update_height(uint32_t node)
{
    int32_t left = node_height(node_pool[node].left);
    int32_t right = node_height(node_pool[node].right);
    node_pool[node].height = 1 + (left > right ? left : right);
}

static uint32_t rotate_right(uint32_t node)
{
    uint32_t pivot = node_pool[node].left;
    node_pool[node].left = node_pool[pivot].right;
    node_pool[pivot].right = node;
    node_update_height(node);
    node_update_height(pivot);
    return pivot;
}

static uint32_t rotate_left(uint32_t node)
{
    uint32_t pivot = node_pool[node].right;
    node_pool[node].right = node_pool[pivot].left;
    node_pool[pivot].left = node;
    node_update_height(node);
    node_update_height(pivot);
    return pivot;
}

static uint32_t rebalance(uint32_t node)
{
    node_update_height(node);
    uint32_t left = node_pool[node].left;
    uint32_t right = node_pool[node].right;
    int32_t balance = node_height(left) - node_height(right);
    if (balance > 1) {
        if (node_height(node_pool[left].left) < node_height(node_pool[left].right))
            node_pool[node].left = rotate_left(left);
        return rotate_right(node);
    }
    if (balance < -1) {
        if (node_height(node_pool[right].right) < node_height(node_pool[right].left))
            node_pool[node].right = rotate_right(right);
        return rotate_left(node);
    }
    return node;
}

static uint32_t tree_insert(uint32_t subtree, uint32_t node)
{
    if (!subtree)
        return node;
    if (node_pool[node].base < node_pool[subtree].base) {
        uint32_t left = tree_insert(node_pool[subtree].left, node);
        node_pool[subtree].left = left;
    } else {
        uint32_t right = tree_insert(node_pool[subtree].right, node);
        node_pool[subtree].right = right;
    }
    return rebalance(subtree);
}

static uint32_t tree_remove_min(uint32_t subtree, uint32_t *min_node)
{
    if (!node_pool[subtree].left) {
        *min_node = subtree;
        return node_pool[subtree].right;
    }
    uint32_t left = tree_remove_min(node_pool[subtree].left, min_node);
    node_pool[subtree].left = left;
    return rebalance(subtree);
}

/* Unlinks the node whose base is exactly base (it must exist). */
static uint32_t tree_remove(uint32_t subtree, uintptr_t base)
{
    if (base < node_pool[subtree].base) {
        uint32_t left = tree_remove(node_pool[subtree].left, base);
        node_pool[subtree].left = left;
    } else if (base > node_pool[subtree].base) {
        uint32_t right = tree_remove(node_pool[subtree].right, base);
        node_pool[subtree].right = right;
    } else {
        uint32_t left = node_pool[subtree].left;
        uint32_t right = node_pool[subtree].right;
        node_release(subtree);
        if (!left || !right)
            return left ? left : right;
        uint32_t successor;
        right = tree_remove_min(right, &successor);
        node_pool[successor].left = left;
        node_pool[successor].right = right;
        return rebalance(successor);
    }
    return rebalance(subtree);
}

/* The registration with the greatest base <= address, or 0. */
static uint32_t tree_floor(uintptr_t address)
{
    uint32_t node = tree_root, best = 0;
    while (node) {
        if (node_pool[node].base <= address) {
            best = node;
            node = node_pool[node].right;
        } else {
            node = node_pool[node].left;
        }
    }
    return best;
}

/* The registration with the smallest base >= address, or 0. */
static uint32_t tree_ceiling(uintptr_t address)
{
    uint32_t node = tree_root, best = 0;
    while (node) {
        if (node_pool[node].base >= address) {
            best = node;
            node = node_pool[node].left;
        } else {
            node = node_pool[node].right;
        }
    }
    return best;
}

/* The registration containing address, or 0. */
static uint32_t registration_find_containing(uintptr_t address)
{
    uint32_t node = tree_floor(address);
    if (node && address - node_pool[node].base < node_pool[node].size)
        return node;
    return 0;
}

/* Live ranges never overlap, so only the last one starting before the end of
 * [base, base+size) can overlap it. */
static bool registration_overlaps(uintptr_t base, size_t size)
{
    uint32_t node = tree_floor(base + size - 1);
    return node && node_pool[node].base + node_pool[node].size > base;
}

static void registration_remove(uint32_t node)
{
    if (node_pool[node].state == FAKE_CUDA_REGISTRATION_LIVE)
        live_count--;
    tree_root = tree_remove(tree_root, node_pool[node].base);
}

static void tree_drop_all(void)
{
    if (node_pool)
        raw_munmap(node_pool, node_pool_capacity * sizeof *node_pool);
    node_pool = NULL;
    node_pool_capacity = 0;
    node_pool_used = 0;
    free_node_head = 0;
    tree_root = 0;
    live_count = 0;
}

/* Calls visit(node, cookie) for the nodes with base >= first_base in base
 * order while it returns true. An AVL tree of 2^32 nodes is under 48 levels
 * deep. */
static void tree_walk_from(uintptr_t first_base, bool (*visit)(uint32_t, void *), void *cookie)
{
    uint32_t stack[64];
    size_t depth = 0;
    uint32_t node = tree_root;
    for (;;) {
        while (node) {
            if (node_pool[node].base >= first_base) {
                stack[depth++] = node;
                node = node_pool[node].left;
            } else {
                node = node_pool[node].right;
            }
        }
        if (!depth)
            return;
        node = stack[--depth];
        if (!visit(node, cookie))
            return;
        node = node_pool[node].right;
    }
}

struct drop_batch {
    uint32_t context;
    size_t count;
    uintptr_t bases[128];
};

static bool collect_context_nodes(uint32_t node, void *cookie)
{
    struct drop_batch *batch = cookie;
    if (node_pool[node].context == batch->context)
        batch->bases[batch->count++] = node_pool[node].base;
    return batch->count < sizeof batch->bases / sizeof batch->bases[0];
}

/* Drops every registration (of any state) made in context serial: batches
 * collected in base order, each walk resuming after the last batch. */
static size_t registrations_drop_context_locked(uint32_t serial)
{
    size_t dropped = 0;
    uintptr_t resume = 0;
    struct drop_batch batch = {.context = serial};
    do {
        batch.count = 0;
        tree_walk_from(resume, collect_context_nodes, &batch);
        for (size_t i = 0; i < batch.count; i++)
            registration_remove(tree_floor(batch.bases[i]));
        dropped += batch.count;
        if (batch.count)
            resume = batch.bases[batch.count - 1] + 1;
    } while (batch.count == sizeof batch.bases / sizeof batch.bases[0] && resume != 0);
    return dropped;
}

/* ------------------------------------------------------------------------ */
/* Device memory (cuMemAlloc_v2): a table of allocations, each backed by    */
/* raw mmap memory and known by an address in fake device address space:   */
/* non-canonical, so it is never a host address and dereferencing it       */
/* faults, as a real device pointer does on the host.                       */

#define DEVICE_TAG ((uintptr_t)0xDE00u << 48)
#define DEVICE_SPAN ((uintptr_t)1 << 48)
/* Allocations start on 2 MiB boundaries with at least 2 MiB unallocated
 * after each, so a range running off the end of one never lands in the next. */
#define DEVICE_ALIGNMENT ((uintptr_t)2 << 20)

enum { MAX_DEVICE_ALLOCATIONS = 4096 };

struct device_allocation {
    uintptr_t address; /* 0: free slot */
    size_t size;       /* as asked */
    size_t mapped;     /* bytes of backing */
    char *backing;
    uint32_t context;
    int device;
};

static struct device_allocation device_allocations[MAX_DEVICE_ALLOCATIONS];
static size_t device_slots_used; /* slots [0, used) may be live */
static size_t device_allocation_count;
static uintptr_t next_device_offset = DEVICE_ALIGNMENT;

static bool is_device_address(uintptr_t address)
{
    return (address & HANDLE_TAG_MASK) == DEVICE_TAG;
}

/* The live allocation holding all of [address, address + size), size >= 1. */
static struct device_allocation *device_find_locked(uintptr_t address, size_t size)
{
    if (!is_device_address(address))
        return NULL;
    for (size_t i = 0; i < device_slots_used; i++) {
        struct device_allocation *allocation = &device_allocations[i];
        uintptr_t offset = address - allocation->address;
        if (allocation->address && offset < allocation->size)
            return size <= allocation->size - offset ? allocation : NULL;
    }
    return NULL;
}

static void device_release_locked(struct device_allocation *allocation)
{
    raw_munmap(allocation->backing, allocation->mapped);
    memset(allocation, 0, sizeof *allocation);
    device_allocation_count--;
    while (device_slots_used && !device_allocations[device_slots_used - 1].address)
        device_slots_used--;
}

/* cuda.h: resetting a primary context destroys all allocations made in it;
 * destroying a context frees its resources. */
static void device_drop_context_locked(uint32_t serial)
{
    for (size_t i = device_slots_used; i-- > 0;) {
        if (device_allocations[i].address && device_allocations[i].context == serial)
            device_release_locked(&device_allocations[i]);
    }
}

static void device_drop_all(void)
{
    for (size_t i = device_slots_used; i-- > 0;) {
        if (device_allocations[i].address)
            device_release_locked(&device_allocations[i]);
    }
    device_slots_used = 0;
    device_allocation_count = 0;
}

/* Backing for size bytes of device memory: never reserved swap, touched only
 * by copies. NULL when the system refuses. */
static void *raw_mmap_noreserve(size_t bytes)
{
    long result = syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0L);
    return result == -1 ? NULL : (void *)result;
}

/* ------------------------------------------------------------------------ */
/* Invariant checks against /proc/self/smaps: smaps_locked.h.               */

static uintptr_t page_floor(uintptr_t address)
{
    return address & ~(page_size - 1);
}

static uintptr_t page_of_last_byte(uintptr_t base, size_t size)
{
    return page_floor(base + size - 1);
}

static void check_registration_locked(uintptr_t base, size_t size,
                                      enum fake_cuda_violation unmapped_kind,
                                      enum fake_cuda_violation not_locked_kind)
{
    struct lock_check check =
        check_range_locked(page_floor(base), page_of_last_byte(base, size) + page_size);
    if (check.unmapped)
        record_violation_locked(unmapped_kind, base, size);
    if (check.not_locked)
        record_violation_locked(not_locked_kind, base, size);
}

/* ---- What pinning meets: the rules cuMemHostRegister follows. ----
 *
 * The open kernel modules pin a registration with pin_user_pages()
 * (kernel-open/nvidia/os-mlock.c, os_lock_user_pages): FOLL_WRITE unless the
 * registration is read-only, FOLL_LONGTERM on x86 since 550.67, never
 * FOLL_FORCE; any failure, or a partial pin, is NV_ERR_INVALID_ADDRESS, which
 * cuMemHostRegister reports as CUDA_ERROR_INVALID_VALUE (observed for
 * read-only memory, vllm-omni #6240, and remap_pfn_range pages,
 * open-gpu-kernel-modules #732). The kernel's gup refuses (mm/gup.c,
 * check_vma_flags): VM_IO and VM_PFNMAP mappings, mappings without read
 * access (PROT_NONE), a write pin of a mapping without VM_WRITE, secretmem,
 * holes; and since 6.5 (writable_file_mapping_allowed) a long-term write pin
 * of a shared file mapping that needs dirty tracking, which shmem, memfd,
 * SysV shared memory, hugetlbfs and ramfs do not. With
 * PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES (ATS) the driver only
 * populates the pages (uvm_populate_pageable.c: get_user_pages_remote, no
 * pin, write access as the mapping has it). */

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif
#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif

/* Whether the shared file mapping of path needs dirty tracking: a file on a
 * file system that writes back (ext4, xfs, btrfs, NFS, overlayfs over them),
 * not shmem (memfd, SysV, shared anonymous, tmpfs), hugetlbfs or ramfs. */
static bool file_needs_dirty_tracking(const char *path)
{
    if (strncmp(path, "/memfd:", 7) == 0 || strncmp(path, "/SYSV", 5) == 0 ||
        strncmp(path, "/dev/zero", 9) == 0)
        return false;
    /* A removed file: its directory tells the file system it was on. */
    char directory[512];
    const char *deleted = strstr(path, " (deleted)");
    if (deleted != NULL) {
        size_t length = (size_t)(deleted - path);
        if (length >= sizeof directory)
            return true;
        memcpy(directory, path, length);
        directory[length] = '\0';
        char *slash = strrchr(directory, '/');
        if (slash != NULL)
            slash[slash == directory ? 1 : 0] = '\0';
        path = directory;
    }
    struct statfs fs;
    if (statfs(path, &fs) != 0)
        return true; /* cannot tell: as a disk file system would */
    return fs.f_type != TMPFS_MAGIC && (unsigned long)fs.f_type != (unsigned long)HUGETLBFS_MAGIC &&
           fs.f_type != RAMFS_MAGIC;
}

struct vma_view {
    uintptr_t start, end;
    bool readable, writable, shared;
    char name[512];
};

static int procmap_fd = -1;
static pid_t procmap_pid;

/* The VMA holding address, or the first above it: 1, 0 when there is none,
 * -1 when the kernel cannot say (then the caller reads smaps). Called with
 * state_lock held. */
static int vma_lookup(uintptr_t address, struct vma_view *view)
{
    procmap_query_fd(&procmap_fd, &procmap_pid);
    struct procmap_query query;
    memset(&query, 0, sizeof query);
    memset(view, 0, sizeof *view);
    query.size = sizeof query;
    query.query_flags = PROCMAP_QUERY_COVERING_OR_NEXT_VMA;
    query.query_addr = address;
    query.vma_name_size = sizeof view->name;
    query.vma_name_addr = (uintptr_t)view->name;
    if (procmap_fd < 0 || ioctl(procmap_fd, PROCMAP_QUERY_IOCTL, &query) != 0)
        return procmap_fd >= 0 && errno == ENOENT ? 0 : -1;
    view->start = query.vma_start;
    view->end = query.vma_end;
    view->readable = query.vma_flags & PROCMAP_QUERY_VMA_READABLE;
    view->writable = query.vma_flags & PROCMAP_QUERY_VMA_WRITABLE;
    view->shared = query.vma_flags & PROCMAP_QUERY_VMA_SHARED;
    view->name[sizeof view->name - 1] = '\0';
    return 1;
}

/* "start-end perms offset dev inode   path": the same view from a line of
 * /proc/self/smaps. */
static void parse_vma_view(const char *line, uintptr_t start, uintptr_t end, struct vma_view *view)
{
    const char *at = strchr(line, ' ');
    memset(view, 0, sizeof *view);
    view->start = start;
    view->end = end;
    if (at == NULL)
        return;
    view->readable = at[1] == 'r';
    view->writable = at[2] == 'w';
    view->shared = at[4] == 's';
    for (int field = 0; field < 4 && at != NULL; field++) /* perms offset dev inode */
        at = strchr(at + 1, ' ');
    while (at != NULL && *at == ' ')
        at++;
    if (at != NULL) {
        size_t length = strlen(at);
        if (length >= sizeof view->name)
            length = sizeof view->name - 1;
        memcpy(view->name, at, length);
    }
}

/* Whether pinning refuses this VMA for its permissions and what backs it. */
static bool vma_refused(const struct vma_view *view, bool for_write)
{
    bool longterm = config.longterm_pins && !config.host_page_tables;
    return !view->readable || (for_write && !view->writable && !config.host_page_tables) ||
           strncmp(view->name, "/secretmem", 10) == 0 ||
           (longterm && for_write && view->shared && view->name[0] == '/' &&
            file_needs_dirty_tracking(view->name));
}

/* Only device and special mappings can be VM_IO or VM_PFNMAP (a device
 * file's mmap, /sys resources, an anonymous inode's, the vvar page); only
 * for those is smaps (VmFlags) read. */
static bool may_be_special(const struct vma_view *view)
{
    const char *name = view->name;
    return (strncmp(name, "/dev/", 5) == 0 && strncmp(name, "/dev/zero", 9) != 0 &&
            strncmp(name, "/dev/shm/", 9) != 0) ||
           strncmp(name, "/sys/", 5) == 0 || strncmp(name, "anon_inode:", 11) == 0 ||
           (name[0] == '[' && strncmp(name, "[heap]", 6) != 0 && strncmp(name, "[stack", 6) != 0 &&
            strncmp(name, "[anon:", 6) != 0);
}

/* smaps, streamed: whether any VMA touching [first_page, end_page) is
 * refused, or VM_IO / VM_PFNMAP, or there is a hole. */
static bool smaps_refuses(uintptr_t first_page, uintptr_t end_page, bool for_write)
{
    struct line_reader reader;
    reader.fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
    if (reader.fd < 0)
        return false; /* cannot tell: let it through */
    reader.at_eof = false;
    reader.discarding = false;
    reader.start = reader.end = 0;
    uintptr_t covered_up_to = first_page;
    bool touching = false, finished = false, refused = false;
    struct vma_view view;
    const char *line;
    while (!finished && !refused && (line = line_reader_next(&reader)) != NULL) {
        uintptr_t vma_start, vma_end;
        if (parse_vma_header(line, &vma_start, &vma_end)) {
            touching = false;
            if (vma_end <= covered_up_to)
                continue;
            if (vma_start > covered_up_to) {
                refused = true; /* a hole */
                continue;
            }
            touching = true;
            covered_up_to = vma_end;
            parse_vma_view(line, vma_start, vma_end, &view);
            refused = vma_refused(&view, for_write);
        } else if (touching && strncmp(line, "VmFlags:", 8) == 0) {
            refused = vm_flags_has(line + 8, "io") || vm_flags_has(line + 8, "pf");
            touching = false;
            finished = covered_up_to >= end_page;
        }
    }
    if (!finished && covered_up_to < end_page)
        refused = true;
    close(reader.fd);
    return refused;
}

/* CUDA_ERROR_INVALID_VALUE when pinning [first_page, end_page) as the
 * driver would (for_write: without READ_ONLY) fails, else success. */
static int pin_check(uintptr_t first_page, uintptr_t end_page, bool for_write)
{
    bool special = false;
    uintptr_t cursor = first_page;
    while (cursor < end_page) {
        struct vma_view view;
        int found = vma_lookup(cursor, &view);
        if (found < 0)
            return smaps_refuses(first_page, end_page, for_write) ? FAKE_CU_ERROR_INVALID_VALUE
                                                                  : FAKE_CU_SUCCESS;
        if (found == 0 || view.start > cursor || vma_refused(&view, for_write))
            return FAKE_CU_ERROR_INVALID_VALUE; /* a hole, or refused */
        special = special || may_be_special(&view);
        cursor = view.end;
    }
    if (special && smaps_refuses(first_page, end_page, for_write))
        return FAKE_CU_ERROR_INVALID_VALUE;
    return FAKE_CU_SUCCESS;
}

/* The shim registers whole pages; two registrations on one page mean it lost
 * track of which of them owns the page's lock. */
static bool shares_page_with_neighbour(uintptr_t base, size_t size)
{
    uint32_t before = base > 0 ? tree_floor(base - 1) : 0;
    if (before &&
        page_of_last_byte(node_pool[before].base, node_pool[before].size) == page_floor(base))
        return true;
    uint32_t after = tree_ceiling(base);
    return after && page_floor(node_pool[after].base) == page_of_last_byte(base, size);
}

/* ------------------------------------------------------------------------ */
/* Simulated latency, slept with state_lock released.                       */

static double latency_seconds(size_t size, double seconds_per_gib)
{
    return seconds_per_gib > 0 ? (double)size / (1024.0 * 1024.0 * 1024.0) * seconds_per_gib : 0;
}

/* The wake generation a sleep starts from. Read before the state lock is
 * released, while the call already counts as in flight: a test that sees it
 * in flight and wakes the sleepers then cannot wake it before it sleeps (the
 * wake-up was lost under qemu-user, and the sleep lasted its 1,000 s). */
static uint64_t sleep_generation(void)
{
    pthread_mutex_lock(&sleep_lock);
    uint64_t generation = wake_generation;
    pthread_mutex_unlock(&sleep_lock);
    return generation;
}

static void latency_sleep(double seconds, uint64_t generation)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = (double)(time_t)seconds;
    if (seconds > 1e9)
        whole = 1e9;
    deadline.tv_sec += (time_t)whole;
    deadline.tv_nsec += (long)((seconds - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&sleep_lock);
    while (wake_generation == generation) {
        if (pthread_cond_timedwait(&sleep_cond, &sleep_lock, &deadline) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&sleep_lock);
}

/* ------------------------------------------------------------------------ */
/* The driver entry points.                                                 */

/* The error every entry point but the three pure ones returns first. */
static int api_state_error_locked(void)
{
    if (deinitialized)
        return FAKE_CU_ERROR_DEINITIALIZED;
    if (fork_poisoned || !initialized)
        return FAKE_CU_ERROR_NOT_INITIALIZED;
    return FAKE_CU_SUCCESS;
}

/* What every driver call that needs the current context answers first: a
 * state the API is in (not initialised, deinitialised), then no context. */
static int enter_context_call_locked(uint32_t *context, int *device)
{
    int error = api_state_error_locked();
    return error ? error : current_context_locked(context, device);
}

FAKE_EXPORT int cuInit(unsigned int flags)
{
    caller_object(FAKE_CU_CALL_INIT, CALLER());
    lock_state();
    int error = FAKE_CU_SUCCESS;
    if (deinitialized)
        error = FAKE_CU_ERROR_DEINITIALIZED;
    else if (fork_poisoned)
        error = FAKE_CU_ERROR_NOT_INITIALIZED;
    else if (flags != 0)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    else if (config.device_count == 0)
        error = FAKE_CU_ERROR_NO_DEVICE;
    else
        initialized = true;
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDriverGetVersion(int *driver_version)
{
    caller_object(FAKE_CU_CALL_DRIVER_GET_VERSION, CALLER());
    if (!driver_version)
        return FAKE_CU_ERROR_INVALID_VALUE;
    lock_state();
    *driver_version = config.driver_version;
    unlock_state();
    return FAKE_CU_SUCCESS;
}

struct error_description {
    int code;
    const char *name;
    const char *text;
};

static const struct error_description error_descriptions[] = {
    {FAKE_CU_SUCCESS, "CUDA_SUCCESS", "no error"},
    {FAKE_CU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {FAKE_CU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {FAKE_CU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {FAKE_CU_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {FAKE_CU_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {FAKE_CU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {FAKE_CU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {FAKE_CU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {FAKE_CU_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {FAKE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {FAKE_CU_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {FAKE_CU_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {FAKE_CU_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {FAKE_CU_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct error_description *error_description_find(int error)
{
    for (size_t i = 0; i < sizeof error_descriptions / sizeof error_descriptions[0]; i++) {
        if (error_descriptions[i].code == error)
            return &error_descriptions[i];
    }
    return NULL;
}

/* An unknown code: INVALID_VALUE and *text = NULL, as the real driver does. */
static int describe_error(int error, const char **text, bool name)
{
    if (!text)
        return FAKE_CU_ERROR_INVALID_VALUE;
    const struct error_description *found = error_description_find(error);
    *text = found ? (name ? found->name : found->text) : NULL;
    return found ? FAKE_CU_SUCCESS : FAKE_CU_ERROR_INVALID_VALUE;
}

FAKE_EXPORT int cuGetErrorName(int error, const char **name)
{
    caller_object(FAKE_CU_CALL_GET_ERROR_NAME, CALLER());
    return describe_error(error, name, true);
}

FAKE_EXPORT int cuGetErrorString(int error, const char **text)
{
    caller_object(FAKE_CU_CALL_GET_ERROR_STRING, CALLER());
    return describe_error(error, text, false);
}

FAKE_EXPORT int cuDeviceGetCount(int *count)
{
    caller_object(FAKE_CU_CALL_DEVICE_GET_COUNT, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && !count)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error)
        *count = (int)config.device_count;
    unlock_state();
    return error;
}

/* The PCI address "0000:BB:00.0", bus 0x17 + the ordinal, in capitals as
 * the driver writes it (no such device exists in sysfs). */
FAKE_EXPORT int cuDeviceGetPCIBusId(char *bus_id, int length, CUdevice device)
{
    caller_object(FAKE_CU_CALL_DEVICE_GET_PCI_BUS_ID, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && (bus_id == NULL || length <= 0))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error)
        snprintf(bus_id, (size_t)length, "0000:%02X:00.0", 0x17 + (int)device);
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDeviceGet(CUdevice *device, int ordinal)
{
    caller_object(FAKE_CU_CALL_DEVICE_GET, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && !device)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(ordinal))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error)
        *device = ordinal;
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDevicePrimaryCtxGetState(CUdevice device, unsigned int *flags, int *active)
{
    caller_object(FAKE_CU_CALL_PRIMARY_CTX_GET_STATE, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && (!flags || !active))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error) {
        *flags = 0;
        *active = primaries[device].serial != 0;
    }
    unlock_state();
    return error;
}

static int primary_retain(void **context, int device, unsigned creator)
{
    lock_state();
    int error = api_state_error_locked();
    if (!error && !context)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error) {
        struct primary_context *primary = &primaries[device];
        if (!primary->serial)
            primary->serial = context_create_locked(device, true, creator);
        primary->refcount++;
        *context = handle_of(primary->serial);
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device)
{
    unsigned creator = caller_object(FAKE_CU_CALL_PRIMARY_CTX_RETAIN, CALLER());
    return primary_retain((void **)context, device, creator);
}

FAKE_EXPORT int fake_cuda_internal_primary_ctx_retain(void **context, int device,
                                                      const void *caller)
{
    caller_object(FAKE_CU_CALL_INTERNAL_PRIMARY_CTX_RETAIN, CALLER());
    unsigned creator = caller_object(-1, caller);
    return primary_retain(context, device, creator);
}

static int primary_release(int device)
{
    lock_state();
    int error = api_state_error_locked();
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error && primaries[device].refcount == 0)
        error = FAKE_CU_ERROR_INVALID_CONTEXT;
    if (!error && --primaries[device].refcount == 0 && primaries[device].serial) {
        uint32_t serial = primaries[device].serial;
        primaries[device].serial = 0;
        context_destroy_locked(serial, device, "release");
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDevicePrimaryCtxRelease(CUdevice device)
{
    caller_object(FAKE_CU_CALL_PRIMARY_CTX_RELEASE, CALLER());
    return primary_release(device);
}

FAKE_EXPORT int cuDevicePrimaryCtxRelease_v2(CUdevice device)
{
    caller_object(FAKE_CU_CALL_PRIMARY_CTX_RELEASE_V2, CALLER());
    return primary_release(device);
}

static int primary_reset(int device)
{
    lock_state();
    int error = api_state_error_locked();
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error && primaries[device].serial) {
        uint32_t serial = primaries[device].serial;
        primaries[device].serial = 0;
        context_destroy_locked(serial, device, "reset");
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDevicePrimaryCtxReset(CUdevice device)
{
    caller_object(FAKE_CU_CALL_PRIMARY_CTX_RESET, CALLER());
    return primary_reset(device);
}

FAKE_EXPORT int cuDevicePrimaryCtxReset_v2(CUdevice device)
{
    caller_object(FAKE_CU_CALL_PRIMARY_CTX_RESET_V2, CALLER());
    return primary_reset(device);
}

FAKE_EXPORT int cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device)
{
    unsigned creator = caller_object(FAKE_CU_CALL_CTX_CREATE_V2, CALLER());
    (void)flags; /* scheduling flags change nothing modelled here */
    lock_state();
    int error = api_state_error_locked();
    if (!error && !context)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    int slot = -1;
    for (int i = 0; !error && slot < 0 && i < FAKE_CUDA_MAX_CREATED_CONTEXTS; i++) {
        if (!created[i].serial)
            slot = i;
    }
    struct thread_stack *stack = stack_locked();
    if (!error && (slot < 0 || stack->depth == FAKE_CUDA_STACK_DEPTH))
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error) {
        uint32_t serial = context_create_locked(device, false, creator);
        created[slot] = (struct created_context){serial, device};
        stack->serials[stack->depth++] = serial;
        *context = handle_of(serial);
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuCtxDestroy_v2(CUcontext context)
{
    caller_object(FAKE_CU_CALL_CTX_DESTROY_V2, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && !context)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    uint32_t serial = error ? 0 : serial_of(context);
    int slot = -1;
    for (int i = 0; !error && serial && i < FAKE_CUDA_MAX_CREATED_CONTEXTS; i++) {
        if (created[i].serial == serial)
            slot = i;
    }
    if (!error && slot < 0)
        error = FAKE_CU_ERROR_INVALID_CONTEXT; /* primary, destroyed or not a context */
    if (!error) {
        int device = created[slot].device;
        created[slot].serial = 0;
        struct thread_stack *stack = stack_locked();
        if (stack->depth && stack->serials[stack->depth - 1] == serial)
            stack->depth--;
        context_destroy_locked(serial, device, "destroy");
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuCtxGetCurrent(CUcontext *context)
{
    caller_object(FAKE_CU_CALL_CTX_GET_CURRENT, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && !context)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error)
        *context = handle_of(stack_top_locked());
    unlock_state();
    return error;
}

/* 0 when handle names a live context, else INVALID_CONTEXT. */
static int live_context_serial_locked(const void *handle, uint32_t *serial)
{
    int device;
    bool primary;
    *serial = serial_of(handle);
    if (context_status_locked(*serial, &device, &primary) != CONTEXT_LIVE)
        return FAKE_CU_ERROR_INVALID_CONTEXT;
    return FAKE_CU_SUCCESS;
}

FAKE_EXPORT int cuCtxSetCurrent(CUcontext context)
{
    caller_object(FAKE_CU_CALL_CTX_SET_CURRENT, CALLER());
    lock_state();
    int error = api_state_error_locked();
    struct thread_stack *stack = stack_locked();
    uint32_t serial = 0;
    if (!error && context)
        error = live_context_serial_locked(context, &serial);
    if (!error) {
        if (!context) {
            if (stack->depth)
                stack->depth--;
        } else if (stack->depth) {
            stack->serials[stack->depth - 1] = serial;
        } else {
            stack->serials[stack->depth++] = serial;
        }
    }
    unlock_state();
    return error;
}

static int context_push(const void *context)
{
    lock_state();
    int error = api_state_error_locked();
    struct thread_stack *stack = stack_locked();
    uint32_t serial = 0;
    if (!error && !context)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error)
        error = live_context_serial_locked(context, &serial);
    if (!error && stack->depth == FAKE_CUDA_STACK_DEPTH)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error)
        stack->serials[stack->depth++] = serial;
    unlock_state();
    return error;
}

FAKE_EXPORT int cuCtxPushCurrent(CUcontext context)
{
    caller_object(FAKE_CU_CALL_CTX_PUSH_CURRENT, CALLER());
    return context_push(context);
}

FAKE_EXPORT int cuCtxPushCurrent_v2(CUcontext context)
{
    caller_object(FAKE_CU_CALL_CTX_PUSH_CURRENT_V2, CALLER());
    return context_push(context);
}

static int context_pop(void **context)
{
    lock_state();
    int error = api_state_error_locked();
    struct thread_stack *stack = stack_locked();
    if (!error && !stack->depth)
        error = FAKE_CU_ERROR_INVALID_CONTEXT;
    if (!error) {
        uint32_t serial = stack->serials[--stack->depth];
        if (context)
            *context = handle_of(serial);
    }
    unlock_state();
    return error;
}

FAKE_EXPORT int cuCtxPopCurrent(CUcontext *context)
{
    caller_object(FAKE_CU_CALL_CTX_POP_CURRENT, CALLER());
    return context_pop((void **)context);
}

FAKE_EXPORT int cuCtxPopCurrent_v2(CUcontext *context)
{
    caller_object(FAKE_CU_CALL_CTX_POP_CURRENT_V2, CALLER());
    return context_pop((void **)context);
}

FAKE_EXPORT int cuCtxGetDevice(CUdevice *device)
{
    caller_object(FAKE_CU_CALL_CTX_GET_DEVICE, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && !device)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    uint32_t serial;
    int found = -1;
    if (!error)
        error = current_context_locked(&serial, &found);
    if (!error)
        *device = found;
    unlock_state();
    return error;
}

static bool injected_failure_due(uint64_t *counter, unsigned every)
{
    return every && ++*counter % every == 0;
}

static void log_register(uintptr_t base, size_t size, unsigned flags, int error, int device,
                         uint32_t context)
{
    struct fake_line line;
    if (cudart_log_fd >= 0) {
        fake_line_start(&line, "register");
        fake_line_pointer(&line, base);
        fake_line_decimal(&line, size);
        fake_line_decimal(&line, flags);
        fake_line_signed(&line, error);
        fake_line_emit(&line, cudart_log_fd);
    }
    if (cuda_log_fd >= 0) {
        fake_line_start(&line, "cu_register");
        fake_line_pointer(&line, base);
        fake_line_decimal(&line, size);
        fake_line_decimal(&line, flags);
        fake_line_signed(&line, error);
        fake_line_signed(&line, device);
        fake_line_pointer(&line, (uintptr_t)handle_of(context));
        fake_line_emit(&line, cuda_log_fd);
    }
}

static void log_unregister(uintptr_t base, int error, int device, uint32_t context)
{
    struct fake_line line;
    if (cudart_log_fd >= 0) {
        fake_line_start(&line, "unregister");
        fake_line_pointer(&line, base);
        fake_line_signed(&line, error);
        fake_line_emit(&line, cudart_log_fd);
    }
    if (cuda_log_fd >= 0) {
        fake_line_start(&line, "cu_unregister");
        fake_line_pointer(&line, base);
        fake_line_signed(&line, error);
        fake_line_signed(&line, device);
        fake_line_pointer(&line, (uintptr_t)handle_of(context));
        fake_line_emit(&line, cuda_log_fd);
    }
}

static uint32_t registration_find_exact(uintptr_t base, uint64_t id)
{
    uint32_t node = tree_floor(base);
    return node && node_pool[node].base == base && node_pool[node].id == id ? node : 0;
}

/* ------------------------------------------------------------------------ */
/* Stream capture.                                                          */

/* Captures in progress: the stream, the mode it was begun in, the thread
 * that began it, and whether a refused call invalidated it. */
enum { MAX_CAPTURES = 16 };
static struct capture {
    bool used;
    bool invalidated;
    const void *stream;
    int mode;
    const void *thread;
} captures[MAX_CAPTURES];
static uint64_t capture_refusals;

/* The calling thread's capture interaction mode (cuda.h: each thread starts
 * in the global mode) and a per-thread address that names the thread. */
static _Thread_local int thread_capture_mode __attribute__((tls_model("initial-exec")));
static _Thread_local char thread_marker __attribute__((tls_model("initial-exec")));

static struct capture *capture_of_locked(const void *stream)
{
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (captures[i].used && captures[i].stream == stream)
            return &captures[i];
    return NULL;
}

/* cuda.h, cuThreadExchangeStreamCaptureMode: a thread in the global mode
 * may make no "potentially unsafe" call while it captures itself (not
 * relaxed) or while any other thread captures in the global mode; one in
 * the thread-local mode only while it captures itself; one in the relaxed
 * mode always. Such a call fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * and invalidates the captures it broke into (the programming guide's
 * "Invalidation"; vLLM #48053 saw it across threads), whose
 * cuStreamEndCapture then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 * The unsafe calls here: cuMemHostRegister, cuMemHostUnregister,
 * cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost (cudaMalloc is the
 * documented example; cudaHostRegister fails so in vLLM #46933). */
static int capture_refusal_locked(void)
{
    if (thread_capture_mode == FAKE_CU_STREAM_CAPTURE_MODE_RELAXED)
        return FAKE_CU_SUCCESS;
    bool refused = false;
    for (int i = 0; i < MAX_CAPTURES; i++) {
        struct capture *capture = &captures[i];
        if (!capture->used || capture->mode == FAKE_CU_STREAM_CAPTURE_MODE_RELAXED)
            continue;
        bool own = capture->thread == &thread_marker;
        bool blocks = own || (thread_capture_mode == FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL &&
                              capture->mode == FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL);
        if (blocks) {
            capture->invalidated = true;
            refused = true;
        }
    }
    if (refused)
        capture_refusals++;
    return refused ? FAKE_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED : FAKE_CU_SUCCESS;
}

FAKE_EXPORT int cuThreadExchangeStreamCaptureMode(int *mode)
{
    caller_object(FAKE_CU_CALL_THREAD_EXCHANGE_STREAM_CAPTURE_MODE, CALLER());
    if (mode == NULL || *mode < FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > FAKE_CU_STREAM_CAPTURE_MODE_RELAXED)
        return FAKE_CU_ERROR_INVALID_VALUE;
    int previous = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = previous;
    return FAKE_CU_SUCCESS;
}

/* The legacy (NULL) stream cannot capture; a stream captures once at a
 * time (CUDA_ERROR_ILLEGAL_STATE, chosen from cudaErrorIllegalState's
 * text). */
FAKE_EXPORT int cuStreamBeginCapture_v2(CUstream stream, int mode)
{
    caller_object(FAKE_CU_CALL_STREAM_BEGIN_CAPTURE_V2, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error &&
        (mode < FAKE_CU_STREAM_CAPTURE_MODE_GLOBAL || mode > FAKE_CU_STREAM_CAPTURE_MODE_RELAXED))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && stream == NULL)
        error = FAKE_CU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!error && capture_of_locked(stream) != NULL)
        error = FAKE_CU_ERROR_ILLEGAL_STATE;
    struct capture *slot = NULL;
    for (int i = 0; !error && slot == NULL && i < MAX_CAPTURES; i++)
        if (!captures[i].used)
            slot = &captures[i];
    if (!error && slot == NULL)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error)
        *slot = (struct capture){
            .used = true, .stream = stream, .mode = mode, .thread = &thread_marker};
    unlock_state();
    return error;
}

/* Ends a capture: from another thread than the one that began it (not
 * relaxed): CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD; invalidated: the capture
 * ends all the same with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and a NULL
 * graph (programming guide). A graph here is any non-NULL handle. */
FAKE_EXPORT int cuStreamEndCapture(CUstream stream, void **graph)
{
    caller_object(FAKE_CU_CALL_STREAM_END_CAPTURE, CALLER());
    lock_state();
    int error = api_state_error_locked();
    struct capture *capture = error ? NULL : capture_of_locked(stream);
    if (!error && graph == NULL)
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && capture == NULL)
        error = FAKE_CU_ERROR_ILLEGAL_STATE;
    if (!error && capture->mode != FAKE_CU_STREAM_CAPTURE_MODE_RELAXED &&
        capture->thread != &thread_marker)
        error = FAKE_CU_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (!error) {
        error = capture->invalidated ? FAKE_CU_ERROR_STREAM_CAPTURE_INVALIDATED : FAKE_CU_SUCCESS;
        *graph = error ? NULL : (void *)&captures[capture - captures];
        capture->used = false;
    }
    unlock_state();
    return error;
}

FAKE_EXPORT uint64_t fake_cuda_capture_refusals(void)
{
    lock_state();
    uint64_t refusals = capture_refusals;
    unlock_state();
    return refusals;
}

/* ------------------------------------------------------------------------ */

static int mem_host_register(uintptr_t base, size_t size, unsigned flags)
{
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    if (!error && injected_failure_due(&register_fail_counter, config.fail_register_every))
        error = config.fail_error;
    if (!error && (!base || !size || (flags & ~FAKE_CU_MEMHOSTREGISTER_VALID_FLAGS) ||
                   size - 1 > UINTPTR_MAX - base))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && (uint64_t)size > config.max_register_bytes)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error && registration_overlaps(base, size))
        error = FAKE_CU_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    /* The shim's invariants, recorded whatever the driver answers next. */
    if (!error && config.check) {
        check_registration_locked(base, size, FAKE_CU_VIOLATION_REGISTER_UNMAPPED,
                                  FAKE_CU_VIOLATION_REGISTER_NOT_LOCKED);
        if (shares_page_with_neighbour(base, size))
            record_violation_locked(FAKE_CU_VIOLATION_PAGE_SHARED, base, size);
    }
    /* cuda.h: READ_ONLY with a context whose device lacks
     * READ_ONLY_HOST_REGISTER_SUPPORTED is CUDA_ERROR_NOT_SUPPORTED. */
    if (!error && (flags & FAKE_CU_MEMHOSTREGISTER_READ_ONLY) && !config.read_only_register[device])
        error = FAKE_CU_ERROR_NOT_SUPPORTED;
    if (!error && config.pin_rules)
        error = pin_check(page_floor(base), page_of_last_byte(base, size) + page_size,
                          !(flags & FAKE_CU_MEMHOSTREGISTER_READ_ONLY));
    uint32_t node = error ? 0 : node_alloc();
    if (!error && !node)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    double seconds = 0;
    uint64_t id = 0;
    if (!error) {
        seconds = latency_seconds(size, config.register_seconds_per_gib);
        id = ++last_registration_id;
        node_pool[node] = (struct registration_node){
            .base = base,
            .size = size,
            .id = id,
            .context = context,
            .device = device,
            .flags = flags,
            .height = 1,
            .state = seconds > 0 ? FAKE_CUDA_REGISTRATION_REGISTERING : FAKE_CUDA_REGISTRATION_LIVE,
        };
        tree_root = tree_insert(tree_root, node);
        if (seconds <= 0) {
            live_count++;
            registrations_completed++;
        }
    }
    if (error || seconds <= 0) {
        log_register(base, size, flags, error, device, context);
        unlock_state();
        return error;
    }

    uint64_t epoch = state_epoch;
    registrations_in_flight++;
    uint64_t generation = sleep_generation();
    unlock_state();
    latency_sleep(seconds, generation);
    lock_state();
    node = epoch == state_epoch ? registration_find_exact(base, id) : 0;
    if (epoch == state_epoch)
        registrations_in_flight--;
    if (node) {
        node_pool[node].state = FAKE_CUDA_REGISTRATION_LIVE;
        live_count++;
        registrations_completed++;
    } else {
        error = FAKE_CU_ERROR_CONTEXT_IS_DESTROYED; /* dropped with its context meanwhile */
    }
    log_register(base, size, flags, error, device, context);
    unlock_state();
    return error;
}

FAKE_EXPORT int cuMemHostRegister_v2(void *pointer, size_t size, unsigned int flags)
{
    caller_object(FAKE_CU_CALL_MEM_HOST_REGISTER_V2, CALLER());
    return mem_host_register((uintptr_t)pointer, size, flags);
}

FAKE_EXPORT int cuMemHostRegister(void *pointer, size_t size, unsigned int flags)
{
    caller_object(FAKE_CU_CALL_MEM_HOST_REGISTER, CALLER());
    return mem_host_register((uintptr_t)pointer, size, flags);
}

FAKE_EXPORT int cuMemHostUnregister(void *pointer)
{
    caller_object(FAKE_CU_CALL_MEM_HOST_UNREGISTER, CALLER());
    uintptr_t base = (uintptr_t)pointer;
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    if (!error && injected_failure_due(&unregister_fail_counter, config.fail_unregister_every))
        error = config.fail_error;
    uint32_t node = error ? 0 : registration_find_containing(base);
    if (!error && !node)
        error = FAKE_CU_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (!error && (node_pool[node].base != base || node_pool[node].host_alloc))
        error = FAKE_CU_ERROR_INVALID_VALUE; /* interior, or cuMemHostAlloc's */
    if (!error && node_pool[node].state != FAKE_CUDA_REGISTRATION_LIVE)
        error = FAKE_CU_ERROR_HOST_MEMORY_NOT_REGISTERED; /* not yet, or no longer */
    double seconds = 0;
    uint64_t id = 0;
    if (!error) {
        if (config.check)
            check_registration_locked(base, node_pool[node].size,
                                      FAKE_CU_VIOLATION_UNREGISTER_UNMAPPED,
                                      FAKE_CU_VIOLATION_UNREGISTER_NOT_LOCKED);
        seconds = latency_seconds(node_pool[node].size, config.unregister_seconds_per_gib);
        if (seconds <= 0) {
            registration_remove(node);
        } else {
            node_pool[node].state = FAKE_CUDA_REGISTRATION_UNREGISTERING;
            live_count--;
            id = node_pool[node].id;
        }
    }
    if (error || seconds <= 0) {
        log_unregister(base, error, device, context);
        unlock_state();
        return error;
    }

    uint64_t epoch = state_epoch;
    unregistrations_in_flight++;
    uint64_t generation = sleep_generation();
    unlock_state();
    latency_sleep(seconds, generation);
    lock_state();
    if (epoch == state_epoch) {
        unregistrations_in_flight--;
        node = registration_find_exact(base, id);
        if (node) /* else dropped with its context meanwhile: unregistered all the same */
            registration_remove(node);
    }
    log_unregister(base, error, device, context);
    unlock_state();
    return error;
}

FAKE_EXPORT int cuDeviceGetAttribute(int *value, int attribute, CUdevice device)
{
    caller_object(FAKE_CU_CALL_DEVICE_GET_ATTRIBUTE, CALLER());
    lock_state();
    int error = api_state_error_locked();
    if (!error && (!value || attribute <= 0 || attribute >= FAKE_CU_DEVICE_ATTRIBUTE_MAX))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error && !device_valid(device))
        error = FAKE_CU_ERROR_INVALID_DEVICE;
    if (!error) {
        switch (attribute) {
        case FAKE_CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
            *value = 1;
            break;
        case FAKE_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
            *value = config.host_page_tables;
            break;
        case FAKE_CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
            *value = config.read_only_register[device];
            break;
        case FAKE_CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
            /* New in CUDA 12.2: an older driver does not know it. */
            if (config.driver_version < 12020)
                error = FAKE_CU_ERROR_INVALID_VALUE;
            else
                *value = config.host_numa_id[device];
            break;
        default:
            *value = 0; /* not modelled */
        }
    }
    unlock_state();
    return error;
}

/* cuMemHostAlloc: pinned memory of the driver's own. Like the real driver
 * mapping and locking memory for itself, it calls mlock (through libc, where
 * a preloaded shim sees it) while it holds its own lock: a shim that called
 * back into the driver from there would wait for that lock forever. */
FAKE_EXPORT int cuMemHostAlloc(void **pointer, size_t size, unsigned int flags)
{
    caller_object(FAKE_CU_CALL_MEM_HOST_ALLOC, CALLER());
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    if (!error && (!pointer || !size ||
                   (flags & ~(FAKE_CU_MEMHOSTALLOC_PORTABLE | FAKE_CU_MEMHOSTALLOC_DEVICEMAP |
                              FAKE_CU_MEMHOSTALLOC_WRITECOMBINED))))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    size_t bytes = (size + page_size - 1) & ~(page_size - 1);
    void *memory = error ? NULL : raw_mmap(bytes);
    if (!error && memory == NULL)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    uint32_t node = error ? 0 : node_alloc();
    if (!error && !node)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error && mlock(memory, bytes) != 0) /* the state lock held */
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (error) {
        if (node)
            node_release(node);
        if (memory)
            raw_munmap(memory, bytes);
        unlock_state();
        return error;
    }
    node_pool[node] = (struct registration_node){
        .base = (uintptr_t)memory,
        .size = bytes,
        .id = ++last_registration_id,
        .context = context,
        .device = device,
        .flags = FAKE_CU_MEMHOSTREGISTER_PORTABLE | FAKE_CU_MEMHOSTREGISTER_DEVICEMAP,
        .height = 1,
        .state = FAKE_CUDA_REGISTRATION_LIVE,
        .host_alloc = 1,
    };
    tree_root = tree_insert(tree_root, node);
    live_count++;
    *pointer = memory;
    unlock_state();
    return FAKE_CU_SUCCESS;
}

FAKE_EXPORT int cuMemFreeHost(void *pointer)
{
    caller_object(FAKE_CU_CALL_MEM_FREE_HOST, CALLER());
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    uint32_t node = error ? 0 : registration_find_containing((uintptr_t)pointer);
    if (!error &&
        (!node || !node_pool[node].host_alloc || node_pool[node].base != (uintptr_t)pointer))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error) {
        size_t bytes = node_pool[node].size;
        registration_remove(node);
        munlock(pointer, bytes); /* through libc, the state lock held */
        raw_munmap(pointer, bytes);
    }
    unlock_state();
    return error;
}

/* The device pointer of mapped registered memory: the host pointer itself
 * (unified addressing, CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM). Memory that
 * is not registered, or registered without DEVICEMAP: INVALID_VALUE. */
FAKE_EXPORT int cuMemHostGetDevicePointer_v2(unsigned long long *device_pointer, void *pointer,
                                             unsigned int flags)
{
    caller_object(FAKE_CU_CALL_MEM_HOST_GET_DEVICE_POINTER_V2, CALLER());
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error && (!device_pointer || flags))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    uint32_t node = error ? 0 : registration_find_containing((uintptr_t)pointer);
    if (!error && (!node || node_pool[node].state != FAKE_CUDA_REGISTRATION_LIVE ||
                   !(node_pool[node].flags & FAKE_CU_MEMHOSTREGISTER_DEVICEMAP)))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error)
        *device_pointer = (unsigned long long)(uintptr_t)pointer;
    unlock_state();
    return error;
}

/* ------------------------------------------------------------------------ */
/* Device memory and copies.                                                */

/* cuMemAlloc: bytesize 0 is INVALID_VALUE (cuda.h). The memory is zeroed
 * (cuda.h only says it is not cleared). */
FAKE_EXPORT int cuMemAlloc_v2(CUdeviceptr *device_pointer, size_t size)
{
    caller_object(FAKE_CU_CALL_MEM_ALLOC_V2, CALLER());
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    if (!error && (!device_pointer || !size))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    size_t slot = device_slots_used;
    for (size_t i = 0; !error && i < device_slots_used; i++) {
        if (!device_allocations[i].address) {
            slot = i;
            break;
        }
    }
    uintptr_t span = 0;
    if (!error) {
        span = size > DEVICE_SPAN ? 0 : (size + 2 * DEVICE_ALIGNMENT - 1) & ~(DEVICE_ALIGNMENT - 1);
        if (slot == MAX_DEVICE_ALLOCATIONS || !span || span > DEVICE_SPAN - next_device_offset)
            error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    }
    size_t mapped = (size + page_size - 1) & ~(page_size - 1);
    void *backing = error ? NULL : raw_mmap_noreserve(mapped);
    if (!error && !backing)
        error = FAKE_CU_ERROR_OUT_OF_MEMORY;
    if (!error) {
        uintptr_t address = DEVICE_TAG | next_device_offset;
        next_device_offset += span;
        device_allocations[slot] = (struct device_allocation){
            .address = address,
            .size = size,
            .mapped = mapped,
            .backing = backing,
            .context = context,
            .device = device,
        };
        if (slot == device_slots_used)
            device_slots_used++;
        device_allocation_count++;
        *device_pointer = address;
    }
    unlock_state();
    return error;
}

/* Only the address cuMemAlloc_v2 returned frees an allocation, from any
 * live context; 0, an interior or unknown address: INVALID_VALUE. */
FAKE_EXPORT int cuMemFree_v2(CUdeviceptr device_pointer)
{
    caller_object(FAKE_CU_CALL_MEM_FREE_V2, CALLER());
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (!error)
        error = capture_refusal_locked();
    struct device_allocation *allocation =
        error || !device_pointer ? NULL : device_find_locked((uintptr_t)device_pointer, 1);
    if (!error && (!allocation || allocation->address != (uintptr_t)device_pointer))
        error = FAKE_CU_ERROR_INVALID_VALUE;
    if (!error)
        device_release_locked(allocation);
    unlock_state();
    return error;
}

/* The calling thread's own memory, copied with process_vm_readv: a host
 * range that is not mapped (or not writable) fails with EFAULT instead of
 * killing the test. Where the system refuses the call (qemu-user, seccomp),
 * plain memcpy. Returns 0, or -1 when the range faults (maybe part copied). */
static int copy_bytes(void *destination, const void *source, size_t size)
{
    pid_t self = (pid_t)syscall(SYS_getpid);
    size_t done = 0;
    while (done < size) {
        struct iovec local = {(char *)destination + done, size - done};
        struct iovec remote = {(char *)source + done, size - done};
        long moved = syscall(SYS_process_vm_readv, self, &local, 1UL, &remote, 1UL, 0UL);
        if (moved > 0) {
            done += (size_t)moved;
        } else if (moved < 0 && errno == EINTR) {
            continue;
        } else if (moved == 0 || errno == EFAULT) {
            return -1;
        } else {
            memcpy((char *)destination + done, (const char *)source + done, size - done);
            return 0;
        }
    }
    return 0;
}

/* The memcpy rule for the host side of a host <-> device copy (the
 * "\note_memcpy" of cuda.h's copies): the range lies inside one
 * registration (pinned), or overlaps none (pageable); anything else is
 * refused. Registrations in flight (registering, unregistering) count. */
static enum fake_cuda_copy_kind host_range_kind_locked(uintptr_t base, size_t size)
{
    uint32_t node = registration_find_containing(base);
    if (node)
        return size <= node_pool[node].base + node_pool[node].size - base ? FAKE_CUDA_COPY_PINNED
                                                                          : FAKE_CUDA_COPY_REFUSED;
    return registration_overlaps(base, size) ? FAKE_CUDA_COPY_REFUSED : FAKE_CUDA_COPY_PAGEABLE;
}

static void log_copy_refused(uintptr_t host, size_t size, bool to_device, int device,
                             uint32_t context)
{
    if (cuda_log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "copy_refused");
    fake_line_pointer(&line, host);
    fake_line_decimal(&line, size);
    fake_line_string(&line, to_device ? " htod" : " dtoh");
    fake_line_signed(&line, device);
    fake_line_pointer(&line, (uintptr_t)handle_of(context));
    fake_line_emit(&line, cuda_log_fd);
}

/* Where a side of a copy lies: its allocation for device memory. */
struct copy_side {
    uintptr_t address;
    bool device;
    char *memory; /* what the fake reads or writes */
};

/* 0 and side->memory, or INVALID_VALUE: a device range outside every live
 * allocation; a host range that is NULL, wraps, or lies in device space. */
static int copy_side_resolve_locked(struct copy_side *side, size_t size)
{
    if (side->device) {
        struct device_allocation *allocation = device_find_locked(side->address, size);
        if (!allocation)
            return FAKE_CU_ERROR_INVALID_VALUE;
        side->memory = allocation->backing + (side->address - allocation->address);
        return FAKE_CU_SUCCESS;
    }
    if (!side->address || size - 1 > UINTPTR_MAX - side->address ||
        is_device_address(side->address) || is_device_address(side->address + size - 1))
        return FAKE_CU_ERROR_INVALID_VALUE;
    side->memory = (char *)side->address;
    return FAKE_CU_SUCCESS;
}

static void count_copy_locked(enum fake_cuda_copy_kind kind, size_t size)
{
    copy_counts[kind]++;
    copy_byte_counts[kind] += size;
}

/* Every copy entry point: synchronous, done before it returns (so a stream,
 * which is not looked at, has nothing left to wait for). The state lock is
 * held throughout: no registration or allocation changes under a copy. */
static int memory_copy(struct copy_side destination, struct copy_side source, size_t size)
{
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    if (error || !size) {
        unlock_state();
        return error;
    }
    if (copy_side_resolve_locked(&destination, size) || copy_side_resolve_locked(&source, size)) {
        count_copy_locked(FAKE_CUDA_COPY_INVALID, size);
        unlock_state();
        return FAKE_CU_ERROR_INVALID_VALUE;
    }
    enum fake_cuda_copy_kind kind;
    if (destination.device && source.device) {
        kind = FAKE_CUDA_COPY_DEVICE;
    } else if (!destination.device && !source.device) {
        kind = FAKE_CUDA_COPY_HOST;
    } else {
        const struct copy_side *host = destination.device ? &source : &destination;
        kind = host_range_kind_locked(host->address, size);
        if (kind == FAKE_CUDA_COPY_REFUSED) {
            count_copy_locked(kind, size);
            log_copy_refused(host->address, size, destination.device, device, context);
            unlock_state();
            return FAKE_CU_ERROR_INVALID_VALUE;
        }
    }
    if (kind == FAKE_CUDA_COPY_DEVICE)
        memmove(destination.memory, source.memory, size); /* both ours, and mapped */
    else if (copy_bytes(destination.memory, source.memory, size) != 0)
        kind = FAKE_CUDA_COPY_INVALID;
    count_copy_locked(kind, size);
    unlock_state();
    return kind == FAKE_CUDA_COPY_INVALID ? FAKE_CU_ERROR_INVALID_VALUE : FAKE_CU_SUCCESS;
}

static struct copy_side host_side(const void *pointer)
{
    return (struct copy_side){.address = (uintptr_t)pointer, .device = false};
}

static struct copy_side device_side(CUdeviceptr pointer)
{
    return (struct copy_side){.address = (uintptr_t)pointer, .device = true};
}

/* cuMemcpy: the kind of each side inferred from its address (unified
 * addressing): fake device space is device memory, anything else host. */
static struct copy_side inferred_side(CUdeviceptr pointer)
{
    return (struct copy_side){.address = (uintptr_t)pointer,
                              .device = is_device_address((uintptr_t)pointer)};
}

FAKE_EXPORT int cuMemcpyHtoD_v2(CUdeviceptr destination, const void *source, size_t size)
{
    caller_object(FAKE_CU_CALL_MEMCPY_HTOD_V2, CALLER());
    return memory_copy(device_side(destination), host_side(source), size);
}

FAKE_EXPORT int cuMemcpyDtoH_v2(void *destination, CUdeviceptr source, size_t size)
{
    caller_object(FAKE_CU_CALL_MEMCPY_DTOH_V2, CALLER());
    return memory_copy(host_side(destination), device_side(source), size);
}

FAKE_EXPORT int cuMemcpyDtoD_v2(CUdeviceptr destination, CUdeviceptr source, size_t size)
{
    caller_object(FAKE_CU_CALL_MEMCPY_DTOD_V2, CALLER());
    return memory_copy(device_side(destination), device_side(source), size);
}

FAKE_EXPORT int cuMemcpy(CUdeviceptr destination, CUdeviceptr source, size_t size)
{
    caller_object(FAKE_CU_CALL_MEMCPY, CALLER());
    return memory_copy(inferred_side(destination), inferred_side(source), size);
}

FAKE_EXPORT int cuMemcpyHtoDAsync_v2(CUdeviceptr destination, const void *source, size_t size,
                                     CUstream stream)
{
    caller_object(FAKE_CU_CALL_MEMCPY_HTOD_ASYNC_V2, CALLER());
    (void)stream;
    return memory_copy(device_side(destination), host_side(source), size);
}

FAKE_EXPORT int cuMemcpyDtoHAsync_v2(void *destination, CUdeviceptr source, size_t size,
                                     CUstream stream)
{
    caller_object(FAKE_CU_CALL_MEMCPY_DTOH_ASYNC_V2, CALLER());
    (void)stream;
    return memory_copy(host_side(destination), device_side(source), size);
}

FAKE_EXPORT int cuMemcpyDtoDAsync_v2(CUdeviceptr destination, CUdeviceptr source, size_t size,
                                     CUstream stream)
{
    caller_object(FAKE_CU_CALL_MEMCPY_DTOD_ASYNC_V2, CALLER());
    (void)stream;
    return memory_copy(device_side(destination), device_side(source), size);
}

FAKE_EXPORT int cuMemcpyAsync(CUdeviceptr destination, CUdeviceptr source, size_t size,
                              CUstream stream)
{
    caller_object(FAKE_CU_CALL_MEMCPY_ASYNC, CALLER());
    (void)stream;
    return memory_copy(inferred_side(destination), inferred_side(source), size);
}

/* Every copy is done when it returns: nothing to wait for. Any stream handle
 * is accepted. */
FAKE_EXPORT int cuStreamSynchronize(CUstream stream)
{
    caller_object(FAKE_CU_CALL_STREAM_SYNCHRONIZE, CALLER());
    (void)stream;
    lock_state();
    uint32_t context = 0;
    int device = -1;
    int error = enter_context_call_locked(&context, &device);
    unlock_state();
    return error;
}

/* ------------------------------------------------------------------------ */
/* The fake-only query and control API.                                     */

FAKE_EXPORT size_t fake_cuda_live_count(void)
{
    lock_state();
    size_t count = live_count;
    unlock_state();
    return count;
}

static struct fake_cuda_registration registration_of(uint32_t node)
{
    return (struct fake_cuda_registration){
        .base = node_pool[node].base,
        .size = node_pool[node].size,
        .flags = node_pool[node].flags,
        .device = node_pool[node].device,
        .context = handle_of(node_pool[node].context),
        .state = node_pool[node].state,
    };
}

struct snapshot_cursor {
    struct fake_cuda_registration *out;
    size_t max;
    size_t copied;
};

static bool snapshot_visit(uint32_t node, void *cookie)
{
    struct snapshot_cursor *cursor = cookie;
    if (cursor->copied == cursor->max)
        return false;
    cursor->out[cursor->copied++] = registration_of(node);
    return cursor->copied < cursor->max;
}

FAKE_EXPORT size_t fake_cuda_snapshot_from(uintptr_t first_base, struct fake_cuda_registration *out,
                                           size_t max)
{
    struct snapshot_cursor cursor = {out, max, 0};
    if (!max)
        return 0;
    lock_state();
    tree_walk_from(first_base, snapshot_visit, &cursor);
    unlock_state();
    return cursor.copied;
}

FAKE_EXPORT size_t fake_cuda_snapshot(struct fake_cuda_registration *out, size_t max)
{
    struct snapshot_cursor cursor = {out, max, 0};
    if (!max)
        return 0;
    lock_state();
    tree_walk_from(0, snapshot_visit, &cursor);
    unlock_state();
    return cursor.copied;
}

struct live_cursor {
    struct fake_cuda_range *out;
    size_t max;
    size_t copied;
};

static bool live_visit(uint32_t node, void *cookie)
{
    struct live_cursor *cursor = cookie;
    if (node_pool[node].state == FAKE_CUDA_REGISTRATION_LIVE)
        cursor->out[cursor->copied++] = (struct fake_cuda_range){.base = node_pool[node].base,
                                                                 .size = node_pool[node].size,
                                                                 .flags = node_pool[node].flags};
    return cursor->copied < cursor->max;
}

FAKE_EXPORT size_t fake_cuda_snapshot_live(struct fake_cuda_range *out, size_t max)
{
    struct live_cursor cursor = {out, max, 0};
    if (!max)
        return 0;
    lock_state();
    tree_walk_from(0, live_visit, &cursor);
    unlock_state();
    return cursor.copied;
}

FAKE_EXPORT int fake_cuda_lookup(const void *address, struct fake_cuda_registration *out)
{
    lock_state();
    uint32_t node = registration_find_containing((uintptr_t)address);
    int found = node && node_pool[node].state == FAKE_CUDA_REGISTRATION_LIVE;
    if (found && out)
        *out = registration_of(node);
    unlock_state();
    return found;
}

struct count_matching {
    bool by_device;
    int device;
    uint32_t context;
    size_t count;
};

static bool count_visit(uint32_t node, void *cookie)
{
    struct count_matching *match = cookie;
    if (node_pool[node].state == FAKE_CUDA_REGISTRATION_LIVE &&
        (match->by_device ? node_pool[node].device == match->device
                          : node_pool[node].context == match->context))
        match->count++;
    return true;
}

FAKE_EXPORT size_t fake_cuda_registrations_on_device(int device)
{
    struct count_matching match = {.by_device = true, .device = device};
    lock_state();
    tree_walk_from(0, count_visit, &match);
    unlock_state();
    return match.count;
}

FAKE_EXPORT size_t fake_cuda_registrations_in_context(const void *context)
{
    struct count_matching match = {.by_device = false};
    lock_state();
    match.context = serial_of(context);
    if (match.context)
        tree_walk_from(0, count_visit, &match);
    unlock_state();
    return match.count;
}

FAKE_EXPORT size_t fake_cuda_registrations_in_flight(void)
{
    lock_state();
    size_t count = registrations_in_flight;
    unlock_state();
    return count;
}

FAKE_EXPORT size_t fake_cuda_unregistrations_in_flight(void)
{
    lock_state();
    size_t count = unregistrations_in_flight;
    unlock_state();
    return count;
}

FAKE_EXPORT uint64_t fake_cuda_registrations_completed(void)
{
    lock_state();
    uint64_t count = registrations_completed;
    unlock_state();
    return count;
}

FAKE_EXPORT uint64_t fake_cuda_copy_count(int kind)
{
    if (kind < 0 || kind >= FAKE_CUDA_COPY_KIND_COUNT)
        return 0;
    lock_state();
    uint64_t count = copy_counts[kind];
    unlock_state();
    return count;
}

FAKE_EXPORT uint64_t fake_cuda_copy_bytes(int kind)
{
    if (kind < 0 || kind >= FAKE_CUDA_COPY_KIND_COUNT)
        return 0;
    lock_state();
    uint64_t bytes = copy_byte_counts[kind];
    unlock_state();
    return bytes;
}

FAKE_EXPORT size_t fake_cuda_device_allocations(void)
{
    lock_state();
    size_t count = device_allocation_count;
    unlock_state();
    return count;
}

FAKE_EXPORT int fake_cuda_is_device_pointer(unsigned long long address)
{
    return is_device_address((uintptr_t)address);
}

FAKE_EXPORT void fake_cuda_wake_sleepers(void)
{
    pthread_mutex_lock(&sleep_lock);
    wake_generation++;
    pthread_cond_broadcast(&sleep_cond);
    pthread_mutex_unlock(&sleep_lock);
}

FAKE_EXPORT size_t fake_cuda_violation_count(void)
{
    size_t total = 0;
    lock_state();
    for (int kind = 0; kind < FAKE_CU_VIOLATION_KIND_COUNT; kind++)
        total += violation_counts[kind];
    unlock_state();
    return total;
}

FAKE_EXPORT size_t fake_cuda_violation_count_of(int kind)
{
    if (kind < 0 || kind >= FAKE_CU_VIOLATION_KIND_COUNT)
        return 0;
    lock_state();
    size_t count = violation_counts[kind];
    unlock_state();
    return count;
}

static bool object_matches(unsigned object, const char *substring)
{
    return !substring || strstr(objects[object].name, substring) != NULL;
}

FAKE_EXPORT uint64_t fake_cuda_call_count_by(int which, const char *object_substring)
{
    if (which < 0 || which >= FAKE_CU_CALL_KIND_COUNT)
        return 0;
    uint64_t total = 0;
    pthread_mutex_lock(&object_lock);
    for (unsigned i = 0; i <= MAX_OBJECTS; i++) {
        if (object_matches(i, object_substring))
            total += objects[i].calls[which];
    }
    pthread_mutex_unlock(&object_lock);
    return total;
}

FAKE_EXPORT uint64_t fake_cuda_call_count(int which)
{
    return fake_cuda_call_count_by(which, NULL);
}

FAKE_EXPORT uint64_t fake_cuda_contexts_created(void)
{
    lock_state();
    uint64_t count = contexts_created_total;
    unlock_state();
    return count;
}

FAKE_EXPORT uint64_t fake_cuda_contexts_created_by(const char *object_substring)
{
    uint64_t total = 0;
    pthread_mutex_lock(&object_lock);
    for (unsigned i = 0; i <= MAX_OBJECTS; i++) {
        if (object_matches(i, object_substring))
            total += objects[i].contexts_created;
    }
    pthread_mutex_unlock(&object_lock);
    return total;
}

FAKE_EXPORT uint64_t fake_cuda_contexts_created_on(int device)
{
    if (device < 0 || device >= FAKE_CUDA_MAX_DEVICES)
        return 0;
    lock_state();
    uint64_t count = contexts_created_on_device[device];
    unlock_state();
    return count;
}

static void caller_copy_locked(unsigned object, struct fake_cuda_caller *out)
{
    uint64_t calls = 0;
    for (int which = 0; which < FAKE_CU_CALL_KIND_COUNT; which++)
        calls += objects[object].calls[which];
    memcpy(out->object, objects[object].name, sizeof out->object);
    out->calls = calls;
    out->contexts_created = objects[object].contexts_created;
}

FAKE_EXPORT size_t fake_cuda_callers(struct fake_cuda_caller *out, size_t max)
{
    size_t copied = 0;
    pthread_mutex_lock(&object_lock);
    for (unsigned i = 0; i < object_count && copied < max; i++)
        caller_copy_locked(i, &out[copied++]);
    if (copied < max) {
        caller_copy_locked(MAX_OBJECTS, &out[copied]);
        if (out[copied].calls || out[copied].contexts_created)
            copied++;
    }
    pthread_mutex_unlock(&object_lock);
    return copied;
}

FAKE_EXPORT int fake_cuda_primary_state(int device, struct fake_cuda_primary_state *out)
{
    if (device < 0 || device >= FAKE_CUDA_MAX_DEVICES || !out)
        return -1;
    lock_state();
    int result = device_valid(device) ? 0 : -1;
    if (!result) {
        out->active = primaries[device].serial != 0;
        out->refcount = primaries[device].refcount;
        out->context = handle_of(primaries[device].serial);
    }
    unlock_state();
    return result;
}

FAKE_EXPORT unsigned fake_cuda_context_stack_depth(void)
{
    lock_state();
    unsigned depth = stack_locked()->depth;
    unlock_state();
    return depth;
}

FAKE_EXPORT void *fake_cuda_context_stack_top(void)
{
    lock_state();
    void *top = handle_of(stack_top_locked());
    unlock_state();
    return top;
}

FAKE_EXPORT int fake_cuda_initialized(void)
{
    lock_state();
    int result = initialized;
    unlock_state();
    return result;
}

FAKE_EXPORT void fake_cuda_reset(void)
{
    lock_state();
    forget_contexts_and_counters_locked();
    initialized = false;
    fork_poisoned = false;
    deinitialized = false;
    load_config_locked();
    pthread_mutex_lock(&object_lock);
    objects_clear_locked();
    pthread_mutex_unlock(&object_lock);
    unlock_state();
}

FAKE_EXPORT void fake_cuda_reload_config(void)
{
    lock_state();
    load_config_locked();
    unlock_state();
}

FAKE_EXPORT void fake_cuda_set_fail_every(unsigned reg, unsigned unreg, int error)
{
    lock_state();
    config.fail_register_every = reg;
    config.fail_unregister_every = unreg;
    config.fail_error = error > 0 ? error : FAKE_CU_ERROR_OUT_OF_MEMORY;
    register_fail_counter = 0;
    unregister_fail_counter = 0;
    unlock_state();
}

FAKE_EXPORT void fake_cuda_set_check(int on)
{
    lock_state();
    config.check = on != 0;
    unlock_state();
}

FAKE_EXPORT void fake_cuda_simulate_exit(void)
{
    enter_deinitialized_if_configured();
}
