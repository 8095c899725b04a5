"""A tensor's memory pages handed back to the OS (Linux, glibc), for code that holds a tensor's values elsewhere for
a while (:class:`comlrl.accel.decode_weights.WeightLoan`)."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Callable

import torch


def libc_function(name: str) -> Callable[..., int] | None:
    """glibc's function ``name`` through ctypes; None off glibc (macOS, musl, Windows)."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_MADVISE = libc_function("madvise")
_MADV_DONTNEED = 4  # Linux


def discard_pages(tensor: torch.Tensor) -> int:
    """Let the OS take back the memory pages that lie wholly inside ``tensor``'s bytes (a dense CPU tensor's, or a
    oneDNN tensor's); their values are lost (they read as zeros, or a file mapping's contents, until written).
    Returns the bytes discarded (0 off Linux/glibc, for a tensor off the CPU or a non-contiguous one).

    Why: freeing a tensor does not always give its memory back -- a weight loaded from a memory-mapped file keeps
    the whole mapping resident, its written pages included, and a freed heap block stays resident until the heap is
    trimmed -- while discarding the pages does, at once, whatever owns them.
    """
    if _MADVISE is None or tensor.device.type != "cpu" or sys.platform != "linux":
        return 0
    if tensor.is_mkldnn:
        start, size = torch.ops.mkldnn.data_ptr(tensor), torch.ops.mkldnn._nbytes(tensor)
    elif tensor.is_contiguous():
        start, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    else:
        return 0
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = -(-start // page) * page, (start + size) // page * page
    if last <= first or _MADVISE(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED) != 0:
        return 0
    return last - first
