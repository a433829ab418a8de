"""What a benchmark script does with its result: the whole result as JSON where it was asked for, the table on
stdout."""
from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, json_path: Path | None, table: str) -> int:
    """Write ``result`` to ``json_path`` (when given), print ``table``; the script's exit status (0)."""
    if json_path:
        json_path.write_text(json.dumps(result, indent=1))
    print(table)
    return 0
