/* check_checkpoint.c -- tests of server/checkpoint_{format,read,write}.c
 * (docs/design.md section 7). */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../server/checkpoint.h"
#include "log.h"
#include "suites.h"

/* ---- helpers ------------------------------------------------------------- */

static char troot[64]; /* per test case: made and removed by the runner */
static char tdir[96];  /* per test, inside troot */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void rm_rf(const char *p)
{
    if (p[0])
        nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Unchecked fixture: runs in the runner process, so the tree goes away even
 * when a forked test fails (a failed assertion _exit()s the child before
 * the checked teardown). */
static void setup_root(void)
{
    snprintf(troot, sizeof troot, "/tmp/gddr-ckpt-test-XXXXXX");
    if (!mkdtemp(troot)) {
        perror("mkdtemp");
        abort();
    }
}

static void teardown_root(void)
{
    rm_rf(troot);
    troot[0] = '\0';
}

static void teardown_dir(void)
{
    rm_rf(tdir);
    tdir[0] = '\0';
    gddr__ckpt_test_flags = 0;
}

static void setup_dir(void)
{
    snprintf(tdir, sizeof tdir, "%s/t-XXXXXX", troot);
    ck_assert_ptr_nonnull(mkdtemp(tdir));
}

/* Deterministic bytes: xorshift64 from a seed. */
static void fill(void *buf, uint64_t len, uint64_t seed)
{
    uint8_t *p = buf;
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

static void sec_set(gddr_ckpt_section *s, const char *name, uint64_t len, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->len = len;
    s->data = len ? malloc(len) : NULL;
    if (len)
        ck_assert_ptr_nonnull(s->data);
    fill(s->data, len, seed);
}

static void secs_free(gddr_ckpt_section *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(s[i].data);
}

static void fpath(char *buf, size_t len, uint64_t seq, const char *suffix)
{
    snprintf(buf, len, "%s/ckpt-%020" PRIu64 ".gddr%s", tdir, seq, suffix);
}

static int exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static uint64_t fsize(const char *p)
{
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    return (uint64_t)sb.st_size;
}

/* Number of directory entries other than . and .. */
static int dir_entries(const char *d)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", d);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    int k = -1;
    ck_assert_int_eq(fscanf(f, "%d", &k), 1);
    pclose(f);
    return k;
}

static uint8_t *slurp(const char *p, uint64_t *len)
{
    *len = fsize(p);
    uint8_t *b = malloc(*len ? *len : 1);
    ck_assert_ptr_nonnull(b);
    int fd = open(p, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, b, *len, 0), (ssize_t)*len);
    close(fd);
    return b;
}

static void spit(const char *p, const uint8_t *b, uint64_t len)
{
    int fd = open(p, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, b, len, 0), (ssize_t)len);
    close(fd);
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Recomputes the trailer CRC so that only the intended defect remains. */
static void fix_crc(uint8_t *b, uint64_t len)
{
    wr32(b + len - 8, gddr__crc32c(0, b, len - 16));
}

/* Writes checkpoint `seq` holding one section "v" of `len` bytes (seed seq). */
static void write_simple(uint64_t seq, uint64_t len, int keep)
{
    gddr_ckpt_section s;
    sec_set(&s, "v", len, seq);
    char err[256] = "";
    int rc = gddr__ckpt_write(tdir, seq, &s, 1, keep, NULL, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "write %" PRIu64 ": %s", seq, err);
    secs_free(&s, 1);
}

static void assert_simple(const gddr_ckpt *c, uint64_t seq, uint64_t len)
{
    ck_assert_uint_eq(c->seq, seq);
    ck_assert_uint_eq(c->n, 1);
    ck_assert_str_eq(c->s[0].name, "v");
    ck_assert_uint_eq(c->s[0].len, len);
    uint8_t *want = malloc(len ? len : 1);
    fill(want, len, seq);
    ck_assert_int_eq(memcmp(c->s[0].data, want, len), 0);
    free(want);
}

/* Captures log lines. */
static char logbuf[16384];
static void log_capture(void *user, int level, const char *msg)
{
    (void)user;
    size_t used = strlen(logbuf);
    snprintf(logbuf + used, sizeof logbuf - used, "%d %s\n", level, msg);
}
static gddr__logger saved_logger;
static void log_start(void)
{
    logbuf[0] = '\0';
    saved_logger = gddr__log_global;
    gddr__log_global.fn = log_capture;
    gddr__log_global.user = NULL;
    gddr__log_global.level = GDDR_LOG_DEBUG;
}
static void log_stop(void) { gddr__log_global = saved_logger; }

/* ---- CRC32C -------------------------------------------------------------- */

START_TEST(test_crc32c)
{
    ck_assert_uint_eq(gddr__crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(gddr__crc32c_sw(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(gddr__crc32c(0, "", 0), 0);
    /* RFC 3720 B.4: 32 bytes of zeros, of 0xff. */
    uint8_t z[32];
    memset(z, 0, sizeof z);
    ck_assert_uint_eq(gddr__crc32c(0, z, 32), 0x8A9136AAu);
    memset(z, 0xff, sizeof z);
    ck_assert_uint_eq(gddr__crc32c(0, z, 32), 0x62A8AB43u);
    /* Chaining. */
    ck_assert_uint_eq(gddr__crc32c(gddr__crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    /* Hardware and table agree at every alignment and length. */
    enum { N = 70000 };
    uint8_t *b = malloc(N);
    fill(b, N, 42);
    for (size_t off = 0; off < 9; off++)
        for (size_t len = 0; len < 300; len += 7) {
            ck_assert_uint_eq(gddr__crc32c(0, b + off, len), gddr__crc32c_sw(0, b + off, len));
        }
    ck_assert_uint_eq(gddr__crc32c(0, b + 3, N - 3), gddr__crc32c_sw(0, b + 3, N - 3));
    uint32_t c = gddr__crc32c(0, b, 12345);
    ck_assert_uint_eq(gddr__crc32c(c, b + 12345, N - 12345), gddr__crc32c_sw(0, b, N));
    free(b);
}
END_TEST

/* ---- write / load -------------------------------------------------------- */

START_TEST(test_roundtrip)
{
    char long_name[64];
    memset(long_name, 'n', 63);
    long_name[63] = '\0';
    gddr_ckpt_section s[5];
    sec_set(&s[0], "values", 1000 * sizeof(float), 1);
    sec_set(&s[1], "versions", 17, 2);
    sec_set(&s[2], "empty", 0, 3);
    sec_set(&s[3], long_name, 1, 4);
    sec_set(&s[4], "membership", 4096 + 3, 5);
    gddr_ckpt_stats st;
    char err[256] = "x";
    ck_assert_int_eq(gddr__ckpt_write(tdir, 7, s, 5, 3, &st, err, sizeof err), GDDR_OK);
    ck_assert_str_eq(err, "");

    char p[256], t[256];
    fpath(p, sizeof p, 7, "");
    fpath(t, sizeof t, 7, ".tmp");
    ck_assert(exists(p));
    ck_assert(!exists(t));
    /* Size: 40 header + records (u16, name, pad to 8, u64) + data padded to
     * 8 + 16 trailer. */
    uint64_t want = 40 + 16;
    want += 8 + 8 + 4000;       /* "values": 2+6 = 8 */
    want += 16 + 8 + 24;        /* "versions": 2+8 -> 16; 17 -> 24 */
    want += 8 + 8 + 0;          /* "empty": 2+5 -> 8 */
    want += 72 + 8 + 8;         /* 63 chars: 65 -> 72; 1 -> 8 */
    want += 16 + 8 + 4104;      /* "membership": 12 -> 16; 4099 -> 4104 */
    ck_assert_uint_eq(fsize(p), want);
    ck_assert_uint_eq(st.bytes, want);
    ck_assert(st.total_ms >= st.write_ms);
    ck_assert(st.total_ms >= st.fsync_ms);
    ck_assert(st.write_ms >= 0 && st.fsync_ms >= 0 && st.copy_ms >= 0);

    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, err, sizeof err), GDDR_OK);
    ck_assert_uint_eq(c.seq, 7);
    ck_assert_str_eq(c.path, p);
    ck_assert_uint_eq(c.n, 5);
    for (size_t i = 0; i < 5; i++) {
        ck_assert_str_eq(c.s[i].name, s[i].name);
        ck_assert_uint_eq(c.s[i].len, s[i].len);
        ck_assert_ptr_nonnull(c.s[i].data);
        if (s[i].len)
            ck_assert_int_eq(memcmp(c.s[i].data, s[i].data, s[i].len), 0);
    }
    const gddr_ckpt_section *f = gddr__ckpt_find(&c, "versions");
    ck_assert_ptr_eq(f, &c.s[1]);
    ck_assert_ptr_eq(gddr__ckpt_find(&c, long_name), &c.s[3]);
    ck_assert_ptr_null(gddr__ckpt_find(&c, "nope"));
    ck_assert_ptr_null(gddr__ckpt_find(&c, "value"));
    gddr__ckpt_free(&c);
    ck_assert_uint_eq(c.n, 0);
    ck_assert_ptr_null(c.s);
    gddr__ckpt_free(&c); /* twice is fine */
    secs_free(s, 5);
}
END_TEST

/* The bytes on disk are what docs/checkpoint-format.md says. */
START_TEST(test_format_bytes)
{
    gddr_ckpt_section s;
    sec_set(&s, "abc", 5, 9);
    ck_assert_int_eq(gddr__ckpt_write(tdir, 0x0102030405060708ull, &s, 1, 0, NULL, NULL, 0),
                     GDDR_OK);
    char p[256];
    fpath(p, sizeof p, 0x0102030405060708ull, "");
    uint64_t len;
    uint8_t *b = slurp(p, &len);
    ck_assert_uint_eq(len, 40 + 8 + 8 + 8 + 16);
    ck_assert_int_eq(memcmp(b, "GDDRCKPT", 8), 0);
    ck_assert_uint_eq(rd32(b + 8), 1);                      /* version */
    ck_assert_uint_eq(rd32(b + 12), 0);                     /* flags */
    ck_assert_uint_eq(rd64(b + 16), 0x0102030405060708ull); /* seq */
    ck_assert_uint_eq(b[16], 0x08);                         /* little-endian */
    uint64_t ns = rd64(b + 24);
    ck_assert(ns > 1600000000ull * 1000000000ull); /* creation time, unix ns */
    ck_assert_uint_eq(rd32(b + 32), 1);            /* section count */
    ck_assert_uint_eq(rd32(b + 36), 0);            /* reserved */
    ck_assert_uint_eq(b[40], 3);                   /* u16 name length */
    ck_assert_uint_eq(b[41], 0);
    ck_assert_int_eq(memcmp(b + 42, "abc", 3), 0);
    for (int i = 45; i < 48; i++)
        ck_assert_uint_eq(b[i], 0); /* pad to 8 */
    ck_assert_uint_eq(rd64(b + 48), 5);
    ck_assert_int_eq(memcmp(b + 56, s.data, 5), 0);
    for (int i = 61; i < 64; i++)
        ck_assert_uint_eq(b[i], 0); /* pad to 8 */
    ck_assert_uint_eq(rd64(b + 64), 64);                     /* content length */
    ck_assert_uint_eq(rd32(b + 72), gddr__crc32c(0, b, 64)); /* CRC32C */
    ck_assert_int_eq(memcmp(b + 76, "KPTE", 4), 0);
    free(b);
    secs_free(&s, 1);
}
END_TEST

START_TEST(test_keep_and_list)
{
    for (uint64_t q = 1; q <= 6; q++)
        write_simple(q, 100 + q, 3);
    uint64_t v[8] = { 0 };
    size_t n = 99;
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 8, &n), GDDR_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(v[0], 6);
    ck_assert_uint_eq(v[1], 5);
    ck_assert_uint_eq(v[2], 4);
    ck_assert_int_eq(dir_entries(tdir), 3);

    /* max smaller than the count: the newest are stored, count says all. */
    uint64_t v2[2] = { 0, 0 };
    ck_assert_int_eq(gddr__ckpt_list(tdir, v2, 2, &n), GDDR_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(v2[0], 6);
    ck_assert_uint_eq(v2[1], 5);
    ck_assert_int_eq(gddr__ckpt_list(tdir, NULL, 0, &n), GDDR_OK);
    ck_assert_uint_eq(n, 3);

    /* A seq older than the kept ones is written and kept anyway. */
    write_simple(2, 50, 3);
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 8, &n), GDDR_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_uint_eq(v[0], 6);
    ck_assert_uint_eq(v[3], 2);

    /* Newest wins on load; keep <= 0 deletes nothing. */
    write_simple(10, 20, 0);
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 8, &n), GDDR_OK);
    ck_assert_uint_eq(n, 5);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    assert_simple(&c, 10, 20);
    gddr__ckpt_free(&c);

    /* keep = 1 leaves only the one just written. */
    write_simple(11, 20, 1);
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 8, &n), GDDR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(v[0], 11);

    /* Seqs sort numerically, also past 32 bits. */
    write_simple(UINT64_MAX, 8, 0);
    write_simple(1ull << 40, 8, 0);
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 8, &n), GDDR_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(v[0], UINT64_MAX);
    ck_assert_uint_eq(v[1], 1ull << 40);
    ck_assert_uint_eq(v[2], 11);
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    assert_simple(&c, UINT64_MAX, 8);
    gddr__ckpt_free(&c);
}
END_TEST

START_TEST(test_corrupt_newest_skipped)
{
    for (uint64_t q = 1; q <= 3; q++)
        write_simple(q, 100000, 0);
    char p[256];
    fpath(p, sizeof p, 3, "");
    uint64_t len;
    uint8_t *b = slurp(p, &len);
    b[len / 2] ^= 0x01;
    spit(p, b, len);
    free(b);

    log_start();
    gddr_ckpt c;
    char err[256] = "";
    int rc = gddr__ckpt_load_newest(tdir, &c, err, sizeof err);
    log_stop();
    ck_assert_int_eq(rc, GDDR_OK);
    assert_simple(&c, 2, 100000);
    gddr__ckpt_free(&c);
    char want[512];
    snprintf(want, sizeof want, "%d checkpoint %s skipped: CRC mismatch", GDDR_LOG_WARN, p);
    ck_assert_msg(strstr(logbuf, want) != NULL, "log was: %s", logbuf);
    /* Only the one skipped file is mentioned. */
    const char *first = strstr(logbuf, "skipped");
    ck_assert_ptr_null(strstr(first + 1, "skipped"));
    /* The corrupt file is left for the operator to look at. */
    ck_assert(exists(p));
}
END_TEST

START_TEST(test_truncated_newest_skipped)
{
    for (uint64_t q = 1; q <= 4; q++)
        write_simple(q, 100000, 0);
    char p3[256], p4[256];
    fpath(p3, sizeof p3, 3, "");
    fpath(p4, sizeof p4, 4, "");
    ck_assert_int_eq(truncate(p4, (off_t)(fsize(p4) / 2)), 0);
    ck_assert_int_eq(truncate(p3, 20), 0);

    log_start();
    gddr_ckpt c;
    int rc = gddr__ckpt_load_newest(tdir, &c, NULL, 0);
    log_stop();
    ck_assert_int_eq(rc, GDDR_OK);
    assert_simple(&c, 2, 100000);
    gddr__ckpt_free(&c);
    char want[512];
    snprintf(want, sizeof want, "checkpoint %s skipped: bad trailer magic", p4);
    ck_assert_msg(strstr(logbuf, want) != NULL, "log was: %s", logbuf);
    snprintf(want, sizeof want, "checkpoint %s skipped: short file (20 bytes)", p3);
    ck_assert_msg(strstr(logbuf, want) != NULL, "log was: %s", logbuf);
}
END_TEST

/* Each defect alone (CRC fixed up) is caught by its own check. */
START_TEST(test_reader_rejects)
{
    static const struct {
        const char *why;
    } cases[] = {
        { "bad magic" },
        { "unknown format version 2" },
        { "unknown flags 0x1" },
        { "section 0 length 1000000 runs past the end" },
        { "section 0 name length 0 invalid" },
        { "seq 99 in the header does not match the file name" },
        { "content length" },
        { "80 stray bytes after the last section" },
        { "section 1 runs past the end" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        teardown_dir();
        setup_dir();
        write_simple(1, 64, 0);
        write_simple(2, 64, 0);
        char p[256];
        fpath(p, sizeof p, 2, "");
        uint64_t len;
        uint8_t *b = slurp(p, &len);
        /* Layout: header 0..40, record 40..56 ("v": u16, name, pad; u64 at
         * 48), data 56..120, trailer 120..136. */
        ck_assert_uint_eq(len, 136);
        switch (k) {
        case 0: b[0] = 'X'; break;
        case 1: wr32(b + 8, 2); break;
        case 2: wr32(b + 12, 1); break;
        case 3: wr64(b + 48, 1000000); break;
        case 4: b[40] = 0; break;
        case 5: wr64(b + 16, 99); break;
        case 6: wr64(b + len - 16, 64); break;
        case 7: wr32(b + 32, 0); break;
        case 8: wr32(b + 32, 2); break;
        }
        fix_crc(b, len);
        spit(p, b, len);
        free(b);
        log_start();
        gddr_ckpt c;
        int rc = gddr__ckpt_load_newest(tdir, &c, NULL, 0);
        log_stop();
        ck_assert_int_eq(rc, GDDR_OK);
        assert_simple(&c, 1, 64);
        gddr__ckpt_free(&c);
        char want[512];
        snprintf(want, sizeof want, "checkpoint %s skipped: %s", p, cases[k].why);
        ck_assert_msg(strstr(logbuf, want) != NULL, "case %zu: log was: %s", k, logbuf);
    }
}
END_TEST

START_TEST(test_empty_and_missing_dir)
{
    gddr_ckpt c;
    memset(&c, 0x5a, sizeof c);
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), 1);
    ck_assert_uint_eq(c.n, 0);
    ck_assert_ptr_null(c.s);

    char missing[256];
    snprintf(missing, sizeof missing, "%s/does/not/exist", tdir);
    memset(&c, 0x5a, sizeof c);
    char err[256] = "";
    ck_assert_int_eq(gddr__ckpt_load_newest(missing, &c, err, sizeof err), 1);
    ck_assert_uint_eq(c.n, 0);
    size_t n = 7;
    uint64_t v[2];
    ck_assert_int_eq(gddr__ckpt_list(missing, v, 2, &n), GDDR_OK);
    ck_assert_uint_eq(n, 0);

    /* Files that only look like checkpoints are not listed; a dir whose
     * only checkpoint is corrupt has no valid one. */
    const char *junk[] = { "ckpt-1.gddr", "ckpt-0000000000000000000x.gddr", "notes.txt",
                           "ckpt-99999999999999999999.gddr", /* > UINT64_MAX */
                           "ckpt-00000000000000000005.gddr.tmp" };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", tdir, junk[i]);
        FILE *f = fopen(p, "w");
        ck_assert_ptr_nonnull(f);
        fputs("GDDRCKPT garbage garbage garbage garbage garbage garbage garbage", f);
        fclose(f);
    }
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 2, &n), GDDR_OK);
    ck_assert_uint_eq(n, 0);
    char bad[256];
    fpath(bad, sizeof bad, 3, "");
    FILE *f = fopen(bad, "w");
    fputs("nothing", f);
    fclose(f);
    ck_assert_int_eq(gddr__ckpt_list(tdir, v, 2, &n), GDDR_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(v[0], 3);
    log_start();
    int rc = gddr__ckpt_load_newest(tdir, &c, NULL, 0);
    log_stop();
    ck_assert_int_eq(rc, 1);
    ck_assert_uint_eq(c.n, 0);
    ck_assert_ptr_nonnull(strstr(logbuf, "skipped: short file (7 bytes)"));

    /* A temp file newer than the newest checkpoint is ignored by the loader. */
    write_simple(4, 10, 0);
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    assert_simple(&c, 4, 10);
    gddr__ckpt_free(&c);
}
END_TEST

START_TEST(test_large_roundtrip)
{
    const uint64_t big = 64ull << 20;
    gddr_ckpt_section s[3];
    sec_set(&s[0], "tensor/embedding", big, 11);
    sec_set(&s[1], "versions", 12345, 12);
    sec_set(&s[2], "tail", (1u << 20) + 1, 13); /* crosses a block edge */
    gddr_ckpt_stats st;
    char err[256] = "";
    int rc = gddr__ckpt_write(tdir, 1, s, 3, 2, &st, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "%s", err);
    ck_assert(st.bytes > big);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, err, sizeof err), GDDR_OK);
    ck_assert_uint_eq(c.n, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(c.s[i].name, s[i].name);
        ck_assert_uint_eq(c.s[i].len, s[i].len);
        ck_assert_int_eq(memcmp(c.s[i].data, s[i].data, s[i].len), 0);
    }
    gddr__ckpt_free(&c);
    secs_free(s, 3);
}
END_TEST

/* Many small sections: more pieces than one write takes (64 iovecs). */
static void many_sections_roundtrip(void)
{
    enum { N = 3000 };
    gddr_ckpt_section *s = calloc(N, sizeof *s);
    ck_assert_ptr_nonnull(s);
    for (size_t i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "t%zu", i);
        sec_set(&s[i], name, (i * 37) % 2500, i + 100);
    }
    char err[256] = "";
    int rc = gddr__ckpt_write(tdir, 5, s, N, 1, NULL, err, sizeof err);
    ck_assert_msg(rc == GDDR_OK, "%s", err);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, err, sizeof err), GDDR_OK);
    ck_assert_uint_eq(c.n, N);
    for (size_t i = 0; i < N; i++) {
        ck_assert_str_eq(c.s[i].name, s[i].name);
        ck_assert_uint_eq(c.s[i].len, s[i].len);
        if (s[i].len)
            ck_assert_int_eq(memcmp(c.s[i].data, s[i].data, s[i].len), 0);
    }
    ck_assert_ptr_eq(gddr__ckpt_find(&c, "t2999"), &c.s[2999]);
    gddr__ckpt_free(&c);
    secs_free(s, N);
    free(s);
}

START_TEST(test_many_sections)
{
    many_sections_roundtrip();
}
END_TEST

START_TEST(test_pwritev_fallback)
{
    gddr__ckpt_test_flags = GDDR_CKPT_TEST_NO_URING;
    many_sections_roundtrip();
    write_simple(9, 5u << 20, 1);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    assert_simple(&c, 9, 5u << 20);
    gddr__ckpt_free(&c);
    gddr__ckpt_test_flags = 0;
}
END_TEST

START_TEST(test_bad_arguments)
{
    gddr_ckpt_section s[2];
    sec_set(&s[0], "a", 8, 1);
    sec_set(&s[1], "a", 8, 2);
    char err[256] = "";
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, s, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "duplicate section name a"));
    s[1].name[0] = '\0';
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, s, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "section 1: name empty"));
    memset(s[1].name, 'x', sizeof s[1].name); /* no NUL */
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, s, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    snprintf(s[1].name, sizeof s[1].name, "b");
    void *d = s[1].data;
    s[1].data = NULL;
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, s, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "NULL data"));
    s[1].data = d;
    ck_assert_int_eq(gddr__ckpt_write(NULL, 1, s, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, NULL, 2, 0, NULL, err, sizeof err), GDDR_EINVAL);
    ck_assert_int_eq(dir_entries(tdir), 0);
    /* Zero sections is a valid (empty) checkpoint. */
    ck_assert_int_eq(gddr__ckpt_write(tdir, 1, NULL, 0, 0, NULL, err, sizeof err), GDDR_OK);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    ck_assert_uint_eq(c.seq, 1);
    ck_assert_uint_eq(c.n, 0);
    gddr__ckpt_free(&c);
    secs_free(s, 2);
}
END_TEST

START_TEST(test_write_bad_dir)
{
    gddr_ckpt_section s;
    sec_set(&s, "v", 4096, 1);
    char dir[256], err[512] = "";
    snprintf(dir, sizeof dir, "%s/nope/sub", tdir);
    gddr_ckpt_stats st;
    ck_assert_int_eq(gddr__ckpt_write(dir, 3, &s, 1, 2, &st, err, sizeof err), GDDR_EIO);
    char want[512];
    snprintf(want, sizeof want, "open %s/ckpt-00000000000000000003.gddr.tmp: %s", dir,
             strerror(ENOENT));
    ck_assert_str_eq(err, want);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert_int_eq(dir_entries(tdir), 0);

    /* A file where the directory should be. */
    snprintf(dir, sizeof dir, "%s/file", tdir);
    FILE *f = fopen(dir, "w");
    fclose(f);
    ck_assert_int_eq(gddr__ckpt_write(dir, 3, &s, 1, 2, NULL, err, sizeof err), GDDR_EIO);
    ck_assert_ptr_nonnull(strstr(err, strerror(ENOTDIR)));

    /* A directory without write permission (root ignores the mode bits). */
    if (geteuid() != 0) {
        snprintf(dir, sizeof dir, "%s/ro", tdir);
        ck_assert_int_eq(mkdir(dir, 0555), 0);
        ck_assert_int_eq(gddr__ckpt_write(dir, 3, &s, 1, 2, NULL, err, sizeof err), GDDR_EIO);
        ck_assert_ptr_nonnull(strstr(err, strerror(EACCES)));
        ck_assert_int_eq(dir_entries(dir), 0);
        chmod(dir, 0755);
    }
    secs_free(&s, 1);
}
END_TEST

/* A write that fails part way (file size limit) leaves neither the final
 * file nor the temp one, through every path: the up-front reservation, the
 * io_uring writes, the pwritev fallback. */
START_TEST(test_write_fails_midway)
{
    struct rlimit old, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_IGN);
    write_simple(1, 1000, 0); /* an older good one stays loadable */
    lim = old;
    lim.rlim_cur = 2u << 20;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);

    static const struct {
        int flags;
        const char *prefix;
    } paths[] = {
        { 0, "allocate " },
        { GDDR_CKPT_TEST_NO_FALLOCATE, "write " },
        { GDDR_CKPT_TEST_NO_FALLOCATE | GDDR_CKPT_TEST_NO_URING, "write " },
    };
    gddr_ckpt_section s;
    sec_set(&s, "v", 8u << 20, 2);
    for (size_t k = 0; k < 3; k++) {
        gddr__ckpt_test_flags = paths[k].flags;
        char err[512] = "";
        int rc = gddr__ckpt_write(tdir, 2, &s, 1, 1, NULL, err, sizeof err);
        ck_assert_int_eq(rc, GDDR_EIO);
        ck_assert_msg(strncmp(err, paths[k].prefix, strlen(paths[k].prefix)) == 0 &&
                          strstr(err, ".tmp: ") && strstr(err, strerror(EFBIG)),
                      "path %zu: err = %s", k, err);
        char p[256], t[256];
        fpath(p, sizeof p, 2, "");
        fpath(t, sizeof t, 2, ".tmp");
        ck_assert(!exists(p));
        ck_assert(!exists(t));
        ck_assert_int_eq(dir_entries(tdir), 1);
    }
    gddr__ckpt_test_flags = 0;
    setrlimit(RLIMIT_FSIZE, &old);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(tdir, &c, NULL, 0), GDDR_OK);
    assert_simple(&c, 1, 1000);
    gddr__ckpt_free(&c);
    secs_free(&s, 1);
}
END_TEST

/* ---- background writer --------------------------------------------------- */

static gddr_ckpt_section *heap_sections(uint64_t seq, uint64_t len)
{
    gddr_ckpt_section *s = calloc(2, sizeof *s);
    ck_assert_ptr_nonnull(s);
    sec_set(&s[0], "v", len, seq);
    sec_set(&s[1], "meta", 24, seq + 1000);
    return s;
}

/* The writer takes one write at a time: while one is in flight, a second
 * submit is refused and a bounded wait times out; a failed write is
 * reported by the wait; the refused sections stay the caller's. The write
 * in flight is held deterministically: its temp file is a FIFO, whose
 * open(O_WRONLY) blocks until this test opens the read end (a large write
 * racing the calls after it was not: a fast disk could finish first). */
START_TEST(test_writer_one_write_in_flight)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/new", tdir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    char stale[300];
    snprintf(stale, sizeof stale, "%s/ckpt-00000000000000000009.gddr.tmp", dir);
    FILE *f = fopen(stale, "w");
    fclose(f);
    ck_assert_int_eq(rmdir(dir) == 0 ? 0 : errno, ENOTEMPTY);

    gddr_ckpt_writer *w = NULL;
    ck_assert_int_eq(gddr__ckpt_writer_start(dir, 2, &w), GDDR_OK);
    ck_assert_ptr_nonnull(w);
    ck_assert(!exists(stale)); /* stale temp file removed */
    ck_assert_int_eq(gddr__ckpt_writer_busy(w), 0);

    int last_rc = -1;
    uint64_t last_seq = 99;
    gddr_ckpt_stats st;
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 1000, &last_rc, &st, &last_seq), GDDR_OK);
    ck_assert_int_eq(last_rc, GDDR_OK);
    ck_assert_uint_eq(last_seq, 0);
    ck_assert_uint_eq(st.bytes, 0);

    /* Write 1 blocks in open() of its temp file, a FIFO, until we read. */
    char gate[300];
    snprintf(gate, sizeof gate, "%s/ckpt-00000000000000000001.gddr.tmp", dir);
    ck_assert_int_eq(mkfifo(gate, 0600), 0);
    gddr_ckpt_section *s1 = heap_sections(1, 1000);
    ck_assert_int_eq(gddr__ckpt_writer_submit(w, 1, s1, 2), GDDR_OK);
    ck_assert_int_eq(gddr__ckpt_writer_busy(w), 1);
    gddr_ckpt_section *s2 = heap_sections(2, 1000);
    ck_assert_int_eq(gddr__ckpt_writer_submit(w, 2, s2, 2), GDDR_ESTATE);
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 0, &last_rc, &st, &last_seq), GDDR_ETIMEDOUT);
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 50, &last_rc, &st, &last_seq), GDDR_ETIMEDOUT);
    ck_assert_int_eq(gddr__ckpt_writer_busy(w), 1);
    /* A reader that comes and goes lets the open return; the writes then
     * find no reader (EPIPE): write 1 fails, and says so. */
    int rd = open(gate, O_RDONLY | O_NONBLOCK);
    ck_assert_int_ge(rd, 0);
    close(rd);
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 30000, &last_rc, &st, &last_seq), GDDR_OK);
    ck_assert_int_eq(gddr__ckpt_writer_busy(w), 0);
    ck_assert_int_eq(last_rc, GDDR_EIO);
    ck_assert_uint_eq(last_seq, 1);
    ck_assert_uint_eq(st.bytes, 0);
    ck_assert(!exists(gate)); /* a failed write removes its temp file */

    /* The refused sections still belong to us: submit them now. */
    ck_assert_int_eq(gddr__ckpt_writer_submit(w, 2, s2, 2), GDDR_OK);
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 30000, &last_rc, &st, &last_seq), GDDR_OK);
    ck_assert_int_eq(last_rc, GDDR_OK);
    ck_assert_uint_eq(last_seq, 2);
    ck_assert(st.bytes > 1000);
    ck_assert(st.total_ms > 0);

    const uint64_t len = 32u << 20;
    /* Stop finishes the write in flight. */
    gddr_ckpt_section *s3 = heap_sections(3, len);
    ck_assert_int_eq(gddr__ckpt_writer_submit(w, 3, s3, 2), GDDR_OK);
    gddr__ckpt_writer_stop(&w);
    ck_assert_ptr_null(w);
    gddr__ckpt_writer_stop(&w); /* NULL is fine */

    uint64_t v[4];
    size_t n;
    ck_assert_int_eq(gddr__ckpt_list(dir, v, 4, &n), GDDR_OK);
    ck_assert_uint_eq(n, 2);
    ck_assert_uint_eq(v[0], 3);
    ck_assert_uint_eq(v[1], 2);
    gddr_ckpt c;
    ck_assert_int_eq(gddr__ckpt_load_newest(dir, &c, NULL, 0), GDDR_OK);
    ck_assert_uint_eq(c.seq, 3);
    ck_assert_uint_eq(c.n, 2);
    const gddr_ckpt_section *sv = gddr__ckpt_find(&c, "v");
    ck_assert_ptr_nonnull(sv);
    ck_assert_uint_eq(sv->len, len);
    uint8_t *want = malloc(len);
    fill(want, len, 3);
    ck_assert_int_eq(memcmp(sv->data, want, len), 0);
    free(want);
    gddr__ckpt_free(&c);
}
END_TEST

START_TEST(test_writer_failure_and_start)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/d", tdir);
    gddr_ckpt_writer *w = NULL;
    /* start creates a missing directory (one level). */
    ck_assert_int_eq(gddr__ckpt_writer_start(dir, 2, &w), GDDR_OK);
    struct stat sb;
    ck_assert_int_eq(stat(dir, &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    /* The directory vanishes: the write fails and is recorded and logged. */
    ck_assert_int_eq(rmdir(dir), 0);
    log_start();
    ck_assert_int_eq(gddr__ckpt_writer_submit(w, 4, heap_sections(4, 100), 2), GDDR_OK);
    int last_rc = 0;
    uint64_t last_seq = 0;
    ck_assert_int_eq(gddr__ckpt_writer_wait(w, 10000, &last_rc, NULL, &last_seq), GDDR_OK);
    log_stop();
    ck_assert_int_eq(last_rc, GDDR_EIO);
    ck_assert_uint_eq(last_seq, 4);
    ck_assert_msg(strstr(logbuf, "0 checkpoint 4 failed: open ") != NULL, "log: %s", logbuf);
    gddr__ckpt_writer_stop(&w);

    /* A path below a regular file cannot be a checkpoint directory. */
    char file[256], bad[300];
    snprintf(file, sizeof file, "%s/f", tdir);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(bad, sizeof bad, "%s/sub", file);
    log_start();
    ck_assert_int_eq(gddr__ckpt_writer_start(file, 2, &w), GDDR_EIO);
    ck_assert_int_eq(gddr__ckpt_writer_start(bad, 2, &w), GDDR_EIO);
    log_stop();
    ck_assert_ptr_null(w);
    ck_assert_ptr_nonnull(strstr(logbuf, "not a directory"));
    ck_assert_int_eq(gddr__ckpt_writer_start(NULL, 2, &w), GDDR_EINVAL);
    ck_assert_int_eq(gddr__ckpt_writer_submit(NULL, 1, NULL, 0), GDDR_EINVAL);
    ck_assert_int_eq(gddr__ckpt_writer_busy(NULL), 0);
}
END_TEST

Suite *suite_checkpoint(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("checkpoint");
    tcase_add_unchecked_fixture(tc, setup_root, teardown_root);
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_crc32c);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_format_bytes);
    tcase_add_test(tc, test_keep_and_list);
    tcase_add_test(tc, test_corrupt_newest_skipped);
    tcase_add_test(tc, test_truncated_newest_skipped);
    tcase_add_test(tc, test_reader_rejects);
    tcase_add_test(tc, test_empty_and_missing_dir);
    tcase_add_test(tc, test_large_roundtrip);
    tcase_add_test(tc, test_many_sections);
    tcase_add_test(tc, test_pwritev_fallback);
    tcase_add_test(tc, test_bad_arguments);
    tcase_add_test(tc, test_write_bad_dir);
    tcase_add_test(tc, test_write_fails_midway);
    tcase_add_test(tc, test_writer_one_write_in_flight);
    tcase_add_test(tc, test_writer_failure_and_start);
    suite_add_tcase(s, tc);
    return s;
}
