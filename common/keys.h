/* keys.h -- CURVE key files shared by gddr-ps, libgddr-client and
 * gddr-keygen.
 *
 * A key file (NAME.key, written by gddr-keygen, mode 0600) holds
 *     public = <40 Z85 characters>
 *     secret = <40 Z85 characters>
 * and a public file (NAME.pub) just the public line. An authorized_keys
 * file lists one Z85 public key per line, optionally followed by a name;
 * '#' starts a comment. Options may come first, as in ssh's
 * authorized_keys, separated by commas:
 *     ranks=0-3 <key> trainer-a      this key may only be worker 0..3
 *     ranks=7 <key>                  only worker 7
 *     observer <key> dashboard       stats, metrics and pulls only
 */
#ifndef GDDR_COMMON_KEYS_H
#define GDDR_COMMON_KEYS_H

#include <stddef.h>

#define GDDR_Z85_KEY 41 /* 40 characters and a NUL */

/* Reads a key file. secret may be NULL (a .pub file). A secret key file
 * readable by group or others is refused, as ssh does. Returns 0 or -1
 * with "path: what is wrong" in err. */
int gddr__keyfile_read(const char *path, char pub[GDDR_Z85_KEY], char sec[GDDR_Z85_KEY],
                       char *err, size_t errlen);

/* Writes NAME.key (0600) and NAME.pub for a fresh key pair. */
int gddr__keyfile_generate(const char *name, char pub[GDDR_Z85_KEY], char *err, size_t errlen);

/* One authorized_keys line. */
typedef struct gddr__authkey {
    unsigned char key[32];
    char z85[GDDR_Z85_KEY];
    int observer_only;      /* stats, metrics and pulls only */
    int rank_lo, rank_hi;   /* worker ranks it may claim, inclusive; -1, -1: any */
} gddr__authkey;

/* Loads an authorized_keys file into a malloc'd array. Returns the count,
 * or -1 with err ("path:line: ..."). */
int gddr__authorized_keys_read(const char *path, gddr__authkey **keys, char *err, size_t errlen);

#endif
