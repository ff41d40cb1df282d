/* keys.h -- CURVE key files shared by gddr-ps, libgddr-client and
 * gddr-keygen.
 *
 * A key file (NAME.key, written by gddr-keygen, mode 0600) holds
 *     public = <40 Z85 characters>
 *     secret = <40 Z85 characters>
 * and a public file (NAME.pub) just the public line. An authorized_keys
 * file lists one Z85 public key per line, optionally followed by a name;
 * '#' starts a comment.
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

/* Loads an authorized_keys file into a malloc'd array of 32-byte binary
 * keys. Returns the count, or -1 with err ("path:line: ..."). */
int gddr__authorized_keys_read(const char *path, unsigned char (**keys)[32], char *err,
                               size_t errlen);

#endif
