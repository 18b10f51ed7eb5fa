"""Plain, loop-by-loop implementations of the papers' equations, one pair at a time, in float64.

Deliberately naive: every sum is written over explicit indices so the vectorised models can be
checked against the equations as printed.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-8


def cos(a, b):
    return float(a @ b) / max(float(a.norm()) * float(b.norm()), EPS)


def _leaky(x):
    return x if x > 0 else 0.1 * x


def _norm_list(vals, kind):
    """SCAN raw_feature_norm over one query axis (a list of floats)."""
    if kind == "softmax":
        m = max(vals)
        ex = [math.exp(x - m) for x in vals]
        return [x / sum(ex) for x in ex]
    if kind.startswith("clipped"):
        vals = [_leaky(x) for x in vals]
    if kind.endswith("l2norm"):
        n = math.sqrt(sum(x * x for x in vals)) + EPS
        return [x / n for x in vals]
    if kind.endswith("l1norm"):
        n = sum(abs(x) for x in vals) + EPS
        return [x / n for x in vals]
    return vals


def _softmax(vals, lam):
    m = max(lam * x for x in vals)
    ex = [math.exp(lam * x - m) for x in vals]
    return [x / sum(ex) for x in ex]


def _pool(rel, how, lam2):
    if how == "avg":
        return sum(rel) / len(rel)
    if how == "sum":
        return sum(rel)
    if how == "max":
        return max(rel)
    return math.log(sum(math.exp(lam2 * r) for r in rel)) / lam2


def scan_alpha(v, e, direction, norm, lam1):
    """SCAN's attention weights of one pair as a (k, n) list: t-i α_ij over regions i for each word j (eq. 1-3),
    i-t α_ij over words j for each region i (eq. 6-7)."""
    v, e = v.double(), e.double()
    k, n = len(v), len(e)
    s = [[float(v[i] @ e[j]) for j in range(n)] for i in range(k)]
    alpha = [[0.0] * n for _ in range(k)]
    if direction == "t2i":
        s_bar_rows = [_norm_list(s[i], norm) for i in range(k)]  # normalised along words
        for j in range(n):
            for i, a in enumerate(_softmax([s_bar_rows[i][j] for i in range(k)], lam1)):
                alpha[i][j] = a
    else:
        s_bar_cols = [_norm_list([s[i][j] for i in range(k)], norm) for j in range(n)]  # along regions
        for i in range(k):
            alpha[i] = _softmax([s_bar_cols[j][i] for j in range(n)], lam1)
    return alpha


def scan_pair(v, e, direction, norm, lam1, agg, lam2):
    """SCAN score of one pair. v: (k, D) valid regions; e: (n, D) valid words."""
    v, e = v.double(), e.double()
    k, n = len(v), len(e)
    alpha = scan_alpha(v, e, direction, norm, lam1)
    if direction == "t2i":
        rel = [cos(e[j], sum(alpha[i][j] * v[i] for i in range(k))) for j in range(n)]
    else:
        rel = [cos(v[i], sum(alpha[i][j] * e[j] for j in range(n))) for i in range(k)]
    return _pool(rel, agg, lam2)


def summax_pair(v, e, direction):
    v, e = v.double(), e.double()
    s = [[float(v[i] @ e[j]) for j in range(len(e))] for i in range(len(v))]
    if direction == "t2i":
        return sum(max(s[i][j] for i in range(len(v))) for j in range(len(e)))
    return sum(max(s[i][j] for j in range(len(e))) for i in range(len(v)))


def score_matrix(pair_fn, img, txt):
    """Fill (n_img, n_txt) by calling ``pair_fn(v_valid, e_valid)`` for each pair."""
    n_img, n_txt = len(img.regions), len(txt.lengths)
    out = torch.zeros(n_img, n_txt, dtype=torch.float64)
    for a in range(n_img):
        v = img.regions[a] if img.mask is None else img.regions[a][img.mask[a]]
        for b in range(n_txt):
            out[a, b] = pair_fn(v, txt.words[b, : int(txt.lengths[b])])
    return out


def caan_pair(model, v, u):
    """CAAN score of one pair, equations as printed (module docstring of vlmatch.models.caan).

    v: (k, D) valid projected regions, u: (n, D) valid words. Explicit loops over i, j."""
    c = model.cfg
    v, u = v.double(), u.double()
    k, n = len(v), len(u)
    p = {name: getattr(model, name).detach().double() for name, _ in model.named_parameters()
         if "." not in name}
    if not (c.inter or c.intra != "none"):
        f, g = [1.0 / k] * k, [1.0 / n] * n
    else:
        hp = [[0.0] * n for _ in range(k)]
        if c.inter or c.intra == "semantic":
            for i in range(k):
                for j in range(n):
                    hp[i][j] = max(math.tanh(float(v[i] @ p["K"] @ u[j])), 0.0)
        col = [math.sqrt(sum(hp[i][j] ** 2 for i in range(k))) for j in range(n)]
        row = [math.sqrt(sum(hp[i][j] ** 2 for j in range(n))) for i in range(k)]
        h_uv = [[hp[i][j] / (col[j] + EPS) for j in range(n)] for i in range(k)]
        h_vu = [[hp[i][j] / (row[i] + EPS) for j in range(n)] for i in range(k)]
        if c.intra == "feature":
            hv = [[float(v[i] @ p["M1"] @ v[i2]) for i2 in range(k)] for i in range(k)]
            hu = [[float(u[j] @ p["M2"] @ u[j2]) for j2 in range(n)] for j in range(n)]
        elif c.intra == "semantic":
            def cosl(a, b):
                na, nb = math.sqrt(sum(x * x for x in a)) + EPS, math.sqrt(sum(x * x for x in b)) + EPS
                return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)

            hv = [[cosl(h_uv[i], h_uv[i2]) for i2 in range(k)] for i in range(k)]
            colvu = [[h_vu[i][j] for i in range(k)] for j in range(n)]
            hu = [[cosl(colvu[j], colvu[j2]) for j2 in range(n)] for j in range(n)]
        lv, lu = [], []
        for i in range(k):
            t = torch.zeros(c.attn_dim, dtype=torch.float64)
            if c.intra != "none":
                for i2 in range(k):
                    t = t + hv[i][i2] * (p["Q1"].T @ v[i2])
            if c.inter:
                for j in range(n):
                    t = t + h_uv[i][j] * (p["Q2"].T @ u[j])
            lv.append(float(p["w_v"] @ torch.tanh(t)))
        for j in range(n):
            t = torch.zeros(c.attn_dim, dtype=torch.float64)
            if c.intra != "none":
                for j2 in range(n):
                    t = t + hu[j][j2] * (p["Q3"].T @ u[j2])
            if c.inter:
                for i in range(k):
                    t = t + h_vu[i][j] * (p["Q4"].T @ v[i])
            lu.append(float(p["w_u"] @ torch.tanh(t)))
        f, g = _softmax(lv, 1.0), _softmax(lu, 1.0)
    v_hat = sum(f[i] * v[i] for i in range(k))
    u_hat = sum(g[j] * u[j] for j in range(n))
    return cos(v_hat, u_hat) if c.norm_output else float(v_hat @ u_hat)


def _sig(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _lin(p, name, x):
    return p[f"{name}.weight"] @ x + p[f"{name}.bias"]


def _gru_states(p, xs):
    """torch.nn.GRU's equations, one step at a time: gates r, z, n in that order."""
    wi, wh, bi, bh = p["gru.weight_ih_l0"], p["gru.weight_hh_l0"], p["gru.bias_ih_l0"], p["gru.bias_hh_l0"]
    d = wh.shape[1]
    h, out = torch.zeros(d, dtype=torch.float64), []
    for x in xs:
        gi, gh = wi @ x + bi, wh @ h + bh
        r = _sig(gi[:d] + gh[:d])
        z = _sig(gi[d:2 * d] + gh[d:2 * d])
        n = torch.tanh(gi[2 * d:] + r * gh[2 * d:])
        h = (1 - z) * n + z * h
        out.append(h)
    return out


def _lstm_states(p, xs, sfx=""):
    """torch.nn.LSTM's equations (gates i, f, g, o), one direction, one step at a time."""
    wi, wh = p[f"lstm.weight_ih_l0{sfx}"], p[f"lstm.weight_hh_l0{sfx}"]
    b = p[f"lstm.bias_ih_l0{sfx}"] + p[f"lstm.bias_hh_l0{sfx}"]
    d = wh.shape[1]
    h, c, out = torch.zeros(d, dtype=torch.float64), torch.zeros(d, dtype=torch.float64), []
    for x in xs:
        g = wi @ x + wh @ h + b
        i, f, gg, o = _sig(g[:d]), _sig(g[d:2 * d]), torch.tanh(g[2 * d:3 * d]), _sig(g[3 * d:])
        c = f * c + i * gg
        h = o * torch.tanh(c)
        out.append(h)
    return out


def _sman_attend(p, name, xs, q, form="eq5"):
    """eq. 5-6 (and 9-10, 13-14, 16-17): h_m = tanh(W x_m ⊙ tanh(W_q q)), α = softmax_m(w_h · h_m);
    ``form="eq9"``: eq. 9 as printed, h_m = tanh(W x_m) ⊙ tanh(W_q q)."""
    qq = torch.tanh(_lin(p, f"{name}.query", q))
    w = p[f"{name}.logit.weight"][0]
    if form == "eq9":
        return _softmax([float(w @ (torch.tanh(_lin(p, f"{name}.key", x)) * qq)) for x in xs], 1.0)
    return _softmax([float(w @ torch.tanh(_lin(p, f"{name}.key", x) * qq)) for x in xs], 1.0)


def pool_grid(feats, pool):
    """The mean of each pool x pool block of a square raster-order grid (M, F) -> (M / pool², F), in
    raster order of the pooled grid, one cell at a time."""
    side = math.isqrt(len(feats))
    out = []
    for r in range(0, side, pool):
        for c in range(0, side, pool):
            out.append(sum(feats[(r + i) * side + (c + j)] for i in range(pool) for j in range(pool)) / pool ** 2)
    return torch.stack(out)


def sman_intra(cosines, m2, scale):
    """eq. 22 for one positive pair from its per-level cosines (the module's reading): 2 max[0, dist - m2],
    dist = Σ_k (1 - cos_k) (``scale="sum"``) or its mean over the K levels (``"per_level"``)."""
    dist = sum(1.0 - c for c in cosines)
    if scale == "per_level":
        dist = dist / len(cosines)
    return 2 * max(0.0, dist - m2)


def affine_words(layer, e):
    """A pretrained text side's word vectors from the transformer's token vectors ``e`` (n, H), one
    token at a time: s_j = W_p e_j + b_p (vlmatch.encoders.pretrained_text)."""
    w, b = layer.weight.detach().double(), layer.bias.detach().double()
    return [torch.stack([sum(w[r, i] * float(x[i]) for i in range(len(x))) + b[r] for r in range(len(b))])
            for x in e.double()]


def sman_pair(model, feats, tokens, e_tokens=None) -> dict:
    """SMAN of one pair from its inputs, the equations of vlmatch.models.sman as printed (float64).

    feats: (M, F) the valid regions in raster order; tokens: the caption's L word ids. With a pretrained
    text side, ``e_tokens`` are the transformer's token vectors (L, H) and S_l = W_p E_l + b_p replaces
    eq. 1. With ``grid_pool``, feats is the whole input grid, pooled here first. Returns the per-level
    cosines, both scores, the pair's intra-pair term (as a positive) and the four attention distributions."""
    c = model.cfg
    p = {k: v.detach().double() for k, v in model.state_dict().items()}
    img = [x.double() for x in (pool_grid(feats, c.grid_pool) if c.grid_pool > 1 else feats)]
    m = len(img)
    if e_tokens is not None:
        s = affine_words(model.words.proj, e_tokens)
    else:
        e = [p["embed.weight"][int(t)] for t in tokens]
        hf = _lstm_states(p, e)
        hb = _lstm_states(p, e[::-1], "_reverse")[::-1]
        s = [(hf[j] + hb[j]) * (0.5 if c.word_combine == "mean" else 1.0) for j in range(len(e))]  # eq. 1
    v0 = torch.tanh(_lin(p, "P0", sum(img) / m))  # eq. 2
    if c.location:
        v0 = v0 + sum(_gru_states(p, img)) / m  # eq. 3-4
    a1v = _sman_attend(p, "att_v1", img, v0)  # eq. 5-6
    v1 = torch.tanh(_lin(p, "P1", sum(a1v[i] * img[i] for i in range(m)) / m))  # eq. 7
    t0 = sum(s) / len(s)  # eq. 8
    a1t = _sman_attend(p, "att_t1", s, t0, c.word_attention)  # eq. 9-10
    t1 = sum(a1t[j] * s[j] for j in range(len(s)))  # eq. 11
    vs, ts, out = [v0, v1], [t0, t1], {"a1v": a1v, "a1t": a1t}
    if c.stacked:
        vh, th = _lin(p, "U_v", v0 + v1), _lin(p, "U_t", t0 + t1)  # eq. 12
        ov, ot = _sig(c.alpha * vh + (1 - c.alpha) * th), _sig(c.alpha * th + (1 - c.alpha) * vh)
        out["a2v"] = a2v = _sman_attend(p, "att_v2", img, ov)  # eq. 13-14
        vs.append(torch.tanh(_lin(p, "P2", sum(a2v[i] * img[i] for i in range(m)) / m)))  # eq. 15
        out["a2t"] = a2t = _sman_attend(p, "att_t2", s, ot)  # eq. 16-17
        ts.append(sum(a2t[j] * s[j] for j in range(len(s))))  # eq. 18
    out["cos"] = [cos(a, b) for a, b in zip(vs, ts, strict=True)]  # eq. 19
    out["sum"] = sum(out["cos"])  # eq. 20
    out["concat"] = cos(torch.cat(vs), torch.cat(ts))  # the paper's inference
    out["intra"] = sman_intra(out["cos"], c.intra_margin, c.intra_scale)  # eq. 22
    return out


def sman_matrix(model, feats, mask, tokens, lengths, key="sum", e=None):
    """(n_img, n_txt) of ``sman_pair(...)[key]`` (a function of the result when ``key`` is callable);
    ``e``: a pretrained text side's token vectors (n_txt, L, H)."""
    out = torch.zeros(len(feats), len(tokens), dtype=torch.float64)
    for a in range(len(feats)):
        f = feats[a] if mask is None else feats[a][mask[a]]
        for b in range(len(tokens)):
            n = int(lengths[b])
            r = sman_pair(model, f, tokens[b, :n], None if e is None else e[b, :n])
            out[a, b] = key(r) if callable(key) else r[key]
    return out


def mtfn_pair(Wa, Wb, wm, c, x, y, R, df):
    """sigmoid(W_m Σ_r (W_a^r x) ⊙ (W_b^r y) + c) for one pair (eq. 2-4, and eq. 6 with the text-text
    weights), every sum written out. Wa: (R·d_f, d_x) stacked rank maps, wm: (d_f,), x, y: projected vectors."""
    Wa, Wb, wm, x, y = (t.detach().double() for t in (Wa, Wb, wm, x, y))
    f = [0.0] * df
    for r in range(R):
        for k in range(df):
            row = r * df + k
            ax = sum(float(Wa[row, i]) * float(x[i]) for i in range(len(x)))
            by = sum(float(Wb[row, i]) * float(y[i]) for i in range(len(y)))
            f[k] += ax * by
    z = sum(float(wm[k]) * f[k] for k in range(df)) + float(c.detach())
    return 1.0 / (1.0 + math.exp(-z))


def mtfn_scores(model, feats, mask, tokens, lengths):
    """S_IT by the plain equations: v = mean of valid regions, t from the model's text encoder."""
    n_img = len(feats)
    out = torch.zeros(n_img, len(lengths), dtype=torch.float64)
    p = model.it
    for a in range(n_img):
        regions = feats[a] if mask is None else feats[a][mask[a]]
        v = sum(regions[i].double() for i in range(len(regions))) / len(regions)
        if model.cfg.input_norm == "l2":
            v = v / (float(v.norm()) + EPS)
        v_t = model.img_proj.weight.double() @ v + model.img_proj.bias.double()  # ṽ = W_v v
        for b in range(len(lengths)):
            t = model.text_features(tokens[b:b + 1, : int(lengths[b])], lengths[b:b + 1])[0].double()
            t_t = model.txt_proj.weight.double() @ t + model.txt_proj.bias.double()  # t̃ = W_t t
            out[a, b] = mtfn_pair(p.a.weight, p.b.weight, p.out.weight[0], p.out.bias[0], v_t, t_t,
                                  model.cfg.rank, model.cfg.fusion_dim)
    return out


def mtfn_caption_scores(model, tokens, lengths):
    n = len(lengths)
    out = torch.zeros(n, n, dtype=torch.float64)
    p = model.tt
    vecs = []
    for b in range(n):
        t = model.text_features(tokens[b:b + 1, : int(lengths[b])], lengths[b:b + 1])[0].double()
        vecs.append(model.tt_proj.weight.double() @ t + model.tt_proj.bias.double())
    for a in range(n):
        for b in range(n):
            out[a, b] = mtfn_pair(p.a.weight, p.b.weight, p.out.weight[0], p.out.bias[0], vecs[a], vecs[b],
                                  model.cfg.rank, model.cfg.fusion_dim)
    return out


# --- MMCA (Wei et al. 2020, §3) -----------------------------------------------------------------
def _affine(lin, x):
    return lin.weight @ x + lin.bias


def _layer_norm(ln, x):
    mu = sum(float(v) for v in x) / len(x)
    var = sum((float(v) - mu) ** 2 for v in x) / len(x)
    return (x - mu) / math.sqrt(var + ln.eps) * ln.weight + ln.bias


def _transformer_unit(unit, xs, valid):
    """Fig. 3 / eq. 1-4 for one token list ``xs`` (vectors); keys where ``valid`` is False are skipped."""
    h = unit.heads
    d = xs[0].shape[0]
    dk = d // h
    qs = [_affine(unit.wq, x) for x in xs]
    ks = [_affine(unit.wk, x) for x in xs]
    vs = [_affine(unit.wv, x) for x in xs]
    outs = []
    for t, x in enumerate(xs):
        heads = []
        for a in range(h):
            sl = slice(a * dk, (a + 1) * dk)
            logits = {s: float(qs[t][sl] @ ks[s][sl]) / math.sqrt(dk) for s in range(len(xs)) if valid[s]}
            m = max(logits.values())
            z = sum(math.exp(v - m) for v in logits.values())
            heads.append(sum(math.exp(logits[s] - m) / z * vs[s][sl] for s in logits))
        y = _layer_norm(unit.norm1, x + _affine(unit.wo, torch.cat(heads)))
        f = _affine(unit.ffn[2], torch.relu(_affine(unit.ffn[0], y)))
        outs.append(_layer_norm(unit.norm2, y + f))
    return outs


def _text_cnn(head, es):
    """Eq. 6-7 over the token vectors ``es``: windows from every position, zeros past the end."""
    n = len(es)
    qs = []
    for conv in head.convs:
        w = conv.weight.shape[2]
        best = None
        for k in range(n):
            acc = conv.bias.clone()
            for o in range(w):
                if k + o < n:
                    acc = acc + conv.weight[:, :, o] @ es[k + o]
            p = torch.relu(acc)
            best = p if best is None else torch.maximum(best, p)
        qs.append(best)
    c = _layer_norm(head.norm, _affine(head.fc, torch.cat(qs)))
    return c / (c.norm() + EPS)


def mmca_pair(model, feats, mask, e):
    """S = i0·c0 + α i1·c1 for one image (features (k, dim), region mask (k,)) and one caption given by
    its text-encoder outputs ``e`` (n, H) (valid tokens only)."""
    valid = [bool(v) for v in mask]
    r = [_affine(model.img_fc, o) for o in feats]
    rs = _transformer_unit(model.self_unit, r, valid)
    kept = [x for x, ok in zip(rs, valid, strict=True) if ok]
    i0 = sum(kept) / len(kept)
    i0 = i0 / (i0.norm() + EPS)
    es = list(e)
    c0 = _text_cnn(model.c0_head, es)
    s = float(i0 @ c0)
    if model.cfg.alpha == 0:
        return s
    w = [_affine(model.word_fc, x) for x in es]
    yc = _transformer_unit(model.cross_unit, r + w, valid + [True] * len(w))
    k = len(r)
    kept = [x for x, ok in zip(yc[:k], valid, strict=True) if ok]
    i1 = sum(kept) / len(kept)
    i1 = i1 / (i1.norm() + EPS)
    c1 = _text_cnn(model.c1_head, yc[k:])
    return s + model.cfg.alpha * float(i1 @ c1)


def mmca_word_region_attention(model, feats, mask, e):
    """MMCA's heat map of one pair as ``pair_attention`` defines it: for each word j of the caption (text-encoder
    outputs ``e`` (n, H), valid tokens only), the cross unit's softmax weights of word j's query over all valid
    tokens (regions and words, eq. 1-2), each head's kept on the regions, averaged over the heads and renormalised
    over the regions: a (k, n) list of lists (regions where ``mask`` is False get 0)."""
    unit = model.cross_unit
    r = [_affine(model.img_fc, o) for o in feats]
    w = [_affine(model.word_fc, x) for x in e]
    xs, valid = r + w, [bool(v) for v in mask] + [True] * len(w)
    h, k = unit.heads, len(r)
    dk = xs[0].shape[0] // h
    qs = [_affine(unit.wq, x) for x in xs]
    ks = [_affine(unit.wk, x) for x in xs]
    out = [[0.0] * len(w) for _ in range(k)]
    for j in range(len(w)):
        q = qs[k + j]
        mass = [0.0] * k
        for a in range(h):
            sl = slice(a * dk, (a + 1) * dk)
            logits = {s: float(q[sl] @ ks[s][sl]) / math.sqrt(dk) for s in range(len(xs)) if valid[s]}
            z = sum(math.exp(x) for x in logits.values())
            for i in range(k):
                if valid[i]:
                    mass[i] += math.exp(logits[i]) / z / h
        for i in range(k):
            out[i][j] = mass[i] / sum(mass)
    return out
