/* Live record: a process's statistics in a small file mapped shared, made at
 * its first lock and written in place as the engine counts (the counters
 * themselves live there: engine_statistics_move_to), so that a process killed
 * by a signal leaves what it had done, and a running one can be watched
 * (pinshim top). Like HotSpot's hsperfdata files that jstat reads.
 *
 * The file describes itself; a reader needs no C header. Layout, version 1
 * (integers in the host's byte order; byte_order says which):
 *
 *   [0, header_bytes)            struct live_record_header
 *   [header_bytes, data_offset)  field_count entries of struct live_record_field
 *   [data_offset, +data_bytes)   the counters, where the fields say
 *
 * A field's name is the dotted key path of the same value in the JSON stats
 * document ("register.ok", "live.bytes"), so that a reader can rebuild the
 * document a process would have written at exit. "[]" in a name marks an
 * array of count elements, stride bytes apart ("devices[].bytes": the JSON's
 * list of devices, element i being device i).
 *
 * Readers may read while the process writes: each value is an aligned 8-byte
 * word (or a text field written before its count becomes non-zero), so a
 * reader sees an old or a new value, never a torn one, but values of one
 * refresh may come from moments apart. Nothing reads the file back inside the
 * process. Made with no allocation: system calls and stack buffers only. */
#ifndef PINSHIM_LIVE_RECORD_H
#define PINSHIM_LIVE_RECORD_H

#include "options.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LIVE_RECORD_MAGIC "PSHMLIVE" /* 8 bytes, no terminator in the file */
#define LIVE_RECORD_VERSION 1
#define LIVE_RECORD_BYTE_ORDER 0x01020304u
#define LIVE_RECORD_SUFFIX ".live"

enum live_record_state {
    LIVE_RECORD_RUNNING = 1,
    LIVE_RECORD_EXITING = 2,  /* exit handlers run: unregistering, writing stats */
    LIVE_RECORD_EXITED = 3,   /* ended by exit or _exit (ended_by says which) */
    LIVE_RECORD_REPLACED = 4, /* the process ran exec: its next image took over */
};

enum live_record_kind {
    LIVE_FIELD_COUNT = 1,       /* uint64_t */
    LIVE_FIELD_NANOSECONDS = 2, /* uint64_t, a duration; the JSON key says seconds */
    LIVE_FIELD_TIME = 3,        /* uint64_t, CLOCK_REALTIME nanoseconds; 0: never */
    LIVE_FIELD_INT32 = 4,       /* int32_t */
    LIVE_FIELD_TEXT = 5,        /* char[bytes], NUL-terminated when shorter */
};

struct live_record_header {
    char magic[8];
    uint32_t version;
    uint32_t byte_order;
    uint32_t header_bytes; /* where the field table starts */
    uint32_t field_count;
    uint32_t field_bytes; /* sizeof(struct live_record_field) */
    uint32_t data_offset;
    uint32_t data_bytes;
    uint32_t state; /* enum live_record_state */
    int64_t pid;
    uint64_t start_ticks;      /* field 22 of /proc/self/stat: with boot_id, the process */
    uint64_t ticks_per_second; /* sysconf(_SC_CLK_TCK) */
    uint64_t created_ns;       /* CLOCK_REALTIME */
    uint64_t ended_ns;         /* CLOCK_REALTIME at EXITED or REPLACED, else 0 */
    uint32_t fork_child;       /* 1: a fork child (its counters start at the fork) */
    uint32_t pid_namespace;    /* inode of /proc/self/ns/pid (0: unknown), for pruning */
    char ended_by[16];         /* "exit", "_exit", "exec"; "" before */
    char boot_id[40];          /* /proc/sys/kernel/random/boot_id, "" when unreadable */
    char version_text[24];     /* PINSHIM_VERSION_STRING */
    char context_mode[16];     /* "program" or "create" */
    char host[256];
    char exe[1024];
    char stats_path[1024]; /* where the JSON goes at exit, "" when none */
};

struct live_record_field {
    char name[48];
    uint32_t offset; /* from data_offset */
    uint32_t kind;   /* enum live_record_kind */
    uint32_t count;  /* array elements (1 for a plain field) */
    uint32_t stride; /* bytes between elements; for TEXT the field's size when count is 1 */
};

/* What the record says of its process, and where it goes. */
struct live_record_identity {
    const char *host;
    const char *exe;
    const char *context_mode;
    const char *stats_path; /* the expanded PINSHIM_STATS file, or NULL */
    bool fork_child;
};

struct live_record {
    char *mapping; /* NULL: none */
    size_t mapping_bytes;
    /* Where the file is: the directory is opened again at the end rather
     * than held open (a program may close or count its descriptors). */
    char directory[CONFIG_PATH_MAX];
    char base_name[280];
    char name[300];
    int attempt; /* name is base_name + ".live" (0) or + ".attempt.live" */
    uint64_t file_device, file_inode;
};

/* Where the records of processes go when PINSHIM_LIVE is auto: a per-user
 * directory on a memory file system, as hsperfdata's are per user: a file
 * that is mapped shared must never fail to take a write (a full disk, a
 * copy-on-write or network file system can answer a write to a mapped page
 * with SIGBUS; tmpfs pages, allocated at creation, cannot). In order:
 * $XDG_RUNTIME_DIR/pinshim when XDG_RUNTIME_DIR is an absolute path to a
 * directory the user owns; /dev/shm/pinshim-UID when /dev/shm is a
 * directory; /tmp/pinshim-UID. Writes the path to out; false if it does not
 * fit. Makes nothing. */
bool live_record_default_directory(const char *xdg_runtime_dir, unsigned uid, char *out,
                                   size_t out_size);

/* Opens (making it, mode 0700, when missing and private is set) the
 * directory: a directory reached without following a symlink at its last
 * component; with private, it must be the caller's own and not writable by
 * group or others. Returns its descriptor, or -1 with why filled in. */
int live_record_open_directory(const char *path, bool private_directory, char *why,
                               size_t why_size);

/* Pruning the default directory (live_record_prune.c): records of this
 * user's processes that are gone, so that killed processes do not pile up
 * in memory (hsperfdata's JVMs do the same at start). ours is the new
 * record's header: only records made on its host, boot and pid namespace,
 * by another process, are looked at: one that is ended (exited, replaced by exec) or whose process
 * is dead (no such pid, or a later process with it) goes at once when it
 * names no statistics file, and once its last change is older than
 * keep_with_stats_ns when it does (what pinshim report DIR reads of a killed
 * job's processes). At most max_entries names are looked at; removed says
 * how many went. */
struct live_record_prune {
    uint64_t keep_with_stats_ns;
    size_t max_entries;
    size_t removed; /* out */
};

void live_record_prune(int directory_fd, const struct live_record_header *ours,
                       struct live_record_prune *prune);

/* Makes the record in the directory (directory_fd, opened from path
 * directory): a new file (O_CREAT|O_EXCL|O_NOFOLLOW,
 * mode 0666 less the umask, as the stats file), named base_name + ".live",
 * or base_name + ".N.live" when that is taken (a record of an earlier process
 * with the same pid, or of this process before an exec: that one is marked
 * REPLACED). data_bytes of counters follow the field table; the header says
 * RUNNING. With prune (not NULL) the directory is pruned first, as
 * live_record_prune says, by this record's header. Returns a pointer to the
 * counters (zeroed), or NULL with why filled in; closes directory_fd either
 * way. */
void *live_record_create(struct live_record *record, int directory_fd, const char *directory,
                         const char *base_name, const struct live_record_identity *identity,
                         struct live_record_prune *prune, size_t data_bytes, char *why,
                         size_t why_size);

/* For live_record_prune.c: field 22 of a /proc/PID/stat (the start time in
 * clock ticks since boot, 0 when unreadable). */
uint64_t live_record_start_ticks(const char *stat_path);

void live_record_set_state(struct live_record *record, enum live_record_state state,
                           const char *ended_by);

/* At a clean end: removes the file when remove is set and it is still this
 * record's (same device and inode at its name), and with it the records this
 * process left before an exec (REPLACED, the same pid, start time and boot,
 * at the names tried before its own); otherwise leaves it EXITED.
 * The mapping stays (other threads may still count into it). */
void live_record_finish(struct live_record *record, const char *ended_by, bool remove);

/* In a fork child: the parent's record is not the child's. Unmaps it (after
 * the caller has moved its counters off it) and forgets it. */
void live_record_forget_after_fork(struct live_record *record);

/* The field table, as the engine's counters are laid out (live_record.c). */
size_t live_record_field_table(const struct live_record_field **out);

#endif
