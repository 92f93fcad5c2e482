from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import subprocess

import pytest
from omegaconf import OmegaConf

from dataflex_rl.hashing import canonical_json, stable_hash
from dataflex_rl.tracking import RunIdentity, config_hash, git_commit
from dataflex_rl.tracking.identity import axis_values

from tests.tracking.identities import make_identity as shared_identity


def make_identity(**overrides) -> RunIdentity:
    return shared_identity(**{"run": "a0.25-s3", "alpha": 0.25, "seed": 3, **overrides})


class TestStableHash:
    def test_is_a_sha256_prefix_of_canonical_json(self):
        value = {"b": {"d": "ü", "c": [1, 2.5, float("nan")]}, "a": pathlib.Path("/x")}
        canonical = '{"a":"/x","b":{"c":[1,2.5,NaN],"d":"ü"}}'  # keys sorted, no spaces, UTF-8, paths as text
        assert canonical_json(value) == canonical
        assert stable_hash(value) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
        assert stable_hash(value, 8) == stable_hash(value)[:8]

    def test_hashes_a_string_as_it_is(self):
        assert stable_hash("sweep\0run", 12) == hashlib.sha256(b"sweep\0run").hexdigest()[:12]


class TestConfigHash:
    def test_is_sha256_prefix_of_canonical_json(self):
        expected = hashlib.sha256(b'{"a":1,"b":{"c":[1,2.5],"d":"x"}}').hexdigest()[:12]
        assert config_hash({"b": {"d": "x", "c": [1, 2.5]}, "a": 1}) == expected == "832a131b69e7"

    def test_key_order_and_dictconfig_do_not_matter(self):
        config = {"trainer": {"lr": 1e-5, "steps": 10}, "seed": 1}
        reordered = {"seed": 1, "trainer": {"steps": 10, "lr": 1e-5}}
        assert config_hash(config) == config_hash(reordered) == config_hash(OmegaConf.create(config))

    def test_any_value_change_changes_it(self):
        assert config_hash({"trainer": {"lr": 1e-5}}) != config_hash({"trainer": {"lr": 2e-5}})
        assert config_hash({"seed": 1}) != config_hash({"seed": "1"})

    def test_resolves_interpolations(self):
        interpolated = OmegaConf.create({"base": 4, "derived": "${base}"})
        assert config_hash(interpolated) == config_hash({"base": 4, "derived": 4})

    def test_refuses_values_json_cannot_hold(self):
        with pytest.raises(TypeError, match="object"):
            config_hash({"bad": object()})


class TestGitCommit:
    def test_commit_of_a_repository(self, tmp_path):
        environment = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=environment)
        (tmp_path / "file.txt").write_text("x")
        subprocess.run(["git", "-C", str(tmp_path), "add", "file.txt"], check=True, env=environment)
        subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "-m", "m"], check=True, env=environment)
        expected = subprocess.run(
            ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
        assert git_commit(tmp_path) == expected
        assert len(expected) == 40

    def test_none_outside_git_and_for_missing_paths(self, tmp_path):
        assert git_commit(tmp_path) is None
        assert git_commit(tmp_path / "does-not-exist") is None

    def test_none_without_git_binary(self, tmp_path, monkeypatch):
        monkeypatch.setenv("PATH", str(tmp_path))
        assert git_commit() is None

    def test_default_is_a_commit_or_none(self):
        commit = git_commit()
        assert commit is None or (len(commit) == 40 and all(c in "0123456789abcdef" for c in commit))


class TestRunIdentity:
    def test_wandb_name_and_tags(self):
        assert make_identity().wandb_name == "sweep1-a0.25-s3"
        assert make_identity(alpha=0).wandb_name == "sweep1-a0-s3"
        assert make_identity(alpha=1.0, seed=12).wandb_name == "sweep1-a1-s12"
        assert make_identity().tags == ("reweight", "local")

    def test_axes_name_the_wandb_run_and_job_type(self):
        identity = make_identity(run="a0.25-s3-lr0.0003", axes={"alpha": 0.25, "trainer.lr": 3e-4, "seed": 3})
        assert identity.wandb_name == "a0.25-s3-lr0.0003"  # the run folder's name, as the grid built it
        assert identity.factors == {"alpha": 0.25, "trainer.lr": 3e-4}
        assert identity.job_type == "a0.25-lr0.0003"
        labelled = make_identity(axes={"mechanism_label": "lopti", "eta": 0.5, "task": "knights_knaves", "seed": 1})
        assert labelled.job_type == "lopti-eta0.5-task-knights_knaves"
        assert make_identity().job_type is None and "axes" not in make_identity().to_dict()
        long_axes = {f"key{index}": "v" * 10 for index in range(8)}
        assert len(make_identity(axes=long_axes).job_type) == 64

    def test_axis_values_read_the_config(self):
        config = {"dataflex": {"actuator": {"params": {"alpha": 0.5, "eta": 0.3}}}, "trainer": {"lr": 1e-4},
                  "seed": 2, "mechanism_label": "lopti"}
        keys = ["mechanism_label", "dataflex.actuator.params.alpha", "dataflex.actuator.params.eta", "+trainer.lr",
                "trainer.missing", "seed"]
        assert axis_values(config, keys) == {"mechanism_label": "lopti", "alpha": 0.5, "eta": 0.3,
                                             "trainer.lr": 1e-4, "trainer.missing": None, "seed": 2}
        identity = RunIdentity.for_config(config, sweep="s", run="r", backend="local", mechanism="reweight",
                                          alpha=0.5, seed=2, axis_keys=keys[1:3])
        assert identity.to_dict()["axes"] == {"alpha": 0.5, "eta": 0.3}
        with pytest.raises(ValueError, match="RunIdentity.axes"):
            make_identity(axes={"trainer.lr": [1, 2]})

    def test_frozen_and_normalised(self):
        identity = make_identity(alpha=1, seed=2)
        assert isinstance(identity.alpha, float) and identity.alpha == 1.0
        with pytest.raises(dataclasses.FrozenInstanceError):
            identity.alpha = 0.5  # type: ignore[misc]

    @pytest.mark.parametrize(
        ("field", "value"),
        [("sweep", ""), ("run", None), ("alpha", float("nan")), ("alpha", True), ("seed", 1.5), ("git_commit", 5)],
    )
    def test_bad_fields_are_named(self, field, value):
        with pytest.raises(ValueError, match=f"RunIdentity.{field}"):
            make_identity(**{field: value})

    def test_for_config_fills_hash(self):
        config = {"a": 1}
        identity = RunIdentity.for_config(
            config, sweep="s", run="r", backend="verl", mechanism="reweight", alpha=0.5, seed=1
        )
        assert identity.config_hash == config_hash(config)
        assert identity.git_commit == git_commit()
        assert identity.to_dict()["backend"] == "verl"
