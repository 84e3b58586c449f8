/* libFuzzer target: the WELCOME and MEMBERS decoders. A decoded message re-encodes to the same
 * bytes; member lists come out sorted, unique and below next_id; WELCOME's borrowed blobs lie
 * inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "net/wire.h"

static void check_members(const hs__members *m) {
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->m[i].id >= m->next_id)
            __builtin_trap();
        if (i && m->m[i].id <= m->m[i - 1].id)
            __builtin_trap();
        if (strlen(m->m[i].addr) > HS__ADDR_MAX)
            __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hs__members m;
    if (hs__wire_members_decode(data, size, &m) == 0) {
        check_members(&m);
        hs_buf *b;
        if (hs_buf_new(&b, size) == 0) {
            if (hs__wire_members_encode(b, &m) != 0 || b->len != size ||
                memcmp(b->data, data, size))
                __builtin_trap();
            hs_buf_unref(b);
        }
        hs__members_clear(&m);
    }
    hs__welcome w;
    if (hs__wire_welcome_decode(data, size, &w) == 0) {
        check_members(&w.members);
        if (w.config_len && (w.config < data || w.config + w.config_len > data + size))
            __builtin_trap();
        if (w.snap_len && (w.snap < data || w.snap + w.snap_len > data + size))
            __builtin_trap();
        hs_buf *b;
        if (hs_buf_new(&b, size) == 0) {
            if (hs__wire_welcome_encode(b, &w) != 0 || b->len != size ||
                memcmp(b->data, data, size))
                __builtin_trap();
            hs_buf_unref(b);
        }
        hs__members_clear(&w.members);
    }
    return 0;
}
