/* Grouped training of MLEM models, one model at a time, in C.
 *
 * The same steps as mlem_neuro/core/numpy_train.py (which documents the gradient): the
 * metric W from the parameters A (float32), the term weights, the predictions and the
 * grouped soft Spearman of _SoftSpearmanPAV (float64, weighted pool-adjacent-violators),
 * the gradient by hand, AdamW without weight decay (float32) and the stopping rule of
 * engine._EarlyStopping.  With full batches, or with the grid's mini-batches of blocks
 * (drawn in advance: the same blocks for every model at a step), every model's steps
 * depend on that model alone, so each model runs to its own stop: no stack, no per-step
 * array operations.
 * Called through ctypes (mlem_neuro/core/ctrain.py); the Python module below only makes
 * the shared library importable and findable.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXM 64            /* most features (W is at most MAXM x MAXM) */
#define EPS 1e-12
#define Q_EPS 1e-12

enum { SPD = 0, DIAGONAL = 1, NONE = 2 };

static float softplusf(float x)
{
    /* torch's softplus (beta 1, threshold 20), in float32 as numpy computes it */
    if (x > 20.0f) return x;
    return log1pf(expf(x < 20.0f ? x : 20.0f));
}

static float sigmoid_f(float x)
{
    return (float)(1.0 / (1.0 + exp(-(double)x)));
}

/* workspace of one model's step, sized once */
typedef struct {
    int m, T, U, Up;      /* Up: the groups present in the step's batch (compact arrays) */
    float *L, *W, *G, *G0, *gL;
    double *tw, *val, *q, *pred, *dpred, *xhat, *s, *cs, *y, *v, *wv, *t, *rc, *g_r, *g_s, *g_p;
    double *cc, *tc;      /* compact counts and target sums of the step's batch */
    double *key;          /* sort keys */
    const double *dense;  /* the term rows (U, T) when none of their terms is 0, else NULL */
    int64_t *order, *bstart, *col, *rowptr;
    int64_t *pidx, *pos, *ofull;   /* present groups; their compact index (or -1); the
                                    * model's last sorted order of all groups */
} Work;

static int work_alloc(Work *w, int m, int T, int U)
{
    size_t mm = (size_t)m * m;
    w->m = m; w->T = T; w->U = U;
    w->L = calloc(mm * 5, sizeof(float));
    w->tw = calloc((size_t)T + 1, sizeof(double));
    w->val = NULL;                                      /* sized by work_set_terms */
    w->col = NULL;
    w->rowptr = calloc((size_t)U + 1, sizeof(int64_t));
    w->q = calloc((size_t)U * 17, sizeof(double));
    w->dense = NULL;
    w->order = calloc((size_t)U * 5 + 2, sizeof(int64_t));
    if (!w->L || !w->tw || !w->rowptr || !w->q || !w->order)
        return -1;
    w->W = w->L + mm; w->G = w->W + mm; w->G0 = w->G + mm; w->gL = w->G0 + mm;
    w->pred = w->q + U; w->dpred = w->pred + U; w->xhat = w->dpred + U; w->s = w->xhat + U;
    w->cs = w->s + U; w->y = w->cs + U; w->v = w->y + U; w->wv = w->v + U; w->t = w->wv + U;
    w->rc = w->t + U; w->g_r = w->rc + U; w->g_s = w->g_r + U; w->g_p = w->g_s + U;
    w->cc = w->g_p + U; w->tc = w->cc + U; w->key = w->tc + U;
    w->bstart = w->order + U;                           /* U + 1 entries */
    w->pidx = w->bstart + U + 1; w->pos = w->pidx + U; w->ofull = w->pos + U;
    for (int u = 0; u < U; u++) { w->pidx[u] = u; w->pos[u] = u; }
    w->Up = U;
    return 0;
}

/* the term rows P (U, T) as sparse rows (their nonzero terms, in term order): with
 * categorical features most terms of a row are 0 (a pair differs in few features), and
 * skipping them leaves every sum unchanged (adding 0 * x is exact for finite x) */
static int work_set_terms(Work *w, const double *P)
{
    int64_t nnz = 0;
    for (size_t e = 0; e < (size_t)w->U * w->T; e++) nnz += P[e] != 0.0;
    w->dense = nnz == (int64_t)w->U * w->T ? P : NULL;
    w->val = malloc(sizeof(double) * (nnz + 1));
    w->col = malloc(sizeof(int64_t) * (nnz + 1));
    if (!w->val || !w->col) return -1;
    nnz = 0;
    for (int u = 0; u < w->U; u++) {
        w->rowptr[u] = nnz;
        for (int t = 0; t < w->T; t++) {
            double p = P[(size_t)u * w->T + t];
            if (p != 0.0) { w->col[nnz] = t; w->val[nnz] = p; nnz++; }
        }
    }
    w->rowptr[w->U] = nnz;
    return 0;
}

/* a new model: its first sort starts from the group order */
static void work_reset(Work *w)
{
    for (int u = 0; u < w->U; u++) w->ofull[u] = u;
}

/* the groups present in a batch: those with a positive count (as numpy_batch keeps) */
static void set_present(Work *w, const double *counts)
{
    int j = 0;
    for (int u = 0; u < w->U; u++) {
        if (counts[u] > 0.0) { w->pidx[j] = u; w->pos[u] = j; j++; }
        else w->pos[u] = -1;
    }
    w->Up = j;
}

static void work_free(Work *w)
{
    free(w->L); free(w->tw); free(w->val); free(w->col); free(w->rowptr); free(w->q);
    free(w->order);
}

/* W (float32, Frobenius-normalised) of parameters A; returns the norm of W0 */
static float metric(const float *A, int m, int constraint, float *L, float *W)
{
    int i, j, r;
    if (constraint == SPD) {
        for (i = 0; i < m; i++)
            for (j = 0; j < m; j++)
                L[i * m + j] = j < i ? A[i * m + j] : (j == i ? softplusf(A[i * m + i]) : 0.0f);
        for (i = 0; i < m; i++)
            for (j = 0; j < m; j++) {
                float acc = 0.0f;
                for (r = 0; r <= (i < j ? i : j); r++) acc += L[i * m + r] * L[j * m + r];
                W[i * m + j] = acc;
            }
    } else if (constraint == DIAGONAL) {
        for (i = 0; i < m * m; i++) W[i] = 0.0f;
        for (i = 0; i < m; i++) W[i * m + i] = softplusf(A[i * m + i]);
    } else {
        for (i = 0; i < m; i++)
            for (j = 0; j < m; j++) W[i * m + j] = 0.5f * (A[i * m + j] + A[j * m + i]);
    }
    float ss = 0.0f;
    for (i = 0; i < m * m; i++) ss += W[i] * W[i];
    float norm = sqrtf(ss);
    float d = norm > 1e-12f ? norm : 1e-12f;
    for (i = 0; i < m * m; i++) W[i] /= d;
    return norm;
}

/* weighted pool-adjacent-violators, non-increasing, of y (n) with weights c: solution v,
 * block starts in bstart; returns the number of blocks */
static int pav_decreasing(const double *y, const double *c, int n, double *v, double *wv,
                          int64_t *bstart)
{
    /* blocks hold their weighted sums (v) and weights (wv); a block's mean is compared
     * with its neighbour's by cross-multiplication (weights are positive), so no merge
     * divides; the means are taken once at the end */
    int nb = 0, i;
    for (i = 0; i < n; i++) {
        v[nb] = c[i] * y[i]; wv[nb] = c[i]; bstart[nb] = i; nb++;
        while (nb > 1 && v[nb - 2] * wv[nb - 1] < v[nb - 1] * wv[nb - 2]) {
            v[nb - 2] += v[nb - 1];                     /* violation of non-increasing */
            wv[nb - 2] += wv[nb - 1];
            nb--;
        }
    }
    for (i = 0; i < nb; i++) v[i] /= wv[i];
    return nb;
}

/* soft Spearman of one model's grouped predictions p on the Up present groups (compact
 * arrays p, c, tsum) and its gradient g_p (compact group order) */
static double soft_spearman(Work *w, const double *p, const double *c, double b,
                            const double *tsum, double strength)
{
    int U = w->Up, u, i, j;
    double mean = 0.0, ss = 0.0;
    for (u = 0; u < U; u++) mean += p[u] * c[u];
    mean /= b;
    for (u = 0; u < U; u++) { double x = p[u] - mean; w->xhat[u] = x; ss += x * x * c[u]; }
    double sigma = sqrt(ss > EPS * EPS ? ss : EPS * EPS), inv_sigma = 1.0 / sigma;
    for (u = 0; u < U; u++) w->xhat[u] *= inv_sigma;
    double kappa = sqrt(b) * b / sqrt(12.0) / strength;
    /* order: decreasing xhat, by insertion sort from the model's previous order of the
     * present groups (its predictions move little between steps, so it is nearly sorted:
     * O(U) passes); the new order goes back to the slots of the present groups */
    int64_t *o = w->order;
    double *key = w->key;          /* the sort's keys, moved with o (no indirect loads) */
    for (i = 0, j = 0; i < w->U; i++) {
        int64_t c = w->pos[w->ofull[i]];
        if (c >= 0) { o[j] = c; key[j] = w->xhat[c]; j++; }
    }
    for (i = 1; i < U; i++) {
        int64_t cur = o[i];
        double kc = key[i];
        for (j = i; j > 0 && key[j - 1] < kc; j--) { o[j] = o[j - 1]; key[j] = key[j - 1]; }
        o[j] = cur;
        key[j] = kc;
    }
    for (i = 0, j = 0; i < w->U; i++)
        if (w->pos[w->ofull[i]] >= 0) w->ofull[i] = w->pidx[o[j++]];
    double start = 0.0, rsum = 0.0, tsum_all = 0.0;
    for (i = 0; i < U; i++) {
        double ci = c[o[i]];
        w->s[i] = kappa * w->xhat[o[i]];
        w->cs[i] = ci;
        w->y[i] = w->s[i] - (b - start - (ci - 1.0) / 2.0);
        w->t[i] = tsum[o[i]];
        tsum_all += w->t[i];
        start += ci;
    }
    int nb = pav_decreasing(w->y, w->cs, U, w->v, w->wv, w->bstart);
    w->bstart[nb] = U;
    for (j = 0; j < nb; j++)
        for (i = (int)w->bstart[j]; i < w->bstart[j + 1]; i++) {
            w->rc[i] = w->s[i] - w->v[j];                       /* sorted soft ranks */
            rsum += w->rc[i] * w->cs[i];
        }
    double nr = 0.0;
    for (i = 0; i < U; i++) { w->rc[i] -= rsum / b; nr += w->cs[i] * w->rc[i] * w->rc[i]; }
    nr = sqrt(nr > EPS * EPS ? nr : EPS * EPS);
    double rho = 0.0;
    double inv_nr = 1.0 / nr;
    for (i = 0; i < U; i++) { w->rc[i] *= inv_nr; rho += w->rc[i] * w->t[i]; }   /* z */
    /* backward (d rho / d pred) */
    for (i = 0; i < U; i++)
        w->g_r[i] = (w->t[i] - w->cs[i] * (tsum_all / b) - w->cs[i] * w->rc[i] * rho) * inv_nr;
    for (j = 0; j < nb; j++) {
        double gsum = 0.0, csum = 0.0;
        for (i = (int)w->bstart[j]; i < w->bstart[j + 1]; i++) {
            gsum += w->g_r[i]; csum += w->cs[i];
        }
        for (i = (int)w->bstart[j]; i < w->bstart[j + 1]; i++)
            w->g_s[o[i]] = (w->g_r[i] - w->cs[i] * (gsum / csum)) * kappa;   /* gx */
    }
    double gsum = 0.0, gdot = 0.0;
    for (u = 0; u < U; u++) { gsum += w->g_s[u]; gdot += w->g_s[u] * w->xhat[u]; }
    for (u = 0; u < U; u++)
        w->g_p[u] = (w->g_s[u] - c[u] * (gsum / b) - c[u] * w->xhat[u] * gdot) * inv_sigma;
    return rho;
}

/* soft Spearman of parameters A and its gradient grad (float32, m x m) */
static double value_and_grad(Work *w, const float *A, int constraint, const int64_t *k,
                             const int64_t *l, const double *c, double b,
                             const double *tsum, double strength, float *grad)
{
    int m = w->m, T = w->T, U = w->U, u, t, i, j, r;
    float norm = metric(A, m, constraint, w->L, w->W);
    double *tw = w->tw;
    for (t = 0; t < T; t++) tw[t] = (double)w->W[k[t] * m + l[t]];
    U = w->Up;
    for (u = 0; u < U; u++) {
        double q = 0.0;
        int64_t row = w->pidx[u];
        if (w->dense) {                          /* the same sum: every term, in order */
            const double *pr = w->dense + (size_t)row * T;
            for (t = 0; t < T; t++) q += tw[t] * pr[t];
        } else {
            for (int64_t e = w->rowptr[row]; e < w->rowptr[row + 1]; e++)
                q += tw[w->col[e]] * w->val[e];
        }
        if (constraint == NONE) {
            double aq = fabs(q), root = sqrt(aq + Q_EPS);
            w->pred[u] = q / root;
            w->dpred[u] = (0.5 * aq + Q_EPS) / (root * root * root);
        } else {
            double pr = sqrt(q > Q_EPS ? q : Q_EPS);
            w->pred[u] = pr;
            w->dpred[u] = q >= Q_EPS ? 0.5 / pr : 0.0;
        }
    }
    double rho = soft_spearman(w, w->pred, c, b, tsum, strength);
    for (i = 0; i < m * m; i++) w->G[i] = 0.0f;
    for (t = 0; t < T; t++) tw[t] = 0.0;
    for (u = 0; u < U; u++) {
        double a = w->g_p[u] * w->dpred[u];
        int64_t row = w->pidx[u];
        if (w->dense) {
            const double *pr = w->dense + (size_t)row * T;
            for (t = 0; t < T; t++) tw[t] += a * pr[t];
        } else {
            for (int64_t e = w->rowptr[row]; e < w->rowptr[row + 1]; e++)
                tw[w->col[e]] += a * w->val[e];
        }
    }
    for (t = 0; t < T; t++) w->G[k[t] * m + l[t]] = (float)tw[t];
    float gdotw = 0.0f;
    for (i = 0; i < m * m; i++) gdotw += w->G[i] * w->W[i];
    float d = norm > 1e-12f ? norm : 1e-12f;
    for (i = 0; i < m * m; i++) w->G0[i] = (w->G[i] - w->W[i] * gdotw) / d;
    for (i = 0; i < m * m; i++) grad[i] = 0.0f;
    if (constraint == SPD) {
        for (i = 0; i < m; i++)
            for (j = 0; j <= i; j++) {
                float acc = 0.0f;
                for (r = 0; r < m; r++)
                    acc += (w->G0[i * m + r] + w->G0[r * m + i]) * w->L[r * m + j];
                grad[i * m + j] = i == j ? acc * sigmoid_f(A[i * m + i]) : acc;
            }
    } else if (constraint == DIAGONAL) {
        for (i = 0; i < m; i++) grad[i * m + i] = w->G0[i * m + i] * sigmoid_f(A[i * m + i]);
    } else {
        for (i = 0; i < m; i++)
            for (j = 0; j < m; j++) grad[i * m + j] = 0.5f * (w->G0[i * m + j] + w->G0[j * m + i]);
    }
    return rho;
}

/* Mini-batches of the grid (quantise._BlockTargets): per model the per-block tables of
 * the target ranks; per step the blocks drawn (the same for every model). */
typedef struct {
    int K, nb;                 /* blocks, blocks per batch */
    const double *C;           /* (U, K) pairs of each group in each block */
    const double *Tb;          /* (M, K, U) sums of target ranks per block and group */
    const double *S1, *S2;     /* (M, K) sums of ranks and of squared ranks per block */
    const int64_t *draws;      /* (max_steps, nb) the blocks of each step */
    double *counts;            /* (max_steps, U) the batch's pairs per group, per step, */
    uint8_t *done;             /* computed by the first model to reach the step (NULL:
                                * (U) only, computed at every step) */
    int64_t *out;              /* (K - nb) the blocks a step leaves out */
    double *total;             /* (U) a model's target sums over all blocks */
    double *part;              /* (U) its sums over the step's drawn (or left-out) blocks */
} Blocks;

/* the batch of model i at a step: compact counts and standardised target sums of the
 * present groups (quantise._BlockTargets.draw, then the present groups as numpy_batch).
 * A group's sum over the drawn blocks is taken over the fewer of the drawn blocks and the
 * blocks left out (then subtracted from its total over all blocks). */
static double block_batch(Work *w, Blocks *bl, int64_t i, int64_t step, int new_model)
{
    const int64_t *d = bl->draws + step * bl->nb;
    int U = w->U, K = bl->K, nb = bl->nb, u, j, r;
    double *counts = bl->counts + (bl->done ? (size_t)step * U : 0);
    const double *Ti = bl->Tb + (size_t)i * K * U;       /* (K, U): a block's row */
    if (!bl->done || !bl->done[step]) {
        for (u = 0; u < U; u++) {
            double c = 0.0;
            for (j = 0; j < nb; j++) c += bl->C[(size_t)u * K + d[j]];
            counts[u] = c;
        }
        if (bl->done) bl->done[step] = 1;
    }
    if (new_model) {
        for (u = 0; u < U; u++) bl->total[u] = 0.0;
        for (r = 0; r < K; r++)
            for (u = 0; u < U; u++) bl->total[u] += Ti[(size_t)r * U + u];
    }
    double b = 0.0, s1 = 0.0, s2 = 0.0;
    for (u = 0; u < U; u++) b += counts[u];
    for (j = 0; j < nb; j++) {
        s1 += bl->S1[i * K + d[j]];
        s2 += bl->S2[i * K + d[j]];
    }
    double mean = s1 / b, var = s2 - b * mean * mean;
    double norm = sqrt(var > 1e-24 ? var : 1e-24);
    set_present(w, counts);
    int use_out = 2 * nb > K, n_out = 0;
    if (use_out) {
        uint64_t in = 0;
        for (j = 0; j < nb; j++) in |= (uint64_t)1 << d[j];
        for (r = 0; r < K; r++)
            if (!(in >> r & 1)) bl->out[n_out++] = r;
    }
    /* every group's sum over the blocks (rows of Ti added whole: contiguous), in the
     * blocks' order; then the present groups' */
    const int64_t *sel = use_out ? bl->out : d;
    int n_sel = use_out ? n_out : nb;
    double *part = bl->part;
    for (u = 0; u < U; u++) part[u] = 0.0;
    for (r = 0; r < n_sel; r++) {
        const double *row = Ti + (size_t)sel[r] * U;
        for (u = 0; u < U; u++) part[u] += row[u];
    }
    double inv_norm = 1.0 / norm;
    for (j = 0; j < w->Up; j++) {
        int64_t g = w->pidx[j];
        double t = use_out ? bl->total[g] - part[g] : part[g];
        w->cc[j] = counts[g];
        w->tc[j] = (t - counts[g] * mean) * inv_norm;
    }
    return b;
}

/* Train M models (see mlem_train_grouped); with bl, on the grid's mini-batches. */
static int train_models(int64_t M, int m, int T, int U, const int64_t *k, const int64_t *l,
                        const double *P, const double *counts, int counts_per_model,
                        const double *targets, Blocks *bl, int constraint,
                        double strength, double lr, double tol, int64_t patience,
                        int64_t max_steps, float *A, int64_t *n_iter, uint8_t *converged,
                        double *best_score, float *history)
{
    Work w;
    int64_t i, step;
    int mm = m * m, e;
    if (m > MAXM || m < 1 || U < 1) return -1;
    if (work_alloc(&w, m, T, U) || work_set_terms(&w, P)) { work_free(&w); return -1; }
    float *cur = malloc(sizeof(float) * mm * 4);
    if (!cur) { work_free(&w); return -1; }
    float *mom = cur + mm, *vel = mom + mm, *grad = vel + mm;
    /* AdamW's bias corrections of each step (as numpy_train: float32 of float64 values) */
    float *corr = malloc(sizeof(float) * 2 * (max_steps > 0 ? max_steps : 1));
    if (!corr) { free(cur); work_free(&w); return -1; }
    for (step = 0; step < max_steps; step++) {
        corr[2 * step] = (float)sqrt(1.0 - pow(0.999, (double)(step + 1)));
        corr[2 * step + 1] = (float)(lr / (1.0 - pow(0.9, (double)(step + 1))));
    }
    const float b1 = 0.9f, b2 = 0.999f, one_b1 = (float)(1.0 - 0.9), one_b2 = (float)(1.0 - 0.999);
    const float adam_eps = 1e-8f, ftol = (float)tol;
    for (i = 0; i < M; i++) {
        const double *c = NULL, *tsum = NULL;
        float *best_A = A + i * mm;
        double b = 0.0;
        if (!bl) {                                       /* full batch: every group */
            c = counts_per_model ? counts + i * U : counts;
            tsum = targets + i * U;
            for (int u = 0; u < U; u++) b += c[u];
        }
        work_reset(&w);
        memcpy(cur, best_A, sizeof(float) * mm);
        memset(mom, 0, sizeof(float) * mm * 2);
        float best = -INFINITY, ref = -INFINITY;
        int64_t since = 0, n = 0;
        for (step = 0; step < max_steps; step++) {
            if (bl) {
                b = block_batch(&w, bl, i, step, step == 0);
                c = w.cc;
                tsum = w.tc;
            }
            double rho = value_and_grad(&w, cur, constraint, k, l, c, b, tsum, strength,
                                        grad);
            float rf = (float)rho;
            if (rf > best) { memcpy(best_A, cur, sizeof(float) * mm); best = rf; }
            if (rf > ref + ftol) { ref = rf; since = 0; } else since++;
            n++;
            if (history) history[i * max_steps + step] = rf;
            float bc2 = corr[2 * step], step_size = corr[2 * step + 1];
            for (e = 0; e < mm; e++) {
                float g = -grad[e];
                mom[e] = mom[e] * b1 + one_b1 * g;
                vel[e] = vel[e] * b2 + one_b2 * g * g;
                float denom = sqrtf(vel[e]) / bc2 + adam_eps;
                cur[e] = cur[e] - step_size * mom[e] / denom;
            }
            if (since >= patience) break;
        }
        if (history)
            for (step = n; step < max_steps; step++) history[i * max_steps + step] = NAN;
        n_iter[i] = n;
        converged[i] = since >= patience;
        best_score[i] = (double)best;
    }
    free(corr);
    free(cur);
    work_free(&w);
    return 0;
}

/* Train M models on full batches.  A (M, m, m) float32: the start, overwritten by the
 * best state seen.  counts: (U,) shared or (M, U) per model (counts_per_model).
 * history: (M, max_steps) float32 filled with NaN beyond each model's last step, or NULL.
 * Returns 0, or -1 when memory ran out or m > MAXM. */
int mlem_train_grouped(int64_t M, int m, int T, int U, const int64_t *k, const int64_t *l,
                       const double *P, const double *counts, int counts_per_model,
                       const double *targets, int constraint, double strength, double lr,
                       double tol, int64_t patience, int64_t max_steps, float *A,
                       int64_t *n_iter, uint8_t *converged, double *best_score,
                       float *history)
{
    return train_models(M, m, T, U, k, l, P, counts, counts_per_model, targets, NULL,
                        constraint, strength, lr, tol, patience, max_steps, A, n_iter,
                        converged, best_score, history);
}

/* Train M models on the grid's mini-batches of blocks: C (U, K), Tb (M, K, U) (the
 * transpose of quantise._BlockTargets's per-model tables), S1 and S2 (M, K) as
 * quantise._BlockTargets holds them (ranks not standardised), draws
 * (max_steps, nb) the blocks of each step.  Otherwise as mlem_train_grouped. */
int mlem_train_blocks(int64_t M, int m, int T, int U, const int64_t *k, const int64_t *l,
                      const double *P, int K, int nb, const double *C, const double *Tb,
                      const double *S1, const double *S2, const int64_t *draws,
                      int constraint, double strength, double lr, double tol,
                      int64_t patience, int64_t max_steps, float *A, int64_t *n_iter,
                      uint8_t *converged, double *best_score, float *history)
{
    if (K > 64 || nb < 1 || nb > K) return -1;
    /* every step's counts are kept (computed once for all models) up to 64 MiB */
    size_t steps = max_steps > 0 ? (size_t)max_steps : 1;
    int cache = steps * (size_t)U <= ((size_t)1 << 23);
    size_t kept = cache ? steps : 1;
    double *work = malloc(sizeof(double) * (kept * U + 2 * U + 1));
    uint8_t *done = cache ? calloc(steps, 1) : NULL;
    int64_t *out = malloc(sizeof(int64_t) * (K + 1));
    if (!work || (cache && !done) || !out) { free(work); free(done); free(out); return -1; }
    Blocks bl = {K, nb, C, Tb, S1, S2, draws, work, done, out, work + kept * U,
                 work + kept * U + U};
    int status = train_models(M, m, T, U, k, l, P, NULL, 0, NULL, &bl, constraint, strength,
                              lr, tol, patience, max_steps, A, n_iter, converged, best_score,
                              history);
    free(done);
    free(out);
    free(work);
    return status;
}

/* The soft Spearman (rho, M) of parameters A (M, m, m) and its gradient (grad, M x m x m):
 * one step of mlem_train_grouped without the update (for tests).  Returns 0 or -1. */
int mlem_value_and_grad(int64_t M, int m, int T, int U, const int64_t *k, const int64_t *l,
                        const double *P, const double *counts, int counts_per_model,
                        const double *targets, int constraint, double strength,
                        const float *A, double *rho, float *grad)
{
    Work w;
    int64_t i;
    int u;
    if (m > MAXM || m < 1 || U < 1) return -1;
    if (work_alloc(&w, m, T, U) || work_set_terms(&w, P)) { work_free(&w); return -1; }
    for (i = 0; i < M; i++) {
        const double *c = counts_per_model ? counts + i * U : counts;
        double b = 0.0;
        for (u = 0; u < U; u++) b += c[u];
        work_reset(&w);
        rho[i] = value_and_grad(&w, A + i * m * m, constraint, k, l, c, b, targets + i * U,
                                strength, grad + i * m * m);
    }
    work_free(&w);
    return 0;
}

/* Exact Spearman of continuous predictions against fixed target ranks, in two passes
 * around numpy's integer sort (mlem_neuro/core/importance.py, _score).
 *
 * mlem_packed_keys: each value of q (R rows of n) as a 64-bit integer whose signed order
 * is the value's order, with its low `bits` bits replaced by the value's index in its row
 * (2**bits >= n).  Returns 1 (and stops) at a value that is not finite, else 0. */
int mlem_packed_keys(int64_t R, int64_t n, const double *q, int bits, int64_t *keys)
{
    const uint64_t top = (uint64_t)1 << 63, low = ((uint64_t)1 << bits) - 1;
    for (int64_t r = 0; r < R; r++)
        for (int64_t i = 0; i < n; i++) {
            double x = q[r * n + i];
            uint64_t u;
            if (!isfinite(x)) return 1;
            memcpy(&u, &x, sizeof u);
            u = (u & top) ? ~u : (u | top);          /* unsigned order = value order */
            u = (u & ~low) | (uint64_t)i;
            keys[r * n + i] = (int64_t)(u ^ top);    /* signed order = unsigned order */
        }
    return 0;
}

/* mlem_packed_keys of feature-importance predictions computed here, kept in q:
 * q[m, r, p] = A[m, p] + d[r, p] * (2 B[m, p] + Wff[m] d[r, p]) for M models, R
 * permutations and n pairs (importance.py: _feature_q; equal inputs give equal values, so
 * ties stay ties).  Returns 1 (and stops) at a value that is not finite, else 0. */
int mlem_feature_keys(int64_t M, int64_t R, int64_t n, const double *A, const double *B,
                      const double *Wff, const double *d, int bits, double *q, int64_t *keys)
{
    const uint64_t top = (uint64_t)1 << 63, low = ((uint64_t)1 << bits) - 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t r = 0; r < R; r++) {
            const double *a = A + m * n, *bb = B + m * n, *dr = d + r * n;
            double w = Wff[m];
            double *qr = q + (m * R + r) * n;
            int64_t *kr = keys + (m * R + r) * n;
            for (int64_t i = 0; i < n; i++) {
                double x = a[i] + dr[i] * (2.0 * bb[i] + w * dr[i]);
                uint64_t u;
                if (!isfinite(x)) return 1;
                qr[i] = x;
                memcpy(&u, &x, sizeof u);
                u = (u & top) ? ~u : (u | top);
                u = (u & ~low) | (uint64_t)i;
                kr[i] = (int64_t)(u ^ top);
            }
        }
    return 0;
}

/* After each row of keys is sorted: the row's order (keys & mask), and
 * rho[r] = sum over positions of c[pos] * tz[r / tz_div][order[pos]] (c: the
 * standardised ranks 1..n); flags[r] bit 1: the row is not in order (values that differ
 * only in the dropped bits), bit 2: it holds equal values (their ranks must be averaged).
 * Rows flagged are the caller's to recompute. */
int mlem_sorted_scores(int64_t R, int64_t n, const double *q, const int64_t *keys, int bits,
                       const double *tz, int64_t tz_div, const double *c, double *rho,
                       uint8_t *flags)
{
    const int64_t mask = ((int64_t)1 << bits) - 1;
    for (int64_t r = 0; r < R; r++) {
        const int64_t *k = keys + r * n;
        const double *qr = q + r * n, *t = tz + (r / tz_div) * n;
        double acc = 0.0, prev = -INFINITY;
        uint8_t flag = 0;
        for (int64_t pos = 0; pos < n; pos++) {
            int64_t idx = k[pos] & mask;
            double x = qr[idx];
            if (x < prev) flag |= 1;
            else if (x == prev) flag |= 2;
            prev = x;
            acc += c[pos] * t[idx];
        }
        rho[r] = acc;
        flags[r] = flag;
    }
    return 0;
}

/* Rank sums of subsets of pairs from one sort per row (fastnull.rank_sums): keys (R, P)
 * are each row's packed keys (mlem_packed_keys of x, the row's values), sorted.  The sets
 * come in C channels of up to J sets that share no pair; labels (P, C) (a pair's labels
 * side by side; uint8 when narrow, else int32) holds, per channel, j * U + g for a pair
 * of the channel's j-th set in distance row g (< U), or J * U for a pair in none of its
 * sets.  Walking a row's order, a pair's rank within its set is the count of the set's
 * pairs up to it; rsum (C, R, J * U) gets, per channel, row and label, the sum of its
 * pairs' ranks (integers, exact in double).  flags[r] bit 1: row r is not in order
 * (values that differ only in the dropped bits), bit 2: it holds equal values (ranks to
 * average); a flagged row's sums are the caller's to recompute.  Returns 0, or -1 when
 * memory ran out. */
#define RANK_WALK_ROW(LTYPE)                                                              \
    for (int64_t p = 0; p < P; p++) {                                                     \
        int64_t idx = k[p] & mask, hi = k[p] >> bits;                                     \
        if (hi == prev_hi) {   /* same kept bits: only the values can tell the order */   \
            double v = xr[idx], u = xr[prev_idx];                                         \
            flag |= (uint8_t)((v < u) | ((v == u) << 1));                                 \
        }                                                                                 \
        prev_hi = hi;                                                                     \
        prev_idx = idx;                                                                   \
        const LTYPE *lab = (const LTYPE *)labels + idx * C;                               \
        for (int c = 0; c < C; c++) {                                                     \
            int64_t code = lab[c];                                                        \
            int64_t *n = count + c * (J + 1) + set_of[code];                              \
            acc[c * V + code] += (double)(++*n);                                          \
        }                                                                                 \
    }

int mlem_rank_walk(int64_t R, int64_t P, const double *x, const int64_t *keys, int bits,
                   int C, int J, int U, const void *labels, int narrow, double *rsum,
                   uint8_t *flags)
{
    const int64_t mask = ((int64_t)1 << bits) - 1;
    const int64_t L = (int64_t)J * U, V = L + 1;   /* a channel's labels, and its spare */
    /* per channel: a count per set and a spare count; sums per label and a spare sum (a
     * pair in none of the channel's sets adds to the spares: no branches, since
     * membership is unpredictable) */
    int64_t *count = malloc(sizeof(int64_t) * (size_t)(C > 0 ? C : 1) * (J + 1));
    double *acc = malloc(sizeof(double) * (size_t)(C > 0 ? C : 1) * V);
    int64_t *set_of = malloc(sizeof(int64_t) * (size_t)V);
    if (!count || !acc || !set_of) { free(count); free(acc); free(set_of); return -1; }
    for (int64_t code = 0; code < V; code++) set_of[code] = code / (U > 0 ? U : 1);
    for (int64_t r = 0; r < R; r++) {
        const int64_t *k = keys + r * P;
        const double *xr = x + r * P;
        /* keys whose kept bits differ are in the order of their values (strictly), so
         * the values are read only where consecutive keys share their kept bits */
        int64_t prev_hi = INT64_MIN, prev_idx = 0;
        uint8_t flag = 0;
        memset(count, 0, sizeof(int64_t) * (size_t)C * (J + 1));
        memset(acc, 0, sizeof(double) * (size_t)C * V);
        if (narrow) { RANK_WALK_ROW(uint8_t) } else { RANK_WALK_ROW(int32_t) }
        for (int c = 0; c < C; c++)
            memcpy(rsum + ((size_t)c * R + r) * L, acc + (size_t)c * V, sizeof(double) * L);
        flags[r] = flag;
    }
    free(count);
    free(acc);
    free(set_of);
    return 0;
}

/* Squared distances of every pair i < j (pair_indices order) from the Gram matrices G
 * (M, n, n) of preprocessed rows: out[m, p] = (G_ii + G_jj) - 2 G_ij, the operations of
 * neural.rdm_all_pairs in the same order (bit for bit).  Returns 0, or -1 when memory
 * ran out. */
int mlem_condensed(int64_t M, int64_t n, const double *G, double *out)
{
    double *sq = malloc(sizeof(double) * (n > 0 ? n : 1));
    if (!sq) return -1;
    for (int64_t m = 0; m < M; m++) {
        const double *g = G + m * n * n;
        double *o = out + m * (n * (n - 1) / 2);
        for (int64_t i = 0; i < n; i++) sq[i] = g[i * n + i];
        for (int64_t i = 0; i < n - 1; i++) {
            const double *row = g + i * n;
            double si = sq[i];
            for (int64_t j = i + 1; j < n; j++)
                *o++ = (si + sq[j]) - 2.0 * row[j];
        }
    }
    free(sq);
    return 0;
}

/* Average ranks (1-based) of R subsets of the N columns of each of M rows, from each
 * row's sorted positions: pos (M, N) the sorted position of each column; first and last
 * (M, N), indexed by sorted position, the first and last sorted position of its group of
 * equal values (NULL: no ties).  cols (R, P) the subsets' columns (distinct within a
 * subset).  out[m * stride_m + r * stride_r + p]: the rank of column cols[r, p] among
 * the columns of subset r in row m, as spearman.SubsetRanks computes it (a count of the
 * subset's columns at or before each sorted position; ties: before + (upto - before +
 * 1) / 2, the same float64 operations).  Returns 0, or -1 when memory ran out. */
int mlem_subset_ranks(int64_t M, int64_t N, const int32_t *pos, const int32_t *first,
                      const int32_t *last, int64_t R, int64_t P, const int64_t *cols,
                      int64_t stride_m, int64_t stride_r, double *out)
{
    int32_t *cnt = malloc(sizeof(int32_t) * (N > 0 ? N : 1));
    if (!cnt) return -1;
    for (int64_t m = 0; m < M; m++) {
        const int32_t *pm = pos + m * N;
        const int32_t *fm = first ? first + m * N : NULL;
        const int32_t *lm = last ? last + m * N : NULL;
        for (int64_t r = 0; r < R; r++) {
            const int64_t *c = cols + r * P;
            double *o = out + m * stride_m + r * stride_r;
            memset(cnt, 0, sizeof(int32_t) * N);
            for (int64_t p = 0; p < P; p++) cnt[pm[c[p]]] = 1;
            int32_t run = 0;
            for (int64_t q = 0; q < N; q++) { run += cnt[q]; cnt[q] = run; }
            if (!fm) {
                for (int64_t p = 0; p < P; p++) o[p] = (double)cnt[pm[c[p]]];
            } else {
                for (int64_t p = 0; p < P; p++) {
                    int32_t q = pm[c[p]], f = fm[q];
                    /* before: the subset's columns strictly before the group */
                    int32_t before = f > 0 ? cnt[f - 1] : 0, upto = cnt[lm[q]];
                    o[p] = (double)before + (double)(upto - before + 1) / 2;
                }
            }
        }
    }
    free(cnt);
    return 0;
}

/* The grid's per-block target tables (quantise._BlockTargets) of M rows of ranks (M, P):
 * T[m, key[p]] += r, S1[m, block[p]] += r, S2[m, block[p]] += r * r, the pairs in order
 * (as torch's scatter_add_ and index_add_ add them); T (M, n_keys), S1 and S2 (M, K)
 * come zeroed. */
int mlem_block_tables(int64_t M, int64_t P, int64_t n_keys, int64_t K, const int64_t *key,
                      const int64_t *block, const double *ranks, double *T, double *S1,
                      double *S2)
{
    for (int64_t m = 0; m < M; m++) {
        const double *r = ranks + m * P;
        double *t = T + m * n_keys, *s1 = S1 + m * K, *s2 = S2 + m * K;
        for (int64_t p = 0; p < P; p++) {
            double v = r[p];
            t[key[p]] += v;
            s1[block[p]] += v;
            s2[block[p]] += v * v;
        }
    }
    return 0;
}

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_ctrain",
    "Grouped full-batch training in C (called through ctypes: mlem_neuro.core.ctrain).",
    -1, NULL
};

PyMODINIT_FUNC PyInit__ctrain(void)
{
    return PyModule_Create(&moduledef);
}
