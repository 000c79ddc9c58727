"""How much the caching allocator counts for a GPT-2-logits-sized tensor (8 x 512 x 50257 fp32, 785.27 MiB):
allocated from a fresh segment, and split from a larger cached one. A diagnostic for the peak-memory rows:
`python -m bench.alloc_rounding` on a GPU (session 7, run G: 786.0 MiB both ways).
"""

import torch


def main() -> None:
    n = 8 * 512 * 50257
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    t = torch.empty(n, device="cuda")
    print("fresh segment: request MiB", round(t.nbytes / 2**20, 3),
          "allocated MiB", round((torch.cuda.memory_allocated() - before) / 2**20, 3),
          "reserved MiB", round(torch.cuda.memory_reserved() / 2**20, 3))
    del t
    big = torch.empty(n + (2 << 20) // 4, device="cuda")  # a cached segment 2 MiB larger, once freed
    del big
    before = torch.cuda.memory_allocated()
    kept = torch.empty(n, device="cuda")
    print("from a larger cached block: allocated MiB", round((torch.cuda.memory_allocated() - before) / 2**20, 3),
          "segments", len([s for s in torch.cuda.memory_snapshot() if s["total_size"] >= kept.nbytes]))


if __name__ == "__main__":
    main()
