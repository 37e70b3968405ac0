/*
 * libmrcache_pmpi: datatypes.
 *
 * A buffer (base, count, datatype) flattened into contiguous blocks.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

/* ------------------------------------------------------------------------ */
/* Datatype flattening                                                        */
/*
 * A buffer (base, count, datatype) becomes a list of contiguous blocks by
 * walking the datatype's constructor tree (MPI_Type_get_envelope /
 * get_contents), so that MPI_BOTTOM plus absolute displacements (HPL) gives the
 * real blocks instead of one range from address 0. Limits, all documented in
 * traces/README.md: at most MAX_BLOCKS blocks per buffer (adjacent blocks are
 * merged; past the cap a new block widens the last one to cover it); at most
 * WALK_BUDGET constructor visits per buffer and MAX_DEPTH levels, past which the
 * rest of the buffer is covered by its bounding range; darray and types whose
 * contents exceed the static arrays are covered by their bounding range.
 */
#define MAX_BLOCKS 256
#define WALK_BUDGET 65536
#define MAX_DEPTH 8
#define CAP_I 2048
#define CAP_A 1024
#define CAP_D 512

typedef struct { uintptr_t addr; size_t len; } blk_t;
static blk_t g_blk[MAX_BLOCKS];
static int g_nblk;
static long g_budget;
static int g_capped;
static int s_ints[MAX_DEPTH][CAP_I];
static MPI_Aint s_aints[MAX_DEPTH][CAP_A];
static MPI_Datatype s_types[MAX_DEPTH][CAP_D];

static void emit(intptr_t addr, intptr_t len) {
    if (len <= 0) return;
    uintptr_t a = (uintptr_t)addr, e = (uintptr_t)addr + (uintptr_t)len;
    if (e < a) return;
    if (g_nblk) {
        blk_t *l = &g_blk[g_nblk - 1];
        if (a >= l->addr && a <= l->addr + l->len) {
            if (e > l->addr + l->len) l->len = e - l->addr;
            return;
        }
    }
    if (g_nblk == MAX_BLOCKS) {
        blk_t *l = &g_blk[g_nblk - 1];
        uintptr_t lo = a < l->addr ? a : l->addr, hi = e > l->addr + l->len ? e : l->addr + l->len;
        l->addr = lo;
        l->len = hi - lo;
        g_capped = 1;
        return;
    }
    g_blk[g_nblk].addr = a;
    g_blk[g_nblk].len = (size_t)len;
    g_nblk++;
}

static int is_named(MPI_Datatype dt) {
    int ni, na, nd, comb;
    if (PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) != MPI_SUCCESS) return 1;
    return comb == MPI_COMBINER_NAMED;
}

static void walk(intptr_t base, MPI_Datatype dt, MPI_Aint count, int depth) {
    MPI_Count size;
    MPI_Aint lb, ext, tlb, text;
    if (count <= 0 || dt == MPI_DATATYPE_NULL) return;
    if (PMPI_Type_size_x(dt, &size) != MPI_SUCCESS || size <= 0) return;
    if (PMPI_Type_get_extent(dt, &lb, &ext) != MPI_SUCCESS) return;
    if (PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS) return;
    g_budget--;
    if (size == text && ext == text) { emit(base + tlb, (intptr_t)(count * text)); return; }
    if (count == 1 && size == text) { emit(base + tlb, text); return; }
    /* The bounding range of all `count` elements. */
    intptr_t blo = base + tlb + (ext < 0 ? (count - 1) * ext : 0);
    intptr_t bhi = base + tlb + text + (ext > 0 ? (count - 1) * ext : 0);
    int ni, na, nd, comb;
    if (depth >= MAX_DEPTH || g_budget <= 0 || PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) != MPI_SUCCESS ||
        comb == MPI_COMBINER_NAMED || comb == MPI_COMBINER_DARRAY || ni > CAP_I || na > CAP_A || nd > CAP_D) {
        if (depth >= MAX_DEPTH || g_budget <= 0 || ni > CAP_I || na > CAP_A || nd > CAP_D) g_capped = 1;
        emit(blo, bhi - blo);
        return;
    }
    int *I = s_ints[depth];
    MPI_Aint *A = s_aints[depth];
    MPI_Datatype *D = s_types[depth];
    if (PMPI_Type_get_contents(dt, ni, na, nd, I, A, D) != MPI_SUCCESS) { emit(blo, bhi - blo); return; }
    MPI_Aint oe = 0, olb = 0;
    if (nd > 0) PMPI_Type_get_extent(D[0], &olb, &oe);
    for (MPI_Aint i = 0; i < count; i++) {
        intptr_t e = base + i * ext;
        if (g_budget <= 0) {
            /* Out of budget: the rest of the buffer is one bounding range. */
            g_capped = 1;
            intptr_t lo = e + tlb;
            emit(lo < blo ? blo : lo, bhi - (lo < blo ? blo : lo));
            break;
        }
        switch (comb) {
        case MPI_COMBINER_DUP:
        case MPI_COMBINER_RESIZED: walk(e, D[0], 1, depth + 1); break;
        case MPI_COMBINER_CONTIGUOUS: walk(e, D[0], I[0], depth + 1); break;
        case MPI_COMBINER_VECTOR:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)j * I[2] * oe, D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_HVECTOR:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)j * A[0], D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_INDEXED:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)I[1 + I[0] + j] * oe, D[0], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_HINDEXED:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[0], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_INDEXED_BLOCK:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)I[2 + j] * oe, D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_HINDEXED_BLOCK:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_STRUCT:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[j], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_SUBARRAY: {
            int nd2 = I[0];
            const int *sizes = &I[1], *subs = &I[1 + nd2], *starts = &I[1 + 2 * nd2];
            int order = I[1 + 3 * nd2];
            if (nd2 <= 0 || nd2 > 32) { emit(blo, bhi - blo); break; }
            MPI_Aint stride[32];
            int fast = order == MPI_ORDER_C ? nd2 - 1 : 0;
            if (order == MPI_ORDER_C) {
                stride[nd2 - 1] = oe;
                for (int d = nd2 - 2; d >= 0; d--) stride[d] = stride[d + 1] * sizes[d + 1];
            } else {
                stride[0] = oe;
                for (int d = 1; d < nd2; d++) stride[d] = stride[d - 1] * sizes[d - 1];
            }
            int idx[32] = {0};
            for (int d = 0; d < nd2; d++) if (subs[d] <= 0) goto subarray_done;
            for (;;) {
                if (g_budget <= 0) { g_capped = 1; emit(blo, bhi - blo); break; }
                MPI_Aint off = 0;
                for (int d = 0; d < nd2; d++) off += (MPI_Aint)(starts[d] + (d == fast ? 0 : idx[d])) * stride[d];
                walk(e + off, D[0], subs[fast], depth + 1);
                /* odometer over the slow dimensions */
                int d = order == MPI_ORDER_C ? nd2 - 2 : 1;
                int step = order == MPI_ORDER_C ? -1 : 1;
                for (; d >= 0 && d < nd2; d += step) {
                    if (++idx[d] < subs[d]) break;
                    idx[d] = 0;
                }
                if (d < 0 || d >= nd2) break;
            }
        subarray_done:
            break;
        }
        default: emit(blo, bhi - blo); i = count; break; /* whole bounding range once */
        }
    }
    for (int j = 0; j < nd; j++)
        if (!is_named(D[j])) PMPI_Type_free(&D[j]);
}

/* Sorts the blocks and merges overlapping or touching ones. */
static void normalise_blocks(void) {
    for (int i = 1; i < g_nblk; i++) {
        blk_t b = g_blk[i];
        int j = i;
        while (j > 0 && g_blk[j - 1].addr > b.addr) { g_blk[j] = g_blk[j - 1]; j--; }
        g_blk[j] = b;
    }
    int out = 0;
    for (int i = 0; i < g_nblk; i++) {
        if (out && g_blk[i].addr <= g_blk[out - 1].addr + g_blk[out - 1].len) {
            uintptr_t e = g_blk[i].addr + g_blk[i].len;
            if (e > g_blk[out - 1].addr + g_blk[out - 1].len) g_blk[out - 1].len = e - g_blk[out - 1].addr;
        } else {
            g_blk[out++] = g_blk[i];
        }
    }
    g_nblk = out;
}
