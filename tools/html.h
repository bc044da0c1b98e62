/* html.h: stash-replay's report as a self-contained HTML page (html.c). */
#ifndef STASH_HTML_H
#define STASH_HTML_H

#include <stdbool.h>
#include <stdio.h>

#include "replay.h"
#include "trace.h"

void html_begin(FILE* f);
/* One trace: its table, and for each configuration replayed with series and layout, the
 * live/reserved plot and the layout at the peak. best: the row to mark (-1: none). */
void html_trace(FILE* f, const trace_t* t, const char* const* confs, const replay_result_t* rs,
                const bool* ok, int n, int best);
void html_end(FILE* f);

#endif
