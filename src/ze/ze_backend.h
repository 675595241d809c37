/* What the Level Zero backend takes from the interposed zeInit
 * (ze_interpose.c), beside the vendor seam. */
#ifndef PINSHIM_ZE_BACKEND_H
#define PINSHIM_ZE_BACKEND_H

/* The program's zeInit succeeded: Level Zero is started,
 * whatever zeDriverGet may be asked (loader 1.15.7 crashes on that question
 * before zeInit, so there it is not asked). */
void ze_backend_note_started(void);

#endif
