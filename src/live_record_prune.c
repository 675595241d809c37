/* Pruning the default directory's records of processes that are gone: each
 * killed process leaves 12 KiB on a memory file system, and a node that runs
 * multiprocessing pools (whose __exit__ kills the workers) day after day
 * would fill its memory with them. The directory is read with getdents64
 * (opendir would allocate through the interposed malloc). */
#include "engine.h"
#include "live_record.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The kernel's struct linux_dirent64: d_ino (8 bytes), d_off (8), d_reclen
 * (2), d_type (1), then the name. */
#define DIRENT_RECORD_BYTES_AT 16
#define DIRENT_TYPE_AT 18
#define DIRENT_NAME_AT 19
#define DIRENT_TYPE_UNKNOWN 0
#define DIRENT_TYPE_REGULAR 8

static bool has_suffix(const char *name, const char *suffix)
{
    size_t length = strlen(name), suffix_length = strlen(suffix);
    return length > suffix_length && strcmp(name + length - suffix_length, suffix) == 0;
}

/* Whether the record's process may still run: its pid exists, and the
 * process that has it now did not start later than the record's (a later
 * start is a later process with a reused pid). Not "the same start time":
 * qemu-user makes its own up, a little after the kernel's, and only for the
 * process itself. When it cannot be told, it is taken as running. */
static bool process_runs(const struct live_record_header *header)
{
    if (header->pid <= 0 || header->pid > INT32_MAX)
        return true;
    if (kill((pid_t)header->pid, 0) != 0 && errno == ESRCH)
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%lld/stat", (long long)header->pid);
    uint64_t ticks = live_record_start_ticks(path);
    return ticks == 0 || ticks <= header->start_ticks;
}

/* The newest time the record names: its creation, its end, its last change. */
static uint64_t last_change_ns(int fd, const struct live_record_header *header)
{
    uint64_t newest = header->created_ns > header->ended_ns ? header->created_ns : header->ended_ns;
    uint64_t changed = 0;
    off_t at =
        (off_t)header->data_offset + (off_t)offsetof(struct engine_statistics, last_change_ns);
    if (header->data_bytes >= sizeof(struct engine_statistics) &&
        pread(fd, &changed, sizeof(changed), at) == (ssize_t)sizeof(changed) && changed > newest)
        newest = changed;
    return newest;
}

/* Whether the record open as fd may go, judged by ours (the new record's
 * header, made now: its creation time is the time now); only a file that
 * owner owns. *info gets the file's status, for the caller's check that the
 * name still leads to it. */
static bool record_is_stale(int fd, const struct live_record_header *ours, uint64_t keep_ns,
                            uid_t owner, struct stat *info)
{
    uint64_t now_ns = ours->created_ns;
    struct live_record_header header;
    if (fstat(fd, info) != 0 || !S_ISREG(info->st_mode) || info->st_uid != owner ||
        pread(fd, &header, sizeof(header), 0) != (ssize_t)sizeof(header) ||
        memcmp(header.magic, LIVE_RECORD_MAGIC, sizeof(header.magic)) != 0 ||
        header.version != LIVE_RECORD_VERSION || header.byte_order != LIVE_RECORD_BYTE_ORDER)
        return false;
    /* Only what this process can judge: its host, boot and pid namespace
     * (a container sharing the directory sees other pids), not itself. */
    if (strncmp(header.host, ours->host, sizeof(header.host)) != 0 ||
        strncmp(header.boot_id, ours->boot_id, sizeof(header.boot_id)) != 0 ||
        header.pid_namespace != ours->pid_namespace || header.pid == ours->pid)
        return false;
    bool ended = header.state == LIVE_RECORD_EXITED || header.state == LIVE_RECORD_REPLACED;
    if (!ended && process_runs(&header))
        return false;
    if (header.stats_path[0] == '\0')
        return true;
    uint64_t changed = last_change_ns(fd, &header);
    return changed <= now_ns && now_ns - changed > keep_ns;
}

void live_record_prune(int directory_fd, const struct live_record_header *ours,
                       struct live_record_prune *prune)
{
    prune->removed = 0;
    /* Without its own boot id and pid namespace this process can judge none. */
    if (ours->pid_namespace == 0 || ours->boot_id[0] == '\0')
        return;
    /* A descriptor of its own: directory_fd's read position stays as it is. */
    int listing = openat(directory_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (listing < 0)
        return;
    uid_t owner = geteuid();
    size_t seen = 0;
    _Alignas(8) char buffer[4096];
    for (;;) {
        long bytes = syscall(SYS_getdents64, listing, buffer, sizeof(buffer));
        if (bytes <= 0)
            break;
        for (long offset = 0; offset < bytes && seen < prune->max_entries;) {
            const char *entry = buffer + offset;
            uint16_t record_bytes;
            memcpy(&record_bytes, entry + DIRENT_RECORD_BYTES_AT, sizeof(record_bytes));
            if (record_bytes == 0)
                break;
            offset += record_bytes;
            uint8_t type = (uint8_t)entry[DIRENT_TYPE_AT];
            const char *name = entry + DIRENT_NAME_AT;
            if ((type != DIRENT_TYPE_REGULAR && type != DIRENT_TYPE_UNKNOWN) ||
                !has_suffix(name, LIVE_RECORD_SUFFIX))
                continue;
            seen++;
            int fd = openat(directory_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            if (fd < 0)
                continue;
            struct stat opened, named;
            /* Still the file that was judged (not one made since at its name). */
            if (record_is_stale(fd, ours, prune->keep_with_stats_ns, owner, &opened) &&
                fstatat(directory_fd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
                opened.st_dev == named.st_dev && opened.st_ino == named.st_ino &&
                unlinkat(directory_fd, name, 0) == 0)
                prune->removed++;
            close(fd);
        }
        if (seen >= prune->max_entries)
            break;
    }
    close(listing);
}
