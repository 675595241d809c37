/* child: see child.h. posix_spawn, three pipes and a poll loop, so a child
 * that fills its stdout pipe while we are still writing its stdin cannot
 * deadlock us. */
#include "child.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct text_buffer {
    char *data;
    size_t length;
    size_t capacity;
};

static bool text_buffer_reserve(struct text_buffer *buffer, size_t extra)
{
    if (buffer->length + extra + 1 <= buffer->capacity)
        return true;
    size_t capacity = buffer->capacity ? buffer->capacity : 4096;
    while (capacity < buffer->length + extra + 1)
        capacity *= 2;
    char *data = realloc(buffer->data, capacity);
    if (!data)
        return false;
    buffer->data = data;
    buffer->capacity = capacity;
    return true;
}

/* Reads what is available on fd into buffer; false at end of file. */
static bool drain_into(int fd, struct text_buffer *buffer)
{
    if (!text_buffer_reserve(buffer, 4096))
        return false;
    ssize_t got = read(fd, buffer->data + buffer->length, 4096);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return true;
    if (got <= 0)
        return false;
    buffer->length += (size_t)got;
    return true;
}

static char *text_buffer_finish(struct text_buffer *buffer, size_t *length)
{
    if (!text_buffer_reserve(buffer, 0))
        return NULL;
    buffer->data[buffer->length] = '\0';
    *length = buffer->length;
    return buffer->data;
}

static bool variable_named(const char *entry, const char *assignment)
{
    size_t name_length = strcspn(assignment, "=");
    return strncmp(entry, assignment, name_length) == 0 && entry[name_length] == '=';
}

/* environ with extra_env applied; the array is malloc'd, the strings are not
 * copied. */
static char **build_environment(const char *const extra_env[])
{
    size_t inherited = 0, extra = 0;
    while (environ[inherited])
        inherited++;
    while (extra_env && extra_env[extra])
        extra++;
    char **environment = calloc(inherited + extra + 1, sizeof *environment);
    if (!environment)
        return NULL;
    size_t used = 0;
    for (size_t i = 0; i < inherited; i++) {
        bool replaced = false;
        for (size_t j = 0; j < extra && !replaced; j++)
            replaced = variable_named(environ[i], extra_env[j]);
        if (!replaced)
            environment[used++] = environ[i];
    }
    for (size_t j = 0; j < extra; j++) {
        const char *equals = strchr(extra_env[j], '=');
        if (equals && equals[1] != '\0') /* "K=" only unsets K */
            environment[used++] = (char *)extra_env[j];
    }
    return environment;
}

static void close_if_open(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

int child_run(const char *const argv[], const char *const extra_env[],
              const char *stdin_text_or_null, struct child_result *out)
{
    memset(out, 0, sizeof *out);
    out->status = -1;
    int stdin_pipe[2] = {-1, -1}, stdout_pipe[2] = {-1, -1}, stderr_pipe[2] = {-1, -1};
    struct text_buffer stdout_text = {0}, stderr_text = {0};
    char **environment = build_environment(extra_env);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);

    /* Writing stdin to a child that exits early raises SIGPIPE: block it in
     * this thread (write then fails with EPIPE) but not in the child. */
    sigset_t sigpipe_only, old_mask;
    sigemptyset(&sigpipe_only);
    sigaddset(&sigpipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigpipe_only, &old_mask);
    posix_spawnattr_setsigmask(&attributes, &old_mask);
    posix_spawnattr_setsigdefault(&attributes, &sigpipe_only);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

    pid_t pid = -1;
    if (!environment || pipe2(stdout_pipe, O_CLOEXEC) || pipe2(stderr_pipe, O_CLOEXEC) ||
        (stdin_text_or_null && pipe2(stdin_pipe, O_CLOEXEC)))
        goto done;
    if (stdin_text_or_null)
        posix_spawn_file_actions_adddup2(&actions, stdin_pipe[0], 0);
    else
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, stdout_pipe[1], 1);
    posix_spawn_file_actions_adddup2(&actions, stderr_pipe[1], 2);
    if (posix_spawnp(&pid, argv[0], &actions, &attributes, (char *const *)argv, environment)) {
        pid = -1;
        goto done;
    }
    close_if_open(&stdin_pipe[0]);
    close_if_open(&stdout_pipe[1]);
    close_if_open(&stderr_pipe[1]);

    size_t stdin_left = stdin_text_or_null ? strlen(stdin_text_or_null) : 0;
    const char *stdin_next = stdin_text_or_null;
    if (stdin_pipe[1] >= 0 && stdin_left == 0)
        close_if_open(&stdin_pipe[1]);
    if (stdin_pipe[1] >= 0)
        fcntl(stdin_pipe[1], F_SETFL, O_NONBLOCK);
    while (stdout_pipe[0] >= 0 || stderr_pipe[0] >= 0) {
        struct pollfd fds[3] = {
            {stdout_pipe[0], POLLIN, 0}, {stderr_pipe[0], POLLIN, 0}, {stdin_pipe[1], POLLOUT, 0}};
        if (poll(fds, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[0].revents && !drain_into(stdout_pipe[0], &stdout_text))
            close_if_open(&stdout_pipe[0]);
        if (fds[1].revents && !drain_into(stderr_pipe[0], &stderr_text))
            close_if_open(&stderr_pipe[0]);
        if (fds[2].revents) {
            ssize_t written = write(stdin_pipe[1], stdin_next, stdin_left);
            if (written > 0) {
                stdin_next += written;
                stdin_left -= (size_t)written;
            }
            if (stdin_left == 0 || (written < 0 && errno != EAGAIN && errno != EINTR))
                close_if_open(&stdin_pipe[1]);
        }
    }

    int wait_status;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(wait_status)) {
        out->status = WEXITSTATUS(wait_status);
    } else if (WIFSIGNALED(wait_status)) {
        out->signaled = true;
        out->status = 128 + WTERMSIG(wait_status);
    }

done:
    close_if_open(&stdin_pipe[0]);
    close_if_open(&stdin_pipe[1]);
    close_if_open(&stdout_pipe[0]);
    close_if_open(&stdout_pipe[1]);
    close_if_open(&stderr_pipe[0]);
    close_if_open(&stderr_pipe[1]);
    /* Consume a SIGPIPE we caused, so unblocking does not deliver it. */
    struct timespec no_wait = {0, 0};
    while (sigtimedwait(&sigpipe_only, NULL, &no_wait) == SIGPIPE)
        ;
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    free(environment);
    out->out = text_buffer_finish(&stdout_text, &out->out_len);
    out->err = text_buffer_finish(&stderr_text, &out->err_len);
    return out->status;
}

void child_result_free(struct child_result *result)
{
    free(result->out);
    free(result->err);
    result->out = result->err = NULL;
    result->out_len = result->err_len = 0;
}

char *read_file_text(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct text_buffer text = {0};
    bool ok = true;
    for (;;) {
        if (!text_buffer_reserve(&text, 65536)) {
            ok = false;
            break;
        }
        ssize_t got = read(fd, text.data + text.length, 65536);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            ok = false;
        if (got <= 0)
            break;
        text.length += (size_t)got;
    }
    close(fd);
    size_t length;
    char *result = ok ? text_buffer_finish(&text, &length) : NULL;
    if (!result)
        free(text.data);
    return result;
}

char *make_temp_dir(void)
{
    const char *parent = getenv("TMPDIR");
    if (!parent || !*parent)
        parent = "/tmp";
    size_t size = strlen(parent) + sizeof "/pinshim-test-XXXXXX";
    char *path = malloc(size);
    if (!path)
        return NULL;
    snprintf(path, size, "%s/pinshim-test-XXXXXX", parent);
    if (!mkdtemp(path)) {
        free(path);
        return NULL;
    }
    return path;
}

/* Whether a user with no rights here (neither owner nor group) can reach
 * directory and run programs from it: every directory from / down to it must
 * let others search it, and its file system must allow execution. */
static bool reachable_by_others(const char *directory, char *why, size_t why_size)
{
    char resolved[PATH_MAX];
    if (realpath(directory, resolved) == NULL) {
        snprintf(why, why_size, "%s: %s", directory, strerror(errno));
        return false;
    }
    struct statvfs file_system;
    if (statvfs(resolved, &file_system) == 0 && (file_system.f_flag & ST_NOEXEC) != 0) {
        snprintf(why, why_size, "%s is on a noexec file system", resolved);
        return false;
    }
    size_t length = strlen(resolved);
    for (size_t end = 0; end <= length; end++) {
        if (end < length && resolved[end] != '/')
            continue;
        char prefix[PATH_MAX];
        snprintf(prefix, sizeof(prefix), "%.*s", (int)end, resolved);
        const char *checked = end == 0 ? "/" : prefix;
        struct stat info;
        if (stat(checked, &info) != 0) {
            snprintf(why, why_size, "%s: %s", checked, strerror(errno));
            return false;
        }
        if ((info.st_mode & S_IXOTH) == 0) {
            snprintf(why, why_size, "%s (mode %03o) is closed to other users", checked,
                     (unsigned)(info.st_mode & 0777));
            return false;
        }
    }
    return true;
}

char *make_shared_temp_dir(char *why, size_t why_size)
{
    const char *tmpdir = getenv("TMPDIR");
    const char *parents[] = {tmpdir != NULL && *tmpdir != '\0' ? tmpdir : NULL, "/tmp"};
    char reasons[2][2 * PATH_MAX + 64] = {"", ""};
    for (size_t i = 0; i < 2; i++) {
        if (parents[i] == NULL)
            continue;
        char reason[PATH_MAX + 64];
        if (!reachable_by_others(parents[i], reason, sizeof(reason))) {
            snprintf(reasons[i], sizeof(reasons[i]), "%s%s: %s", i == 0 ? "TMPDIR=" : "",
                     parents[i], reason);
            continue;
        }
        size_t size = strlen(parents[i]) + sizeof "/pinshim-shared-XXXXXX";
        char *path = malloc(size);
        if (path == NULL)
            break;
        snprintf(path, size, "%s/pinshim-shared-XXXXXX", parents[i]);
        /* mkdtemp makes it 0700; chmod says 0755 whatever the umask. */
        if (mkdtemp(path) != NULL && chmod(path, 0755) == 0)
            return path;
        snprintf(reasons[i], sizeof(reasons[i]), "cannot make %s: %s", path, strerror(errno));
        rmdir(path);
        free(path);
    }
    snprintf(why, why_size, "no directory another user can reach for the test's files: %s%s%s",
             reasons[0], reasons[0][0] != '\0' ? "; " : "", reasons[1]);
    return NULL;
}

static int remove_entry(const char *path, const struct stat *info, int type, struct FTW *where)
{
    (void)info;
    (void)type;
    (void)where;
    return remove(path) == 0 ? 0 : -1;
}

bool remove_tree(const char *path)
{
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0;
}
