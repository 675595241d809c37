/* What the Level Zero backend takes from the interposed zeInit
 * (ze_interpose.c), beside the vendor seam. */
#ifndef PINSHIM_ZE_BACKEND_H
#define PINSHIM_ZE_BACKEND_H

/* The program's zeInit succeeded: Level Zero is started. */
void ze_backend_note_started(void);

/* The program's zeInit failed with code: unless it had succeeded before,
 * the backend calls Level Zero no more (ze_backend.c says why). */
void ze_backend_note_start_failed(int code);

#endif
