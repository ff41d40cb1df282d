/* crc32c.c -- CRC32C (Castagnoli), the checksum of GDDR checkpoints.
 *
 * Debian 12 packages no CRC32C library for C, so this is the standard
 * algorithm: the SSE4.2 crc32 instruction where the CPU has it, else a
 * slicing-by-8 table. crc32c("123456789") = 0xE3069283.
 */
#include "crc32c.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define GDDR_CRC_X86 1
#endif

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_have_hw;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
#ifdef GDDR_CRC_X86
    __builtin_cpu_init();
    crc_have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw_raw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
            crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^ crc_tab[3][p[4]] ^
            crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^ crc_tab[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
    return c;
}

#ifdef GDDR_CRC_X86
__attribute__((target("sse4.2"))) static uint32_t crc_hw_raw(uint32_t c, const uint8_t *p,
                                                             size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
#if defined(__x86_64__)
    uint64_t c64 = c;
    while (n >= 32) {
        uint64_t a, b, d, e;
        memcpy(&a, p, 8);
        memcpy(&b, p + 8, 8);
        memcpy(&d, p + 16, 8);
        memcpy(&e, p + 24, 8);
        c64 = _mm_crc32_u64(c64, a);
        c64 = _mm_crc32_u64(c64, b);
        c64 = _mm_crc32_u64(c64, d);
        c64 = _mm_crc32_u64(c64, e);
        p += 32;
        n -= 32;
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c64 = _mm_crc32_u64(c64, a);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
#endif
    while (n >= 4) {
        uint32_t a;
        memcpy(&a, p, 4);
        c = _mm_crc32_u32(c, a);
        p += 4;
        n -= 4;
    }
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

uint32_t gddr__crc32c_sw(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_sw_raw(~crc, (const uint8_t *)p, n);
}

uint32_t gddr__crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
#ifdef GDDR_CRC_X86
    if (crc_have_hw)
        return ~crc_hw_raw(~crc, (const uint8_t *)p, n);
#endif
    return ~crc_sw_raw(~crc, (const uint8_t *)p, n);
}

