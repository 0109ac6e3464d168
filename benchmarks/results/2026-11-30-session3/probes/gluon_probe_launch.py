import gluon_mla as g


def launch(a, out, ml, lse, errors=None, NUM_STAGES=2, NUM_V=1, regs=(232, 40), maxnreg=168, **kw):
    q = a["q"]
    s_q, h_q, d_qk = q.shape
    return g.sparse_mla_ws_kernel[(s_q * (h_q // 64),)](
        q, a["kv"], a["indices"], a["q_scale"], a["kv_scale"], a["attn_sink"], a["topk_length"],
        errors, out, ml, lse, a["sm_scale"], a["kv"].shape[0], h_q, a["indices"].shape[2],
        D_QK=d_qk, HAS_TOPK_LENGTH=a["topk_length"] is not None,
        HAS_ATTN_SINK=a["attn_sink"] is not None, HAS_ERRORS=errors is not None,
        NUM_STAGES=NUM_STAGES, NUM_V=NUM_V, CONSUMER_REGS=regs[0], PRODUCER_REGS=regs[1],
        num_warps=4, maxnreg=maxnreg, **kw)


