/* A WASI preview-2 command that makes one outgoing HTTP request through
 * wasi:http, for sbx-wasm's tests: `http_get SCHEME AUTHORITY PATH`.
 *
 * Built without libc (clang --target=wasm32 -nostdlib), calling the WASI
 * interfaces through their canonical-ABI imports; the test wraps the core
 * module into a component with the wit-component crate (tests/data/wit:
 * the WIT files of wasmtime-wasi-http 48).
 *
 * Prints "status N" and then the body, and returns ok; or prints
 * "error N" (N: the wasi:http error-code case; 15 is HTTP-request-denied)
 * and returns err (exit status 1). */

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

#define V "@0.2.12"
#define IMPORT(mod, name) __attribute__((import_module(mod V), import_name(name)))

IMPORT("wasi:cli/environment", "get-arguments") void get_arguments(u32 *ret);
IMPORT("wasi:cli/stdout", "get-stdout") u32 get_stdout(void);
IMPORT("wasi:io/streams", "[method]output-stream.blocking-write-and-flush")
void blocking_write_and_flush(u32 self, const u8 *p, u32 len, u32 *ret);
IMPORT("wasi:io/streams", "[method]input-stream.blocking-read")
void blocking_read(u32 self, u64 len, u32 *ret);
IMPORT("wasi:io/poll", "[method]pollable.block") void pollable_block(u32 self);
IMPORT("wasi:http/types", "[constructor]fields") u32 fields_new(void);
IMPORT("wasi:http/types", "[constructor]outgoing-request") u32 outgoing_request_new(u32 headers);
IMPORT("wasi:http/types", "[method]outgoing-request.set-scheme")
u32 set_scheme(u32 self, u32 is_some, u32 tag, const char *p, u32 len);
IMPORT("wasi:http/types", "[method]outgoing-request.set-authority")
u32 set_authority(u32 self, u32 is_some, const char *p, u32 len);
IMPORT("wasi:http/types", "[method]outgoing-request.set-path-with-query")
u32 set_path(u32 self, u32 is_some, const char *p, u32 len);
IMPORT("wasi:http/outgoing-handler", "handle")
void handle(u32 request, u32 has_options, u32 options, u64 *ret);
IMPORT("wasi:http/types", "[method]future-incoming-response.subscribe") u32 fut_subscribe(u32 self);
IMPORT("wasi:http/types", "[method]future-incoming-response.get") void fut_get(u32 self, u64 *ret);
IMPORT("wasi:http/types", "[method]incoming-response.status") u32 resp_status(u32 self);
IMPORT("wasi:http/types", "[method]incoming-response.consume") void resp_consume(u32 self, u32 *ret);
IMPORT("wasi:http/types", "[method]incoming-body.stream") void body_stream(u32 self, u32 *ret);

/* cabi_realloc: a bump allocator over a static arena (one short run). */
static u8 heap[1 << 20];
static u32 top;

__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, u32 old_size, u32 align, u32 size) {
    (void)old_size;
    if (old)
        __builtin_trap();
    top = (top + align - 1) & ~(align - 1);
    if (top + size > sizeof heap)
        __builtin_trap();
    void *p = heap + top;
    top += size;
    return p;
}

static u32 out;

static u32 len(const char *s) {
    u32 n = 0;
    while (s[n])
        n++;
    return n;
}

static void write_bytes(const u8 *p, u32 n) {
    u32 ret[3];
    while (n) {
        u32 k = n > 4096 ? 4096 : n;
        blocking_write_and_flush(out, p, k, ret);
        p += k;
        n -= k;
    }
}

static void write_str(const char *s) { write_bytes((const u8 *)s, len(s)); }

static void write_num(u32 v) {
    char b[12];
    int i = 11;
    b[i] = 0;
    do {
        b[--i] = '0' + v % 10;
        v /= 10;
    } while (v);
    write_str(b + i);
}

static int fail(const char *what, u32 code) {
    write_str("error ");
    write_num(code);
    write_str(" (");
    write_str(what);
    write_str(")\n");
    return 1;
}

/* Strings of the argument list, NUL-terminated copies. */
static char *arg(u32 *list, u32 i) {
    u32 p = list[2 * i], n = list[2 * i + 1];
    char *s = cabi_realloc(0, 0, 1, n + 1);
    for (u32 k = 0; k < n; k++)
        s[k] = ((char *)p)[k];
    s[n] = 0;
    return s;
}

__attribute__((export_name("wasi:cli/run" V "#run")))
u32 run(void) {
    out = get_stdout();
    u32 args[2];
    get_arguments(args);
    if (args[1] < 4) {
        write_str("usage: http_get SCHEME AUTHORITY PATH\n");
        return 1;
    }
    u32 *list = (u32 *)args[0];
    char *scheme = arg(list, 1), *authority = arg(list, 2), *path = arg(list, 3);

    u32 req = outgoing_request_new(fields_new());
    /* scheme: variant { HTTP, HTTPS, other(string) } */
    u32 tag = 2;
    if (scheme[0] == 'h' && len(scheme) == 4)
        tag = 0;
    else if (scheme[0] == 'h' && len(scheme) == 5 && scheme[4] == 's')
        tag = 1;
    if (set_scheme(req, 1, tag, scheme, len(scheme)) != 0)
        return fail("set-scheme", 0);
    if (set_authority(req, 1, authority, len(authority)) != 0)
        return fail("set-authority", 0);
    if (set_path(req, 1, path, len(path)) != 0)
        return fail("set-path-with-query", 0);

    /* result<future-incoming-response, error-code>: tag @0, payload @8 */
    u64 r[4] = {0};
    handle(req, 0, 0, r);
    u8 *rb = (u8 *)r;
    if (rb[0] != 0)
        return fail("handle", rb[8]);
    u32 fut = *(u32 *)(rb + 8);

    pollable_block(fut_subscribe(fut));
    /* option<result<result<incoming-response, error-code>>>:
     * option tag @0, outer result tag @8, inner result tag @16, payload @24 */
    u64 g[6] = {0};
    fut_get(fut, g);
    u8 *gb = (u8 *)g;
    if (gb[0] != 1)
        return fail("response not ready", 0);
    if (gb[8] != 0)
        return fail("response taken", 0);
    if (gb[16] != 0)
        return fail("response", gb[24]);
    u32 resp = *(u32 *)(gb + 24);

    write_str("status ");
    write_num(resp_status(resp));
    write_str("\n");

    u32 c[2];
    resp_consume(resp, c);
    if (c[0] != 0)
        return fail("consume", 0);
    u32 s[2];
    body_stream(c[1], s);
    if (s[0] != 0)
        return fail("stream", 0);
    for (;;) {
        /* result<list<u8>, stream-error>: tag @0, list (ptr, len) @4 */
        u32 rd[3];
        blocking_read(s[1], 65536, rd);
        if (rd[0] != 0)
            break; /* closed (or failed): the end of the body */
        write_bytes((const u8 *)rd[1], rd[2]);
        top = 0; /* the bump arena is free again: nothing kept */
    }
    return 0;
}
