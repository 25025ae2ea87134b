"""Inference engineering (lab 12): its fast paths against the plain labs, PyTorch and the
machine's own limits, in one run.

    uv run --extra torch python benchmarks/bench_inference.py [--threads N] [--seq 1024]
        [--prompt 32] [--new-tokens 32] [--streams 8] [--repeats 7] [--k 3] [--prompts 6]
        [--windows 64] [--only forward,decoding,speculative,int8]

Five measurements, each a table of its contestants, their ratios and the targets:

1. Forward pass of GPT-2 small's shape (random weights, float32, batch 1) at ``--seq``
   tokens: lab 12's fast forward, lab 04's plain forward and HuggingFace's
   ``GPT2LMHeadModel`` on PyTorch (CPU); beside them the forward's matrix products alone,
   back to back in NumPy (what OpenBLAS allows before any other work), and the rest of its
   work alone (``forward_other_work``: softmax, GELU, norms, biases, residuals at their
   fewest passes), whose sum is the least a NumPy forward takes. The fast forward runs twice:
   writing its logits into an array kept from call to call (``out=``, as the products alone
   write theirs) and into a fresh one. Target: the fast forward ≤ 0.9× PyTorch's time.
2. Single-stream cached decoding of GPT-2 small (greedy, ``--new-tokens`` after a
   ``--prompt``-token prompt): lab 12's decoder with one stream, lab 06's ``generate``, the
   decoder's own products alone (``common.matvecs_run`` with ``prefill``: its prefill's,
   then one row per step), the mat-vec products of the steps alone and the
   memory-bandwidth bound (``common.bandwidth_runs``). Target: ≥ 85% of its products alone.
3. Batched decoding: ``--streams`` requests in lab 12's ``BatchedDecoder``, aggregate
   tokens/s, against the single stream (≥ 5×), the single-stream bandwidth bound (past it)
   and HuggingFace ``generate()`` on the same batch (≥ 2×); beside them the batch's own
   products alone (one prefill of every prompt, then steps of ``--streams`` rows), whose
   ratio to one stream's is the most batching can give with these BLAS products. Every
   stream's tokens are checked against lab 06's ``generate`` of that prompt alone.
4. Speculative decoding on the kit's trained pair (target ``gptkit/data/shakespeare_bpe``,
   draft ``gptkit/data/shakespeare_bpe_draft``), greedy, after prompts of held-out
   Shakespeare: ``speculative_greedy`` with the draft model and with prompt lookup (``--k``
   proposals per round), and plain cached decoding (lab 06). Target: ≥ 1.5× plain
   decoding's tokens/s with identical tokens; the acceptance rate is printed, and beside
   it the most that the measured acceptance and the draft's cost per step allow.
5. Weight-only int8 (``quantize_model``, the tied head too): the weights' bytes against
   float32 (3.5–4× smaller), GPT-2 small's one-stream decoding in lab 12's decoder against
   float32 (no speed target: NumPy has no int8 product), with the products alone of each,
   the trained model's perplexity on held-out Shakespeare (within 1%), and at 1, 2 and
   ``--threads`` threads the best NumPy can do: the block matrices dequantised tile by tile
   into a cache-sized buffer per thread, against float32, and the dequantisation alone,
   whose time bounds any NumPy int8 product (``--only tiles`` runs these rows alone).

Sections 1–3 run at 1 thread, 2 threads and ``--threads`` (``common.thread_counts``; the
environment variable ``BENCH_COUNTS`` picks others), NumPy's BLAS, lab 12's ``RowPool``
and PyTorch at the same count, the forward with lab 12's ``threaded_forward`` and the other
work in the pool beside the one-thread contestants; then one scaling table of their
ratios, with the targets for 16 threads (threaded forward ≤ 1.6× PyTorch, its other work
≤ 0.4× PyTorch's forward, one stream ≥ 85% of its products, 8 streams ≥ 1.0× HuggingFace)
and for 2 (the other work in the pool ≤ 0.6× its one-thread time). ``--only`` picks
sections: forward, decoding, speculative, int8, tiles.

The code is the reference's (solutions/). NumPy's BLAS and PyTorch use the same
``--threads`` (default: every core). Timed runs take turns (``common.time_runs``: a warm-up
call each, then the best of ``--repeats``), so the machine's load weighs on all alike. On the
kit's 2-core machine one contestant's repeated runs vary by a tenth and more, while the
targets and bounds differ by a few percent: the best of seven (the default) estimates each
run's undisturbed time far more steadily than the best of three; the int8 section, whose
decoder runs take seconds and whose speed target is bounded far away, takes at most three.
This script prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (sets the BLAS threads before NumPy loads)

THREADS = common.set_threads(sys.argv)

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

DATA = common.ROOT / "gptkit" / "data"
TARGET, DRAFT = DATA / "shakespeare_bpe", DATA / "shakespeare_bpe_draft"
CORPUS = common.ROOT / "labs" / "07_training" / "data" / "shakespeare.txt"
HELD_OUT = 0.92  # the text after this fraction is held out: both models train on the first 90 % of the tokens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=THREADS, help="BLAS and torch threads (default: all cores)")
    p.add_argument("--seq", type=int, default=1024, help="tokens in the forward pass (default 1024)")
    p.add_argument("--prompt", type=int, default=32, help="GPT-2 small's prompt length (default 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens each GPT-2 small stream generates (default 32)")
    p.add_argument("--streams", type=int, default=8, help="streams in the batched decoder (default 8)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs of each contestant (the best counts; default 7)")
    p.add_argument("--k", type=int, default=3, help="tokens proposed per speculative round (default 3)")
    p.add_argument("--prompts", type=int, default=6, help="held-out prompts for speculative decoding (default 6)")
    p.add_argument("--windows", type=int, default=64, help="held-out 64-token windows for perplexity (default 64)")
    p.add_argument("--only", default="", help="comma-separated sections to run: forward, decoding, speculative, "
                                              "int8, or tiles (int8's scaling rows alone) (default: all but tiles)")
    return p.parse_args()


def check(name: str, shown: str, goal: str, met: bool) -> None:
    """One target line: the value, the target and whether it is met."""
    print(f"- {name}: {shown} (target {goal}: {'met' if met else 'NOT met'})")


def seconds_table(times: dict, base: str, what: str) -> None:
    """Each run's seconds and its time ÷ ``base``'s."""
    common.print_table(["run", "seconds", f"÷ {what}"],
                       [[name, f"{t:.3f}", f"{t / times[base]:.2f}"] for name, t in times.items()])


# -- 1. the forward pass ---------------------------------------------------------------------------

def forward_products(model, T: int):
    """The forward pass's matrix products alone at T tokens, each written into an array made
    beforehand (``out=``): every Linear as one (T, in) @ (in, out) product, attention's
    scores and weighted sums per head over the causal half (query blocks of 128, each
    against the keys up to its end), the tied head. The most OpenBLAS allows a NumPy
    forward."""
    D, H = model.d_model, model.h[0].attn.num_heads
    d = D // H
    rows = {w.shape[0]: np.ones((T, w.shape[0]), np.float32) for b in model.h
            for w in (b.attn.c_attn.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)}
    outs = {w.shape: np.empty((T, w.shape[1]), np.float32) for b in model.h
            for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight)}
    q = np.ones((H, T, d), np.float32)
    kt = np.ones((H, d, T), np.float32)
    scores, weighted = np.empty((H, 128, T), np.float32), np.empty((H, 128, d), np.float32)
    head = model.wte.weight.T
    x = np.ones((T, D), np.float32)
    logits = np.empty((T, head.shape[1]), np.float32)
    blocks = [(s, min(s + 128, T)) for s in range(0, T, 128)]

    def products():
        for b in model.h:
            for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight, b.mlp.c_proj.weight):
                np.matmul(rows[w.shape[0]], w, out=outs[w.shape])
            for s, e in blocks:
                w = np.matmul(q[:, s:e], kt[:, :, :e], out=scores[:, : e - s, :e])  # (H, e-s, e)
                np.matmul(w, q[:, :e], out=weighted[:, : e - s])
        np.matmul(x, head, out=logits)

    return products


def forward_other_work(model, T: int, inference):
    """The forward pass's work other than its matrix products, alone, at T tokens, each at
    its fewest NumPy passes on arrays made beforehand: per block, the softmax over the
    causal half of the scores (subtract each row's max, exp in place, the row sums), lab
    12's ``fast_gelu`` on c_fc's output, the two LayerNorms (lab 12's ``_layer_norm``), the
    four biases and the two residual additions; then the final LayerNorm. No tiling, no
    masking, no copies: what any NumPy forward does beside its products, at the least."""
    D, H = model.d_model, model.h[0].attn.num_heads
    half = np.ones((H, T, (T + 1) // 2), np.float32)  # as many scores as the causal half holds
    hidden, x, y = np.ones((T, 4 * D), np.float32), np.ones((T, D), np.float32), np.ones((T, D), np.float32)
    qkv = np.ones((T, 3 * D), np.float32)
    ln = model.h[0].ln_1

    def other():
        for b in model.h:
            np.subtract(half, half.max(axis=-1, keepdims=True), out=half)
            np.exp(half, out=half)
            half.sum(axis=-1)
            inference.fast_gelu(hidden)
            inference._layer_norm(x, ln), inference._layer_norm(x, ln)
            for out, bias in ((qkv, b.attn.c_attn.bias), (y, b.attn.c_proj.bias), (hidden, b.mlp.c_fc.bias),
                              (y, b.mlp.c_proj.bias), (x, y), (x, y)):
                np.add(out, bias, out=out)
        inference._layer_norm(x, model.ln_f)

    return other


def forward_other_work_threaded(model, T: int, inference, pool):
    """``forward_other_work`` over the row blocks of ``pool`` (lab 12's ``RowPool``, BLAS at
    one thread inside): each block of rows gets its softmax, GELU, LayerNorms, biases and
    residual additions, the same passes as the one-thread version, one pool call per kind."""
    D, H = model.d_model, model.h[0].attn.num_heads
    half = np.ones((H * T, (T + 1) // 2), np.float32)
    hidden, x, y = np.ones((T, 4 * D), np.float32), np.ones((T, D), np.float32), np.ones((T, D), np.float32)
    qkv = np.ones((T, 3 * D), np.float32)
    ln = model.h[0].ln_1

    def softmax(a, b):
        rows = half[a:b]
        np.subtract(rows, rows.max(axis=-1, keepdims=True), out=rows)
        np.exp(rows, out=rows)
        rows.sum(axis=-1)

    def rest(bias):
        def rows(a, b):
            inference.fast_gelu(hidden[a:b])
            inference._layer_norm(x[a:b], ln), inference._layer_norm(x[a:b], ln)
            for out, add in ((qkv, bias[0]), (y, bias[1]), (hidden, bias[2]), (y, bias[3]), (x, y[a:b]), (x, y[a:b])):
                np.add(out[a:b], add, out=out[a:b])
        return rows

    def other():
        for b in model.h:
            pool.map(softmax, H * T)
            pool.map(rest((b.attn.c_attn.bias, b.attn.c_proj.bias, b.mlp.c_fc.bias, b.mlp.c_proj.bias)), T)
        pool.map(lambda a, b: inference._layer_norm(x[a:b], model.ln_f), T)

    return other


def cpu_times(runs: dict, repeats: int) -> dict:
    """``{name: fn}`` → ``{name: the least CPU time of one call}``: the process's CPU time
    (every thread's, ``time.process_time``) over each call, the runs taking turns for
    ``repeats`` rounds. Beside a wall-clock time it tells a thread pool's own cost from a
    core it did not get: a pool that adds no work uses about the CPU time of one thread,
    and is then as fast as its cores were free."""
    import time

    best = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.process_time()
            fn()
            best[name] = min(best.get(name, float("inf")), time.process_time() - start)
    return best


def bench_forward(args, model, hf, inference, threads: int, pool) -> dict:
    import torch

    T = args.seq
    ids = np.random.default_rng(T).integers(0, model.vocab_size, (1, T))
    t_ids = torch.from_numpy(ids)

    def pytorch():
        with torch.inference_mode():
            return hf(t_ids).logits.numpy()

    kept = np.empty((1, T, model.vocab_size), np.float32)  # the logits' array, kept from call to call
    kept_threaded = np.empty_like(kept)
    fast_kept, fast_fresh = "lab 12 fast forward, logits into a kept array", "lab 12 fast forward, fresh logits"
    threaded = f"lab 12 threaded forward (RowPool({threads})), logits into a kept array"
    times, outputs = common.time_runs({
        "PyTorch (HuggingFace GPT2LMHeadModel)": (pytorch, args.repeats),
        fast_kept: (lambda: inference.fast_forward(model, ids, out=kept), args.repeats),
        threaded: (lambda: inference.threaded_forward(model, ids, pool, out=kept_threaded), args.repeats),
        fast_fresh: (lambda: inference.fast_forward(model, ids), args.repeats),
        "lab 04 plain forward": (lambda: model(ids), args.repeats),
        common.PROBE + "products alone": (forward_products(model, T), args.repeats),
        common.PROBE + "other work alone": (forward_other_work(model, T, inference), args.repeats),
        common.PROBE + "other work threaded": (forward_other_work_threaded(model, T, inference, pool), args.repeats)})
    cpu = cpu_times({"one": forward_other_work(model, T, inference),
                     "pool": forward_other_work_threaded(model, T, inference, pool)}, args.repeats)
    times["the products alone (NumPy)"] = times.pop(common.PROBE + "products alone")
    times["the other work alone (NumPy, one thread)"] = times.pop(common.PROBE + "other work alone")
    times[f"the other work alone, RowPool({threads})"] = times.pop(common.PROBE + "other work threaded")
    print(f"### Forward pass, GPT-2 small, T = {T}, batch 1, {common.threads(threads)}")
    print()
    base = "PyTorch (HuggingFace GPT2LMHeadModel)"
    seconds_table(times, base, "PyTorch")
    fast, fresh = times[fast_kept] / times[base], times[fast_fresh] / times[base]
    plain = times["lab 04 plain forward"] / times[base]
    alone = times["the products alone (NumPy)"] / times[base]
    diff = max(float(np.abs(outputs[k] - outputs[base]).max()) for k in (fast_kept, fast_fresh, threaded,
                                                                          "lab 04 plain forward"))
    check("lab 12 fast forward ÷ PyTorch, logits into a kept array", f"{fast:.2f}×", "≤ 0.9×", fast <= 0.9)
    print(f"  - with a fresh logits array per call: {fresh:.2f}× (a ({T}, {model.vocab_size}) float32 array is "
          f"{kept.nbytes / 1e6:.0f} MB of new memory, every page of it faulted in and zeroed by the kernel; "
          "PyTorch makes its logits afresh too)")
    print(f"- lab 04 plain forward ÷ PyTorch: {plain:.2f}×; the products alone ÷ PyTorch: {alone:.2f}×"
          f" (the fast forward spends {100 * times['the products alone (NumPy)'] / times[fast_kept]:.0f}%"
          " of its time in them)")
    other1, otherN = times["the other work alone (NumPy, one thread)"], times[f"the other work alone, RowPool({threads})"]
    print(f"- lab 12 threaded forward ÷ PyTorch: {times[threaded] / times[base]:.2f}×; the other work alone ÷ "
          f"PyTorch's whole forward: {other1 / times[base]:.2f}× on one thread, {otherN / times[base]:.2f}× in "
          f"RowPool({threads}) ({otherN / other1:.2f}× its one-thread time; its CPU time, every thread's, "
          f"{cpu['pool'] / cpu['one']:.2f}× the one thread's, load average {os.getloadavg()[0]:.1f})")
    floor = (times["the products alone (NumPy)"] + min(other1, otherN)) / times[base]
    print(f"- the products alone and the other work alone together ÷ PyTorch: {floor:.2f}× (the least a NumPy "
          "forward can take here, each part at its fewest passes with nothing between them, into arrays made "
          "beforehand)")
    print(f"- largest |Δ logit| against PyTorch: {diff:.2e}")
    print()
    return {"fast": fast, "fresh": fresh, "plain": plain, "floor": floor, "threaded": times[threaded] / times[base],
            "alone": alone, "other": other1 / times[base], "other_pool": otherN / times[base],
            "other_scaling": otherN / other1, "other_cpu": cpu["pool"] / cpu["one"], "load": os.getloadavg()[0]}


# -- 2 and 3. single-stream and batched decoding --------------------------------------------------

def serve(inference, model, streams: int, n: int):
    """A run maker: lab 12's ``BatchedDecoder`` with ``streams`` slots, built once, as a server
    builds its engine, and reused by every run: ``run(prompts)`` submits each prompt (T,) for
    ``n`` greedy tokens and returns their tokens in order. A fresh decoder would pay for its
    cache's memory in every run: NumPy asks the kernel for huge pages for large arrays, and
    writing the first positions of every slot and head touches the whole (B, H, L, d_head)
    buffers (about 0.5–1.7 s for GPT-2 small's 8 slots, on this machine)."""
    decoder = inference.BatchedDecoder(model, max_batch=streams)

    def make(prompts):
        def run():
            ids = [decoder.submit(p, n) for p in prompts]
            done = decoder.run()
            return [done[i] for i in ids]
        return run

    return make


def bench_decoding(args, model, hf, inference, generation, threads: int) -> dict:
    import stripped

    n, T, S = args.new_tokens, args.prompt, args.streams
    matrices = [w for b in model.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight,
                                             b.mlp.c_proj.weight)] + [model.wte.weight.T]
    prompts = np.random.default_rng(7).integers(0, model.vocab_size, (S, T))

    def batched(rows):
        run = serve(inference, model, len(rows), n)(rows)
        return lambda: np.stack(run())

    single_name, batch_name = "lab 12 decoder, 1 stream", f"lab 12 BatchedDecoder, {S} streams"
    hf_name = f"HuggingFace generate(), batch {S}"
    times, outputs = common.time_runs({
        "lab 06 generate (KV cache), 1 stream": (lambda: generation.generate(model, prompts[:1], n, temperature=0),
                                                 args.repeats),
        single_name: (batched(prompts[:1]), args.repeats),
        common.STRIPPED: (lambda: stripped.gpt2_generate(model, prompts[:1], n, generation), args.repeats),
        batch_name: (batched(prompts), args.repeats),
        hf_name: (common.hf_greedy(hf, prompts, n), args.repeats),
        **common.bandwidth_runs(args.repeats),
        **common.matvecs_run(matrices, n, args.repeats),
        # the decoders' own products: the prompts' prefill in one pass, then steps of 1 or S rows
        **common.matvecs_run(matrices, n, args.repeats, prefill=T - 1, name="one"),
        **common.matvecs_run(matrices, n, args.repeats, rows=S, prefill=S * (T - 1), name="batch")})
    print(f"### Decoding GPT-2 small: one stream and {S} streams, {common.threads(threads)}")
    print()
    print(f"{n} new tokens per stream after {T}-token prompts, greedy; tokens/s counts every stream's new tokens.")
    print()
    read_per_token = weight_bytes(model) - model.wpe.weight.nbytes
    one_alone, batch_alone = "products alone, 1 stream (prefill and steps)", f"products alone, {S} streams"
    times[one_alone] = times.pop(common.PROBE + "one")
    batch_times = {k: times.pop(k) for k in (batch_name, hf_name)}
    batch_times[batch_alone] = times.pop(common.PROBE + "batch")
    speed, bound = common.print_speeds_and_bound(times, n, read_per_token, "every parameter but the position table")
    for k, t in batch_times.items():
        speed[k] = S * n / t
    print()
    common.print_table(["run (all streams)", "seconds", "tokens/s"],
                       [[k, f"{t:.2f}", f"{speed[k]:.1f}"] for k, t in batch_times.items()])
    print()
    print(f"The products alone are the decoder's own matrix products, back to back, nothing else: the prefill "
          f"({T - 1} prompt tokens per stream, the head included, in one product per matrix) and {n} steps of 1 or "
          f"{S} rows. {S} rows cost more than one: OpenBLAS computes a product of a few rows at a fraction of its "
          f"peak, so batching can give at most their ratio.")
    print()
    single, alone, batch = speed[single_name], speed[one_alone], speed[batch_name]
    ceiling = speed[batch_alone] / alone
    common.print_target("lab 12 one stream ÷ its products alone", single / alone, 0.85, percent=True)
    print(f"  - the most NumPy allows a step: the stripped step ÷ the same products = "
          f"{100 * speed[common.STRIPPED] / alone:.0f}%")
    print(f"- lab 06 generate ÷ the same products: {100 * speed['lab 06 generate (KV cache), 1 stream'] / alone:.0f}%")
    common.print_target(f"{S} streams ÷ one stream (aggregate tokens/s)", batch / single, 5.0)
    print(f"  - the most these products allow: {S} streams' products alone ÷ one stream's = {ceiling:.2f}×; "
          f"the {S} streams run at {100 * batch / speed[batch_alone]:.0f}% of their products alone")
    common.print_target(f"{S} streams ÷ the single-stream bandwidth bound", batch / bound, 1.0)
    common.print_target(f"{S} streams ÷ HuggingFace generate() on the same batch", batch / speed[hf_name], 2.0)
    print(f"  - the most these products allow: {S} streams' products alone ÷ HuggingFace = "
          f"{speed[batch_alone] / speed[hf_name]:.2f}×")
    alone_each = [generation.generate(model, p[None], n, temperature=0)[0] for p in prompts]
    print(f"- every stream's tokens equal lab 06's generate of its prompt alone: "
          f"{common.all_same([outputs[batch_name], np.stack(alone_each)])}; HuggingFace's batch gives them too: "
          f"{common.all_same([outputs[batch_name], outputs[hf_name]])}")
    print()
    return {"single": single / alone, "batch": batch, "vs_single": batch / single, "ceiling": ceiling,
            "vs_bound": batch / bound, "vs_hf": batch / speed[hf_name], "hf_ceiling": speed[batch_alone] / speed[hf_name], "tokens_s": single}


# -- 4. speculative decoding -------------------------------------------------------------------------

def held_out_ids(tokenizer_module) -> np.ndarray:
    """The held-out end of the kit's Shakespeare as the trained models' BPE ids."""
    from gptkit.notebook import TrainedModel

    trained = TrainedModel(TARGET)
    tok = tokenizer_module.Tokenizer(trained.vocab, trained.merges)
    text = CORPUS.read_text(encoding="utf-8")
    return np.asarray(tok.encode(text[int(HELD_OUT * len(text)):]), dtype=np.int64)


def target_pass(inference, model, prompt, T: int, calls: int = 50):  # calls: as bench_speculative reads it
    """A run: ``calls`` passes of ``model`` over T tokens after ``prompt`` (its cache set back
    after each), through ``forward_slots`` as speculative decoding runs them."""
    cache, slot = inference.SlotCache(model, 1), np.zeros(1, np.int64)
    inference.forward_slots(model, prompt[None], cache, slot)
    held, fed = int(cache.lengths[0]), np.asarray(prompt[:T])[None]

    def run():
        for _ in range(calls):
            cache.lengths[0] = held
            inference.forward_slots(model, fed, cache, slot)

    return run


def bench_speculative(args, inference, generation, gpt2_weights, held_out) -> dict:
    target, draft = gpt2_weights.load_gpt2(TARGET), gpt2_weights.load_gpt2(DRAFT)
    target.eval(), draft.eval()
    L, P, k = 16, args.prompts, args.k
    n = target.max_seq_len - L
    starts = np.linspace(0, len(held_out) - L - 1, P).astype(int)
    prompts = [held_out[s:s + L] for s in starts]  # (L,) each
    stats = {}
    repeats = max(9, args.repeats)  # runs of a fraction of a second, on models small enough for Python to dominate

    def each(fn):
        return lambda: [np.asarray(fn(p)).reshape(-1) for p in prompts]

    def speculative(name, drafter):
        def run():
            outs, total = [], {"proposed": 0, "accepted": 0, "rounds": 0}
            for p in prompts:
                tokens, st = inference.speculative_greedy(target, drafter, p, n, k=k)
                outs.append(tokens)
                total = {key: total[key] + st[key] for key in total}
            stats[name] = total
            return outs
        return run

    plain = "plain cached decoding (lab 06 generate)"
    with_draft, with_lookup = f"speculative, draft model, k = {k}", f"speculative, prompt lookup, k = {k}"
    target_12, draft_12 = "target alone, lab 12 decoder", "draft alone, lab 12 decoder"
    with threadpool_limits(1, user_api="blas"):  # every contestant: width 128 and 64, a second thread only waits
        times, outputs = common.time_runs({
            plain: (each(lambda p: generation.generate(target, p[None], n, temperature=0)), repeats),
            with_draft: (speculative(with_draft, draft), repeats),
            with_lookup: (speculative(with_lookup, None), repeats),
            target_12: (serve(inference, target, 1, n)(prompts), repeats),
            draft_12: (serve(inference, draft, 1, n)(prompts), repeats),
            common.PROBE + "pass 1": (target_pass(inference, target, prompts[0], 1), repeats),
            common.PROBE + f"pass {k + 1}": (target_pass(inference, target, prompts[0], k + 1), repeats),
            common.PROBE + "draft pass": (target_pass(inference, draft, prompts[0], 1), repeats)})
    calls = 50  # target_pass's passes per run
    step, verify, draft_step = (times.pop(common.PROBE + key) / calls for key in ("pass 1", f"pass {k + 1}",
                                                                                  "draft pass"))
    print("### Speculative decoding, the trained pair")
    print()
    print(f"Target: {len(target.h)} layers, width {target.d_model}; draft: {len(draft.h)} layer, width "
          f"{draft.d_model}; {P} prompts of {L} held-out tokens, {n} new tokens each (the models' context is "
          f"{target.max_seq_len}), greedy; one BLAS thread for every run of this section (at these widths a "
          f"second thread only waits for the first).")
    print()
    speed = common.print_speeds(times, P * n)
    base = speed[plain]
    for name in (with_draft, with_lookup):
        proposed, accepted, rounds = (stats[name][key] for key in ("proposed", "accepted", "rounds"))
        same = common.all_same([np.concatenate(outputs[name]), np.concatenate(outputs[plain])])
        common.print_target(f"{name} ÷ plain", speed[name] / base, 1.5)
        print(f"  - acceptance: {accepted} of {proposed} proposed tokens ({100 * accepted / max(proposed, 1):.0f}%), "
              f"{P * n / rounds:.2f} tokens per target pass; identical greedy tokens: {same}")
    # What the measured costs allow, each a forward_slots pass alone (nothing of the rounds'
    # bookkeeping): per round, m draft passes (m = proposed / rounds) and one target pass over
    # 1 + m tokens, costed between the measured passes over 1 and k + 1 tokens, for
    # tokens / rounds tokens; against plain decoding's tokens/s.
    def allowed(name: str, draft_pass: float) -> float:
        m, per_pass = stats[name]["proposed"] / stats[name]["rounds"], P * n / stats[name]["rounds"]
        return per_pass / (m * draft_pass + step + (verify - step) * m / k) / base

    ceiling, lookup_ceiling = allowed(with_draft, draft_step), allowed(with_lookup, 0.0)
    print(f"- the passes alone: the target over 1 token {1e3 * step:.2f} ms (as a rate, {1 / step / base:.2f}× plain "
          f"decoding's tokens/s), over {k + 1} tokens {1e3 * verify:.2f} ms ({verify / step:.2f}× one token's); the "
          f"draft over 1 token {1e3 * draft_step:.2f} ms ({draft_step / step:.2f}× the target's): models this small "
          f"are bound by their NumPy calls, not by their bytes")
    print(f"- what these passes allow, with no other work: {ceiling:.2f}× plain decoding with this draft, "
          f"{lookup_ceiling:.2f}× with prompt lookup (its lookups free)")
    print()
    return {"draft": speed[with_draft] / base, "lookup": speed[with_lookup] / base, "ceiling": ceiling,
            "acceptance": stats[with_draft]["accepted"] / max(stats[with_draft]["proposed"], 1)}


# -- 5. int8 ------------------------------------------------------------------------------------------

def weight_bytes(model) -> int:
    """Bytes of every array the model holds as a parameter (int8 weights and their scales included)."""
    return sum(int(p.nbytes) for _, p in model.named_parameters())


def int8_products(model, n: int, repeats: int) -> dict:
    """A run for ``time_runs``: the int8 model's products alone, ``n`` tokens' worth: every
    ``Int8Linear`` and the ``Int8Embedding`` head on one row, back to back (dequantising
    tile by tile, as in a step), nothing else of a step."""
    layers = [layer for b in model.h for layer in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    rows = [np.ones((1, layer.d_in), np.float32) for layer in layers]
    last = np.ones((1, model.d_model), np.float32)

    def products():
        for _ in range(n):
            for x, layer in zip(rows, layers):
                layer(x)
            model.wte.head(last)

    return {common.PROBE + "int8 products alone": (products, repeats)}


def int8_cached_tiles(layers, pool, n: int, *, dequantise_only: bool = False):
    """A run: ``n`` tokens' worth of the int8 ``layers``' products on one row, each weight
    dequantised tile by tile into a float32 buffer of ``TILE`` numbers per thread (256 KB,
    made once: it stays in the core's cache) and multiplied from there; the columns split
    over ``pool``'s threads (lab 12's ``RowPool``, BLAS at one thread inside). With
    ``dequantise_only``, the dequantisation alone: the least time any NumPy int8 product of
    these weights can take, since NumPy has no int8 product and every weight must become
    float32 on its way to BLAS."""
    buffers = {}
    xs = [np.ones((1, layer.d_in), np.float32) for layer in layers]
    outs = [np.zeros((1, layer.d_out), np.float32) for layer in layers]
    for layer in layers:
        assert layer.d_in % layer.block == 0, "whole blocks of rows only"

    def one(layer, x, out):
        block = layer.block

        def columns(c0, c1):
            buf = buffers.get(threading.get_ident())
            if buf is None:
                buf = buffers.setdefault(threading.get_ident(), np.empty(TILE, np.float32))
            step = TILE // block  # the widest tile of one block of rows that fits the buffer
            for s0 in range(c0, c1, step):
                s1 = min(s0 + step, c1)
                width = s1 - s0
                rows = TILE // width // block * block  # whole blocks of rows per tile
                acc = out[:, s0:s1]
                acc[...] = 0.0
                for r0 in range(0, layer.d_in, rows):
                    r1 = min(r0 + rows, layer.d_in)
                    nb = (r1 - r0) // block
                    tile = buf[: (r1 - r0) * width].reshape(nb, block, width)
                    np.multiply(layer.qweight[r0:r1, s0:s1].reshape(nb, block, width),
                                layer.scales[r0 // block : r0 // block + nb, None, s0:s1], out=tile)
                    if not dequantise_only:
                        acc += x[:, r0:r1] @ tile.reshape(r1 - r0, width)

        pool.map(columns, layer.d_out, min_rows=64)

    def run():
        for _ in range(n):
            for layer, x, out in zip(layers, xs, outs):
                one(layer, x, out)

    return run


TILE = 1 << 16  # float32 numbers in a thread's dequantisation buffer (256 KB)


def int8_scaling(args, f32, q8, inference) -> dict:
    """The int8 rows of the scaling table: at 1, 2 and ``--threads`` threads, the float32
    products of the 48 block matrices for ``--new-tokens`` tokens (one row), the int8
    products dequantised tile by tile into a cache-sized buffer, and the dequantisation
    alone; returns {threads: (int8 ÷ float32 speed, the bound dequantisation implies)}."""
    n = args.new_tokens
    weights = [w for b in f32.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight,
                                          b.mlp.c_proj.weight)]
    layers = [layer for b in q8.h for layer in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    rows, result = [], {}
    for count in common.thread_counts(THREADS):
        with common.at_threads(count), inference.RowPool(count) as pool:
            times, _ = common.time_runs({
                **common.matvecs_run(weights, n, args.repeats, name="f32"),
                "int8": (int8_cached_tiles(layers, pool, n), args.repeats),
                "dequantise": (int8_cached_tiles(layers, pool, n, dequantise_only=True), args.repeats)})
        f32_t, int8_t, dq_t = times[common.PROBE + "f32"], times["int8"], times["dequantise"]
        result[count] = (f32_t / int8_t, f32_t / dq_t)
        rows.append([count, f"{1e3 * f32_t / n:.2f}", f"{1e3 * int8_t / n:.2f}", f"{1e3 * dq_t / n:.2f}",
                     f"{f32_t / int8_t:.2f}×", f"{f32_t / dq_t:.2f}×"])
    print(f"The 48 block matrices' products for one token (one row), ms per token, best of {args.repeats}: float32 "
          f"as stored; int8 dequantised tile by tile into a {TILE * 4 // 1024} KB float32 buffer per thread, made "
          "once (it stays in the core's cache), the columns split over lab 12's RowPool; the dequantisation alone. "
          "NumPy has no int8 product, so every weight becomes float32 on its way to BLAS: the dequantisation "
          "alone bounds what int8 can give.")
    print()
    common.print_scaling(["float32 ms", "int8, cached tiles ms", "dequantisation alone ms", "int8 ÷ float32 speed",
                          "bound: float32 ÷ dequantisation alone"], rows)
    return result


def bench_int8(args, make_model, inference, gpt2_weights, generation, held_out) -> dict:
    n, T = args.new_tokens, args.prompt
    f32 = make_model()
    q8 = inference.quantize_model(make_model())
    before, after = weight_bytes(f32), weight_bytes(q8)
    prompt = np.random.default_rng(11).integers(0, f32.vocab_size, T)
    repeats = min(3, args.repeats)  # the int8 runs take seconds each
    runs = {"float32, lab 12 decoder": (serve(inference, f32, 1, n)([prompt]), repeats),
            "int8, lab 12 decoder": (serve(inference, q8, 1, n)([prompt]), repeats),
            **common.matvecs_run([w for b in f32.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight,
                                                               b.mlp.c_fc.weight, b.mlp.c_proj.weight)]
                                 + [f32.wte.weight.T], n, repeats),
            **int8_products(q8, n, repeats)}
    times, outputs = common.time_runs(runs)
    times["float32 products alone"] = times.pop(common.PROBE + "products alone")
    times["int8 products alone (dequantised tile by tile)"] = times.pop(common.PROBE + "int8 products alone")
    print(f"### Weight-only int8, GPT-2 small (block {64})")
    print()
    print(f"One stream, {n} new tokens after a {T}-token prompt, greedy; the products alone are each model's "
          "matrix products for as many tokens, back to back.")
    print()
    speed = common.print_speeds(times, n)
    ratio = before / after
    check("weight bytes, float32 ÷ int8", f"{ratio:.2f}× ({before / 1e6:.0f} MB → {after / 1e6:.0f} MB, every "
          "parameter, scales included)", "3.5–4×", 3.5 <= ratio <= 4.0)
    fast = speed["int8, lab 12 decoder"] / speed["float32, lab 12 decoder"]
    print(f"- int8 decoding ÷ float32: {fast:.2f}× (no target: NumPy has no int8 product, so int8 weights save "
          "memory, not time; the scaling rows below give the most dequantising can allow)")
    print(f"- the products alone, int8 ÷ float32: "
          f"{speed['int8 products alone (dequantised tile by tile)'] / speed['float32 products alone']:.2f}×; "
          f"the int8 decoder's tokens equal float32's: "
          f"{common.all_same([outputs['int8, lab 12 decoder'], outputs['float32, lab 12 decoder']])}")
    print()
    tiles = int8_scaling(args, f32, q8, inference)
    del f32, q8

    target = gpt2_weights.load_gpt2(TARGET)
    target.eval()
    W = target.max_seq_len
    count = min(args.windows, len(held_out) // W)
    windows = held_out[:count * W].reshape(count, W)
    p32 = float(generation.perplexity(target, windows))
    p8 = float(generation.perplexity(inference.quantize_model(target), windows))
    change = p8 / p32 - 1
    check(f"perplexity of the trained model on {count} held-out windows of {W} tokens",
          f"float32 {p32:.3f}, int8 {p8:.3f} ({100 * change:+.2f}%)", "within ±1%", abs(change) <= 0.01)
    print()
    return {"bytes": ratio, "speed": fast, "ppl": change, "tiles": tiles}


def scaling_table(forward: dict, decoding: dict, args) -> None:
    """The forward's and the decoders' ratios at each thread count, with the issue's targets
    at the largest count (and the 2-thread one for the other work)."""
    counts = sorted(set(forward) | set(decoding))
    rows = []
    for c in counts:
        f, d = forward.get(c), decoding.get(c)
        rows.append([c, *(f"{f[k]:.2f}×" if f else "not run" for k in ("plain", "fast", "threaded", "alone"))]
                    + ([f"{f['other']:.2f}×", f"{f['other_pool']:.2f}×", f"{f['other_scaling']:.2f}×"] if f
                       else ["not run"] * 3)
                    + ([f"{100 * d['single']:.0f}%", f"{d['vs_hf']:.2f}×",
                        f"{d['hf_ceiling']:.2f}×"] if d else ["not run"] * 3))
    print("### Scaling with threads")
    print()
    print(f"Every ratio at the row's thread count, NumPy's BLAS and PyTorch alike; forward at T = {args.seq}; "
          f"ratios to PyTorch are of times (lower is faster), the decoders' of tokens/s.")
    print()
    common.print_scaling(["lab 04 ÷ PyTorch", "fast forward ÷ PyTorch", "threaded forward ÷ PyTorch",
                          "products alone ÷ PyTorch", "other work, 1 thread ÷ PyTorch",
                          "other work, RowPool ÷ PyTorch", "other work, RowPool ÷ 1 thread",
                          "1 stream ÷ its products",
                          f"{args.streams} streams ÷ HuggingFace", "their products alone ÷ HuggingFace"], rows)
    top = counts[-1]
    if top < 16:
        print(f"- the targets for 16 threads are not judged here: the most threads measured is {top}")
    if top >= 16 and top in forward:
        f = forward[top]
        print(f"- at {common.threads(top)}: threaded forward {f['threaded']:.2f}× PyTorch (target ≤ 1.6× on 16 "
              f"threads: {'met' if f['threaded'] <= 1.6 else 'NOT met'}); its other work in the pool "
              f"{f['other_pool']:.2f}× PyTorch's forward (target ≤ 0.4×: {'met' if f['other_pool'] <= 0.4 else 'NOT met'})")
    if 2 in forward:
        r = forward[2]["other_scaling"]
        print(f"- at 2 threads the other work in the pool takes {r:.2f}× its one-thread time (target ≤ 0.6×: "
              f"{'met' if r <= 0.6 else 'NOT met'}); its CPU time, both threads', {forward[2]['other_cpu']:.2f}× the "
              f"one thread's, load average {forward[2]['load']:.1f} (CPU time near 1×: the pool adds no work of its "
              "own, and what keeps the time above 0.5× is a second core taken by other work or the memory's "
              "bandwidth, not the pool)")
    if top >= 16 and top in decoding:
        d = decoding[top]
        print(f"- at {common.threads(top)}: one stream {100 * d['single']:.0f}% of its products alone (target ≥ 85%: "
              f"{'met' if d['single'] >= 0.85 else 'NOT met'}); {args.streams} streams {d['vs_hf']:.2f}× HuggingFace's "
              f"batch (target ≥ 1.0×: {'met' if d['vs_hf'] >= 1.0 else 'NOT met'})")
    print()


def main() -> None:
    args = parse_args()
    model, hf, n_params = common.gpt2_small_pair(THREADS, seed=2024)
    import generation  # the reference labs, importable once gpt2_small_pair has set the path
    import gpt
    import gpt2_weights
    import inference
    import tokenizer

    from gptkit.checkpoints import GPT2_SMALL, random_gpt2_state

    only = set(args.only.split(",")) if args.only else {"forward", "decoding", "speculative", "int8"}
    load = os.getloadavg()[0]
    common.print_machine(THREADS, f"; load average {load:.1f} at the start (other work on the "
                                  "machine weighs on every contestant alike, the memory-bound ones most)")
    print(f"GPT-2 small's shape: {n_params / 1e6:.1f}M parameters, random, float32. The forward and decoding "
          f"sections run at {', '.join(map(str, common.thread_counts(THREADS)))} threads, the same count for NumPy's "
          "BLAS, lab 12's RowPool and PyTorch.")
    print()
    forward, decoding = {}, {}
    for count in common.thread_counts(THREADS):
        with common.at_threads(count), inference.RowPool(count) as pool:
            if "forward" in only:
                forward[count] = bench_forward(args, model, hf, inference, count, pool)
            if "decoding" in only:
                decoding[count] = bench_decoding(args, model, hf, inference, generation, count)
    if forward or decoding:
        scaling_table(forward, decoding, args)
    del hf
    spec = q = None
    if "speculative" in only or "int8" in only:
        held_out = held_out_ids(tokenizer)
    if "speculative" in only:
        spec = bench_speculative(args, inference, generation, gpt2_weights, held_out)

    def make_model():
        return gpt.GPTModel(**GPT2_SMALL.model_kwargs()).load_state_dict(
            random_gpt2_state(GPT2_SMALL, np.random.default_rng(2024))).eval()

    del model
    if "int8" in only:
        q = bench_int8(args, make_model, inference, gpt2_weights, generation, held_out)
    elif "tiles" in only:  # the int8 scaling rows alone (no decoders, no perplexity)
        print(f"### Weight-only int8, GPT-2 small (block {64}): the dequantisation's bound")
        print()
        q = {"tiles": int8_scaling(args, make_model(), inference.quantize_model(make_model()), inference)}
        print()
    print(f"Load average at the end: {os.getloadavg()[0]:.1f}.")
    print()
    top = THREADS
    parts = []
    if top in forward:
        f, lo = forward[top], forward[min(forward)]
        parts.append(f"lab 12's forward of GPT-2 small takes {f['fast']:.2f}× PyTorch's time at {common.threads(top)} "
                     f"({f['threaded']:.2f}× threaded; lab 04's {f['plain']:.2f}×)"
                     + (f", {lo['fast']:.2f}× at {common.threads(min(forward))}" if min(forward) != top else ""))
    if top in decoding:
        d = decoding[top]
        parts.append(f"one stream decodes at {100 * d['single']:.0f}% of its products alone and {args.streams} streams "
                     f"at {d['vs_hf']:.2f}× HuggingFace at {common.threads(top)}")
    if spec:
        parts.append(f"speculative decoding {spec['draft']:.2f}× with the draft ({100 * spec['acceptance']:.0f}% "
                     f"accepted), {spec['lookup']:.2f}× with prompt lookup (1 thread)")
    if q:
        bound = q["tiles"][top][1]
        parts.append((f"int8 weights {q['bytes']:.1f}× smaller, perplexity {100 * q['ppl']:+.2f}%, " if "bytes" in q
                      else "int8 products ") + f"at most {bound:.2f}× float32's speed at {common.threads(top)} "
                     "(dequantisation's bound)")
    common.print_summary("; ".join(parts) + f" (load average {load:.1f} at the start)")


if __name__ == "__main__":
    main()
