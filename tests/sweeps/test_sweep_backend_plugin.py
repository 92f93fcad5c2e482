"""A backend added the documented way, its package plus one YAML in conf/backend/, runs a sweep with no other edit."""

from __future__ import annotations

import shutil
import sys

import pytest

import sweeps.backends
from dataflex_rl.validation import ConfigError
from sweeps.cli import main as sweep_main

from .conftest import read_manifest
from .test_sweep_session import config_of, standin_argv

ECHO_BACKEND = '''
import dataclasses

from sweeps.backends.local import LocalBackend, LocalSettings


@dataclasses.dataclass(frozen=True)
class EchoSettings(LocalSettings):
    note: str = "one run at a time"


class EchoBackend(LocalBackend):
    settings = EchoSettings

    def jobs_here(self, config):
        return 1, f"the echo backend runs {config.backend_settings.note}"
'''


@pytest.fixture
def echo_backend(tmp_path, monkeypatch):
    package = tmp_path / "echo_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sweep_backend.py").write_text(ECHO_BACKEND)
    conf_dir = tmp_path / "conf_backend"
    shutil.copytree(sweeps.backends.BACKEND_CONF_DIR, conf_dir)
    (conf_dir / "echo.yaml").write_text("_target_: echo_pkg.sweep_backend.EchoBackend\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(sweeps.backends, "BACKEND_CONF_DIR", conf_dir)
    sweeps.backends.get_backend.cache_clear()
    try:
        yield conf_dir
    finally:
        sweeps.backends.get_backend.cache_clear()
        for name in ("echo_pkg", "echo_pkg.sweep_backend"):
            sys.modules.pop(name, None)


def test_a_backend_added_as_its_package_and_one_yaml_runs_a_sweep(tmp_path, echo_backend, repo_on_path, capsys):
    config = config_of("backend=echo")
    assert type(sweeps.backends.get_backend(config.backend)).__name__ == "EchoBackend"
    assert (config.backend_settings.note, config.backend_settings.steps) == ("one run at a time", 120)  # its defaults
    with pytest.raises(ConfigError, match="echo: unknown key\\(s\\) 'colour'; allowed keys: steps, sft_warm_start, note"):
        config_of("backend=echo", "+echo.colour=red")
    with pytest.raises(ConfigError, match="echo.note = 'x' is not allowed with backend=local: .* add backend=echo"):
        config_of("echo.note=x")
    argv = [item for item in standin_argv(tmp_path, "backend=echo", "echo.sft_warm_start=false",
                                          "echo.note='two runs, one at a time'") if not item.startswith("local.")]
    assert sweep_main(argv) == 0
    assert "the echo backend runs two runs, one at a time" in capsys.readouterr().out
    manifest = read_manifest(tmp_path / "runs" / "shared")
    assert manifest["backend"] == "echo"
    assert len(manifest["runs"]) == 2  # alpha 0 and 0.5


def test_a_backend_name_without_its_yaml_is_refused_naming_the_allowed_ones(echo_backend):
    (echo_backend / "echo.yaml").unlink()
    with pytest.raises(ConfigError, match="backend = 'echo' is not allowed.*'local'.*'verl'"):
        config_of("backend=echo")
