"""Embedding throughput on this CPU versus transformers, and agreement with it, measured in one run.

Batches of --batch prompts (random token ids, lengths uniform in [--min-len, --max-len], seeded), pooled as
--pooling says and L2-normalized. Rows, interleaved round by round so a change in the machine's load shows on
every row: Sluice's engine with the whole batch in one call (`LLM.embed`: prompts packed into forwards of up to
--max-num-batched-tokens tokens, no padding), Sluice one prompt per call, transformers with the batch padded
(right padding, attention mask, the same pooling over the real tokens) and transformers one prompt per call.
Reports inputs/s (median over --rounds) and each row's ratio to transformers' batched row, and the lowest
cosine similarity of Sluice's vectors (batched and one at a time) with transformers' unpadded ones, per input.
Writes bench/results/embedding.json.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from sluice_runtime.engine.llm import LLM

RESULTS = Path(__file__).parent / "results"


def make_batches(rounds: int, batch: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [[[rng.randrange(100, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(batch)]
            for _ in range(rounds)]


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, T, H] hidden states and [B, T] mask of real tokens -> [B, H] normalized vectors."""
    if pooling == "last":
        pooled = hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
    else:
        pooled = (hidden * mask[..., None]).sum(dim=1) / mask.sum(dim=1, keepdim=True)
    return torch.nn.functional.normalize(pooled.float(), dim=1)


class TransformersEmbedder:
    def __init__(self, model_dir: Path, pooling: str, pad_id: int):
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.pooling = pooling
        self.pad_id = pad_id

    @torch.inference_mode()
    def embed(self, prompts: list[list[int]]) -> torch.Tensor:
        longest = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, :len(prompt)] = torch.tensor(prompt)
            mask[i, :len(prompt)] = 1
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return pool(hidden, mask, self.pooling)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--pooling", choices=["mean", "last"], default="mean")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "embedding.json")
    args = parser.parse_args()

    llm = LLM("smollm2", pooling=args.pooling, num_kv_blocks=16, max_num_batched_tokens=args.max_num_batched_tokens)
    info = llm.engine.model_info
    reference = TransformersEmbedder(info.path, args.pooling, llm.tokenizer.pad_token_id or 0)
    batches = make_batches(args.rounds, args.batch, args.min_len, args.max_len, info.vocab_size, args.seed)
    rows = {"sluice, whole batch per call": [], "sluice, one input per call": [],
            "transformers, padded batch": [], "transformers, one input per call": []}
    lowest = {"batched": 1.0, "one at a time": 1.0}
    llm.embed(batches[0][:2])  # first-call costs (kernel builds, allocator) belong to no row
    reference.embed(batches[0][:2])
    for round_no, batch in enumerate(batches):
        seconds, batched = timed(lambda batch=batch: llm.embed(batch))
        rows["sluice, whole batch per call"].append(len(batch) / seconds)
        seconds, single = timed(lambda batch=batch: [llm.embed([p])[0] for p in batch])
        rows["sluice, one input per call"].append(len(batch) / seconds)
        seconds, _ = timed(lambda batch=batch: reference.embed(batch))
        rows["transformers, padded batch"].append(len(batch) / seconds)
        seconds, unpadded = timed(lambda batch=batch: torch.cat([reference.embed([p]) for p in batch]))
        rows["transformers, one input per call"].append(len(batch) / seconds)
        for name, vectors in (("batched", batched), ("one at a time", single)):
            cosines = (torch.tensor(vectors) * unpadded).sum(dim=1)
            lowest[name] = min(lowest[name], float(cosines.min()))
        print(f"round {round_no + 1}/{args.rounds} done", flush=True)

    baseline = statistics.median(rows["transformers, padded batch"])
    table = []
    print(f"\n{args.rounds} rounds of {args.batch} inputs, {args.min_len}-{args.max_len} tokens, pooling "
          f"{args.pooling}, float32, {torch.get_num_threads()} threads")
    print(f"{'row':36} {'inputs/s':>9} {'vs transformers batch':>22}")
    for name, values in rows.items():
        median = statistics.median(values)
        table.append({"row": name, "inputs_per_s": round(median, 2), "ratio": round(median / baseline, 3),
                      "per_round": [round(v, 2) for v in values]})
        print(f"{name:36} {median:9.2f} {median / baseline:21.2f}x")
    print(f"lowest cosine with transformers (unpadded), per input: batched {lowest['batched']:.6f}, "
          f"one at a time {lowest['one at a time']:.6f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "batch": args.batch, "rounds": args.rounds, "lengths": [args.min_len, args.max_len], "pooling": args.pooling,
        "threads": torch.get_num_threads(), "rows": table,
        "lowest_cosine": {k: round(v, 6) for k, v in lowest.items()},
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
