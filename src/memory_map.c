#include "memory_map.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

/* /proc/self/maps and smaps lines are read through a stack buffer of this
 * size (lines are under 300 bytes but for long path names, which are skipped). */
#define MEMORY_MAP_LINE_BUFFER_BYTES 4096
/* Pages mincore reports on per call (one byte each): 16 MiB of 4 KiB pages,
 * 256 MiB of 64 KiB ones. */
#define MINCORE_PAGES_PER_CALL 4096

static bool parse_hex(const char **cursor, const char *limit, uintptr_t *value)
{
    uintptr_t result = 0;
    const char *at = *cursor;
    int digits = 0;
    for (; at < limit; at++, digits++) {
        char c = *at;
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else
            break;
        result = result * 16 + digit;
    }
    *cursor = at;
    *value = result;
    return digits > 0;
}

/* Reads path line by line into a stack buffer (lines longer than it are
 * skipped) and calls visit for each; visit returns false to stop. */
static bool for_each_line(const char *path,
                          bool (*visit)(void *state, const char *line, const char *line_end),
                          void *state)
{
    int saved_errno = errno;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        errno = saved_errno;
        return false;
    }
    char buffer[MEMORY_MAP_LINE_BUFFER_BYTES];
    size_t held = 0;
    bool going = true, done = false;
    while (going && !done) {
        ssize_t n = read(fd, buffer + held, sizeof(buffer) - held);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            done = true;
        else
            held += (size_t)n;
        const char *line = buffer;
        const char *limit = buffer + held;
        for (;;) {
            const char *newline = memchr(line, '\n', (size_t)(limit - line));
            if (newline == NULL || !going)
                break;
            going = visit(state, line, newline);
            line = newline + 1;
        }
        size_t consumed = (size_t)(line - buffer);
        memmove(buffer, line, held - consumed);
        held -= consumed;
        if (held == sizeof(buffer))
            held = 0;
    }
    close(fd);
    errno = saved_errno;
    return true;
}

/* A mapping's header line: "start-end perms ...". */
static bool parse_mapping_line(const char *line, const char *line_end, uintptr_t *low,
                               uintptr_t *high)
{
    const char *cursor = line;
    if (!parse_hex(&cursor, line_end, low) || cursor >= line_end || *cursor != '-')
        return false;
    cursor++;
    return parse_hex(&cursor, line_end, high) && cursor < line_end && *cursor == ' ';
}

struct find_state {
    uintptr_t addr, start, end;
    bool found;
};

static bool find_visit(void *opaque, const char *line, const char *line_end)
{
    struct find_state *state = opaque;
    uintptr_t low, high;
    if (parse_mapping_line(line, line_end, &low, &high) && low <= state->addr &&
        state->addr < high) {
        state->start = low;
        state->end = high;
        state->found = true;
        return false;
    }
    return true;
}

bool memory_map_find(uintptr_t addr, uintptr_t *start, uintptr_t *end)
{
    struct find_state state = {.addr = addr};
    if (!for_each_line("/proc/self/maps", find_visit, &state) || !state.found)
        return false;
    *start = state.start;
    *end = state.end;
    return true;
}

struct private_anonymous_state {
    uintptr_t start, end;
    void (*found)(void *context, uintptr_t part_start, uintptr_t part_end);
    void *context;
};

/* "start-end rw-p 00000000 00:00 0    [heap]": after the range, the
 * permissions, the offset, the device and the inode. */
static bool private_anonymous_visit(void *opaque, const char *line, const char *line_end)
{
    struct private_anonymous_state *state = opaque;
    uintptr_t low, high, ignored;
    if (!parse_mapping_line(line, line_end, &low, &high))
        return true;
    if (low >= state->end)
        return false;
    const char *cursor = memchr(line, ' ', (size_t)(line_end - line));
    if (high <= state->start || cursor == NULL || line_end - cursor < 6)
        return true;
    cursor++;
    bool private_writable =
        cursor[0] == 'r' && cursor[1] == 'w' && cursor[3] == 'p' && cursor[4] == ' ';
    cursor += 5;
    if (!private_writable || !parse_hex(&cursor, line_end, &ignored)) /* the offset */
        return true;
    while (cursor < line_end && *cursor == ' ')
        cursor++;
    while (cursor < line_end && *cursor != ' ') /* the device */
        cursor++;
    while (cursor < line_end && *cursor == ' ')
        cursor++;
    bool anonymous =
        cursor < line_end && *cursor == '0' && (cursor + 1 == line_end || cursor[1] == ' ');
    uintptr_t from = low > state->start ? low : state->start;
    uintptr_t to = high < state->end ? high : state->end;
    if (anonymous && from < to)
        state->found(state->context, from, to);
    return true;
}

bool memory_map_private_anonymous_parts(uintptr_t start, uintptr_t end,
                                        void (*found)(void *context, uintptr_t part_start,
                                                      uintptr_t part_end),
                                        void *context)
{
    struct private_anonymous_state state = {start, end, found, context};
    return for_each_line("/proc/self/maps", private_anonymous_visit, &state);
}

struct locked_state {
    uintptr_t start, end;
    uintptr_t mapping_low, mapping_high;
    void (*found)(void *context, uintptr_t part_start, uintptr_t part_end);
    void *context;
};

static bool locked_visit(void *opaque, const char *line, const char *line_end)
{
    struct locked_state *state = opaque;
    uintptr_t low, high;
    if (parse_mapping_line(line, line_end, &low, &high)) {
        state->mapping_low = low;
        state->mapping_high = high;
        return low < state->end;
    }
    static const char flags_key[] = "VmFlags:";
    size_t length = (size_t)(line_end - line);
    if (length < sizeof(flags_key) - 1 || memcmp(line, flags_key, sizeof(flags_key) - 1) != 0)
        return true;
    bool locked = false;
    for (const char *at = line + sizeof(flags_key) - 1; at + 2 <= line_end; at++)
        if (at[-1] == ' ' && at[0] == 'l' && at[1] == 'o' && (at + 2 == line_end || at[2] == ' '))
            locked = true;
    uintptr_t from = state->mapping_low > state->start ? state->mapping_low : state->start;
    uintptr_t to = state->mapping_high < state->end ? state->mapping_high : state->end;
    if (locked && from < to)
        state->found(state->context, from, to);
    return true;
}

bool memory_map_locked_parts(uintptr_t start, uintptr_t end,
                             void (*found)(void *context, uintptr_t part_start, uintptr_t part_end),
                             void *context)
{
    struct locked_state state = {.start = start, .end = end, .found = found, .context = context};
    return for_each_line("/proc/self/smaps", locked_visit, &state);
}

bool memory_map_is_mapped(uintptr_t start, uintptr_t end)
{
    if (start >= end)
        return true;
    int saved_errno = errno;
    bool mapped = syscall(SYS_msync, start, end - start, MS_ASYNC) == 0;
    errno = saved_errno;
    return mapped;
}

bool memory_map_resident_parts(uintptr_t start, uintptr_t end, uintptr_t page_size,
                               void (*found)(void *context, uintptr_t part_start,
                                             uintptr_t part_end),
                               void *context)
{
    int saved_errno = errno;
    unsigned char vector[MINCORE_PAGES_PER_CALL];
    uintptr_t run_start = 0, chunk = start;
    bool in_run = false, ok = true;
    while (chunk < end) {
        uintptr_t pages = (end - chunk) / page_size;
        if (pages > sizeof(vector))
            pages = sizeof(vector);
        if (syscall(SYS_mincore, chunk, pages * page_size, vector) != 0) {
            ok = false; /* a hole: what was seen so far stands */
            break;
        }
        for (uintptr_t i = 0; i < pages; i++) {
            uintptr_t page = chunk + i * page_size;
            bool resident = (vector[i] & 1) != 0;
            if (resident && !in_run) {
                run_start = page;
                in_run = true;
            } else if (!resident && in_run) {
                found(context, run_start, page);
                in_run = false;
            }
        }
        chunk += pages * page_size;
    }
    if (in_run)
        found(context, run_start, chunk);
    errno = saved_errno;
    return ok;
}

/* ---- what pinning meets ---- */

#define TMPFS_MAGIC_NUMBER 0x01021994ul
#define HUGETLBFS_MAGIC_NUMBER 0x958458f6ul
#define RAMFS_MAGIC_NUMBER 0x858458f6ul

/* Whether the shared file mapping of path needs dirty tracking (the
 * kernel's vma_needs_dirty_tracking): a file on a file system that writes
 * back, not shmem (memfd, SysV, shared anonymous memory, tmpfs), hugetlbfs
 * or ramfs. A removed file is judged by its directory. */
static bool needs_dirty_tracking(const char *path, size_t length)
{
    static const char *const shmem_names[] = {"/memfd:", "/SYSV", "/dev/zero"};
    for (size_t i = 0; i < sizeof(shmem_names) / sizeof(shmem_names[0]); i++)
        if (length >= strlen(shmem_names[i]) &&
            memcmp(path, shmem_names[i], strlen(shmem_names[i])) == 0)
            return false;
    char name[512];
    static const char deleted[] = " (deleted)";
    if (length >= sizeof(name))
        return true;
    memcpy(name, path, length);
    name[length] = '\0';
    size_t tail = sizeof(deleted) - 1;
    if (length > tail && strcmp(name + length - tail, deleted) == 0) {
        name[length - tail] = '\0';
        char *slash = strrchr(name, '/');
        if (slash != NULL)
            slash[slash == name ? 1 : 0] = '\0';
    }
    struct statfs fs;
    int saved_errno = errno;
    bool known = statfs(name, &fs) == 0;
    errno = saved_errno;
    if (!known)
        return true;
    unsigned long type = (unsigned long)fs.f_type;
    return type != TMPFS_MAGIC_NUMBER && type != HUGETLBFS_MAGIC_NUMBER &&
           type != RAMFS_MAGIC_NUMBER;
}

struct kinds_state {
    uintptr_t start, end, covered;
    uintptr_t mapping_low, mapping_high;
    enum memory_map_kind mapping_kind;
    bool in_range;
    /* The run being built, reported when the kind changes. */
    uintptr_t run_start, run_end;
    enum memory_map_kind run_kind;
    bool have_run;
    void (*found)(void *context, uintptr_t part_start, uintptr_t part_end,
                  enum memory_map_kind kind);
    void *context;
};

static void kinds_add(struct kinds_state *state, uintptr_t from, uintptr_t to,
                      enum memory_map_kind kind)
{
    if (from >= to)
        return;
    if (state->have_run && state->run_kind == kind && state->run_end == from) {
        state->run_end = to;
        return;
    }
    if (state->have_run)
        state->found(state->context, state->run_start, state->run_end, state->run_kind);
    state->run_start = from;
    state->run_end = to;
    state->run_kind = kind;
    state->have_run = true;
}

/* perms ("rw-s") and path of a header line. */
static enum memory_map_kind header_kind(const char *line, const char *line_end)
{
    const char *perms = memchr(line, ' ', (size_t)(line_end - line));
    if (perms == NULL || line_end - perms < 5)
        return MEMORY_MAP_NO_ACCESS;
    perms++;
    if (perms[0] != 'r')
        return MEMORY_MAP_NO_ACCESS;
    if (perms[1] != 'w')
        return MEMORY_MAP_READ_ONLY;
    if (perms[3] != 's')
        return MEMORY_MAP_WRITABLE;
    /* The path: after perms, offset, dev and inode. */
    const char *at = perms;
    for (int field = 0; field < 4 && at != NULL; field++) {
        at = memchr(at, ' ', (size_t)(line_end - at));
        if (at != NULL)
            while (at < line_end && *at == ' ')
                at++;
    }
    if (at == NULL || at >= line_end || *at != '/')
        return MEMORY_MAP_WRITABLE; /* shared anonymous memory: shmem */
    return needs_dirty_tracking(at, (size_t)(line_end - at)) ? MEMORY_MAP_SHARED_FILE
                                                             : MEMORY_MAP_WRITABLE;
}

static bool kinds_visit(void *opaque, const char *line, const char *line_end)
{
    struct kinds_state *state = opaque;
    uintptr_t low, high;
    if (parse_mapping_line(line, line_end, &low, &high)) {
        state->in_range = false;
        if (high <= state->covered)
            return true;
        if (low >= state->end)
            return false;
        if (low > state->covered)
            kinds_add(state, state->covered, low, MEMORY_MAP_UNMAPPED);
        state->mapping_low = low > state->start ? low : state->start;
        state->mapping_high = high < state->end ? high : state->end;
        state->mapping_kind = header_kind(line, line_end);
        state->in_range = true;
        state->covered = state->mapping_high;
        return true;
    }
    static const char flags_key[] = "VmFlags:";
    size_t length = (size_t)(line_end - line);
    if (!state->in_range || length < sizeof(flags_key) - 1 ||
        memcmp(line, flags_key, sizeof(flags_key) - 1) != 0)
        return true;
    enum memory_map_kind kind = state->mapping_kind;
    for (const char *at = line + sizeof(flags_key) - 1; at + 2 <= line_end; at++)
        if (at[-1] == ' ' && (at + 2 == line_end || at[2] == ' ') &&
            ((at[0] == 'i' && at[1] == 'o') || (at[0] == 'p' && at[1] == 'f')))
            kind = MEMORY_MAP_IO;
    kinds_add(state, state->mapping_low, state->mapping_high, kind);
    state->in_range = false;
    return state->covered < state->end;
}

bool memory_map_kinds(uintptr_t start, uintptr_t end,
                      void (*found)(void *context, uintptr_t part_start, uintptr_t part_end,
                                    enum memory_map_kind kind),
                      void *context)
{
    struct kinds_state state = {
        .start = start, .end = end, .covered = start, .found = found, .context = context};
    if (!for_each_line("/proc/self/smaps", kinds_visit, &state))
        return false;
    if (state.covered < end)
        kinds_add(&state, state.covered, end, MEMORY_MAP_UNMAPPED);
    if (state.have_run)
        found(context, state.run_start, state.run_end, state.run_kind);
    return true;
}
