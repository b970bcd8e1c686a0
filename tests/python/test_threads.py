"""attn2d from several Python threads and from forked DataLoader workers: the same bits as
serial calls, and a worker's torch.set_num_threads honoured; and batch x heads past 65,535."""

from __future__ import annotations

import threading

import torch
from torch.utils.data import DataLoader, Dataset

import attn2d
from reference import naive_attention


def _step(q, k, v, g, pattern=None):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if pattern is None:
        out = attn2d.attention(*leaves)
    else:
        out = attn2d.attention2d(*leaves, pattern=pattern)
    out.backward(g)
    return [out.detach()] + [t.grad for t in leaves]


def test_four_threads_at_once_give_the_bits_of_serial_calls():
    from attn2d.patterns import Window

    cases = [
        ([torch.randn(2, 2, 300, 16) for _ in range(3)], torch.randn(2, 2, 300, 16), None),
        ([torch.randn(1, 2, 20, 20, 8) for _ in range(3)], torch.randn(1, 2, 20, 20, 8),
         Window(5)),
    ]
    for inputs, grad, pattern in cases:
        want = _step(*inputs, grad, pattern)
        got = [None] * 4

        def work(i):
            got[i] = _step(*inputs, grad, pattern)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for result in got:
            assert all(torch.equal(a, b) for a, b in zip(result, want))


class _Attending(Dataset):
    """Each item sets one thread, runs attention in the worker and reports how many threads the
    kernels' host pool ran 64 tasks on."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        torch.set_num_threads(1)
        gen = torch.Generator().manual_seed(i)
        q, k, v = (torch.randn(1, 2, 33, 8, generator=gen) for _ in range(3))
        return (attn2d.attention(q, k, v), naive_attention(q, k, v).float(),
                torch.ops.attn2d.host_threads_used(64))


def test_forked_dataloader_workers_run_attention_and_keep_their_thread_count():
    loader = DataLoader(_Attending(), batch_size=None, num_workers=2,
                        multiprocessing_context="fork")
    for out, want, threads in loader:
        assert (out - want).abs().max() < 1e-5
        assert threads == 1


def test_batch_times_heads_past_65535():
    q = torch.randn(1, 65_537, 3, 4)
    out = attn2d.attention(q, q, q)
    assert (out - naive_attention(q, q, q).float()).abs().max() < 1e-5
