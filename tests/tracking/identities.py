"""The run identity the tracking tests share."""

from __future__ import annotations

from dataflex_rl.tracking import RunIdentity


def make_identity(**overrides) -> RunIdentity:
    fields = dict(
        sweep="sweep1",
        run="a0.5-s1",
        backend="local",
        mechanism="reweight",
        alpha=0.5,
        seed=1,
        config_hash="0123456789ab",
        git_commit=None,
    )
    return RunIdentity(**{**fields, **overrides})
