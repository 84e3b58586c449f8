/* libFuzzer target: the decoders of the handshake and small control messages (HELLO and
 * HELLO_ACK, REFUSE/BYE/SUSPECT, JOIN family, HEARTBEAT). What decodes must encode back to the
 * same bytes (the layouts have no slack), and decode again to the same struct. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "net/wire.h"

#define CHECK_ROUNDTRIP(T, enc, dec)                                                               \
    do {                                                                                           \
        T a, b;                                                                                    \
        if (dec(data, size, &a) == 0) {                                                            \
            hs_buf *buf;                                                                           \
            if (hs_buf_new(&buf, size) < 0)                                                        \
                return 0;                                                                          \
            if (enc(buf, &a) != 0 || buf->len != size || memcmp(buf->data, data, size))            \
                __builtin_trap();                                                                  \
            if (dec(buf->data, buf->len, &b) != 0 || memcmp(&a, &b, sizeof(a)))                    \
                __builtin_trap();                                                                  \
            hs_buf_unref(buf);                                                                     \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    CHECK_ROUNDTRIP(hs__hello, hs__wire_hello_encode, hs__wire_hello_decode);
    CHECK_ROUNDTRIP(hs__reason, hs__wire_reason_encode, hs__wire_reason_decode);
    CHECK_ROUNDTRIP(hs__join, hs__wire_join_encode, hs__wire_join_decode);
    CHECK_ROUNDTRIP(hs__heartbeat, hs__wire_heartbeat_encode, hs__wire_heartbeat_decode);
    return 0;
}
