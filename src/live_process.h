/* The process's live record: made once, at the first lock call, with the
 * engine's counters moved into it (live_record.h has the file). The process's
 * runtime module calls these, with what they need of the process. */
#ifndef PINSHIM_LIVE_PROCESS_H
#define PINSHIM_LIVE_PROCESS_H

#include "engine.h"
#include "options.h"

#include <stdbool.h>

/* 0 until the first start; read by the lock paths (one relaxed load). */
extern int live_process_state;

/* Makes the record where config's PINSHIM_LIVE says, once; nothing in
 * secure-execution mode or with PINSHIM_LIVE=off. */
void live_process_start(const struct pinshim_config *config, struct engine *engine,
                        bool fork_child);
void live_process_exiting(void);
/* At a clean end (ended_by "exit" or "_exit"); statistics_kept: the JSON
 * statistics file was written; statistics_to_file: one was asked for. */
void live_process_finish(const char *ended_by, bool statistics_kept, bool statistics_to_file);
void live_process_after_fork_child(void);

#endif
