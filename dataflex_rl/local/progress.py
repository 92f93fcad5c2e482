"""Progress bars (tqdm) that stay quiet when stderr is not a terminal (CI, sweep logs)."""

from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress_bar(total: int, desc: str, initial: int = 0) -> tqdm:
    return tqdm(total=total, desc=desc, initial=initial, disable=not sys.stderr.isatty(), dynamic_ncols=True,
                leave=False)
