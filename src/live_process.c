/* The process's live record (live_record.h): made at its first lock, where
 * PINSHIM_LIVE says, the engine's counters moved into it; ended at exit or
 * _exit, forgotten in a fork child, taken over by the next image after exec.
 * What it needs of the process comes in its arguments (live_process.h). */
#include "live_process.h"

#include "live_record.h"
#include "log.h"
#include "stats.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum live_state { LIVE_NOT_TRIED = 0, LIVE_STARTING, LIVE_ACTIVE, LIVE_NONE };

int live_process_state;
/* The default directory's records of processes that are gone: those with a
 * statistics file stay a day, for pinshim report DIR; a process looks at no
 * more than this many names when it makes its own record. */
#define LIVE_PRUNE_KEEP_WITH_STATS_NS (24ull * 3600 * 1000000000ull)
#define LIVE_PRUNE_MAX_ENTRIES 1024

static struct live_record record;

void live_process_start(const struct pinshim_config *config, struct engine *engine, bool fork_child)
{
    int expected = LIVE_NOT_TRIED;
    if (!__atomic_compare_exchange_n(&live_process_state, &expected, LIVE_STARTING, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    int saved_errno = errno;
    int outcome = LIVE_NONE;
    /* No record in secure-execution mode: a setuid program must not write
     * where its caller's environment says, nor leave its counters behind. */
    if (config == NULL || config->live_mode == LIVE_OFF || config_secure_execution())
        goto done;
    char directory[CONFIG_PATH_MAX];
    bool private_directory = config->live_mode == LIVE_AUTO;
    if (private_directory) {
        if (!live_record_default_directory(getenv("XDG_RUNTIME_DIR"), (unsigned)geteuid(),
                                           directory, sizeof(directory)))
            goto done;
    } else {
        snprintf(directory, sizeof(directory), "%s", config->live_directory);
    }
    char why[CONFIG_PATH_MAX + 128];
    int directory_fd = live_record_open_directory(directory, private_directory, why, sizeof(why));
    if (directory_fd < 0) {
        log_warn("no live record in %.300s (%s): pinshim top will not show this process and a "
                 "kill leaves no statistics; PINSHIM_LIVE=DIR names another directory, "
                 "PINSHIM_LIVE=off makes none",
                 directory, why);
        goto done;
    }
    char host[256] = "unknown";
    if (gethostname(host, sizeof(host) - 1) != 0)
        snprintf(host, sizeof(host), "unknown");
    host[sizeof(host) - 1] = '\0';
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    exe[n > 0 ? n : 0] = '\0';
    char stats_path[CONFIG_PATH_MAX] = "";
    if (config->stats_mode == STATS_JSON &&
        !stats_expand_path(config->stats_path, (long)getpid(), host, stats_path,
                           sizeof(stats_path)))
        stats_path[0] = '\0';
    char base_name[300];
    snprintf(base_name, sizeof(base_name), "%s.%ld", host, (long)getpid());
    struct live_record_identity identity = {
        .host = host,
        .exe = exe,
        .context_mode = config->context_mode == CONTEXT_CREATE ? "create" : "program",
        .stats_path = stats_path[0] != '\0' ? stats_path : NULL,
        .fork_child = fork_child,
    };
    /* The default directory is pruned; a directory the user named is left
     * to the user (pinshim report --prune). */
    struct live_record_prune prune = {LIVE_PRUNE_KEEP_WITH_STATS_NS, LIVE_PRUNE_MAX_ENTRIES, 0};
    void *place = live_record_create(&record, directory_fd, directory, base_name, &identity,
                                     private_directory ? &prune : NULL,
                                     sizeof(struct engine_statistics), why, sizeof(why));
    if (place == NULL) {
        log_warn("no live record in %.300s (%s): pinshim top will not show this process and a "
                 "kill leaves no statistics",
                 directory, why);
        goto done;
    }
    engine_statistics_move_to(engine, place);
    log_debug("live record %s/%s", directory, record.name);
    if (prune.removed > 0)
        log_debug("removed %zu live record(s) of processes gone from %s", prune.removed, directory);
    outcome = LIVE_ACTIVE;
done:
    __atomic_store_n(&live_process_state, outcome, __ATOMIC_RELEASE);
    errno = saved_errno;
}

static bool live_active(void)
{
    return __atomic_load_n(&live_process_state, __ATOMIC_ACQUIRE) == LIVE_ACTIVE;
}

void live_process_exiting(void)
{
    if (live_active())
        live_record_set_state(&record, LIVE_RECORD_EXITING, NULL);
}

void live_process_finish(const char *ended_by, bool statistics_kept, bool statistics_to_file)
{
    if (!live_active())
        return;
    /* The record goes when what it says is kept elsewhere (the JSON file),
     * or when no statistics were asked for (a clean end leaves nothing, as
     * before live records); a JSON file that could not be written leaves
     * the record, ended, so that nothing is lost. */
    bool remove = !statistics_to_file || statistics_kept;
    live_record_finish(&record, ended_by, remove);
}

void live_process_after_fork_child(void)
{
    /* The engine's reset has moved the child's counters back into the
     * engine; the parent's record is the parent's. */
    if (live_active())
        live_record_forget_after_fork(&record);
    __atomic_store_n(&live_process_state, LIVE_NOT_TRIED, __ATOMIC_RELAXED);
}
