import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def tiny_dir(tmp_path) -> str:
    """A saved tiny model and its tokenizer (tests/tiny.py), loadable by path like a Hub checkpoint."""
    from tiny import tiny_model, tiny_tokenizer

    path = tmp_path / "tiny-model"
    tiny_model().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


# bf16=None detects native bf16 (this CPU class has AVX512-BF16): the suite's exact-fp32 checks pin the default off,
# in this process and in the torchrun workers it starts; tests of the detection unset it
os.environ.setdefault("COMLRL_BF16", "0")
