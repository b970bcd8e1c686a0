"""Every attn2d.nn module trains under two-process DistributedDataParallel (gloo, localhost):
after a few steps on different data per rank, the parameters are still equal on both ranks and
have moved."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _modules():
    import attn2d.nn as ann

    return [
        (ann.SelfAttention2d(16, heads=2), lambda g: (torch.randn(2, 16, 6, 7, generator=g),)),
        (ann.MultiheadSelfAttention2d(16, 4), lambda g: (torch.randn(2, 16, 5, 6, generator=g),)),
        (ann.Attention(16, num_heads=4), lambda g: (torch.randn(2, 9, 16, generator=g),)),
        (ann.CrossAttention(16, 8, num_heads=2),
         lambda g: (torch.randn(2, 9, 16, generator=g), torch.randn(2, 4, 8, generator=g))),
    ]


def _worker(rank: int, world: int, port: int, result_path: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        report = []
        for index, (module, make_inputs) in enumerate(_modules()):
            torch.manual_seed(0)  # same initial weights on both ranks
            for p in module.parameters():
                torch.nn.init.normal_(p, std=0.3)
            before = [p.detach().clone() for p in module.parameters()]
            ddp = torch.nn.parallel.DistributedDataParallel(module)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            g = torch.Generator().manual_seed(100 + rank)  # different data on each rank
            for _ in range(3):
                opt.zero_grad()
                ddp(*make_inputs(g)).square().mean().backward()
                opt.step()
            flat = torch.cat([p.detach().flatten() for p in module.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            moved = float((flat - torch.cat([b.flatten() for b in before])).abs().max())
            report.append((index, float((gathered[0] - gathered[1]).abs().max()), moved))
        if rank == 0:
            torch.save(report, result_path)
        # Both ranks leave their last collective before either tears gloo down: without it a
        # rank can exit mid-teardown and abort ("terminate called without an active
        # exception") on a loaded machine.
        dist.barrier()
        # Past this point a rank only tears gloo down, which the barrier does not make safe
        # from that abort under load; the markers tell such a death from an earlier one.
        open(f"{result_path}.done{rank}", "w").close()
    finally:
        dist.destroy_process_group()


def test_two_process_ddp_keeps_parameters_equal(tmp_path):
    result = str(tmp_path / "ddp.pt")
    try:
        mp.spawn(_worker, args=(2, _free_port(), result), nprocs=2, join=True)
    except mp.ProcessExitedException:
        # A rank killed by a signal after both ranks finished every collective died in gloo's
        # teardown, not in anything this test checks; any earlier death still fails the test.
        if not all(os.path.exists(f"{result}.done{rank}") for rank in range(2)):
            raise
    report = torch.load(result)
    assert len(report) == 4
    for index, difference, moved in report:
        assert difference == 0.0, (index, difference)
        assert moved > 1e-4, (index, moved)
