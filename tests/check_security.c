/* check_security.c -- CURVE encryption and the authorized_keys allowlist,
 * against a real gddr-ps: an authorized key gets in and trains, a stranger's
 * key and a plaintext client get nothing -- GDDR_EAUTH at once, with a
 * message naming the cause, however long reconnect_timeout_ms is (they
 * used to hang in the hello's send) -- and the server counts the refusal; bad key files stop the daemon with the key's name.
 */
#include "harness.h" /* first: it sets _GNU_SOURCE */

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <zmq.h>

#include "gddr/gddr.h"
#include "keys.h"
#include "suites.h"

typedef struct keyset {
    char dir[64];
    char server_pub[GDDR_Z85_KEY], alice_pub[GDDR_Z85_KEY], mallory_pub[GDDR_Z85_KEY];
    char server_key[128], alice_key[128], mallory_key[128], allow[128];
} keyset;

static void make_keys(keyset *k)
{
    char err[512], name[128];
    snprintf(k->dir, sizeof k->dir, "/tmp/gddr-test-keys-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(k->dir));
    snprintf(name, sizeof name, "%s/server", k->dir);
    ck_assert_msg(gddr__keyfile_generate(name, k->server_pub, err, sizeof err) == 0, "%s", err);
    snprintf(name, sizeof name, "%s/alice", k->dir);
    ck_assert_msg(gddr__keyfile_generate(name, k->alice_pub, err, sizeof err) == 0, "%s", err);
    snprintf(name, sizeof name, "%s/mallory", k->dir);
    ck_assert_msg(gddr__keyfile_generate(name, k->mallory_pub, err, sizeof err) == 0, "%s", err);
    snprintf(k->server_key, sizeof k->server_key, "%s/server.key", k->dir);
    snprintf(k->alice_key, sizeof k->alice_key, "%s/alice.key", k->dir);
    snprintf(k->mallory_key, sizeof k->mallory_key, "%s/mallory.key", k->dir);
    snprintf(k->allow, sizeof k->allow, "%s/authorized_keys", k->dir);
    FILE *f = fopen(k->allow, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "# workers allowed in\n%s alice\n", k->alice_pub);
    fclose(f);
}

static void remove_keys(keyset *k)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", k->dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_keyfiles)
{
    keyset k;
    make_keys(&k);
    struct stat st;
    ck_assert_int_eq(stat(k.alice_key, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    char pub[GDDR_Z85_KEY], sec[GDDR_Z85_KEY], err[512];
    ck_assert_msg(gddr__keyfile_read(k.alice_key, pub, sec, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(pub, k.alice_pub);
    char derived[GDDR_Z85_KEY];
    ck_assert_int_eq(zmq_curve_public(derived, sec), 0);
    ck_assert_str_eq(derived, pub);
    /* The .pub file alone reads without a secret. */
    char pubfile[160];
    snprintf(pubfile, sizeof pubfile, "%s/alice.pub", k.dir);
    ck_assert_int_eq(gddr__keyfile_read(pubfile, pub, NULL, err, sizeof err), 0);
    ck_assert_str_eq(pub, k.alice_pub);
    /* A secret key others can read is refused. */
    chmod(k.alice_key, 0644);
    ck_assert_int_eq(gddr__keyfile_read(k.alice_key, pub, sec, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "chmod 600"), "err: %s", err);
    gddr__authkey *keys = NULL;
    ck_assert_int_eq(gddr__authorized_keys_read(k.allow, &keys, err, sizeof err), 1);
    unsigned char bin[32];
    zmq_z85_decode(bin, k.alice_pub);
    ck_assert_int_eq(memcmp(keys[0].key, bin, 32), 0);
    ck_assert_int_eq(keys[0].rank_lo, -1);
    ck_assert_int_eq(keys[0].observer_only, 0);
    free(keys);
    /* A .pub file appended as it is ("public = KEY"), with options too, as
     * ssh users add keys. */
    char both[160], cmd[1024];
    snprintf(both, sizeof both, "%s/from_pub", k.dir);
    snprintf(cmd, sizeof cmd, "cat '%s/alice.pub' > '%s' && printf 'ranks=1 ' >> '%s' && cat '%s/mallory.pub' >> '%s'",
             k.dir, both, both, k.dir, both);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(gddr__authorized_keys_read(both, &keys, err, sizeof err) == 2, "%s", err);
    ck_assert_str_eq(keys[0].z85, k.alice_pub);
    ck_assert_str_eq(keys[1].z85, k.mallory_pub);
    ck_assert_int_eq(keys[1].rank_lo, 1);
    free(keys);
    remove_keys(&k);
}
END_TEST

/* 1 (after saying SKIP) when this libzmq cannot do CURVE. */
static int no_curve(void)
{
    if (zmq_has("curve"))
        return 0;
    printf("SKIP curve: this libzmq has no CURVE support\n");
    return 1;
}

static gddr_client_opts opts_for(const char *ep, const char *server_pub, const char *keyfile)
{
    gddr_client_opts o = GDDR_CLIENT_OPTS_INIT;
    o.server = ep;
    o.rank = 0;
    o.world_size = 1;
    o.timeout_ms = 700;
    /* gddr_client_open waits this long for a server that does not answer
     * (it may be starting); a stranger never gets an answer. */
    o.reconnect_timeout_ms = 700;
    o.curve_server_key = server_pub;
    o.curve_key_file = keyfile;
    return o;
}

/* Keeps the last error the library logged (an open that fails frees the
 * client, and its message with it). */
static void keep_error(void *user, int level, const char *msg)
{
    if (level == GDDR_LOG_ERROR)
        snprintf(user, 512, "%s", msg);
}

/* A client the server refuses in the handshake: gddr_client_open fails
 * with GDDR_EAUTH and a message holding `why`, although it would wait ten
 * minutes for a server that is merely not up yet (the Check case's
 * timeout catches a hang). */
static void refused(gddr_client_opts o, const char *why)
{
    char msg[512] = "";
    o.timeout_ms = 5000;
    o.reconnect_timeout_ms = 600000;
    o.log = keep_error;
    o.log_user = msg;
    gddr_client *m = NULL;
    int rc = gddr_client_open(&o, &m);
    ck_assert_ptr_null(m);
    ck_assert_msg(rc == GDDR_EAUTH, "open gave %s (%s), expected GDDR_EAUTH", gddr_strerror(rc), msg);
    ck_assert_msg(strstr(msg, why), "the error \"%s\" does not say \"%s\"", msg, why);
}

/* No wait is unbounded, and the error says why: a port nobody listens on,
 * and a listener that accepts and never speaks, each end gddr_client_open
 * within connect_timeout_ms (asserted by the Check case's timeout: the
 * reconnect_timeout_ms it used to wait is ten minutes here). */
START_TEST(test_open_bounded)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    char ep[64], msg[512] = "";
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    gddr_client_opts o = opts_for(ep, NULL, NULL);
    o.timeout_ms = 1000;
    o.connect_timeout_ms = 1500;
    o.reconnect_timeout_ms = 600000;
    o.log = keep_error;
    o.log_user = msg;
    gddr_client *c = NULL;
    /* Bound but not listening: connections are refused. */
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_ETIMEDOUT);
    ck_assert_msg(strstr(msg, "nothing accepts connections"), "%s", msg);
    /* Listening (the kernel accepts) but silent. */
    ck_assert_int_eq(listen(ls, 8), 0);
    msg[0] = 0;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_ETIMEDOUT);
    ck_assert_msg(strstr(msg, "did not answer a hello"), "%s", msg);
    close(ls);
}
END_TEST

/* Alice (on the list) opens a client, registers key (8 values; its id in
 * *id), pushes 2s at lr 0.5 and pulls the values moved by 1: she is in.
 * Returns her client. */
static gddr_client *alice_trains(const gt_server *s, const keyset *k, const char *key, int *id)
{
    gddr_client_opts o = opts_for(s->endpoint, k->server_pub, k->alice_key);
    o.timeout_ms = 30000; /* her replies come: a bound that only catches a hang */
    o.reconnect_timeout_ms = 30000;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, g[8] = { 2, 2, 2, 2, 2, 2, 2, 2 }, out[8];
    ck_assert_int_eq(gddr_register(c, key, w, 8, id, NULL), GDDR_OK);
    uint64_t v = 0;
    ck_assert_int_eq(gddr_push(c, *id, g, &v), GDDR_OK);
    ck_assert_int_eq(gddr_pull(c, *id, out, 0, &v), GDDR_OK);
    ck_assert_int_eq(v, 1);
    for (int i = 0; i < 8; i++)
        ck_assert_float_eq(out[i], w[i] - 1.0f);
    return c;
}

/* Stops the server; it must exit 0. */
static void stop_ok(gt_server *s)
{
    int status = 0;
    ck_assert_int_eq(gt_server_stop(s, 30000, &status), 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

START_TEST(test_allowlist)
{
    if (no_curve())
        return;
    keyset k;
    make_keys(&k);
    char set1[200], set2[200], err[512];
    snprintf(set1, sizeof set1, "curve_secret_key_file=%s", k.server_key);
    snprintf(set2, sizeof set2, "authorized_keys=%s", k.allow);
    const char *sets[] = { set1, set2, "lr=0.5", NULL };
    gt_server s;
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);

    /* Alice is on the list: she registers, pushes and pulls. */
    int id;
    gddr_client *c = alice_trains(&s, &k, "secure.w", &id);
    float out[8];
    uint64_t v = 0;

    /* Mallory has a valid key pair but is not on the list. */
    refused(opts_for(s.endpoint, k.server_pub, k.mallory_key), "authorized_keys");

    /* A plaintext client cannot talk to a CURVE server either. */
    refused(opts_for(s.endpoint, NULL, NULL), "requires CURVE");

    /* Nothing the strangers did changed the tensor, and the refusal counts. */
    ck_assert_int_eq(gddr_pull(c, id, out, 0, &v), GDDR_OK);
    ck_assert_int_eq(v, 1);
    char *text = NULL;
    ck_assert_int_eq(gddr_server_metrics_text(c, &text), GDDR_OK);
    const char *line = strstr(text, "\ngddr_auth_rejected_total ");
    ck_assert_ptr_nonnull(line);
    ck_assert_int_ge(atoi(line + strlen("\ngddr_auth_rejected_total ")), 1);
    free(text);
    gddr_client_close(&c);
    stop_ok(&s);
    remove_keys(&k);
}
END_TEST

/* Key options: a key limited to rank 1 cannot be worker 0; an observer key
 * reads (stats, pulls) but cannot be a worker or ask for checkpoints. A
 * plaintext client and one with the wrong server key fail the handshake
 * and are counted. */
START_TEST(test_key_options)
{
    if (no_curve())
        return;
    keyset k;
    make_keys(&k);
    FILE *f = fopen(k.allow, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "ranks=1 %s alice\nobserver %s dashboard\n", k.alice_pub, k.mallory_pub);
    fclose(f);
    char set1[200], set2[200], set3[200], err[512];
    snprintf(set1, sizeof set1, "curve_secret_key_file=%s", k.server_key);
    snprintf(set2, sizeof set2, "authorized_keys=%s", k.allow);
    snprintf(set3, sizeof set3, "checkpoint_dir=%s/ck", k.dir);
    const char *sets[] = { set1, set2, set3, "checkpoint_interval_s=0", NULL };
    gt_server s;
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);

    gddr_client_opts o = opts_for(s.endpoint, k.server_pub, k.alice_key);
    o.timeout_ms = o.reconnect_timeout_ms = 30000;
    o.world_size = 2;
    gddr_client *c = NULL;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_EWORKER); /* rank 0: not hers */
    o.rank = 1;
    ck_assert_int_eq(gddr_client_open(&o, &c), GDDR_OK);
    float w[4] = { 1, 2, 3, 4 }, g[4] = { 1, 1, 1, 1 }, out[4];
    int id;
    uint64_t v = 0;
    ck_assert_int_eq(gddr_register(c, "opt.w", w, 4, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_push(c, id, g, &v), GDDR_OK);

    gddr_client_opts om = opts_for(s.endpoint, k.server_pub, k.mallory_key);
    om.timeout_ms = om.reconnect_timeout_ms = 30000;
    gddr_client *m = NULL;
    ck_assert_int_eq(gddr_client_open(&om, &m), GDDR_EWORKER); /* an observer key as worker */
    om.observer = 1;
    ck_assert_int_eq(gddr_client_open(&om, &m), GDDR_OK);
    int mid;
    ck_assert_int_eq(gddr_register(m, "opt.w", w, 4, &mid, NULL), GDDR_OK); /* a lookup */
    ck_assert_int_eq(gddr_pull(m, mid, out, 0, &v), GDDR_OK);
    ck_assert_uint_eq(v, 1);
    ck_assert_int_eq(gddr_request_checkpoint(m), GDDR_EWORKER);
    ck_assert_int_eq(gddr_register(m, "opt.new", w, 4, &mid, NULL), GDDR_ENOKEY);
    gddr_server_stats st;
    ck_assert_int_eq(gddr_server_stats_get(m, &st), GDDR_OK);
    ck_assert_uint_eq(st.pushes, 1);
    gddr_client_close(&m);

    /* Plaintext, and a wrong server key: refused in the handshake, counted. */
    refused(opts_for(s.endpoint, NULL, NULL), "requires CURVE");
    refused(opts_for(s.endpoint, k.alice_pub, k.alice_key), "curve_server_key"); /* not the server's */
    /* The server counts from its own monitor, which may see a connection
     * the client dropped at once as merely closed: tried again (bounded)
     * until two failures are counted. */
    int counted = 0;
    for (int64_t until = gt_now_ms() + 60000; counted < 2 && gt_now_ms() < until;) {
        char *text = NULL;
        ck_assert_int_eq(gddr_server_metrics_text(c, &text), GDDR_OK);
        const char *line = strstr(text, "\ngddr_handshake_failures_total ");
        ck_assert_ptr_nonnull(line);
        counted = atoi(line + strlen("\ngddr_handshake_failures_total "));
        free(text);
        if (counted < 2) {
            usleep(200000);
            refused(opts_for(s.endpoint, NULL, NULL), "requires CURVE");
        }
    }
    ck_assert_msg(counted >= 2, "two failed handshakes, counted %d", counted);
    gddr_client_close(&c);
    int status = 0;
    ck_assert_int_eq(gt_server_stop(&s, 30000, &status), 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* A line with an unknown option is refused with its line number. */
    f = fopen(k.allow, "w");
    fprintf(f, "# ok\nranks=2-1 %s\n", k.alice_pub);
    fclose(f);
    gddr__authkey *keys = NULL;
    ck_assert_int_eq(gddr__authorized_keys_read(k.allow, &keys, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":2: ") && strstr(err, "ranks="), "err: %s", err);
    f = fopen(k.allow, "w");
    fprintf(f, "admin %s\n", k.alice_pub);
    fclose(f);
    ck_assert_int_eq(gddr__authorized_keys_read(k.allow, &keys, err, sizeof err), -1);
    ck_assert_msg(strstr(err, ":1: unknown option 'admin'"), "err: %s", err);
    remove_keys(&k);
}
END_TEST

/* Under systemd with LoadCredential=curve_secret_key_file:PATH, the daemon
 * takes its key from $CREDENTIALS_DIRECTORY (where systemd copies it, mode
 * 400, for the service user) and no config names the key: a worker with the
 * matching server key gets in, a plaintext one does not. */
START_TEST(test_key_from_credential)
{
    if (no_curve())
        return;
    keyset k;
    make_keys(&k);
    char creds[96], cred[160], cmd[1024], set2[200], err[512];
    snprintf(creds, sizeof creds, "%s/credentials", k.dir);
    snprintf(cred, sizeof cred, "%s/curve_secret_key_file", creds);
    snprintf(cmd, sizeof cmd, "mkdir '%s' && cp '%s' '%s' && chmod 400 '%s'", creds, k.server_key,
             cred, cred);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(unlink(k.server_key), 0); /* only the credential holds it */
    snprintf(set2, sizeof set2, "authorized_keys=%s", k.allow);
    const char *sets[] = { set2, "lr=0.5", NULL }; /* no curve_secret_key_file */
    gt_server s;
    setenv("CREDENTIALS_DIRECTORY", creds, 1);
    int started = gt_server_start(&s, sets, err, sizeof err);
    unsetenv("CREDENTIALS_DIRECTORY");
    ck_assert_msg(started == 0, "%s", err);

    int id;
    gddr_client *c = alice_trains(&s, &k, "cred.w", &id);
    refused(opts_for(s.endpoint, NULL, NULL), "requires CURVE");
    gddr_client_close(&c);
    stop_ok(&s);
    remove_keys(&k);
}
END_TEST

/* Bad key settings stop the daemon before it listens, naming the key. */
START_TEST(test_bad_key_config)
{
    keyset k;
    make_keys(&k);
    char bin[512];
    gt_bin_path(bin, sizeof bin, "gddr-ps");
    if (access(bin, X_OK) != 0) {
        printf("SKIP gddr-ps binary not built\n");
        remove_keys(&k);
        return;
    }
    char set1[200], set2[200];
    struct { const char *key_file, *allow, *expect; } cases[] = {
        { "/nonexistent/server.key", k.allow, "curve_secret_key_file" },
        { k.server_key, "/nonexistent/authorized_keys", "authorized_keys" },
        { k.server_key, NULL, "authorized_keys too" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(set1, sizeof set1, "curve_secret_key_file=%s", cases[i].key_file);
        snprintf(set2, sizeof set2, "authorized_keys=%s", cases[i].allow ? cases[i].allow : "");
        char *argv[] = { bin, "--listen", "tcp://127.0.0.1:*", "--set", set1, "--set", set2, NULL };
        char *out = NULL, err[512];
        int status = 0;
        /* stderr goes to the test log; the exit status is what we assert. */
        int rc = gt_run_capture(argv, 30000, 1, &out, &status, err, sizeof err);
        free(out);
        ck_assert_int_eq(rc, 0);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "case %zu: status %d", i, status);
    }
    /* The messages themselves: the validation sentence names the key. */
    chmod(k.server_key, 0644);
    char pub[GDDR_Z85_KEY], sec[GDDR_Z85_KEY], err[512];
    ck_assert_int_eq(gddr__keyfile_read(k.server_key, pub, sec, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "server.key"), "err: %s", err);
    remove_keys(&k);
}
END_TEST

/* A handshake the server breaks off (killed in the middle of it: the
 * connection reset) is not a refusal: the client keeps trying and gets in
 * once a server answers. A listener that reads the client's first bytes and
 * resets the connection, twice, stands for the killed server; then gddr-ps
 * starts on that port. (A worker opening while a server was killed gave
 * up at once with "is curve_server_key the server's public key?".) */
typedef struct opener {
    gddr_client_opts o;
    gddr_client *c;
    int rc;
} opener;

static void *open_main(void *arg)
{
    opener *op = arg;
    op->rc = gddr_client_open(&op->o, &op->c);
    return NULL;
}

START_TEST(test_broken_handshake_retried)
{
    if (no_curve())
        return;
    keyset k;
    make_keys(&k);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    ck_assert_int_eq(listen(ls, 8), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%u", ntohs(a.sin_port));
    opener op = { .o = opts_for(ep, k.server_pub, k.alice_key) };
    op.o.timeout_ms = 2000;
    op.o.reconnect_timeout_ms = 60000;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, open_main, &op), 0);
    for (int i = 0; i < 2; i++) {
        int cs = accept(ls, NULL, NULL);
        ck_assert_int_ge(cs, 0);
        char buf[64];
        ck_assert_int_gt(recv(cs, buf, sizeof buf, 0), 0); /* the client's greeting */
        struct linger lg = { 1, 0 };
        setsockopt(cs, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(cs); /* RST */
    }
    close(ls);
    char set1[200], set2[200], listen_on[96], err[512];
    snprintf(set1, sizeof set1, "curve_secret_key_file=%s", k.server_key);
    snprintf(set2, sizeof set2, "authorized_keys=%s", k.allow);
    snprintf(listen_on, sizeof listen_on, "listen=%s", ep);
    const char *sets[] = { set1, set2, listen_on, NULL };
    gt_server s;
    ck_assert_msg(gt_server_start(&s, sets, err, sizeof err) == 0, "%s", err);
    pthread_join(th, NULL);
    ck_assert_msg(op.rc == GDDR_OK, "gddr_client_open after two broken handshakes: %s",
                  gddr_strerror(op.rc));
    float w[4] = { 1, 2, 3, 4 }, out[4];
    int id;
    uint64_t v;
    ck_assert_int_eq(gddr_register(op.c, "after.reset", w, 4, &id, NULL), GDDR_OK);
    ck_assert_int_eq(gddr_pull(op.c, id, out, 0, &v), GDDR_OK);
    ck_assert_float_eq(out[3], 4.0f);
    gddr_client_close(&op.c);
    stop_ok(&s);
    remove_keys(&k);
}
END_TEST

Suite *suite_security(void)
{
    Suite *s = suite_create("security");
    TCase *tc = tcase_create("curve");
    tcase_set_timeout(tc, 120); /* a hang-catcher; the tests take seconds */
    tcase_add_test(tc, test_keyfiles);
    tcase_add_test(tc, test_allowlist);
    tcase_add_test(tc, test_key_options);
    tcase_add_test(tc, test_bad_key_config);
    tcase_add_test(tc, test_key_from_credential);
    tcase_add_test(tc, test_open_bounded);
    tcase_add_test(tc, test_broken_handshake_retried);
    suite_add_tcase(s, tc);
    return s;
}
