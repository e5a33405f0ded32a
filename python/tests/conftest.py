import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(os.environ.get("MUCC_CORPUS", ROOT.parent / "shared" / "corpus" / "mirage-benchmarks"))


@pytest.fixture(scope="session")
def corpus() -> pathlib.Path:
    if not (CORPUS / "lora.json").exists():
        pytest.fail(f"the benchmark corpus is not at {CORPUS} (set MUCC_CORPUS)")
    return CORPUS

# mirage_scripts.py sits beside the tests.
import sys  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
