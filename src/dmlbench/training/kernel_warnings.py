"""Warnings raised while a run trains, shown once each in the run log and kept with the checkpoint.

On a GPU with ``training.deterministic`` on, an operation that has no deterministic CUDA kernel
warns (``torch.use_deterministic_algorithms(True, warn_only=True)``) and runs anyway: the run's
numbers are then not reproducible bit for bit, and a library may instead have switched to a slow
path of its own. Such warnings used to reach the terminal at most once per process, mixed with
everything else; here every distinct warning of an epoch is written to the run log with the epoch
it first appeared in, and the operations that were not deterministic are recorded in the
checkpoint (``nondeterministic_ops``), so that the ``deterministic`` stat of metrics.json says
what actually ran.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

#: How torch's determinism alert names the operation: "<op> does not have a deterministic implementation".
_NONDETERMINISTIC_OP = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


def nondeterministic_op(message: str) -> str | None:
    """The operation a determinism alert names, or None for any other warning.

    >>> nondeterministic_op("index_add_cuda_ does not have a deterministic implementation, but you set ...")
    'index_add_cuda_'
    >>> nondeterministic_op("some other warning") is None
    True
    """
    match = _NONDETERMINISTIC_OP.match(message)
    return match["op"] if match else None


class KernelWarnings:
    """Collects the distinct warnings of a run, epoch by epoch.

    Args:
        seen: warnings already reported (from a resume checkpoint), as ``"Category: message"`` texts.
    """

    def __init__(self, seen: list[str] | None = None):
        self.seen: list[str] = list(seen or [])

    @contextmanager
    def watch(self, where: str) -> Iterator[None]:
        """Record every warning raised in the block; print each one not seen before, naming ``where``."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for warning in caught:
            text = f"{warning.category.__name__}: {warning.message}"
            if text not in self.seen:
                self.seen.append(text)
                tqdm.write(f"[dmlbench] warning in {where}: {text}")

    def nondeterministic_ops(self) -> list[str]:
        """The operations that warned that they have no deterministic kernel, in the order first seen."""
        ops = (nondeterministic_op(text.split(": ", 1)[-1]) for text in self.seen)
        return list(dict.fromkeys(op for op in ops if op is not None))
