/* log.h -- one level-gated logger for the daemon, the tools and the library.
 *
 * gddr-ps logs one line per event to stderr: with a time on a terminal or
 * in a file, with a "<N>" syslog priority and no time when stderr is the
 * journal (JOURNAL_STREAM), so that `journalctl -p err` filters. The
 * client library is silent unless the trainer installs a callback, so the
 * sink is a function pointer: stderr for programs, the trainer's callback
 * (or nothing) inside libgddr-client. The level check happens before any
 * formatting, so a disabled debug line costs one comparison.
 */
#ifndef GDDR_COMMON_LOG_H
#define GDDR_COMMON_LOG_H

#include "gddr_base.h"

typedef struct gddr__logger {
    gddr_log_fn fn;   /* NULL: drop everything */
    void *user;
    int level;        /* lines above this level are dropped */
} gddr__logger;

/* The process-wide logger used by gddr_log(); programs point it at stderr
 * with gddr__log_to_stderr(). Not thread-safe to change while others log. */
extern gddr__logger gddr__log_global;

void gddr__log_to_stderr(const char *prog, int level);
void gddr__logf(const gddr__logger *lg, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define gddr_log(lvl, ...)                                                    \
    do {                                                                      \
        if ((lvl) <= gddr__log_global.level && gddr__log_global.fn)           \
            gddr__logf(&gddr__log_global, (lvl), __VA_ARGS__);                \
    } while (0)

/* Parses "error", "warn", "info", "debug"; returns -1 for anything else. */
int gddr__log_level_parse(const char *s);

#endif
