"""A recipe's per-batch log terms, summed over an epoch without making a training step wait for the GPU.

Reading a CUDA tensor's value on the host (``float(t)``, ``t.item()``, ``if t:``, ``t.cpu().numpy()``) waits for
every queued kernel, so a step that logs a term that way cannot overlap the next step's Python with its own GPU
work. :class:`TermSums` keeps the sums on the terms' device and reads them once, at the epoch's end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

#: Terms computed on the host from a batch's tensors (copied to the CPU): (tensors…) → {name: value}.
HostTerms = Callable[..., Mapping[str, float]]


class TermSums:
    """Sums of named scalar terms over an epoch's batches, and their means.

    :meth:`add` sums a tensor term in float64 on its own device (a float term in Python): the same
    sum, in the same order, as adding ``float(term)`` batch after batch. :meth:`add_host` defers terms
    that are computed on the host from a batch's tensors (with numpy, or checks that raise): the tensors
    are copied to the CPU without waiting, and the terms are computed at :meth:`means`, batch by batch,
    and summed in the same order.

    >>> sums = TermSums()
    >>> mean = lambda x: {"c": float(x.mean())}
    >>> sums.add("a", torch.tensor(1.5)); sums.add("b", 2.0); sums.add_host((torch.tensor([1.0, 3.0]),), mean)
    >>> sums.add("a", torch.tensor(0.5)); sums.add("b", 4.0); sums.add_host((torch.tensor([5.0, 7.0]),), mean)
    >>> sums.means(batches=2)
    {'a': 1.0, 'b': 3.0, 'c': 4.0}
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor | float] = {}
        self._host: list[tuple[HostTerms, tuple[torch.Tensor, ...]]] = []
        self._copied_from_cuda = False

    def add(self, name: str, term: torch.Tensor | float) -> None:
        """Add one batch's scalar ``term`` (a 0-d tensor on any device, or a float)."""
        value = term.detach().double() if isinstance(term, torch.Tensor) else float(term)
        self._sums[name] = self._sums.get(name, 0.0) + value

    def add_host(self, inputs: tuple[torch.Tensor, ...], terms: HostTerms) -> None:
        """Add one batch's ``terms(*inputs)`` (on CPU copies of ``inputs``), computed when the means are read."""
        self._host.append((terms, tuple(tensor.detach().to("cpu", non_blocking=True) for tensor in inputs)))
        self._copied_from_cuda |= any(tensor.is_cuda for tensor in inputs)

    def means(self, batches: int) -> dict[str, float]:
        """Each term's sum / ``batches`` (at least 1); waits for the device's queued work once."""
        if self._copied_from_cuda:
            torch.cuda.synchronize()  # the deferred host copies have landed
        totals = {name: float(total) for name, total in self._sums.items()}
        host: dict[str, float] = {}
        for terms, copies in self._host:
            for name, value in terms(*copies).items():
                host[name] = host.get(name, 0.0) + value
        return {name: total / max(batches, 1) for name, total in {**totals, **host}.items()}
