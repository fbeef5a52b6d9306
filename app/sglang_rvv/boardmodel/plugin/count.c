/*
 * count.c: a qemu-user TCG plugin (plugin API version 1, qemu 7.2) that counts, for a whole
 * riscv64 guest process, what every translation block executed: instructions, vector
 * instructions, vector instructions weighted by their register group (LMUL), vector loads and the
 * bytes they read. It writes one table per mark; sglang_rvv.boardmodel.counting attributes the
 * blocks to shared objects with the guest's own /proc/self/maps and subtracts marks.
 *
 * A mark is a write(2) to the file descriptor MARK_FD, which no real program has open (it fails
 * with EBADF in the guest); its length is the mark's number. The guest calls
 * os.write(MARK_FD, b"x" * n) between decode steps, so the difference of two marks is one step.
 *
 * Debian ships no qemu-plugin.h, so the few declarations used are written out below, as the
 * plugin API version 1 documents them (include/qemu/qemu-plugin.h of qemu 7.2).
 *
 * Arguments: out=PATH (the table, required); threads=1 also counts the instructions of each guest
 * thread (each is a vCPU of its own in qemu-user; vCPU 0 is the main thread) and writes them as
 * "thread VCPU INSNS" rows at the end of each table. It costs a callback per executed block, so it
 * is off unless asked for (SGLang's serving count asks: its polling threads count beside the forward).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the plugin API, version 1 ---- */
#define QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))
typedef uint64_t qemu_plugin_id_t;
typedef uint32_t qemu_plugin_meminfo_t;
typedef struct {
    const char *target_name;
    struct { int min; int cur; } version;
    bool system_emulation;
    union { struct { int smp_vcpus; int max_vcpus; } system; };
} qemu_info_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
enum qemu_plugin_mem_rw { QEMU_PLUGIN_MEM_R = 1, QEMU_PLUGIN_MEM_W, QEMU_PLUGIN_MEM_RW };
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t, struct qemu_plugin_tb *);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int, void *);
typedef void (*qemu_plugin_vcpu_mem_cb_t)(unsigned int, qemu_plugin_meminfo_t, uint64_t, void *);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t, void *);
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t, unsigned int, int64_t, uint64_t,
                                              uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                                              uint64_t, uint64_t);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, qemu_plugin_vcpu_tb_trans_cb_t);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op,
                                              void *, uint64_t);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *, qemu_plugin_vcpu_udata_cb_t,
                                          enum qemu_plugin_cb_flags, void *);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *, qemu_plugin_vcpu_udata_cb_t,
                                            enum qemu_plugin_cb_flags, void *);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *, qemu_plugin_vcpu_mem_cb_t,
                                      enum qemu_plugin_cb_flags, enum qemu_plugin_mem_rw, void *);
void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t, qemu_plugin_vcpu_syscall_cb_t);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, qemu_plugin_udata_cb_t, void *);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
const void *qemu_plugin_insn_data(const struct qemu_plugin_insn *);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *);
unsigned int qemu_plugin_mem_size_shift(qemu_plugin_meminfo_t);
void qemu_plugin_outs(const char *);

QEMU_PLUGIN_EXPORT int qemu_plugin_version = 1;

/* ---- the counts ---- */
#define MARK_FD 0x434f554eu      /* "COUN": a descriptor no guest has open */
#define RISCV_SYS_WRITE 64
#define FORMAT "count-table 1"  /* counting.py refuses any other table format */

/* One record per translated block (start address and length: a block translated again with the
 * same extent shares its record). The static fields are decoded once at translation. */
typedef struct {
    uint64_t vaddr;
    uint32_t n_insns, n_vec, n_vload;
    uint64_t execs;            /* inline add: every execution of the block */
    uint64_t vec_lmul8;        /* vector instructions x LMUL x 8 (LMUL may be 1/8) */
    uint64_t vec_unknown;      /* vector instructions executed under a vtype set by vsetvl */
    uint64_t vload_bytes;      /* bytes read by the block's vector loads, element by element */
} Block;

static Block **table;          /* open addressing on (vaddr, n_insns) */
static size_t table_size, table_used;
static FILE *out;
#define MAX_VCPUS 4096         /* guest threads alive at once; a later one reuses a freed index */
static bool by_thread;
static uint64_t thread_insns[MAX_VCPUS];
static unsigned int max_vcpu_seen;
static uint64_t cur_lmul8 = 8; /* the vtype's LMUL x 8 as last set by vsetvli/vsetivli; 0: unknown */

static size_t slot_of(uint64_t vaddr, uint32_t n) {
    uint64_t h = (vaddr ^ ((uint64_t)n << 48)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (table_size - 1);
}

static void grow(void) {
    Block **old = table;
    size_t old_size = table_size;
    table_size = table_size ? table_size * 2 : 1u << 16;
    table = calloc(table_size, sizeof *table);
    if (!table) { qemu_plugin_outs("count: out of memory\n"); abort(); }
    for (size_t i = 0; i < old_size; i++) {
        if (!old[i]) continue;
        size_t s = slot_of(old[i]->vaddr, old[i]->n_insns);
        while (table[s]) s = (s + 1) & (table_size - 1);
        table[s] = old[i];
    }
    free(old);
}

static Block *block_for(uint64_t vaddr, uint32_t n, bool *fresh) {
    if (2 * (table_used + 1) > table_size) grow();
    size_t s = slot_of(vaddr, n);
    while (table[s]) {
        if (table[s]->vaddr == vaddr && table[s]->n_insns == n) { *fresh = false; return table[s]; }
        s = (s + 1) & (table_size - 1);
    }
    Block *b = calloc(1, sizeof *b);
    if (!b) { qemu_plugin_outs("count: out of memory\n"); abort(); }
    b->vaddr = vaddr;
    b->n_insns = n;
    table[s] = b;
    table_used++;
    *fresh = true;
    return b;
}

/* ---- RVV 1.0 decoding (32-bit encodings only: no compressed instruction is a vector one) ---- */
enum kind { K_OTHER, K_VSET, K_VLOAD, K_VEC };

static enum kind decode(uint32_t insn, uint64_t *lmul8) {
    uint32_t opcode = insn & 0x7f, funct3 = (insn >> 12) & 7;
    if (opcode == 0x57) {                              /* OP-V */
        if (funct3 != 7) return K_VEC;
        uint32_t vtype;
        if ((insn >> 31) == 0) vtype = (insn >> 20) & 0x7ff;            /* vsetvli */
        else if ((insn >> 30) == 3) vtype = (insn >> 20) & 0x3ff;       /* vsetivli */
        else { *lmul8 = 0; return K_VSET; }                             /* vsetvl: a register */
        static const uint64_t by_vlmul[8] = {8, 16, 32, 64, 0, 1, 2, 4}; /* vlmul 4 is reserved */
        *lmul8 = by_vlmul[vtype & 7];
        return K_VSET;
    }
    /* LOAD-FP / STORE-FP with a vector width (0, 5, 6, 7; 1-4 are the scalar FP widths) */
    bool vwidth = funct3 == 0 || funct3 >= 5;
    if (opcode == 0x07 && vwidth) return K_VLOAD;
    if (opcode == 0x27 && vwidth) return K_VEC;
    return K_OTHER;
}

/* ---- callbacks ---- */
static void on_vset(unsigned int vcpu, void *lmul8) {
    (void)vcpu;
    cur_lmul8 = (uint64_t)(uintptr_t)lmul8;
}

/* Runs at block entry: every vector instruction in a block runs under the vtype it was entered
 * with, because qemu 7.2 ends a block at each vsetvl* (the new vtype starts the next block). */
static void on_vec_block(unsigned int vcpu, void *udata) {
    (void)vcpu;
    Block *b = udata;
    if (cur_lmul8) b->vec_lmul8 += (uint64_t)b->n_vec * cur_lmul8;
    else b->vec_unknown += b->n_vec;
}

/* threads=1: each vCPU adds its block's length to its own counter, so no two threads share one. */
static void on_thread_block(unsigned int vcpu, void *n_insns) {
    if (vcpu >= MAX_VCPUS) return;
    thread_insns[vcpu] += (uint64_t)(uintptr_t)n_insns;
    if (vcpu > max_vcpu_seen) max_vcpu_seen = vcpu;
}

static void on_vload_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *udata) {
    (void)vcpu; (void)vaddr;
    ((Block *)udata)->vload_bytes += 1u << qemu_plugin_mem_size_shift(info);
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    bool fresh;
    Block *b = block_for(qemu_plugin_tb_vaddr(tb), (uint32_t)n, &fresh);
    uint32_t n_vec = 0, n_vload = 0;
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        if (qemu_plugin_insn_size(insn) != 4) continue;
        uint32_t word;
        memcpy(&word, qemu_plugin_insn_data(insn), 4);
        uint64_t lmul8 = 0;
        switch (decode(word, &lmul8)) {
        case K_VSET:
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_vset, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)lmul8);
            break;
        case K_VLOAD:
            qemu_plugin_register_vcpu_mem_cb(insn, on_vload_mem, QEMU_PLUGIN_CB_NO_REGS,
                                             QEMU_PLUGIN_MEM_R, b);
            n_vec++;
            n_vload++;
            break;
        case K_VEC:
            n_vec++;
            break;
        case K_OTHER:
            break;
        }
    }
    if (fresh) { b->n_vec = n_vec; b->n_vload = n_vload; }
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->execs, 1);
    if (n_vec) qemu_plugin_register_vcpu_tb_exec_cb(tb, on_vec_block, QEMU_PLUGIN_CB_NO_REGS, b);
    if (by_thread)
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_thread_block, QEMU_PLUGIN_CB_NO_REGS, (void *)(uintptr_t)n);
}

/* One table: "mark N" then a row per executed block (cumulative since the start). */
static void write_table(const char *mark) {
    fprintf(out, "mark %s\n", mark);
    for (size_t i = 0; i < table_size; i++) {
        Block *b = table[i];
        if (!b || !b->execs) continue;
        fprintf(out, "%" PRIx64 " %u %u %u %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                b->vaddr, b->n_insns, b->n_vec, b->n_vload, b->execs, b->vec_lmul8,
                b->vec_unknown, b->vload_bytes);
    }
    for (unsigned int v = 0; by_thread && v <= max_vcpu_seen; v++)
        if (thread_insns[v]) fprintf(out, "thread %u %" PRIu64 "\n", v, thread_insns[v]);
    fprintf(out, "end\n");
    fflush(out);
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1,
                       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
                       uint64_t a7, uint64_t a8) {
    (void)id; (void)vcpu; (void)a2; (void)a4; (void)a5; (void)a6; (void)a7; (void)a8;
    if (num != RISCV_SYS_WRITE || (uint32_t)a1 != MARK_FD) return;
    char mark[24];
    snprintf(mark, sizeof mark, "%" PRIu64, a3);
    write_table(mark);
}

static void on_exit_cb(qemu_plugin_id_t id, void *udata) {
    (void)id; (void)udata;
    write_table("exit");
    fclose(out);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv) {
    const char *path = NULL;
    for (int i = 0; i < argc; i++)
        if (strncmp(argv[i], "out=", 4) == 0) path = argv[i] + 4;
        else if (strcmp(argv[i], "threads=1") == 0) by_thread = true;
    if (info->version.cur < 1 || info->version.min > 1) {
        qemu_plugin_outs("count: this qemu does not offer plugin API version 1; rebuild the plugin "
                         "against the qemu-user version images/lock.toml [tools.count] pins\n");
        return -1;
    }
    if (strcmp(info->target_name, "riscv64") != 0 || info->system_emulation) {
        qemu_plugin_outs("count: this plugin counts riscv64 user-mode guests only\n");
        return -1;
    }
    if (!path) { qemu_plugin_outs("count: missing argument out=PATH\n"); return -1; }
    out = fopen(path, "w");
    if (!out) { qemu_plugin_outs("count: cannot write the out= file\n"); return -1; }
    fprintf(out, "%s\n", FORMAT);
    fflush(out);
    grow();
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    return 0;
}
