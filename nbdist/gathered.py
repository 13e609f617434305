"""Every rank's text over the process group: what the parts that run a body on every rank (``heal``,
``diverge``) share. torch is imported where it is called, so importing this costs nothing."""

from __future__ import annotations

from typing import Any


def gathered(text: str, here: Any) -> list[str]:
    """Every rank's ``text`` (UTF-8, rank order), as tensors of bytes over the process group (on ``here``)."""
    import torch
    import torch.distributed as dist

    mine = text.encode()
    n = dist.get_world_size()
    sizes = [torch.zeros(1, dtype=torch.int64, device=here) for _ in range(n)]
    dist.all_gather(sizes, torch.tensor([len(mine)], dtype=torch.int64, device=here))
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    if mine:
        padded[:len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    every = [torch.zeros(longest, dtype=torch.uint8, device=here) for _ in range(n)]
    dist.all_gather(every, padded.to(here))
    return [bytes(t[:int(size.item())].cpu().numpy().tobytes()).decode()
            for t, size in zip(every, sizes, strict=True)]
