"""The recall model's accuracy in plain torch (no server): teacher-forced exact match on the
bench's own prompts, and the NextN head's first draft step on the answer tokens. The CPU tests
and recall_build.py --check use it; the servers' numbers come from accuracy_bench.py."""

from __future__ import annotations

import recall_task as task
import torch

L = task.VALUE_LEN


@torch.no_grad()
def evaluate(
    model, contexts, seed: int, haystacks: int, queries: int, device: str, miswire: str = ""
) -> dict:
    """Per context: exact match (all VALUE_LEN argmaxes right is what a greedy decode of the
    same weights returns), token accuracy, and the NextN depth-1 hit rate on the answer tokens
    (what the first draft token of MTP can reach). `miswire`: RecallModel.target's modes."""
    model.eval()
    out = {}
    for ctx in contexts:
        stacks, qs = task.bench_set(seed, ctx, haystacks, queries)
        answers, draft_hits, draft_n = [], 0, 0
        for h, stack in enumerate(stacks):
            mine = [q for q in qs if q.haystack == h]
            for i in range(0, len(mine), 8):
                chunk = mine[i : i + 8]
                ids = torch.tensor(
                    [stack.prompt(q.key) + list(q.answer) for q in chunk], device=device
                )
                n = len(stack.ids) + 2
                with torch.autocast(
                    device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"
                ):
                    logits, _, _ = model.target(ids, fp8=False, miswire=miswire, logits_from=n - 1)
                answers += logits[:, :L].argmax(-1).tolist()
                if not miswire:
                    hits, count = _draft_hits(model, ids, n, device)
                    draft_hits += hits
                    draft_n += count
        s = task.score(answers, [q.answer for q in qs])
        out[str(ctx)] = {
            **s.as_dict(),
            **({"draft1_token_accuracy": draft_hits / draft_n} if draft_n else {}),
        }
    return out


def _draft_hits(model, ids, n, device) -> tuple[int, int]:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        _, drafts = model(ids, fp8=False, chain=1, region=n)
    lg, pos = drafts[0]
    # depth 1 at j predicts ids[j + 2]: answer tokens 2..L sit at n+1 .. n+L-1
    j = torch.arange(n - 1, n + L - 2, device=ids.device)
    pred = lg[:, j - pos[0]].argmax(-1)
    return int((pred == ids[:, j + 2]).sum()), pred.numel()
