/* log.c -- see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

gddr__logger gddr__log_global = { NULL, NULL, GDDR_LOG_WARN };

static const char *level_names[] = { "error", "warn", "info", "debug" };
static char stderr_prog[64] = "gddr";
static int stderr_is_journal;

/* systemd sets JOURNAL_STREAM=DEV:INODE when stderr is a journal stream; it
 * counts only while stderr is still that stream (not redirected since). */
static int journal_stream(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat sb;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &sb) != 0)
        return 0;
    return (unsigned long long)sb.st_dev == dev && (unsigned long long)sb.st_ino == ino;
}

static void stderr_sink(void *user, int level, const char *msg)
{
    (void)user;
    int lvl = level < 0 ? 0 : level > 3 ? 3 : level;
    if (stderr_is_journal) {
        /* "<N>" is the syslog priority journald files the line under
         * (journalctl -p err); the journal keeps its own time. */
        static const int prio[] = { 3, 4, 6, 7 };
        fprintf(stderr, "<%d>%s[%s] %s\n", prio[lvl], stderr_prog, level_names[lvl], msg);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld %s[%s] %s\n", when, ts.tv_nsec / 1000000L, stderr_prog,
            level_names[lvl], msg);
}

void gddr__log_to_stderr(const char *prog, int level)
{
    snprintf(stderr_prog, sizeof stderr_prog, "%s", prog);
    stderr_is_journal = journal_stream();
    gddr__log_global.fn = stderr_sink;
    gddr__log_global.user = NULL;
    gddr__log_global.level = level;
}

void gddr__logf(const gddr__logger *lg, int level, const char *fmt, ...)
{
    if (!lg || !lg->fn || level > lg->level)
        return;
    char buf[1024], line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* One event, one line: control characters (a newline in a string that
     * came off the wire, say) are escaped, so nothing a peer sends can
     * forge a log line. */
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)buf; *p && o + 5 < sizeof line; p++) {
        if (*p < 0x20 || *p == 0x7f)
            o += (size_t)snprintf(line + o, sizeof line - o, "\\x%02x", *p);
        else
            line[o++] = (char)*p;
    }
    line[o] = 0;
    lg->fn(lg->user, level, line);
}

int gddr__log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return GDDR_LOG_WARN;
    return -1;
}

const char *gddr_strerror(int err)
{
    switch (err) {
#define GDDR__ERR_CASE(name, num, text) case num: return text;
        GDDR_ERRORS(GDDR__ERR_CASE)
#undef GDDR__ERR_CASE
    }
    return "unknown error";
}
