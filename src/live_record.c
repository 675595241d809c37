#include "live_record.h"

#include "engine.h"
#include "io.h"

#include "pinshim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STAT(path, member, kind)                                                                   \
    {                                                                                              \
        path, offsetof(struct engine_statistics, member), kind, 1, 0                               \
    }
#define COUNT(path, member) STAT(path, member, LIVE_FIELD_COUNT)
#define TEXT(path, member)                                                                         \
    {                                                                                              \
        path, offsetof(struct engine_statistics, member), LIVE_FIELD_TEXT, 1,                      \
            sizeof(((struct engine_statistics *)0)->member)                                        \
    }
#define NANOSECONDS(path, member) STAT(path, member, LIVE_FIELD_NANOSECONDS)
#define ARRAY(path, member, kind, count, element)                                                  \
    {                                                                                              \
        path, offsetof(struct engine_statistics, member), kind, count, sizeof(element)             \
    }

/* The names are the JSON document's key paths (stats.c writes the same
 * values at exit); "at_exit" there means "at the record's last change" here. */
static const struct live_record_field fields[] = {
    COUNT("register.ok", counters.register_ok),
    COUNT("register.failed", counters.register_failed),
    COUNT("register.already_registered", counters.register_already_registered),
    COUNT("register.skipped_small", skipped_small),
    COUNT("register.skipped_no_runtime", skipped_disabled),
    COUNT("register.skipped_runtime_library", skipped_runtime_library),
    COUNT("register.by_pieces", registered_by_pieces),
    COUNT("register.read_only", read_only_registrations),
    COUNT("register.skipped_read_only_unsupported", skipped_read_only_unsupported),
    COUNT("register.skipped_io", skipped_pieces[ENGINE_MAPPING_IO]),
    COUNT("register.skipped_no_access", skipped_pieces[ENGINE_MAPPING_NO_ACCESS]),
    COUNT("register.skipped_shared_file", skipped_pieces[ENGINE_MAPPING_SHARED_FILE]),
    COUNT("register.skipped_unmapped", skipped_pieces[ENGINE_MAPPING_UNMAPPED]),
    COUNT("register.skipped_address", skipped_address),
    COUNT("register.skipped_onfault_pages", skipped_onfault_pages),
    COUNT("register.bytes", counters.register_bytes),
    NANOSECONDS("register.seconds", counters.register_nanoseconds),
    COUNT("unregister.ok", counters.unregister_ok),
    COUNT("unregister.failed", counters.unregister_failed),
    COUNT("unregister.munlock", counters.unregister_munlock),
    COUNT("unregister.free", counters.unregister_free),
    COUNT("unregister.realloc", counters.unregister_realloc),
    COUNT("unregister.munmap", counters.unregister_munmap),
    COUNT("unregister.mremap", counters.unregister_mremap),
    COUNT("unregister.mmap_fixed", counters.unregister_mmap_fixed),
    COUNT("unregister.exit", counters.unregister_exit),
    COUNT("unregister.program", counters.unregister_program),
    COUNT("unregister.mprotect", counters.unregister_mprotect),
    COUNT("unregister.join", counters.unregister_join),
    COUNT("unregister.exit_unloading", exit_unloading),
    COUNT("unregister.gone", gone_with_context),
    NANOSECONDS("unregister.seconds", counters.unregister_nanoseconds),
    COUNT("runs.joined", runs_joined),
    COUNT("runs.join_failed", join_failed),
    COUNT("runs.chunked", runs_chunked),
    COUNT("runs.held_ranges_at_exit", held_ranges),
    COUNT("runs.held_bytes_at_exit", held_bytes),
    COUNT("deferred.ranges", deferred_total),
    COUNT("deferred.registered_later", deferred_registered),
    COUNT("deferred.dropped", dropped_pending),
    COUNT("deferred.pending_ranges_at_exit", counters.pending_ranges),
    COUNT("deferred.pending_bytes_at_exit", counters.pending_bytes),
    COUNT("thread.queued_at_exit", counters.queued_ranges),
    COUNT("thread.cancelled", cancelled_queued),
    NANOSECONDS("thread.wait_seconds", wait_nanoseconds),
    NANOSECONDS("thread.background_seconds", background_nanoseconds),
    COUNT("program.registrations", program_registrations),
    COUNT("program.unregistrations", program_unregistrations),
    COUNT("program.handed_over", program_handed_over),
    COUNT("program.kept", program_kept),
    COUNT("program.taken_back", program_took_back),
    COUNT("calls.lock", lock_calls),
    COUNT("calls.unlock", unlock_calls),
    COUNT("calls.mlockall", mlockall_calls),
    COUNT("live.ranges", counters.live_ranges),
    COUNT("live.bytes", counters.live_bytes),
    COUNT("live.peak_bytes", counters.peak_bytes),
    STAT("last_change", last_change_ns, LIVE_FIELD_TIME),
    TEXT("accelerator.vendor", vendor),
    TEXT("accelerator.register_call", register_call),
    ARRAY("devices[].registrations", devices[0].registrations, LIVE_FIELD_COUNT, ENGINE_MAX_DEVICES,
          struct engine_device_counts),
    ARRAY("devices[].bytes", devices[0].bytes, LIVE_FIELD_COUNT, ENGINE_MAX_DEVICES,
          struct engine_device_counts),
    ARRAY("errors[].code", errors[0].code, LIVE_FIELD_INT32, ENGINE_ERROR_SLOTS,
          struct engine_error_count),
    ARRAY("errors[].count", errors[0].count, LIVE_FIELD_COUNT, ENGINE_ERROR_SLOTS,
          struct engine_error_count),
    ARRAY("errors[].name", errors[0].name, LIVE_FIELD_TEXT, ENGINE_ERROR_SLOTS,
          struct engine_error_count),
    ARRAY("numa.nodes[].bytes", numa_nodes[0].bytes, LIVE_FIELD_COUNT, NUMA_PLACEMENT_MAX_NODES,
          struct engine_numa_counts),
    ARRAY("numa.nodes[].local_bytes", numa_nodes[0].local_bytes, LIVE_FIELD_COUNT,
          NUMA_PLACEMENT_MAX_NODES, struct engine_numa_counts),
    COUNT("numa.remote_bytes", numa_remote_bytes),
    COUNT("numa.unknown_bytes", numa_unknown_bytes),
    ARRAY("numa.device_nodes[]", device_nodes[0], LIVE_FIELD_INT32, ENGINE_MAX_DEVICES, int32_t),
    TEXT("huge_pages.kernel", huge_pages_kernel),
    COUNT("huge_pages.huge_bytes", huge_bytes),
    COUNT("huge_pages.small_bytes", small_bytes),
    COUNT("huge_pages.unknown_bytes", page_size_unknown_bytes),
    COUNT("huge_pages.made_bytes", huge_made_bytes),
    COUNT("huge_pages.had_pages_bytes", huge_had_pages_bytes),
    COUNT("huge_pages.no_block_bytes", huge_no_block_bytes),
    COUNT("huge_pages.refused_bytes", huge_refused_bytes),
    COUNT("huge_pages.stopped_bytes", huge_stopped_bytes),
    COUNT("huge_pages.aligned_allocations", huge_aligned_allocations),
    COUNT("huge_pages.backed_off", huge_backed_off),
};

#define FIELD_COUNT (sizeof(fields) / sizeof(fields[0]))
#define ALIGN_UP(value, to) (((value) + (to)-1) / (to) * (to))
#define NAME_ATTEMPTS 16

size_t live_record_field_table(const struct live_record_field **out)
{
    *out = fields;
    return FIELD_COUNT;
}

static void copy_text(char *out, size_t out_size, const char *text)
{
    size_t length = text == NULL ? 0 : strlen(text);
    if (length >= out_size)
        length = out_size - 1;
    if (length > 0)
        memcpy(out, text, length);
    out[length] = '\0';
}

static uint64_t realtime_ns(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0)
        return 0;
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

uint64_t live_record_start_ticks(const char *stat_path)
{
    char text[1024];
    if (!read_small_file(stat_path, text, sizeof(text)))
        return 0;
    /* Field 22: the start time. */
    const char *cursor = proc_stat_field(text, 22);
    if (cursor == NULL)
        return 0;
    uint64_t ticks = 0;
    for (; *cursor >= '0' && *cursor <= '9'; cursor++)
        ticks = ticks * 10 + (uint64_t)(*cursor - '0');
    return ticks;
}

/* This process's pid namespace: the inode of /proc/self/ns/pid, 0 when unknown. */
static uint32_t pid_namespace(void)
{
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
    if (n <= 0)
        return 0;
    link[n] = '\0';
    const char *digits = strchr(link, '[');
    uint64_t inode = 0;
    for (digits = digits ? digits + 1 : link + n; *digits >= '0' && *digits <= '9'; digits++)
        inode = inode * 10 + (uint64_t)(*digits - '0');
    return inode <= UINT32_MAX ? (uint32_t)inode : 0;
}

bool live_record_default_directory(const char *xdg_runtime_dir, unsigned uid, char *out,
                                   size_t out_size)
{
    struct stat info;
    int n;
    if (xdg_runtime_dir != NULL && xdg_runtime_dir[0] == '/' && stat(xdg_runtime_dir, &info) == 0 &&
        S_ISDIR(info.st_mode) && info.st_uid == uid)
        n = snprintf(out, out_size, "%s/pinshim", xdg_runtime_dir);
    else if (stat("/dev/shm", &info) == 0 && S_ISDIR(info.st_mode))
        n = snprintf(out, out_size, "/dev/shm/pinshim-%u", uid);
    else
        n = snprintf(out, out_size, "/tmp/pinshim-%u", uid);
    return n > 0 && (size_t)n < out_size;
}

int live_record_open_directory(const char *path, bool private_directory, char *why, size_t why_size)
{
    if (private_directory && mkdir(path, 0700) != 0 && errno != EEXIST) {
        snprintf(why, why_size, "cannot make the directory: %s", strerror(errno));
        return -1;
    }
    /* O_NOFOLLOW: a symlink planted at the private directory's name (in a
     * directory all users write to) is refused, never followed. */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (private_directory ? O_NOFOLLOW : 0));
    if (fd < 0) {
        snprintf(why, why_size, "%s", strerror(errno));
        return -1;
    }
    struct stat info;
    if (fstat(fd, &info) != 0) {
        snprintf(why, why_size, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    if (private_directory && info.st_uid != geteuid()) {
        snprintf(why, why_size, "it belongs to uid %u, not to this user", (unsigned)info.st_uid);
        close(fd);
        return -1;
    }
    if (private_directory && (info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        snprintf(why, why_size, "others can write to it (mode %03o)",
                 (unsigned)(info.st_mode & 0777));
        close(fd);
        return -1;
    }
    return fd;
}

/* Opens the record at name when it is this very process's (same pid, start
 * time and boot: from before an exec), reading its header. -1 otherwise. */
static int open_own_earlier_record(int directory_fd, const char *name,
                                   const struct live_record_header *ours,
                                   struct live_record_header *header)
{
    int fd = openat(directory_fd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat info;
    if (fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_uid == geteuid() &&
        pread(fd, header, sizeof(*header), 0) == (ssize_t)sizeof(*header) &&
        memcmp(header->magic, LIVE_RECORD_MAGIC, sizeof(header->magic)) == 0 &&
        header->version == LIVE_RECORD_VERSION && header->byte_order == LIVE_RECORD_BYTE_ORDER &&
        header->pid == ours->pid && header->start_ticks == ours->start_ticks &&
        strncmp(header->boot_id, ours->boot_id, sizeof(header->boot_id)) == 0)
        return fd;
    close(fd);
    return -1;
}

/* The name is taken. When it holds this process's record from before an
 * exec, still running, that record ended there. */
static void mark_earlier_image(int directory_fd, const char *name,
                               const struct live_record_header *ours)
{
    struct live_record_header header;
    int fd = open_own_earlier_record(directory_fd, name, ours, &header);
    if (fd < 0)
        return;
    if (header.state == LIVE_RECORD_RUNNING || header.state == LIVE_RECORD_EXITING) {
        uint32_t state = LIVE_RECORD_REPLACED;
        char ended_by[sizeof(header.ended_by)] = "exec";
        uint64_t ended = realtime_ns();
        /* ended_by and the time first: a reader that sees the state sees them. */
        if (pwrite(fd, ended_by, sizeof(ended_by), offsetof(struct live_record_header, ended_by)) ==
                (ssize_t)sizeof(ended_by) &&
            pwrite(fd, &ended, sizeof(ended), offsetof(struct live_record_header, ended_ns)) ==
                (ssize_t)sizeof(ended))
            (void)!pwrite(fd, &state, sizeof(state), offsetof(struct live_record_header, state));
    }
    close(fd);
}

static int record_name(char *out, size_t out_size, const char *base_name, int attempt)
{
    return attempt == 0
               ? snprintf(out, out_size, "%s%s", base_name, LIVE_RECORD_SUFFIX)
               : snprintf(out, out_size, "%s.%d%s", base_name, attempt, LIVE_RECORD_SUFFIX);
}

/* Gives the file its blocks now, so that no later write to its mapped pages
 * can need one (a full file system answers such a write with SIGBUS). */
static bool allocate_file(int fd, size_t bytes)
{
    if (syscall(SYS_fallocate, fd, 0, (off_t)0, (off_t)bytes) == 0)
        return true;
    if (errno != EOPNOTSUPP && errno != ENOSYS)
        return false;
    static const char zeros[4096];
    for (size_t offset = 0; offset < bytes;) {
        size_t chunk = bytes - offset < sizeof(zeros) ? bytes - offset : sizeof(zeros);
        ssize_t n = pwrite(fd, zeros, chunk, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        offset += (size_t)n;
    }
    return true;
}

static void fill_header(struct live_record_header *header,
                        const struct live_record_identity *identity, size_t data_offset,
                        size_t data_bytes)
{
    memset(header, 0, sizeof(*header));
    header->version = LIVE_RECORD_VERSION;
    header->byte_order = LIVE_RECORD_BYTE_ORDER;
    header->header_bytes = (uint32_t)ALIGN_UP(sizeof(*header), 64);
    header->field_count = (uint32_t)FIELD_COUNT;
    header->field_bytes = (uint32_t)sizeof(struct live_record_field);
    header->data_offset = (uint32_t)data_offset;
    header->data_bytes = (uint32_t)data_bytes;
    header->state = LIVE_RECORD_RUNNING;
    header->pid = (int64_t)getpid();
    header->start_ticks = live_record_start_ticks("/proc/self/stat");
    header->pid_namespace = pid_namespace();
    long ticks = sysconf(_SC_CLK_TCK);
    header->ticks_per_second = ticks > 0 ? (uint64_t)ticks : 0;
    header->created_ns = realtime_ns();
    header->fork_child = identity->fork_child ? 1 : 0;
    read_small_file("/proc/sys/kernel/random/boot_id", header->boot_id, sizeof(header->boot_id));
    copy_text(header->version_text, sizeof(header->version_text), PINSHIM_VERSION_STRING);
    copy_text(header->context_mode, sizeof(header->context_mode), identity->context_mode);
    copy_text(header->host, sizeof(header->host), identity->host);
    copy_text(header->exe, sizeof(header->exe), identity->exe);
    copy_text(header->stats_path, sizeof(header->stats_path), identity->stats_path);
}

void *live_record_create(struct live_record *record, int directory_fd, const char *directory,
                         const char *base_name, const struct live_record_identity *identity,
                         struct live_record_prune *prune, size_t data_bytes, char *why,
                         size_t why_size)
{
    memset(record, 0, sizeof(*record));
    size_t header_bytes = ALIGN_UP(sizeof(struct live_record_header), 64);
    size_t data_offset = ALIGN_UP(header_bytes + sizeof(fields), 64);
    long page = sysconf(_SC_PAGESIZE);
    size_t file_bytes = ALIGN_UP(data_offset + data_bytes, page > 0 ? (size_t)page : 4096);
    struct live_record_header header;
    fill_header(&header, identity, data_offset, data_bytes);
    if (prune != NULL)
        live_record_prune(directory_fd, &header, prune);

    int fd = -1;
    for (int attempt = 0; attempt < NAME_ATTEMPTS && fd < 0; attempt++) {
        int n = record_name(record->name, sizeof(record->name), base_name, attempt);
        record->attempt = attempt;
        if (n <= 0 || (size_t)n >= sizeof(record->name) ||
            strlen(base_name) >= sizeof(record->base_name)) {
            snprintf(why, why_size, "the name %s is too long", base_name);
            close(directory_fd);
            return NULL;
        }
        /* O_EXCL: never opens what is there (a symlink included). */
        fd = openat(directory_fd, record->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                    0666);
        if (fd < 0 && errno == EEXIST)
            mark_earlier_image(directory_fd, record->name, &header);
        else if (fd < 0)
            break;
    }
    if (fd < 0) {
        int error = errno;
        snprintf(why, why_size, "cannot create %s: %s", record->name,
                 error == EEXIST ? "every name tried is taken" : strerror(error));
        close(directory_fd);
        return NULL;
    }
    struct stat info;
    long mapped = -1;
    if (!allocate_file(fd, file_bytes) || fstat(fd, &info) != 0 ||
        (mapped = syscall(SYS_mmap, NULL, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                          (off_t)0)) == -1) {
        snprintf(why, why_size, "cannot map %s: %s", record->name, strerror(errno));
        close(fd);
        unlinkat(directory_fd, record->name, 0);
        close(directory_fd);
        return NULL;
    }
    close(fd);
    char *mapping = (char *)mapped;
    memcpy(mapping + header_bytes, fields, sizeof(fields));
    /* The magic last, as one release store (the mapping is page-aligned): a reader that
     * finds it finds the rest written. A store rather than a fence, which TSan cannot see. */
    uint64_t magic_word;
    memcpy(&magic_word, LIVE_RECORD_MAGIC, sizeof(magic_word));
    memset(header.magic, 0, sizeof(header.magic));
    memcpy(mapping, &header, sizeof(header));
    __atomic_store_n((uint64_t *)(void *)mapping, magic_word, __ATOMIC_RELEASE);
    close(directory_fd);
    record->mapping = mapping;
    record->mapping_bytes = file_bytes;
    copy_text(record->directory, sizeof(record->directory), directory);
    copy_text(record->base_name, sizeof(record->base_name), base_name);
    record->file_device = (uint64_t)info.st_dev;
    record->file_inode = (uint64_t)info.st_ino;
    return mapping + data_offset;
}

void live_record_set_state(struct live_record *record, enum live_record_state state,
                           const char *ended_by)
{
    if (record->mapping == NULL)
        return;
    struct live_record_header *header = (struct live_record_header *)record->mapping;
    if (ended_by != NULL) {
        copy_text(header->ended_by, sizeof(header->ended_by), ended_by);
        __atomic_store_n(&header->ended_ns, realtime_ns(), __ATOMIC_RELAXED);
    }
    __atomic_store_n(&header->state, (uint32_t)state, __ATOMIC_RELEASE);
}

void live_record_finish(struct live_record *record, const char *ended_by, bool remove)
{
    if (record->mapping == NULL)
        return;
    live_record_set_state(record, LIVE_RECORD_EXITED, ended_by);
    if (!remove)
        return;
    int directory_fd = open(record->directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (directory_fd < 0)
        return;
    struct stat info;
    /* Only this record's file: the name may hold another by now. */
    if (fstatat(directory_fd, record->name, &info, AT_SYMLINK_NOFOLLOW) == 0 &&
        (uint64_t)info.st_dev == record->file_device && (uint64_t)info.st_ino == record->file_inode)
        unlinkat(directory_fd, record->name, 0);
    /* And what this process's earlier images (before exec) left. */
    const struct live_record_header *ours = (const struct live_record_header *)record->mapping;
    for (int attempt = 0; attempt < record->attempt; attempt++) {
        char name[sizeof(record->name)];
        struct live_record_header header;
        int n = record_name(name, sizeof(name), record->base_name, attempt);
        int fd = n > 0 && (size_t)n < sizeof(name)
                     ? open_own_earlier_record(directory_fd, name, ours, &header)
                     : -1;
        if (fd < 0)
            continue;
        if (header.state == LIVE_RECORD_REPLACED)
            unlinkat(directory_fd, name, 0);
        close(fd);
    }
    close(directory_fd);
}

void live_record_forget_after_fork(struct live_record *record)
{
    if (record->mapping != NULL)
        syscall(SYS_munmap, record->mapping, record->mapping_bytes);
    memset(record, 0, sizeof(*record));
}
