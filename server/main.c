/* main.c -- the gddr-ps command line, signals and systemd glue.
 *
 *   gddr-ps -c /etc/gddr/gddr-ps.ini        run in the foreground
 *   gddr-ps -c FILE --check-config          validate and exit (0 = good)
 *   gddr-ps [-c FILE] --dump-config         print every key as INI
 *   gddr-ps --set section.key=value ...     override a key
 *
 * SIGINT/SIGTERM: checkpoint (when configured) and exit 0. SIGHUP: reload
 * the reloadable keys. With libsystemd, READY=1 is sent once the socket is
 * bound and WATCHDOG=1 every half watchdog period.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "log.h"
#include "ps.h"

static gddr_ps *volatile the_ps;
/* Signals that came before the daemon was ready: held, not acted on. */
static volatile sig_atomic_t early_stop, early_reload;

static void on_signal(int sig)
{
    gddr_ps *ps = the_ps;
    if (!ps) {
        if (sig == SIGHUP)
            early_reload = 1;
        else
            early_stop = sig;
        return;
    }
    if (sig == SIGHUP)
        ps->reload = 1;
    else
        ps->stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: gddr-ps [-c FILE] [--check-config] [--dump-config] [--set KEY=VALUE]...\n"
            "               [--listen ENDPOINT] [--endpoint-file FILE]\n"
            "  -c, --config FILE     INI file (see config/gddr-ps.ini)\n"
            "  --check-config        validate the configuration and exit\n"
            "  --dump-config         print the effective configuration and exit\n"
            "  --set KEY=VALUE       override one key (KEY or section.KEY)\n"
            "  --listen ENDPOINT     same as --set listen=ENDPOINT\n"
            "  --endpoint-file FILE  write the bound endpoint to FILE\n"
            "  --version\n");
}

static uint64_t watchdog_usec;
static int64_t last_watchdog_ms;

static int startup_rc;

static void on_ready(gddr_ps *ps)
{
    /* Signals held during start-up act now. A stop asked for before the
     * daemon ever served is a failed start, not a clean exit: say so, and
     * exit non-zero so that Restart=on-failure notices. */
    if (early_stop) {
        gddr_log(GDDR_LOG_ERROR, "%s arrived while starting: exiting without serving",
                 early_stop == SIGINT ? "SIGINT" : "SIGTERM");
        ps->stop = 1;
        startup_rc = 1;
        return;
    }
    if (early_reload)
        ps->reload = 1;
    if (ps->cfg.endpoint_file[0]) {
        char tmp[GDDR_CONF_STRMAX + 8];
        snprintf(tmp, sizeof tmp, "%s.tmp", ps->cfg.endpoint_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", ps->endpoint) < 0 || fclose(f) != 0 ||
            rename(tmp, ps->cfg.endpoint_file) != 0)
            gddr_log(GDDR_LOG_ERROR, "cannot write endpoint_file %s", ps->cfg.endpoint_file);
    }
#ifdef HAVE_LIBSYSTEMD
    sd_notifyf(0, "READY=1\nSTATUS=listening on %s", ps->endpoint);
    if (sd_watchdog_enabled(0, &watchdog_usec) <= 0)
        watchdog_usec = 0;
#endif
}

static void on_tick(gddr_ps *ps)
{
#ifdef HAVE_LIBSYSTEMD
    if (watchdog_usec) {
        int64_t now = gddr__now_ms();
        if ((uint64_t)(now - last_watchdog_ms) * 2000 >= watchdog_usec) {
            sd_notify(0, "WATCHDOG=1");
            last_watchdog_ms = now;
        }
    }
#else
    (void)ps;
    (void)watchdog_usec;
    (void)last_watchdog_ms;
#endif
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int check = 0, dump = 0;
    char *sets[64];
    int nsets = 0;
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' },   { "check-config", no_argument, 0, 'k' },
        { "dump-config", no_argument, 0, 'd' },    { "set", required_argument, 0, 's' },
        { "listen", required_argument, 0, 'l' },   { "endpoint-file", required_argument, 0, 'e' },
        { "help", no_argument, 0, 'h' },           { "version", no_argument, 0, 'V' },
        { 0, 0, 0, 0 },
    };
    static char buf[64][GDDR_CONF_STRMAX + 32];
    int c;
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        if (nsets >= 63 && (c == 's' || c == 'l' || c == 'e')) {
            fprintf(stderr, "gddr-ps: too many overrides\n");
            return 2;
        }
        switch (c) {
        case 'c': path = optarg; break;
        case 'k': check = 1; break;
        case 'd': dump = 1; break;
        case 's': sets[nsets++] = optarg; break;
        case 'l': snprintf(buf[nsets], sizeof buf[0], "listen=%s", optarg); sets[nsets] = buf[nsets]; nsets++; break;
        case 'e': snprintf(buf[nsets], sizeof buf[0], "endpoint_file=%s", optarg); sets[nsets] = buf[nsets]; nsets++; break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("gddr-ps %s\n", GDDR_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gddr-ps: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    gddr_ps_config cfg;
    char err[1024];
    if (gddr_ps_config_read(&cfg, path, err, sizeof err) < 0) {
        fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
        return 1;
    }
    for (int i = 0; i < nsets; i++) {
        if (gddr_ps_config_apply_override(&cfg, sets[i], err, sizeof err) < 0) {
            fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
            return 1;
        }
    }
    if (gddr_ps_config_validate(&cfg, path ? path : "--set", err, sizeof err) < 0) {
        fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
        return 1;
    }
    if (dump) {
        gddr__conf_dump(gddr_ps_conf_table, &cfg, stdout);
        return 0;
    }
    if (check) {
        printf("gddr-ps: configuration %s is valid\n", path ? path : "(defaults)");
        return 0;
    }
    gddr__log_to_stderr("gddr-ps", cfg.log_level);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* A parent may have left them blocked (and pending): from here on the
     * handlers hold them until the daemon is ready (on_ready). */
    sigset_t ours;
    sigemptyset(&ours);
    sigaddset(&ours, SIGINT);
    sigaddset(&ours, SIGTERM);
    sigaddset(&ours, SIGHUP);
    sigprocmask(SIG_UNBLOCK, &ours, NULL);

    gddr_ps *opened = NULL;
    if (gddr_ps_open(&opened, &cfg, path, err, sizeof err) != GDDR_OK) {
        gddr_log(GDDR_LOG_ERROR, "cannot start: %s", err);
        return 1;
    }
    opened->tick = on_tick;
    opened->overrides = sets;
    opened->noverrides = nsets;
    the_ps = opened;
    gddr_ps_run(the_ps, on_ready);
    int rc = the_ps->final_ckpt_rc == GDDR_OK && !startup_rc ? 0 : 1;
    gddr_log(GDDR_LOG_INFO, "stopped: %llu pushes, %llu pulls, %llu updates applied",
             (unsigned long long)the_ps->pushes, (unsigned long long)the_ps->pulls_served,
             (unsigned long long)the_ps->versions_total);
#ifdef HAVE_LIBSYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    gddr_ps *ps = the_ps;
    the_ps = NULL;
    gddr_ps_close(&ps);
    return rc;
}
