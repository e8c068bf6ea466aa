"""JSON from files and records that others could have written (model directories, datasets, trial records, name
resolve entries): json.loads, with nesting deeper than Python's stack ("[[[[..." a million deep) reported as the
ValueError every malformed JSON gives (callers already turn that into a clear message), not a RecursionError that
escapes them as a traceback."""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """json.loads(text); ValueError for any text that is not JSON Python can hold."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested deeper than this reader follows") from None
