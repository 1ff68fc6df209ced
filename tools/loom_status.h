/* loom-info --status (loom_status.c). SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_TOOLS_STATUS_H
#define LOOM_TOOLS_STATUS_H

/* Prints what the Loom communicators of these processes (all on this host
 * when npids is 0) are doing; returns the exit status: 1 if none. */
int loom_status_main(int npids, const int *pids);

#endif
