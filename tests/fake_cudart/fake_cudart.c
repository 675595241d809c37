/* fake_cudart: see fake_cudart.h for what it does and how it is configured.
 *
 * The shim under test interposes the allocator and the mapping functions, so
 * nothing here calls malloc/free, and the registration table lives in memory
 * obtained with raw mmap/mremap system calls (the libc wrappers could be the
 * shim's, which would call back into us).
 */
#include "fake_cudart.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Built with -fvisibility=hidden: only what is marked here is exported. */
#define FAKE_EXPORT __attribute__((visibility("default")))
#ifdef FAKE_CUDART_MINIMAL
#define FAKE_EXPORT_EXTRA
#else
#define FAKE_EXPORT_EXTRA __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Configuration and global state (all guarded by state_lock).              */

struct fake_config {
    bool no_driver;
    unsigned device_count;
    unsigned fail_register_every;
    unsigned fail_unregister_every;
    int fail_error;
    bool unload_at_exit;
    bool check;
};

/* One node of the AVL tree of live registrations. Nodes live in one array
 * (node_pool) and refer to each other by index; index 0 means "none". */
struct registration_node {
    uintptr_t base;
    size_t size;
    unsigned flags;
    uint32_t left;
    uint32_t right;
    int32_t height;
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static bool config_loaded;
static struct fake_config config;
static bool unloading;
static int log_fd = -1;
static uintptr_t page_size = 4096;

static struct registration_node *node_pool;
static uint32_t node_pool_capacity;
static uint32_t node_pool_used; /* next never-used index; 0 is reserved */
static uint32_t free_node_head;
static uint32_t tree_root;
static size_t live_count;

static uint64_t call_counts[FAKE_CALL_KIND_COUNT];
static size_t violation_counts[FAKE_VIOLATION_KIND_COUNT];
static uint64_t register_fail_counter;
static uint64_t unregister_fail_counter;

/* initial-exec: a dlopen'ed library's dynamic TLS is allocated with malloc on
 * a thread's first access, which the shim intercepts; static TLS is not. */
static _Thread_local int thread_last_error __attribute__((tls_model("initial-exec")));

static const char *const violation_names[FAKE_VIOLATION_KIND_COUNT] = {
    [FAKE_VIOLATION_REGISTER_UNMAPPED] = "register_unmapped",
    [FAKE_VIOLATION_REGISTER_NOT_LOCKED] = "register_not_locked",
    [FAKE_VIOLATION_PAGE_SHARED] = "page_shared",
    [FAKE_VIOLATION_UNREGISTER_UNMAPPED] = "unregister_unmapped",
    [FAKE_VIOLATION_UNREGISTER_NOT_LOCKED] = "unregister_not_locked",
};

static unsigned env_unsigned(const char *name, unsigned fallback)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback;
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno || *end || text[0] == '-' || value > UINT32_MAX)
        return fallback;
    return (unsigned)value;
}

static void load_config_locked(void)
{
    config.no_driver = env_unsigned("FAKE_CUDART_NO_DRIVER", 0) != 0;
    config.device_count = env_unsigned("FAKE_CUDART_DEVICES", 1);
    config.fail_register_every = env_unsigned("FAKE_CUDART_FAIL_REGISTER_EVERY", 0);
    config.fail_unregister_every = env_unsigned("FAKE_CUDART_FAIL_UNREGISTER_EVERY", 0);
    config.fail_error = (int)env_unsigned("FAKE_CUDART_FAIL_ERROR", 0);
    if (config.fail_error <= 0)
        config.fail_error = FAKE_CUDA_ERROR_MEMORY_ALLOCATION;
    config.unload_at_exit = env_unsigned("FAKE_CUDART_UNLOAD_AT_EXIT", 0) != 0;
    config.check = env_unsigned("FAKE_CUDART_CHECK", 1) != 0;
    register_fail_counter = 0;
    unregister_fail_counter = 0;

    if (log_fd >= 0)
        close(log_fd);
    log_fd = -1;
    const char *log_path = getenv("FAKE_CUDART_LOG");
    if (log_path && *log_path)
        log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);

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

/* A fork while another thread holds state_lock would leave it locked forever
 * in the child; the shim's tests fork. */
static void before_fork(void)
{
    pthread_mutex_lock(&state_lock);
}

static void after_fork(void)
{
    pthread_mutex_unlock(&state_lock);
}

static void enter_unloading_if_configured(void)
{
    lock_state();
    if (config.unload_at_exit)
        unloading = true;
    unlock_state();
}

/* The real runtime tears itself down from an exit handler registered when it
 * starts, so exit handlers registered before that and every library
 * destructor (the shim's included) see cudaErrorCudartUnloading. We do the
 * same, with the destructor as a backstop for dlclose. */
static void at_exit_teardown(void)
{
    enter_unloading_if_configured();
}

__attribute__((constructor)) static void fake_cudart_load(void)
{
    lock_state();
    unlock_state();
    pthread_atfork(before_fork, after_fork, after_fork);
    atexit(at_exit_teardown);
}

__attribute__((destructor)) static void fake_cudart_unload(void)
{
    enter_unloading_if_configured();
}

/* ------------------------------------------------------------------------ */
/* Log lines, formatted without stdio (which may allocate).                 */

struct line_builder {
    char text[256];
    size_t length;
};

static void line_put_string(struct line_builder *line, const char *text)
{
    while (*text && line->length < sizeof line->text - 1)
        line->text[line->length++] = *text++;
}

static void line_put_number(struct line_builder *line, uint64_t value, unsigned radix)
{
    char digits[24];
    size_t count = 0;
    do {
        digits[count++] = "0123456789abcdef"[value % radix];
        value /= radix;
    } while (value);
    while (count && line->length < sizeof line->text - 1)
        line->text[line->length++] = digits[--count];
}

static void line_put_decimal(struct line_builder *line, uint64_t value)
{
    line_put_string(line, " ");
    line_put_number(line, value, 10);
}

static void line_put_signed(struct line_builder *line, int value)
{
    line_put_string(line, value < 0 ? " -" : " ");
    line_put_number(line, value < 0 ? (uint64_t) - (int64_t)value : (uint64_t)value, 10);
}

static void line_put_pointer(struct line_builder *line, uintptr_t value)
{
    line_put_string(line, " 0x");
    line_put_number(line, value, 16);
}

static void line_start(struct line_builder *line, const char *event)
{
    line->length = 0;
    line_put_string(line, event);
    line_put_decimal(line, (uint64_t)getpid());
}

/* One write(2) per line, so processes sharing the file never interleave. */
static void line_emit(struct line_builder *line)
{
    if (log_fd < 0)
        return;
    line->text[line->length++] = '\n';
    ssize_t written;
    do {
        written = write(log_fd, line->text, line->length);
    } while (written < 0 && errno == EINTR);
}

static void log_register(uintptr_t base, size_t size, unsigned flags, int error)
{
    if (log_fd < 0)
        return;
    struct line_builder line;
    line_start(&line, "register");
    line_put_pointer(&line, base);
    line_put_decimal(&line, size);
    line_put_decimal(&line, flags);
    line_put_signed(&line, error);
    line_emit(&line);
}

static void log_unregister(uintptr_t base, int error)
{
    if (log_fd < 0)
        return;
    struct line_builder line;
    line_start(&line, "unregister");
    line_put_pointer(&line, base);
    line_put_signed(&line, error);
    line_emit(&line);
}

static void log_get_last_error(int error)
{
    if (log_fd < 0)
        return;
    struct line_builder line;
    line_start(&line, "getlasterror");
    line_put_signed(&line, error);
    line_emit(&line);
}

static void record_violation_locked(enum fake_cudart_violation kind, uintptr_t base, size_t size)
{
    violation_counts[kind]++;
    if (log_fd < 0)
        return;
    struct line_builder line;
    line_start(&line, "violation");
    line_put_string(&line, " ");
    line_put_string(&line, violation_names[kind]);
    line_put_pointer(&line, base);
    line_put_decimal(&line, size);
    line_emit(&line);
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

/* ------------------------------------------------------------------------ */
/* Invariant checks against /proc/self/smaps, streamed through a stack      */
/* buffer: smaps can be megabytes and we may not allocate.                  */

struct line_reader {
    int fd;
    bool at_eof;
    bool discarding; /* skipping the rest of an over-long line */
    size_t start;
    size_t end;
    char buffer[4096];
};

/* The next line without its newline, or NULL at end of file. An over-long
 * line is returned truncated (we only look at the start of lines). */
static char *line_reader_next(struct line_reader *reader)
{
    for (;;) {
        char *chunk = reader->buffer + reader->start;
        char *newline = memchr(chunk, '\n', reader->end - reader->start);
        if (newline) {
            *newline = '\0';
            reader->start = (size_t)(newline + 1 - reader->buffer);
            if (reader->discarding) {
                reader->discarding = false;
                continue;
            }
            return chunk;
        }
        if (reader->discarding) {
            reader->start = reader->end = 0;
        } else if (reader->start > 0) {
            memmove(reader->buffer, chunk, reader->end - reader->start);
            reader->end -= reader->start;
            reader->start = 0;
        }
        if (reader->end == sizeof reader->buffer - 1 || (reader->at_eof && reader->end > 0)) {
            reader->buffer[reader->end] = '\0';
            reader->discarding = !reader->at_eof;
            reader->start = reader->end = 0;
            return reader->buffer;
        }
        if (reader->at_eof)
            return NULL;
        ssize_t got =
            read(reader->fd, reader->buffer + reader->end, sizeof reader->buffer - 1 - reader->end);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            reader->at_eof = true;
        else
            reader->end += (size_t)got;
    }
}

static bool parse_hex(const char **cursor, uintptr_t *value)
{
    const char *text = *cursor;
    uintptr_t result = 0;
    int digits = 0;
    for (;; text++, digits++) {
        char c = *text;
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else
            break;
        result = result * 16 + digit;
    }
    *cursor = text;
    *value = result;
    return digits > 0;
}

/* "start-end perms ..." starts every VMA block; other lines start with a
 * capitalised key, never a lowercase hex digit. */
static bool parse_vma_header(const char *line, uintptr_t *start, uintptr_t *end)
{
    return parse_hex(&line, start) && *line++ == '-' && parse_hex(&line, end) && *line == ' ';
}

static bool vm_flags_has_locked(const char *flags)
{
    for (const char *at = flags; (at = strstr(at, " lo")) != NULL; at += 3) {
        if (at[3] == ' ' || at[3] == '\0')
            return true;
    }
    return false;
}

struct lock_check {
    bool unmapped;
    bool not_locked;
};

/* Is every page of [first_page, end_page) mapped, and is every VMA touching
 * it locked? VMAs are listed in address order, so one pass suffices. */
static struct lock_check check_range_locked(uintptr_t first_page, uintptr_t end_page)
{
    struct lock_check result = {false, false};
    struct line_reader reader;
    reader.fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
    if (reader.fd < 0)
        return result; /* cannot tell: record nothing */
    reader.at_eof = false;
    reader.discarding = false;
    reader.start = reader.end = 0;

    uintptr_t covered_up_to = first_page;
    bool in_touching_vma = false;
    bool finished = false;
    const char *line;
    while (!finished && (line = line_reader_next(&reader)) != NULL) {
        uintptr_t vma_start, vma_end;
        if (parse_vma_header(line, &vma_start, &vma_end)) {
            in_touching_vma = false;
            if (vma_end <= covered_up_to)
                continue;
            if (vma_start > covered_up_to) {
                result.unmapped = true;
                finished = true;
                continue;
            }
            in_touching_vma = true;
            covered_up_to = vma_end;
        } else if (in_touching_vma && strncmp(line, "VmFlags:", 8) == 0) {
            if (!vm_flags_has_locked(line + 7))
                result.not_locked = true;
            in_touching_vma = false;
            finished = covered_up_to >= end_page;
        }
    }
    if (!finished && covered_up_to < end_page)
        result.unmapped = true;
    close(reader.fd);
    return result;
}

static uintptr_t page_floor(uintptr_t address)
{
    return address & ~(page_size - 1);
}

static uintptr_t page_of_last_byte(uintptr_t base, size_t size)
{
    return page_floor(base + size - 1);
}

static void check_registration_locked(uintptr_t base, size_t size,
                                      enum fake_cudart_violation unmapped_kind,
                                      enum fake_cudart_violation not_locked_kind)
{
    struct lock_check check =
        check_range_locked(page_floor(base), page_of_last_byte(base, size) + page_size);
    if (check.unmapped)
        record_violation_locked(unmapped_kind, base, size);
    if (check.not_locked)
        record_violation_locked(not_locked_kind, base, size);
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
/* The CUDA runtime entry points.                                           */

/* The error every entry point returns before looking at its arguments. */
static int runtime_state_error_locked(void)
{
    if (unloading)
        return FAKE_CUDA_ERROR_CUDART_UNLOADING;
    if (config.no_driver)
        return FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER;
    return FAKE_CUDA_SUCCESS;
}

static bool injected_failure_due(uint64_t *counter, unsigned every)
{
    return every && ++*counter % every == 0;
}

static int host_register_locked(uintptr_t base, size_t size, unsigned flags)
{
    int error = runtime_state_error_locked();
    if (error)
        return error;
    if (config.device_count == 0)
        return FAKE_CUDA_ERROR_NO_DEVICE;
    if (injected_failure_due(&register_fail_counter, config.fail_register_every))
        return config.fail_error;
    if (!base || !size || (flags & ~FAKE_CUDA_HOST_REGISTER_VALID_FLAGS) ||
        size - 1 > UINTPTR_MAX - base)
        return FAKE_CUDA_ERROR_INVALID_VALUE;
    if (registration_overlaps(base, size))
        return FAKE_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;

    uint32_t node = node_alloc();
    if (!node)
        return FAKE_CUDA_ERROR_MEMORY_ALLOCATION;
    if (config.check) {
        check_registration_locked(base, size, FAKE_VIOLATION_REGISTER_UNMAPPED,
                                  FAKE_VIOLATION_REGISTER_NOT_LOCKED);
        if (shares_page_with_neighbour(base, size))
            record_violation_locked(FAKE_VIOLATION_PAGE_SHARED, base, size);
    }
    node_pool[node] =
        (struct registration_node){.base = base, .size = size, .flags = flags, .height = 1};
    tree_root = tree_insert(tree_root, node);
    live_count++;
    return FAKE_CUDA_SUCCESS;
}

static int host_unregister_locked(uintptr_t base)
{
    int error = runtime_state_error_locked();
    if (error)
        return error;
    if (injected_failure_due(&unregister_fail_counter, config.fail_unregister_every))
        return config.fail_error;
    uint32_t node = registration_find_containing(base);
    if (!node)
        return FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (node_pool[node].base != base)
        return FAKE_CUDA_ERROR_INVALID_VALUE;
    if (config.check)
        check_registration_locked(base, node_pool[node].size, FAKE_VIOLATION_UNREGISTER_UNMAPPED,
                                  FAKE_VIOLATION_UNREGISTER_NOT_LOCKED);
    tree_root = tree_remove(tree_root, base);
    live_count--;
    return FAKE_CUDA_SUCCESS;
}

/* Failures stay in the calling thread's last error until cudaGetLastError. */
static int finish_call(int error)
{
    if (error)
        thread_last_error = error;
    return error;
}

FAKE_EXPORT int cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    lock_state();
    call_counts[FAKE_CALL_REGISTER]++;
    int error = host_register_locked((uintptr_t)ptr, size, flags);
    log_register((uintptr_t)ptr, size, flags, error);
    unlock_state();
    return finish_call(error);
}

FAKE_EXPORT int cudaHostUnregister(void *ptr)
{
    lock_state();
    call_counts[FAKE_CALL_UNREGISTER]++;
    int error = host_unregister_locked((uintptr_t)ptr);
    log_unregister((uintptr_t)ptr, error);
    unlock_state();
    return finish_call(error);
}

/* With no driver (or after teardown) the runtime reports that state instead
 * of the thread's error; reading it still clears the thread's error. */
FAKE_EXPORT_EXTRA int cudaGetLastError(void)
{
    lock_state();
    call_counts[FAKE_CALL_GET_LAST_ERROR]++;
    int error = runtime_state_error_locked();
    if (!error)
        error = thread_last_error;
    thread_last_error = FAKE_CUDA_SUCCESS;
    log_get_last_error(error);
    unlock_state();
    return error;
}

FAKE_EXPORT_EXTRA int cudaPeekAtLastError(void)
{
    lock_state();
    call_counts[FAKE_CALL_PEEK_AT_LAST_ERROR]++;
    int error = runtime_state_error_locked();
    unlock_state();
    if (error)
        return finish_call(error);
    return thread_last_error;
}

FAKE_EXPORT_EXTRA int cudaGetDeviceCount(int *count)
{
    lock_state();
    call_counts[FAKE_CALL_GET_DEVICE_COUNT]++;
    int error = runtime_state_error_locked();
    if (!error && !count)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    if (!error) {
        *count = (int)config.device_count;
        if (config.device_count == 0)
            error = FAKE_CUDA_ERROR_NO_DEVICE;
    }
    unlock_state();
    return finish_call(error);
}

/* Writes only the leading `type` member of struct cudaPointerAttributes:
 * 1 (cudaMemoryTypeHost) inside a registration, else 0 (unregistered). */
FAKE_EXPORT_EXTRA int cudaPointerGetAttributes(void *attributes, const void *ptr)
{
    lock_state();
    call_counts[FAKE_CALL_POINTER_GET_ATTRIBUTES]++;
    int error = runtime_state_error_locked();
    if (!error && !attributes)
        error = FAKE_CUDA_ERROR_INVALID_VALUE;
    if (!error) {
        int type = registration_find_containing((uintptr_t)ptr) ? 1 : 0;
        memcpy(attributes, &type, sizeof type);
    }
    unlock_state();
    return finish_call(error);
}

struct error_description {
    int code;
    const char *name;
    const char *text;
};

static const struct error_description error_descriptions[] = {
    {FAKE_CUDA_SUCCESS, "cudaSuccess", "no error"},
    {FAKE_CUDA_ERROR_INVALID_VALUE, "cudaErrorInvalidValue", "invalid argument"},
    {FAKE_CUDA_ERROR_MEMORY_ALLOCATION, "cudaErrorMemoryAllocation", "out of memory"},
    {FAKE_CUDA_ERROR_INITIALIZATION, "cudaErrorInitializationError", "initialization error"},
    {FAKE_CUDA_ERROR_CUDART_UNLOADING, "cudaErrorCudartUnloading", "driver shutting down"},
    {FAKE_CUDA_ERROR_STUB_LIBRARY, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {FAKE_CUDA_ERROR_INSUFFICIENT_DRIVER, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {FAKE_CUDA_ERROR_NO_DEVICE, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {FAKE_CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {FAKE_CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {FAKE_CUDA_ERROR_NOT_PERMITTED, "cudaErrorNotPermitted", "operation not permitted"},
    {FAKE_CUDA_ERROR_NOT_SUPPORTED, "cudaErrorNotSupported", "operation not supported"},
};

static const struct error_description *error_description_find(int error)
{
    static const struct error_description unknown = {-1, "cudaErrorUnknown", "unknown error"};
    for (size_t i = 0; i < sizeof error_descriptions / sizeof error_descriptions[0]; i++) {
        if (error_descriptions[i].code == error)
            return &error_descriptions[i];
    }
    return &unknown;
}

FAKE_EXPORT_EXTRA const char *cudaGetErrorName(int error)
{
    return error_description_find(error)->name;
}

FAKE_EXPORT_EXTRA const char *cudaGetErrorString(int error)
{
    return error_description_find(error)->text;
}

/* ------------------------------------------------------------------------ */
/* The query and control API for tests.                                     */

FAKE_EXPORT_EXTRA size_t fake_cudart_live_count(void)
{
    lock_state();
    size_t count = live_count;
    unlock_state();
    return count;
}

FAKE_EXPORT_EXTRA size_t fake_cudart_snapshot(struct fake_cudart_range *out, size_t max)
{
    /* An AVL tree of 2^32 nodes is under 48 levels deep. */
    uint32_t stack[64];
    size_t depth = 0, copied = 0;
    lock_state();
    uint32_t node = tree_root;
    while (copied < max && (node || depth)) {
        while (node) {
            stack[depth++] = node;
            node = node_pool[node].left;
        }
        node = stack[--depth];
        out[copied++] = (struct fake_cudart_range){.base = node_pool[node].base,
                                                   .size = node_pool[node].size,
                                                   .flags = node_pool[node].flags};
        node = node_pool[node].right;
    }
    unlock_state();
    return copied;
}

FAKE_EXPORT_EXTRA size_t fake_cudart_violation_count(void)
{
    size_t total = 0;
    lock_state();
    for (int kind = 0; kind < FAKE_VIOLATION_KIND_COUNT; kind++)
        total += violation_counts[kind];
    unlock_state();
    return total;
}

FAKE_EXPORT_EXTRA size_t fake_cudart_violation_count_of(enum fake_cudart_violation kind)
{
    if ((unsigned)kind >= FAKE_VIOLATION_KIND_COUNT)
        return 0;
    lock_state();
    size_t count = violation_counts[kind];
    unlock_state();
    return count;
}

FAKE_EXPORT_EXTRA uint64_t fake_cudart_call_count(int which)
{
    if (which < 0 || which >= FAKE_CALL_KIND_COUNT)
        return 0;
    lock_state();
    uint64_t count = call_counts[which];
    unlock_state();
    return count;
}

FAKE_EXPORT_EXTRA void fake_cudart_reset(void)
{
    lock_state();
    tree_drop_all();
    memset(call_counts, 0, sizeof call_counts);
    memset(violation_counts, 0, sizeof violation_counts);
    unloading = false;
    load_config_locked();
    unlock_state();
    thread_last_error = FAKE_CUDA_SUCCESS;
}

FAKE_EXPORT_EXTRA void fake_cudart_reload_config(void)
{
    lock_state();
    load_config_locked();
    unlock_state();
}

FAKE_EXPORT_EXTRA void fake_cudart_set_fail_every(unsigned reg, unsigned unreg, int error)
{
    lock_state();
    config.fail_register_every = reg;
    config.fail_unregister_every = unreg;
    config.fail_error = error > 0 ? error : FAKE_CUDA_ERROR_MEMORY_ALLOCATION;
    register_fail_counter = 0;
    unregister_fail_counter = 0;
    unlock_state();
}

FAKE_EXPORT_EXTRA void fake_cudart_set_check(int on)
{
    lock_state();
    config.check = on != 0;
    unlock_state();
}

FAKE_EXPORT_EXTRA void fake_cudart_simulate_exit(void)
{
    enter_unloading_if_configured();
}
