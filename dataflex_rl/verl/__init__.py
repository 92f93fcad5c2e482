"""The verl backend: ``dataflex_*`` trainers registered through ``verl.plugins`` (docs/verl.md)."""

VERL_VERSION = "0.9.1"  # the verl release this backend is written against (the doctor and the CPU mode check it)
