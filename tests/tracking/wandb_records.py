"""Test helpers over :mod:`dataflex_rl.tracking.wandb_file`: wait for a run file's last records."""

from __future__ import annotations

import pathlib
import time

from dataflex_rl.tracking.wandb_file import history, records

__all__ = ["history", "records", "run_file"]


def run_file(run_dir: pathlib.Path, run_id: str, patience_s: float = 60.0) -> pathlib.Path:
    """The single offline run file of ``run_id`` under ``run_dir/wandb``, once it holds the run's exit record.

    ``run.finish()`` returns when wandb-core has handled the exit, but wandb-core may write the file's last records
    a moment later, so this waits (up to ``patience_s``, a generous bound, not a speed check) for the exit record.
    """
    found = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(found) == 1, f"expected one offline run file for {run_id}, found {found}"
    deadline = time.monotonic() + patience_s
    while True:
        kinds = [record.WhichOneof("record_type") for record in records(found[0])]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert "exit" in kinds, f"{found[0]} has no exit record after {patience_s} s; records: {kinds}"
    return found[0]
