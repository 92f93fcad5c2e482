"""``meta.json``'s numeric environment: what it records, how a resume under another environment shows, and that torch
honours ``ATEN_CPU_CAPABILITY`` in a fresh process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dataflex_rl.tracking import RunStore, run_store
from dataflex_rl.tracking.run_store import meta as meta_module

from tests.tracking.identities import make_identity

ENVIRONMENT_KEYS = {"cpu", "cpu_capability", "aten_cpu_capability", "blas", "threads", "machine"}
VARIABLE = "ATEN_CPU_CAPABILITY"


def test_meta_records_the_numeric_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        RunStore(tmp_path).write_meta(make_identity())
    finally:
        torch.set_num_threads(threads)
    environment = json.loads((tmp_path / "meta.json").read_text())["environment"]
    assert set(environment) == ENVIRONMENT_KEYS
    assert environment["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert environment["aten_cpu_capability"] is None
    assert f"BLAS_INFO={environment['blas']}," in torch.__config__.show()
    assert environment["threads"] == 1
    assert environment["machine"] == platform.machine()
    assert isinstance(environment["cpu"], str) and environment["cpu"]
    assert "environment_changes" not in json.loads((tmp_path / "meta.json").read_text())


def test_aten_cpu_capability_follows_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, "avx2")
    assert RunStore(tmp_path).write_meta(make_identity())["environment"]["aten_cpu_capability"] == "avx2"


def test_cpu_model_falls_back_to_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\n")
    monkeypatch.setattr(meta_module, "_CPUINFO", str(cpuinfo))
    assert run_store.numeric_environment()["cpu"] == "Test CPU @ 1.00GHz"
    monkeypatch.setattr(meta_module, "_CPUINFO", str(tmp_path / "absent"))
    assert run_store.numeric_environment()["cpu"] == (platform.processor() or platform.machine())


def test_resume_under_another_environment_appends_a_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    first = RunStore(tmp_path).write_meta(make_identity(), now="2025-01-01T00:00:00.000+00:00")
    resumed = RunStore(tmp_path).write_meta(make_identity(), now="2025-01-02T00:00:00.000+00:00")
    assert resumed["environment"] == first["environment"] and "environment_changes" not in resumed

    monkeypatch.setenv(VARIABLE, "avx2")
    changed = RunStore(tmp_path).write_meta(make_identity(), now="2025-01-03T00:00:00.000+00:00")
    assert changed["environment"] == first["environment"]  # the first session's is kept
    assert changed["environment_changes"] == [
        {**first["environment"], "aten_cpu_capability": "avx2", "time": "2025-01-03T00:00:00.000+00:00"}]

    # the same environment again changes nothing; going back to the first is a change of its own
    again = RunStore(tmp_path).write_meta(make_identity(), now="2025-01-04T00:00:00.000+00:00")
    assert again["environment_changes"] == changed["environment_changes"]
    monkeypatch.delenv(VARIABLE)
    back = RunStore(tmp_path).write_meta(make_identity(), now="2025-01-05T00:00:00.000+00:00")
    assert [change["aten_cpu_capability"] for change in back["environment_changes"]] == ["avx2", None]
    assert back["environment_changes"][-1]["time"] == "2025-01-05T00:00:00.000+00:00"
    store = RunStore(tmp_path)
    store.close()
    # closing keeps them
    assert run_store.read_meta(store.run_dir)["environment_changes"] == back["environment_changes"]


def test_environment_keys_are_reserved(tmp_path: Path) -> None:
    for key in ("environment", "environment_changes"):
        with pytest.raises(ValueError, match=f"\\['{key}'\\] are reserved"):
            RunStore(tmp_path).write_meta(make_identity(), extra={key: {}})


def _has_avx2() -> bool:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.startswith("flags") and " avx2" in line for line in lines)


@pytest.mark.skipif(not _has_avx2(), reason="this CPU lacks AVX2 (no avx2 flag in /proc/cpuinfo), so torch "
                    "cannot dispatch to AVX2 kernels")
def test_a_process_started_with_the_variable_reports_avx2_kernels() -> None:
    probe = ("import json; from dataflex_rl.tracking.run_store import numeric_environment; "
             "print(json.dumps(numeric_environment()))")
    result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, VARIABLE: "avx2"}, capture_output=True,
                            text=True, check=True, timeout=120)
    environment = json.loads(result.stdout)
    assert environment["cpu_capability"] == "AVX2"
    assert environment["aten_cpu_capability"] == "avx2"
