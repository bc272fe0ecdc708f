"""tests/integrations: helpers in integ_helpers.py (runs, settings and the Hugging Face cache under
tmp_path: the autouse fixture of tests/conftest.py)."""
from __future__ import annotations

import integ_helpers  # noqa: F401 - offline Hugging Face before transformers is first imported
