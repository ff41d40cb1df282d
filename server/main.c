/* main.c -- the gddr-ps command line, signals and systemd glue.
 *
 *   gddr-ps -c /etc/gddr/gddr-ps.ini        run in the foreground
 *   gddr-ps -c FILE --check-config          validate and exit (0 = good)
 *   gddr-ps [-c FILE] --dump-config         print every key as INI
 *   gddr-ps --dump-config --markdown        README's configuration table
 *   gddr-ps --set section.key=value ...     override a key
 *   gddr-ps ... --detach [--pid-file FILE]  print the endpoint once
 *                                           listening, run on in the background
 *
 * SIGINT/SIGTERM: checkpoint (when configured) and exit 0. SIGHUP: reload
 * the reloadable keys. With libsystemd, READY=1 is sent once the socket is
 * bound and WATCHDOG=1 every half watchdog period.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "client_conf.h"
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
            "usage: gddr-ps [-c FILE] [--check-config] [--dump-config [--markdown]] [--set KEY=VALUE]...\n"
            "               [--listen ENDPOINT] [--endpoint-file FILE] [--detach] [--pid-file FILE]\n"
            "  -c, --config FILE     INI file (see config/gddr-ps.ini)\n"
            "  --check-config        validate the configuration (values, files, directories) and exit\n"
            "  --dump-config         print the effective configuration and exit\n"
            "  --markdown            with --dump-config: the reference table of every key\n"
            "                        (server and [client]) in Markdown, as in the README\n"
            "  --set KEY=VALUE       override one key (KEY or section.KEY)\n"
            "  --listen ENDPOINT     same as --set listen=ENDPOINT\n"
            "  --endpoint-file FILE  write the bound endpoint to FILE (removed at start)\n"
            "  --detach              once listening, print the endpoint on stdout and go on in\n"
            "                        the background (exit 1 if the server did not start)\n"
            "  --pid-file FILE       write the server's pid to FILE once listening\n"
            "  --version\n");
}

static uint64_t watchdog_usec;
static int64_t last_watchdog_ms;

static int startup_rc;
/* --detach: the pipe on which the background server tells the waiting
 * foreground process its endpoint (closing it unwritten = failed start). */
static int ready_fd = -1;
static const char *pid_file;

/* The table of every key, server and client, as the README shows it (the
 * client's table: common/client_conf.c). */
static void print_markdown(void)
{
    printf("| key | default | meaning |\n|---|---|---|\n");
    gddr__conf_markdown(ps_conf_table, stdout);
    gddr__conf_markdown(gddr__client_conf_keys(), stdout);
}

/* Forks; the parent waits until the child is listening, prints its
 * endpoint and exits 0, or exits 1 when the child ended first. Returns in
 * the child only. */
static void detach(void)
{
    int p[2];
    if (pipe(p) != 0) {
        perror("gddr-ps: pipe");
        exit(1);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("gddr-ps: fork");
        exit(1);
    }
    if (pid > 0) {
        close(p[1]);
        char ep[GDDR_CONF_STRMAX + 2];
        size_t n = 0;
        ssize_t got;
        while (n < sizeof ep - 1 && ((got = read(p[0], ep + n, sizeof ep - 1 - n)) > 0 ||
                                     (got < 0 && errno == EINTR)))
            n += got > 0 ? (size_t)got : 0;
        ep[n] = 0;
        if (n > 0 && ep[n - 1] == '\n') {
            fputs(ep, stdout);
            exit(fflush(stdout) == 0 ? 0 : 1);
        }
        int st;
        waitpid(pid, &st, 0);
        fprintf(stderr, "gddr-ps: the server did not start (%s %d)\n",
                WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        exit(1);
    }
    close(p[0]);
    ready_fd = p[1];
    setsid();
    /* stdout is the caller's $(...): let it end once the endpoint is out.
     * stderr (the log) stays where the caller put it. */
    int dn = open("/dev/null", O_RDWR);
    if (dn >= 0) {
        dup2(dn, 0);
        dup2(dn, 1);
        if (dn > 2)
            close(dn);
    }
}

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
    if (pid_file) {
        FILE *f = fopen(pid_file, "w");
        if (!f || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0)
            gddr_log(GDDR_LOG_ERROR, "cannot write pid file %s", pid_file);
    }
    if (ps->cfg.endpoint_file[0]) {
        char tmp[GDDR_CONF_STRMAX + 8];
        snprintf(tmp, sizeof tmp, "%s.tmp", ps->cfg.endpoint_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", ps->endpoint) < 0 || fclose(f) != 0 ||
            rename(tmp, ps->cfg.endpoint_file) != 0)
            gddr_log(GDDR_LOG_ERROR, "cannot write endpoint_file %s", ps->cfg.endpoint_file);
    }
    if (ready_fd >= 0) {
        char line[GDDR_CONF_STRMAX + 2];
        int n = snprintf(line, sizeof line, "%s\n", ps->endpoint);
        if (write(ready_fd, line, (size_t)n) != n)
            gddr_log(GDDR_LOG_ERROR, "--detach: cannot hand the endpoint over: %s", strerror(errno));
        close(ready_fd);
        ready_fd = -1;
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
    int check = 0, dump = 0, markdown = 0, want_detach = 0;
    char *sets[64];
    int nsets = 0;
    static const struct option opts[] = {
        { "config", required_argument, 0, 'c' },   { "check-config", no_argument, 0, 'k' },
        { "dump-config", no_argument, 0, 'd' },    { "set", required_argument, 0, 's' },
        { "listen", required_argument, 0, 'l' },   { "endpoint-file", required_argument, 0, 'e' },
        { "markdown", no_argument, 0, 'm' },       { "detach", no_argument, 0, 'D' },
        { "pid-file", required_argument, 0, 'p' },
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
        case 'm': markdown = 1; break;
        case 'D': want_detach = 1; break;
        case 'p': pid_file = optarg; break;
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
    if (markdown && !dump) {
        fprintf(stderr, "gddr-ps: --markdown goes with --dump-config\n");
        return 2;
    }
    if (markdown) {
        print_markdown();
        return 0;
    }
    gddr_ps_config cfg;
    char err[1024];
    if (ps_config_read(&cfg, path, err, sizeof err) < 0) {
        fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
        return 1;
    }
    for (int i = 0; i < nsets; i++) {
        if (ps_config_apply_override(&cfg, sets[i], err, sizeof err) < 0) {
            fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
            return 1;
        }
    }
    if (ps_config_validate(&cfg, path ? path : "--set", err, sizeof err) < 0) {
        fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
        return 1;
    }
    if (dump) {
        gddr__conf_dump(ps_conf_table, &cfg, stdout);
        return 0;
    }
    /* The files and directories it names, as the daemon will need them:
     * what --check-config passes, the daemon can start with. */
    if (ps_config_check_paths(&cfg, path ? path : "--set", err, sizeof err) < 0) {
        fprintf(stderr, "gddr-ps: FATAL CONFIG ERROR: %s\n", err);
        return 1;
    }
    if (check) {
        printf("gddr-ps: configuration %s is valid\n", path ? path : "(defaults)");
        return 0;
    }
    /* A file left by an earlier run would give an old endpoint to whoever
     * waits for this one. */
    if (cfg.endpoint_file[0])
        unlink(cfg.endpoint_file);
    if (pid_file)
        unlink(pid_file);
    if (want_detach)
        detach();
    gddr__log_to_stderr("gddr-ps", cfg.log_level);
    if (cfg.curve_key_from_credential)
        gddr_log(GDDR_LOG_INFO, "CURVE secret key from the systemd credential %s",
                 cfg.curve_secret_key_file);

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
    if (ps_open(&opened, &cfg, path, err, sizeof err) != GDDR_OK) {
        /* A bind failure is a config error: say which line gave the endpoint. */
        char where[GDDR_CONF_STRMAX + 64] = "", w[GDDR_CONF_STRMAX + 32], listen[GDDR_CONF_STRMAX + 16];
        snprintf(listen, sizeof listen, "cannot bind %s:", cfg.listen);
        const char *key = strncmp(err, "cannot bind metrics_listen ", 27) == 0 ? "metrics_listen"
                          : strncmp(err, listen, strlen(listen)) == 0   ? "listen"
                                                                        : NULL;
        if (key)
            snprintf(where, sizeof where, "%s: key '%s': ",
                     ps_config_where(&cfg, path ? path : "--set", key, w, sizeof w), key);
        gddr_log(GDDR_LOG_ERROR, "cannot start: %s%s", where, err);
        return 1;
    }
    opened->tick = on_tick;
    opened->overrides = sets;
    opened->noverrides = nsets;
    the_ps = opened;
    ps_run(the_ps, on_ready);
    int rc = the_ps->final_ckpt_rc == GDDR_OK && !startup_rc ? 0 : 1;
    gddr_log(GDDR_LOG_INFO, "stopped: %llu pushes, %llu pulls, %llu updates applied",
             (unsigned long long)the_ps->pushes, (unsigned long long)the_ps->pulls_served,
             (unsigned long long)the_ps->versions_total);
#ifdef HAVE_LIBSYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    gddr_ps *ps = the_ps;
    the_ps = NULL;
    ps_close(&ps);
    if (pid_file)
        unlink(pid_file);
    return rc;
}
