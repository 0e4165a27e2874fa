#!/usr/bin/env python3
"""Train the recall model (bench/accuracy/recall_model.py) on the recall task, seeded, and write
the checkpoint SGLang serves.

    python bench/accuracy/recall_train.py --out DIR               # the lab GPU: a few minutes
    python bench/accuracy/recall_train.py --out DIR --smoke       # CPU: tiny steps, loss must fall

One joint loss, DeepSeek-V3 style: the target's next token on every answer token, plus the NextN
head's token after next, at draft depths 1..3 chained the way SGLang's EAGLE worker runs them
(--speculative-num-steps 3). Half the steps round the KV rows to FP8 e4m3 (straight-through),
as an FP8 pool stores them, so the model is as robust to FP8 KV as a served model must be.
Batches are drawn on the device in the task's layout (recall_task: unique keys, 8-token values
from per-slot alphabets, filler between records, queries at the end), at lengths that grow from
256 to 8,192 tokens. Prints a plan, the loss every --log-every steps, then the teacher-forced
exact-match accuracy of the finished model on the bench's own prompts (2k, 8k, 32k) and writes
DIR/train.json beside the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import recall_model as rm
import recall_task as task

L = task.VALUE_LEN
SEG = L + 3  # Q key v1..vL END
DEPTH_WEIGHTS = (1.0, 0.5, 0.3, 0.3)  # target, draft depth 1, 2, 3


def log(msg: str) -> None:
    print(f"[recall-train +{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


T0 = time.monotonic()


def draw_batch(
    gen: torch.Generator, batch: int, length: int, n_records: int, n_queries: int, device: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids (B, T), target (B, T): the token at p is an answer token to predict, region: the
    index of the first query). Same layout as recall_task.haystack + queries, drawn on device."""
    body = length - 1 - n_queries * SEG
    fillers = body - n_records * (L + 1)
    if fillers < 0 or n_records > task.N_KEYS or n_queries > n_records:
        raise ValueError(f"{n_records} records and {n_queries} queries do not fit {length}")

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    def randint(hi, *shape):
        return torch.randint(0, hi, shape, generator=gen, device=device)

    keys = task.KEY0 + rand(batch, task.N_KEYS).argsort(1)[:, :n_records]
    slots = torch.arange(L, device=device) * task.SYMBOLS
    values = task.VALUE0 + slots + randint(task.SYMBOLS, batch, n_records, L)
    records = torch.cat([keys[..., None], values], dim=-1)  # (B, N, L+1)
    # random order of N records and F single filler tokens; each item's start in the body
    order = rand(batch, n_records + fillers).argsort(1)
    is_rec = order < n_records
    sizes = torch.where(is_rec, L + 1, 1)
    starts = sizes.cumsum(1) - sizes
    # record r sits where the shuffle put item r (no boolean indexing: no host sync per step)
    rec_start = starts.gather(1, order.argsort(1)[:, :n_records])
    ids_body = task.FILLER0 + randint(task.N_FILLERS, batch, body)
    where = rec_start[..., None] + torch.arange(L + 1, device=device)
    ids_body.scatter_(1, where.view(batch, -1), records.view(batch, -1))
    pick = rand(batch, n_records).argsort(1)[:, :n_queries]
    asked = records.gather(1, pick[..., None].expand(-1, -1, L + 1))  # (B, M, L+1)
    q = torch.full((batch, n_queries, 1), task.QUERY_ID, device=device)
    end = torch.full((batch, n_queries, 1), task.END_ID, device=device)
    segs = torch.cat([q, asked, end], dim=-1).view(batch, -1)
    bos = torch.full((batch, 1), task.BOS, device=device)
    ids = torch.cat([bos, ids_body, segs], dim=1)
    region = 1 + body
    # targets: every value and END token of a segment, and each Q after the first
    seg_target = torch.ones(SEG, dtype=torch.bool, device=device)
    seg_target[1] = False  # the key is the question, not predictable
    target = torch.zeros_like(ids, dtype=torch.bool)
    target[:, region:] = seg_target.repeat(n_queries)
    target[:, region] = False  # the first Q
    return ids, target, region


def loss_of(model, ids, target, region, fp8: bool, chain: int):
    logits, drafts = model(ids, fp8=fp8, chain=chain, region=region)
    lo = ids.shape[1] - logits.shape[1]  # logits at positions lo.. predict ids[lo + 1 ..]
    terms = [_ce(logits[:, :-1], ids[:, lo + 1 :], target[:, lo + 1 :])]
    for lg, pos in drafts:
        # positions run to T - 2; the last one's target (ids[T]) does not exist
        tpos = pos[:-1] + 2
        terms.append(_ce(lg[:, :-1], ids[:, tpos], target[:, tpos]))
    total = sum(w * t for w, t in zip(DEPTH_WEIGHTS, terms, strict=False))
    return total, terms


def _ce(logits, labels, mask):
    """Mean cross-entropy over the masked positions (weights, not indexing: no host sync)."""
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none"
    )
    m = mask.reshape(-1).float()
    return (ce * m).sum() / m.sum().clamp(min=1.0)


# ---------------------------------------------------------------- schedule


class Schedule:
    """Stages of growing length: short sequences first (the mechanism forms fast there), then
    long ones with up to 1,000 records (the distractor counts of the 8k and 32k prompts).
    By time (the default on the GPU: each stage a share of --budget-s, cosine learning rate over
    the budget, so a slower GPU trains fewer steps of the same schedule) or by steps (--steps:
    the same run on any machine, e.g. the CPU smoke)."""

    def __init__(
        self, lengths: list[int], shares: list[float], lr: float, budget_s: float, steps: int
    ):
        self.lengths, self.lr, self.budget_s, self.steps = lengths, lr, budget_s, steps
        total = sum(shares)
        self.bounds = [sum(shares[: i + 1]) / total for i in range(len(shares))]

    def progress(self, step: int, elapsed_s: float) -> float:
        return step / self.steps if self.steps else elapsed_s / self.budget_s

    def length(self, progress: float) -> int:
        for bound, length in zip(self.bounds, self.lengths, strict=True):
            if progress < bound:
                return length
        return self.lengths[-1]

    def rate(self, progress: float) -> float:
        warm = 0.03
        if progress < warm:
            return self.lr * max(progress / warm, 0.01)
        x = min(1.0, (progress - warm) / (1 - warm))
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * x)))


def stage_batch(length: int, tokens: int) -> int:
    return max(1, tokens // length)


def draw_shape(rng, length: int, smoke: bool, progress: float) -> tuple[int, int]:
    """(records, queries) for one step. Few records make the copy pay off before the key match
    exists (attending to every value of the wanted slot already narrows the answer to N
    candidates), so the first tenth of training keeps N <= 8; after that half the steps draw N
    log-uniformly from 2 (easy, strong signal) and half uniformly from the top 80 % of what fits
    (the bench's densities: up to 1,000 records, as its 32k prompts hold). Each step asks about
    min(N, 16) records (4 in the smoke)."""
    ask = 4 if smoke else 16
    most = max(2, min(1000, (length - 1 - ask * SEG) // (L + 1)))
    if progress < 0.1:
        most = min(most, 8)
    if rng.random() < 0.5:
        n = round(math.exp(rng.uniform(math.log(2), math.log(most))))
    else:
        n = int(rng.integers(max(2, int(0.2 * most)), most + 1))
    n = max(2, min(n, most))
    return n, min(n, ask)


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model, contexts, seed: int, haystacks: int, queries: int, device: str, miswire: str = ""
) -> dict:
    """Teacher-forced exact match on recall_task.bench_set prompts: all VALUE_LEN argmaxes right
    is exactly what a greedy decode of the same weights returns. Also the NextN depth-1 hit
    rate on the answer tokens (what the first draft token of MTP can reach)."""
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
                with torch.autocast(
                    device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"
                ):
                    n = len(stack.ids) + 2
                    logits, _, _ = model.target(ids, fp8=False, miswire=miswire, logits_from=n - 1)
                pred = logits[:, :L].argmax(-1).tolist()
                answers += pred
                if not miswire:
                    draft_hits_chunk, n_chunk = _draft_hits(model, ids, n, device)
                    draft_hits += draft_hits_chunk
                    draft_n += n_chunk
        s = task.score(answers, [q.answer for q in qs])
        out[str(ctx)] = {
            **s.as_dict(),
            **({"draft1_token_accuracy": draft_hits / draft_n} if draft_n else {}),
        }
    model.train()
    return out


def _draft_hits(model, ids, n, device) -> tuple[int, int]:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        _, drafts = model(ids, fp8=False, chain=1, region=n)
    lg, pos = drafts[0]
    # depth 1 at j predicts ids[j + 2]: answer tokens 2..L sit at n+1 .. n+L-1
    j = torch.arange(n - 1, n + L - 2, device=ids.device)
    pred = lg[:, j - pos[0]].argmax(-1)
    return int((pred == ids[:, j + 2]).sum()), pred.numel()


# ---------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="checkpoint folder")
    p.add_argument("--smoke", action="store_true", help="CPU smoke: tiny steps, loss must fall")
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--steps", type=int, default=0, help="fixed steps (default: --budget-s of time)")
    p.add_argument("--budget-s", type=float, default=150.0, help="training time (without --steps)")
    p.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    p.add_argument(
        "--shares", default="0.15,0.2,0.2,0.15,0.15,0.15", help="time (or steps) per length"
    )
    p.add_argument("--tokens", type=int, default=65536, help="tokens per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--chain", type=int, default=3, help="draft depths trained (EAGLE steps)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-contexts", default="2048,8192,32768")
    p.add_argument("--eval-haystacks", type=int, default=2)
    p.add_argument("--eval-queries", type=int, default=32)
    p.add_argument("--bench-seed", type=int, default=1, help="the bench's prompt seed")
    a = p.parse_args(argv)
    if a.smoke:
        a.steps, a.tokens, a.lengths, a.shares = a.steps or 40, 384, "128", "1"
        a.lr = 5e-3
        a.eval_contexts, a.eval_haystacks, a.eval_queries = "256", 1, 8
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    import numpy as np

    torch.manual_seed(a.seed)
    gen = torch.Generator(device=device).manual_seed(a.seed)
    gen_py = np.random.default_rng(a.seed)
    # The smoke keeps the latent shapes (the FP8 rows, kv_b_proj) but one head and a narrow
    # residual: it proves the loop, the export and that the loss falls, in seconds on a CPU.
    shape = rm.SMOKE_SHAPE if a.smoke else rm.Shape()
    model = rm.RecallModel(shape).to(device)
    lengths = [int(x) for x in a.lengths.split(",")]
    shares = [float(x) for x in a.shares.split(",")]
    sched = Schedule(lengths, shares, a.lr, a.budget_s, a.steps)
    what = f"{a.steps} steps" if a.steps else f"{a.budget_s:.0f} s"
    log(f"plan: {what} on {device}, lengths " + ", ".join(
        f"{n} (batch {stage_batch(n, a.tokens)}, {100 * f / sum(shares):.0f} %)" for n, f in zip(lengths, shares, strict=True))
        + f"; {rm.size_report(shape)['bf16_bytes'] / 1e6:.1f} MB of bf16 weights")  # fmt: skip
    decay = [p_ for n, p_ in model.named_parameters() if p_.dim() >= 2 and "embed" not in n]
    rest = [p_ for n, p_ in model.named_parameters() if not (p_.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.98), fused=device == "cuda",
    )  # fmt: skip
    history, step = [], 0
    t_train = time.monotonic()
    while True:
        done = sched.progress(step, time.monotonic() - t_train)
        if done >= 1.0:
            break
        length = sched.length(done)
        n_rec, n_q = draw_shape(gen_py, length, a.smoke, done)
        ids, target, region = draw_batch(
            gen, stage_batch(length, a.tokens), length, n_rec, n_q, device
        )
        fp8 = bool(step % 2)
        for g in opt.param_groups:
            g["lr"] = sched.rate(done)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss, parts = loss_of(model, ids, target, region, fp8, a.chain)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.log_every == 0:
            parts = [t.item() for t in parts]
            history.append({"step": step, "length": length, "loss": loss.item(), "parts": parts})
            log(f"step {step} ({100 * done:.0f} %) len {length} records {n_rec}: loss {loss.item():.4f} "
                f"(target {parts[0]:.3f}, drafts " + " ".join(f"{x:.3f}" for x in parts[1:]) + ")")  # fmt: skip
        step += 1
    train_s = time.monotonic() - t_train
    out = Path(a.out)
    files = rm.write_checkpoint(model.to("cpu").to(torch.float32), out)
    model.to(device)
    log(f"wrote {', '.join(f.name for f in files)} to {out} after {train_s:.0f} s of training")
    contexts = [int(x) for x in a.eval_contexts.split(",")]
    acc = evaluate(model, contexts, a.bench_seed, a.eval_haystacks, a.eval_queries, device)
    for ctx, r in acc.items():
        log(f"torch reference, context {ctx}: exact {r['accuracy']:.3f}, tokens "
            f"{r['token_accuracy']:.3f}, draft depth 1 {r.get('draft1_token_accuracy', 0):.3f}")  # fmt: skip
    report = {
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "seed": a.seed,
        "steps": step,
        "schedule": {
            "lengths": a.lengths,
            "shares": a.shares,
            "budget_s": a.budget_s,
            "steps": a.steps,
            "tokens_per_step": a.tokens,
            "lr": a.lr,
        },
        "train_s": round(train_s, 1),
        "history": history,
        "eval": acc,
    }
    (out / "train.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
