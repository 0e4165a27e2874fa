"""The accuracy bench's miswired server, first on the CPU: the built recall model, decoded through
the native FP8 kernel (Triton's interpreter), answers right; decoded through the same kernel with
the bench's miswire diff applied (bench/accuracy/miswire-native-latent-block.diff), it answers
wrong. What the 'miswired' server on the GPU must show, here through the very kernel code it runs.

As in the server, the prompt is prefilled by another path (here the model's own attention over
the FP8-rounded rows; there FlashInfer on their cast), so the first answer token is right either
way; each later one is a decode step, whose attention the kernel computes in MLA's absorbed
form: q_nope through w_kc into the latent, scores against the cached 576-byte FP8 rows, the latent
output back through w_vc. Teacher-forced: every step sees the right earlier answer tokens.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import accuracy_bench as ab  # noqa: E402  (bench/accuracy)
import recall_build as rb  # noqa: E402
import recall_model as rm  # noqa: E402
import recall_task as task  # noqa: E402

from glmserve.selftest.runner import load_kernel_module  # noqa: E402
from glmserve.series.udiff import apply_file_patch, parse_patch  # noqa: E402

KERNEL = ab.REPO / "src" / "glmserve" / "kernels" / "fp8_mla_decode.py"
CONTEXT, QUERIES = 128, 2  # small: the interpreter runs every program of the grid in Python


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> rm.RecallModel:
    out = tmp_path_factory.mktemp("recall")
    rm.write_checkpoint(rb.build(31), out)
    return rm.read_checkpoint(out).float().eval()


def kernel(tmp_path, miswired: bool):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("Triton was imported before TRITON_INTERPRET=1 could be set")
    source = KERNEL.read_bytes()
    if miswired:
        (fp,) = parse_patch(ab.MISWIRE_DIFF.read_bytes(), ab.MISWIRE_DIFF.name)
        source = apply_file_patch(source, fp, ab.MISWIRE_DIFF.name)
    path = tmp_path / ("miswired" if miswired else "shipped") / "fp8_mla_decode.py"
    path.parent.mkdir(parents=True)
    path.write_bytes(source)
    module = load_kernel_module(path)
    # One merge program per (token, head) instead of eight: the same function (a tiling choice
    # of the merge, not of the stage the diff changes), at half the interpreter's time.
    module.MERGE_BLOCK_D = rm.KV_LORA
    return module


def decoded_answers(native, model: rm.RecallModel, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy tokens at the answer positions (B, VALUE_LEN): position n - 1 from the prefill,
    positions n .. n + VALUE_LEN - 2 from decode steps whose attention `native` computes."""
    b, t = ids.shape
    pos = torch.arange(t)
    steps = torch.arange(n, n + task.VALUE_LEN - 1)
    # Request (i, s): prompt i's decode step at position s, over that prompt's rows 0 .. s.
    lens = [int(s) + 1 for _ in range(b) for s in steps]
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    kv_indices = torch.cat(
        [torch.arange(i * t, i * t + int(s) + 1) for i in range(b) for s in steps]
    ).to(torch.int32)
    x = model.embed_tokens(ids)
    with torch.no_grad():
        for layer in model.layers:
            a = layer.self_attn
            hn = layer.input_layernorm(x)
            rows = a.cache_rows(hn, pos, fp8=True)  # the FP8 pool's values
            q = a.queries(hn, pos)
            k, v = a.keys_values(rows)
            attn = a.out(rm.attend(q, k, v))  # the prefill's view of every position
            w_kc, w_vc = a.absorbed()
            qs = q[:, :, steps].transpose(1, 2).reshape(-1, a.heads, rm.QK_DIM)
            q_lat = torch.einsum("thn,hnc->thc", qs[..., : rm.NOPE], w_kc)
            out = torch.empty(q_lat.shape, dtype=torch.bfloat16)
            native.mla_decode_fp8(
                q_lat.bfloat16().contiguous(),
                qs[..., rm.NOPE :].bfloat16().contiguous(),
                rows.reshape(b * t, 1, -1).to(torch.float8_e4m3fn),
                kv_indptr,
                kv_indices,
                rm.QK_DIM**-0.5,
                out,
            )
            o = torch.einsum("thc,hvc->thv", out.float(), w_vc).reshape(b, len(steps), -1)
            attn[:, steps] = a.o_proj(o)
            x = x + attn
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        logits = model.lm_head(model.norm(x)[:, n - 1 : n - 1 + task.VALUE_LEN])
    return logits.argmax(-1)


def test_the_bench_miswire_loses_through_the_kernel_and_the_shipped_kernel_does_not(
    model, tmp_path
) -> None:
    stacks, qs = task.bench_set(3, CONTEXT, 1, QUERIES)
    ids = torch.tensor([stacks[0].prompt(q.key) + list(q.answer) for q in qs])
    n = len(stacks[0].ids) + 2
    want = torch.tensor([q.answer for q in qs])

    shipped = decoded_answers(kernel(tmp_path, miswired=False), model, ids, n)
    assert torch.equal(shipped, want)

    miswired = decoded_answers(kernel(tmp_path, miswired=True), model, ids, n)
    assert torch.equal(miswired[:, 0], want[:, 0])  # the prefill's token: not the kernel's
    exact = task.score(miswired.tolist(), want.tolist()).accuracy
    assert exact < 0.5, miswired
    # every decode step is off, not one slip: the bench's bar holds with room to spare
    assert (miswired[:, 1:] != want[:, 1:]).float().mean() > 0.5
