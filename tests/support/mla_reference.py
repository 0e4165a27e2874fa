"""A plain MLA attention in fp32, the oracle the self-test's CPU tests hand to its runner in
place of FlashInfer (a test instrument: it never ships in the package)."""

from __future__ import annotations

from typing import Any

from glmserve.selftest.runner import CKV_DIM, Attention


def reference_mla_attention(torch: Any, sm_scale: float) -> Attention:
    """Plain MLA attention over page-size-1 slots, fp32 math (a test oracle, not FlashInfer)."""

    def attention(q_nope, q_pe, kv, kv_indptr, kv_indices, qo_indptr, causal):
        outs = []
        for b in range(len(kv_indptr) - 1):
            slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            rows = kv[slots, 0].float()
            ckv, kpe = rows[:, :CKV_DIM], rows[:, CKV_DIM:]
            qs = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            qn, qp = q_nope[qs].float(), q_pe[qs].float()
            logits = torch.einsum("thd,kd->thk", qn, ckv) + torch.einsum("thd,kd->thk", qp, kpe)
            logits = logits * sm_scale
            if causal:
                n_q, n_kv = qn.shape[0], rows.shape[0]
                pos_q = torch.arange(n_q)[:, None] + (n_kv - n_q)
                allowed = torch.arange(n_kv)[None, :] <= pos_q
                logits = logits.masked_fill(~allowed[:, None, :], float("-inf"))
            outs.append(torch.einsum("thk,kd->thd", logits.softmax(-1), ckv))
        return torch.cat(outs).to(q_nope.dtype)

    return attention
