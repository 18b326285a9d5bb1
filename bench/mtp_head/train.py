"""Device side of the SmolLM2 draft head (bench/mtp_head/README.md): trains the MTP head by self-distillation from
the bundle make_data.py wrote, and saves it under the artifact's logical names.

Run (H200): python3 bench/mtp_head/train.py --data DIR --out DIR [--seed 0] [--budget-s 150]

The head has the Qwen3.5 MTP shape (qwen35-architecture.md section 6) with the base model's own layer type:
u = fc([norm(embed(token t+1)) | norm(hidden t)]); one llama decoder layer over u with its own causal attention;
hm = norm(u); logits = the model's tied head applied to hm. Trained, as the engine drafts, for 3 steps at once: step
0 reads the model's hidden state, step s > 0 the head's own hm of step s - 1 one position back, and attends over step
0's keys before its draft run and the earlier steps' keys inside it (the drafting KV cache exactly). The loss at
every step is the KL divergence from the model's own next-token distribution at t + 1 (softmax of its head over its
hidden state there, over the bundle's vocabulary shortlist) plus a small relative-MSE pull of hm towards that
hidden state. Validation: the expected greedy acceptance of K = 1..3 drafts on held-out answers.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import numpy as np

STEPS = 3  # draft steps trained at once (K = 1..3 are measured)
PROMPT_WEIGHT = 0.3  # loss weight of prompt positions (answers: 1; the shared system prompt: 0)
REGRESSION_WEIGHT = 0.1
STEP_WEIGHTS = (1.0, 0.8, 0.6)
VALIDATION_SHARE = 0.1


def dequant_q8_0(blocks: np.ndarray, cols: int) -> np.ndarray:
    """GGUF Q8_0 rows [n, cols/32 x 34 bytes] -> f32 [n, cols]: an f16 scale, then 32 int8 values, per block."""
    b = blocks.reshape(blocks.shape[0], cols // 32, 34)
    scale = b[..., :2].copy().view(np.float16).astype(np.float32)
    return (b[..., 2:].view(np.int8).astype(np.float32) * scale).reshape(blocks.shape[0], cols)


def dequant_q4_1(blocks: np.ndarray, cols: int) -> np.ndarray:
    """GGUF Q4_1 rows [n, cols/32 x 20 bytes] -> f32: f16 scale d, f16 minimum m, 16 bytes whose low nibbles are
    values 0..15 of the block and high nibbles 16..31; value = d * q + m."""
    b = blocks.reshape(blocks.shape[0], cols // 32, 20)
    d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
    q = np.concatenate([b[..., 4:] & 0x0F, b[..., 4:] >> 4], axis=-1).astype(np.float32)
    return (q * d + m).reshape(blocks.shape[0], cols)


def init_tensors(bundle, config: dict) -> dict[str, np.ndarray]:
    """The base model's last layer (and final norm) as f32, under the head's names."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    cols = {"attn_q": h, "attn_k": h, "attn_v": h, "attn_output": h, "ffn_gate": h, "ffn_up": h, "ffn_down": inter}
    names = {"attn_norm": "input_norm", "ffn_norm": "post_attn_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
             "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}
    out = {}
    for key in bundle.files:
        if not key.startswith("init."):
            continue
        _, name, kind = key.split(".")
        data = bundle[key]
        if kind == "Q4_1":
            value = dequant_q4_1(data, cols[name])
        elif kind == "F32":
            value = data.astype(np.float32)
        else:
            raise SystemExit(f"init tensor {key}: encoding {kind} not handled")
        out["norm" if name == "output_norm" else names[name]] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget-s", type=float, default=150.0, help="wall time for all training runs together")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--cpu-smoke", action="store_true", help="a few steps on the CPU on a slice (checks the code)")
    args = ap.parse_args()
    train(args)


def train(args) -> None:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    torch.manual_seed(args.seed)
    # f32 with TF32 matrix products: the model is small, and the teacher's logits want more than bf16's 8 bits.
    torch.backends.cuda.matmul.allow_tf32 = True
    random.seed(args.seed)
    device = "cpu" if args.cpu_smoke else "cuda"
    config = json.loads((args.data / "config.json").read_text())
    bundle = np.load(args.data / "bundle.npz")
    H, nh, nkv, hd = config["hidden_size"], config["num_heads"], config["num_kv_heads"], config["head_dim"]
    eps = float(config["rms_norm_eps"])
    rope = config["rope"]
    rot = int(rope.get("rotary_dim") or hd)
    interleaved = rope.get("pairing", "half") == "interleaved"

    shortlist = bundle["shortlist"]
    embed = torch.tensor(dequant_q8_0(bundle["embed_q8_0"], H), device=device)  # [S, H]
    row_of = np.full(int(config["vocab_size"]), -1, np.int64)
    row_of[shortlist] = np.arange(shortlist.size)

    # Conversations: token rows (shortlist indices), hidden [n, H] (the shared prefix stored once), weights.
    lengths, prompt_lengths = bundle["lengths"], bundle["prompt_lengths"]
    prefix_hidden = bundle["prefix_hidden"].astype(np.float32)
    prefix = prefix_hidden.shape[0]
    tokens_all, hidden_all = bundle["tokens"], bundle["hidden"]
    greedy_conv = bundle["greedy"]
    convs, t0, h0 = [], 0, 0
    for n, p in zip(lengths.tolist(), prompt_lengths.tolist(), strict=True):
        tok = row_of[tokens_all[t0:t0 + n]]
        assert (tok >= 0).all(), "a data token outside the shortlist"
        hid = np.concatenate([prefix_hidden, hidden_all[h0:h0 + n - prefix].astype(np.float32)])
        weight = np.where(np.arange(n) < p, PROMPT_WEIGHT, 1.0).astype(np.float32)
        weight[:prefix] = 0.0
        convs.append((tok, hid, weight, p))
        t0 += n
        h0 += n - prefix
    order = list(range(len(convs)))
    random.Random(args.seed).shuffle(order)
    n_val = max(1, int(len(convs) * VALIDATION_SHARE))
    val_idx, train_idx = order[:n_val], order[n_val:]
    if args.cpu_smoke:
        val_idx, train_idx = val_idx[:2], train_idx[:4]

    inv_freq = 1.0 / (float(rope["theta"]) ** (torch.arange(0, rot, 2, device=device).float() / rot))

    def batch(ids: list[int]):
        L = max(len(convs[i][0]) for i in ids)
        tok = torch.zeros(len(ids), L, dtype=torch.long)
        hid = torch.zeros(len(ids), L, H)
        w = torch.zeros(len(ids), L)
        for b, i in enumerate(ids):
            t, h_, wt, _ = convs[i]
            tok[b, :len(t)] = torch.from_numpy(t)
            hid[b, :len(t)] = torch.from_numpy(h_)
            w[b, :len(t)] = torch.from_numpy(wt)
        return tok.to(device), hid.to(device), w.to(device)

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def apply_rope(x):  # x [B, heads, L, hd]; positions 0..L-1 (RoPE is relative: the engine's offsets cancel)
        L = x.shape[2]
        ang = torch.arange(L, device=device).float()[:, None] * inv_freq[None]
        cos, sin = ang.cos(), ang.sin()
        r = x[..., :rot]
        if interleaved:
            a, b = r[..., 0::2], r[..., 1::2]
            out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        else:
            a, b = r[..., :rot // 2], r[..., rot // 2:]
            out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        return torch.cat([out, x[..., rot:]], dim=-1)

    class Head(torch.nn.Module):
        def __init__(self, init: dict[str, np.ndarray] | None):
            super().__init__()
            P = torch.nn.Parameter

            def t(name, shape, scale):
                if init is not None and name in init:
                    return P(torch.tensor(init[name], dtype=torch.float32))
                return P(torch.randn(*shape) * scale)

            std = 0.02
            self.enorm = P(torch.ones(H))
            self.hnorm = P(torch.ones(H))
            fc = torch.randn(H, 2 * H) * std
            fc[:, H:] += torch.eye(H)  # start from the hidden state passed through
            self.fc = P(fc)
            self.input_norm = t("input_norm", (H,), 0) if init else P(torch.ones(H))
            self.post_attn_norm = t("post_attn_norm", (H,), 0) if init else P(torch.ones(H))
            self.q = t("q", (nh * hd, H), std)
            self.k = t("k", (nkv * hd, H), std)
            self.v = t("v", (nkv * hd, H), std)
            self.o = t("o", (H, nh * hd), std / math.sqrt(2))
            self.gate = t("gate", (config["intermediate_size"], H), std)
            self.up = t("up", (config["intermediate_size"], H), std)
            self.down = t("down", (H, config["intermediate_size"]), std / math.sqrt(2))
            self.norm = t("norm", (H,), 0) if init else P(torch.ones(H))

        def step(self, emb, hid, cache: list, s: int):
            """One draft step over all positions: returns hm and appends this step's (k, v) to cache."""
            u = F.linear(torch.cat([rms(emb, self.enorm), rms(hid, self.hnorm)], -1), self.fc)
            x = rms(u, self.input_norm)
            B, L, _ = x.shape
            q = apply_rope(F.linear(x, self.q).view(B, L, nh, hd).transpose(1, 2))
            k = apply_rope(F.linear(x, self.k).view(B, L, nkv, hd).transpose(1, 2))
            v = F.linear(x, self.v).view(B, L, nkv, hd).transpose(1, 2)
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            cache.append((k, v))
            scale = 1.0 / math.sqrt(hd)
            k0, v0 = cache[0]
            # Step s at position p: step 0's keys at j <= p - s, then step i's key at p - s + i (i = 1..s).
            scores = [(q @ k0.transpose(-1, -2)) * scale]
            pos = torch.arange(L, device=device)
            scores[0] = scores[0].masked_fill(pos[None, :] > pos[:, None] - s, float("-inf"))
            shifted = []
            for i in range(1, s + 1):
                ki, vi = cache[i]
                shift = s - i
                ks = F.pad(ki, (0, 0, shift, 0))[:, :, :L]
                vs = F.pad(vi, (0, 0, shift, 0))[:, :, :L]
                scores.append(((q * ks).sum(-1, keepdim=True)) * scale)
                shifted.append(vs)
            att = torch.cat(scores, -1).float().softmax(-1).to(q.dtype)
            out = att[..., :L] @ v0
            for i, vs in enumerate(shifted):
                out = out + att[..., L + i:L + i + 1] * vs
            u = u + F.linear(out.transpose(1, 2).reshape(B, L, nh * hd), self.o)
            y = rms(u, self.post_attn_norm)
            u = u + F.linear(F.silu(F.linear(y, self.gate)) * F.linear(y, self.up), self.down)
            return rms(u, self.norm)

    def run(head: Head, tok, hid, w):
        """The loss and, per step, whether each row's argmax is the model's. Row p of every step reads token p + 1
        and predicts token p + 2 (the teacher: the model at p + 1)."""
        emb_next = embed[tok[:, 1:]]  # token p + 1 at row p, rows 0..L-2
        teacher_h = hid[:, 1:]
        with torch.no_grad():
            teacher_logp = (teacher_h @ embed.T).float().log_softmax(-1)
            teacher_top = teacher_logp.argmax(-1)
        valid = w[:, 1:] > 0
        cache: list = []
        total = torch.zeros((), device=device)
        matches = []
        hidden_in = hid[:, :-1]
        for s in range(STEPS):
            hm = head.step(emb_next, hidden_in, cache, s)
            logp = (hm @ embed.T).float().log_softmax(-1)
            kl = (teacher_logp.exp() * (teacher_logp - logp)).sum(-1)
            reg = (hm - teacher_h).pow(2).mean(-1) / teacher_h.pow(2).mean(-1).clamp_min(1e-6)
            row_ok = valid.clone()
            row_ok[:, :s] = False  # step s needs s earlier positions in its draft run
            wt = w[:, 1:] * row_ok
            total = total + STEP_WEIGHTS[s] * ((kl + REGRESSION_WEIGHT * reg) * wt).sum() / wt.sum().clamp_min(1)
            matches.append(logp.argmax(-1) == teacher_top)
            hidden_in = F.pad(hm, (0, 0, 1, 0))[:, :-1]  # step s + 1 at p reads hm of step s at p - 1
        return total, matches

    def acceptance(head: Head, ids: list[int]) -> dict:
        """Expected accepted drafts per round at K = 1..STEPS over the greedy held-out answers: a round drafts
        after the model's token at q + 1 (an answer token), from MTP row q; its drafts are accepted while each step's
        argmax is the model's (which, on greedy text, is the text's next token)."""
        head.eval()
        accepted, rounds = np.zeros(STEPS), 0
        with torch.no_grad():
            for i in range(0, len(ids), 8):
                chunk = ids[i:i + 8]
                _, m = run(head, *batch(chunk))
                rows = m[0].shape[1]
                q = torch.arange(rows - STEPS + 1, device=device)
                n = torch.tensor([len(convs[j][0]) for j in chunk], device=device)[:, None]
                p = torch.tensor([convs[j][3] for j in chunk], device=device)[:, None]
                greedy = torch.tensor([bool(greedy_conv[j]) for j in chunk], device=device)[:, None]
                chain = (q[None] + 1 >= p) & (q[None] + STEPS - 1 <= n - 2) & greedy
                rounds += int(chain.sum())
                for s in range(STEPS):
                    chain = chain & m[s][:, s:s + q.numel()]
                    accepted[s] += int(chain.sum())
        head.train()
        out = {f"K{k}": float(accepted[:k].sum() / max(rounds, 1)) for k in range(1, STEPS + 1)}
        out["rounds"] = rounds
        return out

    init = init_tensors(bundle, config)
    runs = [("last-layer init", init, 1e-3), ("last-layer init", init, 3e-4), ("random init", None, 1e-3)]
    if args.cpu_smoke:
        runs = runs[:1]
    started = time.perf_counter()
    results, best = [], None
    for r, (name, init_w, lr) in enumerate(runs):
        torch.manual_seed(args.seed + r)
        head = Head(init_w).to(device)
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
        batch_size = 16
        steps_per_epoch = math.ceil(len(train_idx) / batch_size)
        total_steps = args.epochs * steps_per_epoch if not args.cpu_smoke else 2
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i, n=total_steps: min(1.0, (i + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(i, n) / n)))
        run_budget = args.budget_s / len(runs)
        run_start = time.perf_counter()
        history, best_run = [], (-1.0, None, 0)
        step = 0
        rng = random.Random(args.seed + r)
        for epoch in range(args.epochs):
            ids = train_idx[:]
            rng.shuffle(ids)
            for i in range(0, len(ids), batch_size):
                loss, _ = run(head, *batch(ids[i:i + batch_size]))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                if step >= total_steps:
                    break
            val = acceptance(head, val_idx)
            history.append({"epoch": epoch, "loss": float(loss), **val})
            print(f"[{name} lr {lr}] epoch {epoch} loss {float(loss):.4f} val {val}", flush=True)
            if val["K3"] > best_run[0]:
                best_run = (val["K3"], {k: p.detach().clone() for k, p in head.named_parameters()}, epoch)
            if step >= total_steps or time.perf_counter() - run_start > run_budget:
                break
        results.append({"run": name, "lr": lr, "best_epoch": best_run[2], "best_val_K3": best_run[0],
                        "history": history})
        if best is None or best_run[0] > best[0]:
            best = (best_run[0], best_run[1], r)
    trained_s = time.perf_counter() - started

    params = best[1]
    names = {"fc": "mtp.fc", "enorm": "mtp.pre_fc_norm_embedding", "hnorm": "mtp.pre_fc_norm_hidden",
             "norm": "mtp.norm", "input_norm": "mtp.layers.0.input_norm",
             "post_attn_norm": "mtp.layers.0.post_attn_norm", "q": "mtp.layers.0.attn.q_proj",
             "k": "mtp.layers.0.attn.k_proj", "v": "mtp.layers.0.attn.v_proj", "o": "mtp.layers.0.attn.o_proj",
             "gate": "mtp.layers.0.mlp.gate", "up": "mtp.layers.0.mlp.up", "down": "mtp.layers.0.mlp.down"}
    tensors = {names[k]: v.float().cpu().to(torch.float16).contiguous() for k, v in params.items()}
    peak = max(float(v.abs().max()) for v in params.values())
    assert peak < 6.0e4, f"a head weight of {peak} does not fit f16"
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "seed": args.seed, "train_conversations": len(train_idx), "val_conversations": len(val_idx),
              "steps": STEPS, "step_weights": STEP_WEIGHTS, "prompt_weight": PROMPT_WEIGHT,
              "regression_weight": REGRESSION_WEIGHT, "epochs": args.epochs, "budget_s": args.budget_s,
              "trained_s": round(trained_s, 1), "chosen_run": best[2], "runs": results}
    save_file(tensors, str(args.out / "mtp_head.safetensors"),
              metadata={"recipe": json.dumps({k: report[k] for k in ("seed", "steps", "epochs", "chosen_run")}),
                        "layout": "ninfer logical names; q/k rows in the base artifact's rope pairing"})
    (args.out / "train_report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
