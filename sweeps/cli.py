"""python -m sweeps [key=value ...]: run an alpha x seed sweep (make sweep), then write its report.

Keys (conf/sweeps/default.yaml documents each):

    alpha=0.0,0.25,0.5  seeds=1,2  name=NAME  steps=N  jobs=N  threads=N  backend=local|verl
    mechanisms=baseline,ar  eta=0.1,0.5  extra=[trainer.lr=1e-3 trainer.kl_coef=0,0.01]
    launcher=process|slurm|ray  slurm.partition=gpu  ray.address=http://HOST:8265
    add_baseline=false  dry_run=true  report=false  root=runs

launcher=... picks conf/sweeps/launcher/<name>.yaml; slurm.* and ray.* are the settings of that launcher only.

extra holds train overrides for every run; one written as a Hydra sweep (key=a,b) is a grid axis.
--cfg (or Hydra's --cfg job) prints the composed sweep config and exits; --help prints this text.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dataflex_rl.validation import ConfigError
from sweeps.config import compose_config, parse_sweep_config


def load_config(argv: Sequence[str], config_name: str = "default", allowed_extra_keys: Sequence[str] = ()):
    """Compose ``conf/sweeps/<config_name>.yaml`` with ``argv`` and validate it (raises ConfigError)."""
    cfg = compose_config(config_name, argv)
    return cfg, parse_sweep_config(cfg, allowed_extra_keys)


CFG_SECTIONS = ("job", "hydra", "all")


def split_cfg_flag(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(whether ``--cfg`` was given, the other arguments); Hydra's section word after it (``--cfg job``) is
    accepted and dropped, since the sweep drivers compose only their own config."""
    rest: list[str] = []
    show = False
    arguments = list(argv)
    for index, argument in enumerate(arguments):
        if argument == "--cfg":
            show = True
        elif show and argument in CFG_SECTIONS and index and arguments[index - 1] == "--cfg":
            continue
        else:
            rest.append(argument)
    return show, rest


def help_text(doc: str) -> str:
    """A module docstring as plain terminal text (reStructuredText's double backticks and ``::`` removed)."""
    return doc.replace("``", "").replace("::", ":").strip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (see :func:`sweeps.driver.run_sweep`)."""
    from omegaconf import OmegaConf

    from sweeps.driver import EXIT_REFUSED, run_sweep

    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(help_text(__doc__), end="")
        return 0
    show_config, argv = split_cfg_flag(argv)
    try:
        cfg, config = load_config(argv)
    except ConfigError as error:
        print(f"error: sweep refused, nothing was started: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if show_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    return run_sweep(config, argv)
