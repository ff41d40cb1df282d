/* crc32c.h -- CRC32C (Castagnoli) for checkpoint files (crc32c.c). */
#ifndef GDDR_COMMON_CRC32C_H
#define GDDR_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Running CRC32C: start with crc = 0, feed pieces in order.
 * crc32c("123456789") = 0xE3069283. Hardware (SSE4.2) where available. */
uint32_t gddr__crc32c(uint32_t crc, const void *p, size_t n);
/* The table-driven version alone (tests compare the two). */
uint32_t gddr__crc32c_sw(uint32_t crc, const void *p, size_t n);

#endif
