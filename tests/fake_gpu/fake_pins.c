/* fake_pins: see fake_pins.h. Locks: state_lock guards the table, the
 * counters and the violations; callers_lock the calling objects; dladdr,
 * which takes the dynamic loader's lock, is called with neither held. */
#include "fake_pins.h"

#include "fake_line.h"
#include "smaps_locked.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct config {
    unsigned fail_register_every, fail_unregister_every;
    int fail_error;
    bool check;
    double register_seconds_per_gib, unregister_seconds_per_gib;
    int log_fd;
};

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static bool configured;
static struct config config = {.check = true, .log_fd = -1};
static uintptr_t page_size = 4096;

static struct fake_pins_entry *table; /* FAKE_PINS_CAPACITY entries, raw mmap */
static size_t table_count;
static uint64_t last_id;
static uint64_t epoch;
static uint64_t register_calls_counted, unregister_calls_counted;
static size_t violations[FAKE_GPU_VIOLATION_KIND_COUNT];
static uint64_t copies[FAKE_GPU_COPY_OUTCOME_COUNT], copy_bytes[FAKE_GPU_COPY_OUTCOME_COUNT];

static const char *const violation_names[FAKE_GPU_VIOLATION_KIND_COUNT] = {
    "register_unmapped",     "register_not_locked", "page_shared",   "unregister_unmapped",
    "unregister_not_locked", "register_overlap",    "loader_handle", "too_early",
};

void fake_pins_lock(void)
{
    pthread_mutex_lock(&state_lock);
}

void fake_pins_unlock(void)
{
    pthread_mutex_unlock(&state_lock);
}

/* getenv reads the environment as it is; no allocation. */
static unsigned env_unsigned(const char *name, unsigned fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    unsigned value = 0;
    for (; *text >= '0' && *text <= '9'; text++)
        value = value * 10 + (unsigned)(*text - '0');
    return value;
}

static double env_decimal(const char *name)
{
    const char *text = getenv(name);
    if (text == NULL)
        return 0;
    double value = 0, scale = 0;
    for (; *text; text++) {
        if (*text == '.' && scale == 0) {
            scale = 1;
        } else if (*text >= '0' && *text <= '9') {
            value = value * 10 + (*text - '0');
            scale *= 10;
        } else {
            break;
        }
    }
    return scale > 0 ? value / scale : value;
}

void fake_pins_configure(int out_of_memory)
{
    fake_pins_lock();
    if (!configured) {
        configured = true;
        long page = sysconf(_SC_PAGESIZE);
        if (page > 0)
            page_size = (uintptr_t)page;
        config.fail_register_every = env_unsigned("FAKE_GPU_FAIL_REGISTER_EVERY", 0);
        config.fail_unregister_every = env_unsigned("FAKE_GPU_FAIL_UNREGISTER_EVERY", 0);
        const char *error = getenv("FAKE_GPU_FAIL_ERROR");
        config.fail_error = error != NULL && *error ? (int)strtol(error, NULL, 0) : out_of_memory;
        const char *check = getenv("FAKE_GPU_CHECK");
        config.check = check == NULL || strcmp(check, "0") != 0;
        config.register_seconds_per_gib = env_decimal("FAKE_GPU_REGISTER_SECONDS_PER_GIB");
        config.unregister_seconds_per_gib = env_decimal("FAKE_GPU_UNREGISTER_SECONDS_PER_GIB");
        const char *log = getenv("FAKE_GPU_LOG");
        if (log != NULL && *log)
            config.log_fd = (int)syscall(SYS_openat, AT_FDCWD, log,
                                         O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        void *memory = (void *)syscall(SYS_mmap, NULL, FAKE_PINS_CAPACITY * sizeof(*table),
                                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        table = memory == MAP_FAILED ? NULL : memory;
    }
    fake_pins_unlock();
}

bool fake_pins_checking(void)
{
    return config.check;
}

/* ---- the table ---- */

/* The first entry whose base is at or above address. */
static size_t lower_bound(uintptr_t address)
{
    size_t low = 0, high = table_count;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (table[middle].base < address)
            low = middle + 1;
        else
            high = middle;
    }
    return low;
}

long fake_pins_containing(uintptr_t address)
{
    size_t at = lower_bound(address + 1);
    if (at == 0)
        return -1;
    struct fake_pins_entry *entry = &table[at - 1];
    return address - entry->base < entry->size ? (long)(at - 1) : -1;
}

long fake_pins_overlapping(uintptr_t base, size_t size, size_t *count)
{
    size_t at = lower_bound(base);
    if (at > 0 && table[at - 1].base + table[at - 1].size > base)
        at--;
    size_t first = at;
    while (at < table_count && table[at].base < base + size)
        at++;
    *count = at - first;
    return at > first ? (long)first : -1;
}

struct fake_pins_entry *fake_pins_at(long index)
{
    return &table[index];
}

long fake_pins_find_id(uint64_t id)
{
    for (size_t i = 0; i < table_count; i++)
        if (table[i].id == id)
            return (long)i;
    return -1;
}

long fake_pins_insert(uintptr_t base, size_t size, unsigned flags, uintptr_t tag, uint8_t state)
{
    if (table == NULL || table_count == FAKE_PINS_CAPACITY)
        return -1;
    size_t at = lower_bound(base);
    memmove(&table[at + 1], &table[at], (table_count - at) * sizeof(*table));
    table[at] = (struct fake_pins_entry){base, size, ++last_id, tag, flags, state};
    table_count++;
    return (long)at;
}

void fake_pins_remove(long index)
{
    size_t at = (size_t)index;
    memmove(&table[at], &table[at + 1], (table_count - at - 1) * sizeof(*table));
    table_count--;
}

size_t fake_pins_count(void)
{
    return table_count;
}

/* ---- checks ---- */

static void record_violation(enum fake_gpu_violation kind, uintptr_t base, size_t size)
{
    violations[kind]++;
    if (config.log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "violation");
    fake_line_string(&line, " ");
    fake_line_string(&line, violation_names[kind]);
    fake_line_pointer(&line, base);
    fake_line_decimal(&line, size);
    fake_line_emit(&line, config.log_fd);
}

void fake_pins_violation(enum fake_gpu_violation kind, uintptr_t base, size_t size)
{
    record_violation(kind, base, size);
}

static uintptr_t page_floor(uintptr_t address)
{
    return address & ~(page_size - 1);
}

static void check_locked(uintptr_t base, size_t size, enum fake_gpu_violation unmapped,
                         enum fake_gpu_violation not_locked)
{
    struct lock_check check =
        check_range_locked(page_floor(base), page_floor(base + size - 1) + page_size);
    if (check.unmapped)
        record_violation(unmapped, base, size);
    if (check.not_locked)
        record_violation(not_locked, base, size);
}

void fake_pins_check_register(uintptr_t base, size_t size)
{
    if (!config.check)
        return;
    check_locked(base, size, FAKE_GPU_VIOLATION_REGISTER_UNMAPPED,
                 FAKE_GPU_VIOLATION_REGISTER_NOT_LOCKED);
    /* The shim rounds every registration out to whole pages of its own: no
     * page of this one may be in another. */
    size_t count = 0;
    long first = fake_pins_overlapping(
        page_floor(base), page_floor(base + size - 1) + page_size - page_floor(base), &count);
    for (size_t i = 0; first >= 0 && i < count; i++) {
        struct fake_pins_entry *other = &table[first + (long)i];
        if (other->base + other->size <= base || other->base >= base + size)
            record_violation(FAKE_GPU_VIOLATION_PAGE_SHARED, base, size);
    }
}

void fake_pins_check_unregister(uintptr_t base, size_t size)
{
    if (config.check)
        check_locked(base, size, FAKE_GPU_VIOLATION_UNREGISTER_UNMAPPED,
                     FAKE_GPU_VIOLATION_UNREGISTER_NOT_LOCKED);
}

/* Every page of [base, base + size) mapped and readable: what any pin of
 * user pages needs (the kernel's check_vma_flags refuses holes and
 * mappings without read access, mm/gup.c). */
bool fake_pins_pinnable(uintptr_t base, size_t size, bool for_write)
{
    uintptr_t first = page_floor(base), end = page_floor(base + size - 1) + page_size;
    struct line_reader reader = {.fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC)};
    if (reader.fd < 0)
        return true; /* cannot tell */
    uintptr_t covered = first;
    bool readable = true, writable = true;
    const char *line;
    while (covered < end && (line = line_reader_next(&reader)) != NULL) {
        uintptr_t start, stop;
        if (!parse_vma_header(line, &start, &stop) || stop <= covered)
            continue;
        if (start > covered)
            break; /* a hole */
        const char *permissions = strchr(line, ' ');
        readable = readable && permissions != NULL && permissions[1] == 'r';
        writable = writable && permissions != NULL && permissions[2] == 'w';
        covered = stop;
    }
    close(reader.fd);
    return readable && (!for_write || writable) && covered >= end;
}

bool fake_pins_injected_failure(bool unregister, int *error)
{
    unsigned every = unregister ? config.fail_unregister_every : config.fail_register_every;
    uint64_t *counted = unregister ? &unregister_calls_counted : &register_calls_counted;
    ++*counted;
    if (every == 0 || *counted % every != 0)
        return false;
    *error = config.fail_error;
    return true;
}

/* ---- latency ---- */

double fake_pins_latency(size_t size, bool unregister)
{
    double per_gib =
        unregister ? config.unregister_seconds_per_gib : config.register_seconds_per_gib;
    return per_gib * (double)size / (double)(1ull << 30);
}

void fake_pins_sleep(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec time = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&time, &time) != 0)
        ;
}

uint64_t fake_pins_epoch(void)
{
    return epoch;
}

/* ---- calls by object ---- */

#define MAX_OBJECTS 16
static pthread_mutex_t callers_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[256];
    uint64_t calls[FAKE_PINS_MAX_CALL_KINDS];
} objects[MAX_OBJECTS + 1]; /* the last is "(other)" */
static unsigned object_count;
static uint64_t calls_total[FAKE_PINS_MAX_CALL_KINDS];

void fake_pins_count_call(int kind, const void *caller)
{
    Dl_info info;
    const char *name = "(unknown)";
    if (dladdr(caller, &info) && info.dli_fname != NULL)
        name = info.dli_fname;
    pthread_mutex_lock(&callers_lock);
    unsigned slot = 0;
    while (slot < object_count && strcmp(objects[slot].name, name) != 0)
        slot++;
    if (slot == object_count && object_count < MAX_OBJECTS) {
        size_t length = strlen(name);
        if (length >= sizeof(objects[slot].name))
            length = sizeof(objects[slot].name) - 1;
        memcpy(objects[slot].name, name, length);
        objects[slot].name[length] = '\0';
        object_count++;
    }
    if (kind >= 0 && kind < FAKE_PINS_MAX_CALL_KINDS) {
        objects[slot].calls[kind]++;
        calls_total[kind]++;
    }
    pthread_mutex_unlock(&callers_lock);
}

/* ---- copies and device memory ---- */

void fake_pins_count_copy(enum fake_gpu_copy_outcome outcome, size_t bytes)
{
    copies[outcome]++;
    copy_bytes[outcome] += bytes;
}

static struct fake_device_block device_blocks[FAKE_DEVICE_CAPACITY];
static uintptr_t next_device_address = (uintptr_t)0x7e0000000000ull << 8; /* non-canonical */

static size_t device_span(size_t size)
{
    return (size + page_size - 1) & ~(size_t)(page_size - 1);
}

uintptr_t fake_device_alloc(size_t size)
{
    if (size == 0 || size > ((size_t)1 << 46))
        return 0;
    for (size_t i = 0; i < FAKE_DEVICE_CAPACITY; i++) {
        if (device_blocks[i].base != 0)
            continue;
        void *memory = (void *)syscall(SYS_mmap, NULL, device_span(size), PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (memory == MAP_FAILED)
            return 0;
        device_blocks[i] = (struct fake_device_block){next_device_address, size, memory};
        next_device_address += device_span(size);
        return device_blocks[i].base;
    }
    return 0;
}

bool fake_device_free(uintptr_t base)
{
    for (size_t i = 0; i < FAKE_DEVICE_CAPACITY; i++) {
        if (base == 0 || device_blocks[i].base != base)
            continue;
        syscall(SYS_munmap, device_blocks[i].backing, device_span(device_blocks[i].size));
        device_blocks[i] = (struct fake_device_block){0, 0, NULL};
        return true;
    }
    return false;
}

bool fake_device_find(uintptr_t address, struct fake_device_block *block)
{
    for (size_t i = 0; i < FAKE_DEVICE_CAPACITY; i++) {
        if (device_blocks[i].base != 0 && address >= device_blocks[i].base &&
            address - device_blocks[i].base < device_blocks[i].size) {
            *block = device_blocks[i];
            return true;
        }
    }
    return false;
}

/* ---- log ---- */

void fake_pins_log_register(uintptr_t base, size_t size, unsigned flags, int error)
{
    if (config.log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "register");
    fake_line_pointer(&line, base);
    fake_line_decimal(&line, size);
    fake_line_decimal(&line, flags);
    fake_line_signed(&line, error);
    fake_line_emit(&line, config.log_fd);
}

void fake_pins_log_unregister(uintptr_t base, int error)
{
    if (config.log_fd < 0)
        return;
    struct fake_line line;
    fake_line_start(&line, "unregister");
    fake_line_pointer(&line, base);
    fake_line_signed(&line, error);
    fake_line_emit(&line, config.log_fd);
}

/* ---- the query API ---- */

FAKE_EXPORT size_t fake_gpu_snapshot(struct fake_gpu_range *out, size_t max)
{
    fake_pins_lock();
    size_t count = 0;
    for (size_t i = 0; i < table_count && count < max; i++)
        if (table[i].state == FAKE_PINS_LIVE)
            out[count++] = (struct fake_gpu_range){table[i].base, table[i].size};
    fake_pins_unlock();
    return count;
}

FAKE_EXPORT size_t fake_gpu_live_count(void)
{
    fake_pins_lock();
    size_t count = 0;
    for (size_t i = 0; i < table_count; i++)
        count += table[i].state == FAKE_PINS_LIVE;
    fake_pins_unlock();
    return count;
}

FAKE_EXPORT size_t fake_gpu_violation_count(void)
{
    fake_pins_lock();
    size_t count = 0;
    for (int i = 0; i < FAKE_GPU_VIOLATION_KIND_COUNT; i++)
        count += violations[i];
    fake_pins_unlock();
    return count;
}

FAKE_EXPORT size_t fake_gpu_violation_count_of(int kind)
{
    if (kind < 0 || kind >= FAKE_GPU_VIOLATION_KIND_COUNT)
        return 0;
    fake_pins_lock();
    size_t count = violations[kind];
    fake_pins_unlock();
    return count;
}

FAKE_EXPORT uint64_t fake_gpu_call_count(int kind)
{
    if (kind < 0 || kind >= FAKE_PINS_MAX_CALL_KINDS)
        return 0;
    pthread_mutex_lock(&callers_lock);
    uint64_t count = calls_total[kind];
    pthread_mutex_unlock(&callers_lock);
    return count;
}

FAKE_EXPORT uint64_t fake_gpu_call_count_by(int kind, const char *object_substring)
{
    if (kind < 0 || kind >= FAKE_PINS_MAX_CALL_KINDS)
        return 0;
    uint64_t count = 0;
    pthread_mutex_lock(&callers_lock);
    for (unsigned i = 0; i < object_count; i++)
        if (strstr(objects[i].name, object_substring) != NULL)
            count += objects[i].calls[kind];
    pthread_mutex_unlock(&callers_lock);
    return count;
}

FAKE_EXPORT void fake_gpu_reset(void)
{
    fake_pins_lock();
    table_count = 0;
    epoch++;
    register_calls_counted = unregister_calls_counted = 0;
    memset(violations, 0, sizeof(violations));
    memset(copies, 0, sizeof(copies));
    memset(copy_bytes, 0, sizeof(copy_bytes));
    fake_pins_unlock();
    pthread_mutex_lock(&callers_lock);
    memset(objects, 0, sizeof(objects));
    memset(calls_total, 0, sizeof(calls_total));
    object_count = 0;
    pthread_mutex_unlock(&callers_lock);
}

FAKE_EXPORT uint64_t fake_gpu_copy_count(int outcome)
{
    if (outcome < 0 || outcome >= FAKE_GPU_COPY_OUTCOME_COUNT)
        return 0;
    fake_pins_lock();
    uint64_t count = copies[outcome];
    fake_pins_unlock();
    return count;
}

FAKE_EXPORT uint64_t fake_gpu_copy_bytes(int outcome)
{
    if (outcome < 0 || outcome >= FAKE_GPU_COPY_OUTCOME_COUNT)
        return 0;
    fake_pins_lock();
    uint64_t bytes = copy_bytes[outcome];
    fake_pins_unlock();
    return bytes;
}

FAKE_EXPORT void fake_gpu_set_fail_every(unsigned reg, unsigned unreg, int error)
{
    fake_pins_lock();
    config.fail_register_every = reg;
    config.fail_unregister_every = unreg;
    config.fail_error = error;
    register_calls_counted = unregister_calls_counted = 0;
    fake_pins_unlock();
}

FAKE_EXPORT void fake_gpu_set_check(int on)
{
    fake_pins_lock();
    config.check = on != 0;
    fake_pins_unlock();
}

struct fake_pins_timed fake_pins_insert_timed(uintptr_t base, size_t size, unsigned flags,
                                              uintptr_t tag, long *at)
{
    struct fake_pins_timed timed = {0, fake_pins_latency(size, false), fake_pins_epoch()};
    *at = fake_pins_insert(base, size, flags, tag,
                           timed.seconds > 0 ? FAKE_PINS_REGISTERING : FAKE_PINS_LIVE);
    if (*at >= 0 && timed.seconds > 0)
        timed.id = fake_pins_at(*at)->id;
    return timed;
}

struct fake_pins_timed fake_pins_remove_timed(long at)
{
    struct fake_pins_entry *entry = fake_pins_at(at);
    fake_pins_check_unregister(entry->base, entry->size);
    struct fake_pins_timed timed = {0, fake_pins_latency(entry->size, true), fake_pins_epoch()};
    if (timed.seconds > 0) {
        entry->state = FAKE_PINS_UNREGISTERING;
        timed.id = entry->id;
    } else {
        fake_pins_remove(at);
    }
    return timed;
}

void fake_pins_finish_timed(struct fake_pins_timed timed, bool removal)
{
    if (timed.id == 0)
        return;
    fake_pins_sleep(timed.seconds);
    fake_pins_lock();
    long at = timed.epoch == fake_pins_epoch() ? fake_pins_find_id(timed.id) : -1;
    if (at >= 0 && removal)
        fake_pins_remove(at);
    else if (at >= 0)
        fake_pins_at(at)->state = FAKE_PINS_LIVE;
    fake_pins_unlock();
}
