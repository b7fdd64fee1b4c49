/* The WASI program the sbx-wasm tests run (compiled with clang
 * --target=wasm32-wasi). One mode per argv[1]; failures print the errno
 * text and exit 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>

static int fail(const char *what, const char *path) {
    printf("%s %s: %s\n", what, path, strerror(errno));
    return 1;
}

static volatile unsigned long sink;
static char *volatile keep;

/* Unbounded recursion on the engine's (native) stack: no local lives in
 * linear memory, and the store after the call keeps it a real call. */
__attribute__((noinline)) static unsigned long deep(unsigned long n) {
    unsigned long r = deep(n + 1);
    sink = r;
    return r ^ n;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "hello";
    if (!strcmp(mode, "hello")) {
        printf("hello from wasm\n");
        return 0;
    }
    if (!strcmp(mode, "args")) {
        for (int i = 0; i < argc; i++) printf("%s\n", argv[i]);
        return 0;
    }
    if (!strcmp(mode, "exit")) return atoi(argv[2]);
    if (!strcmp(mode, "env")) {
        for (int i = 2; i < argc; i++) {
            const char *v = getenv(argv[i]);
            printf("%s=%s\n", argv[i], v ? v : "(unset)");
        }
        return 0;
    }
    if (!strcmp(mode, "read")) {
        FILE *f = fopen(argv[2], "r");
        if (!f) return fail("open", argv[2]);
        char buf[4096];
        size_t n = fread(buf, 1, sizeof buf, f);
        fwrite(buf, 1, n, stdout);
        fclose(f);
        return 0;
    }
    if (!strcmp(mode, "write")) {
        FILE *f = fopen(argv[2], "w");
        if (!f) return fail("open", argv[2]);
        if (fputs(argv[3], f) < 0 || fclose(f) != 0) return fail("write", argv[2]);
        printf("wrote %s\n", argv[2]);
        return 0;
    }
    if (!strcmp(mode, "mkdir")) {
        if (mkdir(argv[2], 0755) != 0) return fail("mkdir", argv[2]);
        printf("made %s\n", argv[2]);
        return 0;
    }
    if (!strcmp(mode, "unlink")) {
        if (unlink(argv[2]) != 0) return fail("unlink", argv[2]);
        printf("removed %s\n", argv[2]);
        return 0;
    }
    if (!strcmp(mode, "rename")) {
        if (rename(argv[2], argv[3]) != 0) return fail("rename", argv[2]);
        printf("renamed %s\n", argv[2]);
        return 0;
    }
    if (!strcmp(mode, "symlink")) {
        if (symlink(argv[2], argv[3]) != 0) return fail("symlink", argv[3]);
        printf("linked %s\n", argv[3]);
        return 0;
    }
    if (!strcmp(mode, "loop")) {
        for (;;) sink++;
    }
    if (!strcmp(mode, "bomb")) {
        unsigned long mb = 0;
        for (;;) {
            char *p = malloc(1 << 20);
            if (!p) {
                printf("malloc failed after %lu MiB\n", mb);
                return 2;
            }
            memset(p, 1, 1 << 20);
            keep = p; /* used: the allocation cannot be optimised away */
            mb++;
        }
    }
    if (!strcmp(mode, "recurse")) {
        sink = deep(0);
        return 0;
    }
    if (!strcmp(mode, "trap")) __builtin_trap();
    printf("unknown mode %s\n", mode);
    return 64;
}
