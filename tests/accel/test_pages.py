"""Discarding a tensor's memory pages gives them back to the OS, whatever owns them."""

from __future__ import annotations

import sys

import pytest
import torch

from comlrl.accel.pages import discard_pages

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux page calls")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_discarded_pages_leave_the_resident_set_and_read_as_zeros_inside_only():
    t = torch.ones(64 * 2**20 // 4)  # 64 MB, written
    before = _rss_mb()
    gone = discard_pages(t[1:])  # the first page is partly outside the view: it stays
    assert gone >= 63 * 2**20 and before - _rss_mb() >= 50
    assert t[0] == 1 and t[t.numel() // 2] == 0 and t.sum() < t.numel() / 100
    assert discard_pages(t[::2]) == 0  # not contiguous: untouched


def test_discarding_a_written_file_mapped_tensor_frees_its_private_copy(tmp_path):
    """A weight memory-mapped from a file (how from_pretrained may load one) and then written (an optimizer step):
    freeing the tensor would keep the mapping's written pages; discarding them gives them back."""
    path = tmp_path / "weights.bin"
    torch.full((32 * 2**20 // 4,), 2.0).numpy().tofile(path)
    t = torch.from_file(str(path), shared=False, size=32 * 2**20 // 4)  # MAP_PRIVATE
    t.add_(1.0)  # private copies of every page
    before = _rss_mb()
    assert discard_pages(t) > 31 * 2**20
    assert before - _rss_mb() >= 25
    assert torch.all(t[1024:-1024] == 2.0)  # the file's values again


def test_a_packed_onednn_weights_pages_can_be_discarded():
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        pytest.skip("no oneDNN")
    packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(4096, 2048), 4)  # 32 MB
    before = _rss_mb()
    assert discard_pages(packed) > 31 * 2**20 and before - _rss_mb() >= 25
