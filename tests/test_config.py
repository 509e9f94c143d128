"""Run configuration: parsing, overrides, clear errors, and every YAML in the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.config import ConfigError, RunConfig, explain, load_config

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "asyncrl.cli"]


def _yaml_files() -> list[Path]:
    # the repository's own files: no virtualenv (.venv, .venv-bench, .venv-vllm), run, cache or
    # mutmut's mutated copy (`make mutants`)
    skip = {".git", "runs", ".cache", "node_modules", "mutants"}
    return sorted(
        p
        for p in ROOT.rglob("*.y*ml")
        if p.suffix in (".yaml", ".yml")
        and not skip & set(p.parts)
        and not any(part.startswith(".venv") for part in p.relative_to(ROOT).parts)
    )


def test_repository_has_yaml_configs() -> None:
    assert any(p.parent.name == "configs" for p in _yaml_files())


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_in_repo_parses(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    if path.parent.name == "configs":
        cfg = load_config(path)
        assert isinstance(cfg, RunConfig)
        # the file's own values win over defaults
        assert cfg.model_dump(mode="json")["name"] == data.get("name", "run")
    else:
        assert data is not None


def test_the_readme_yaml_is_copied_from_a_config_the_suite_parses() -> None:
    """README's "bring your environment" block is the config it links, line for line: parsed above,
    and it cannot drift from the file."""
    readme = (ROOT / "README.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    (name,) = set(re.findall(r"\]\(configs/([\w.]+\.yaml)\)", readme))
    assert f"\n{block}" in (ROOT / "configs" / name).read_text()


def test_defaults_and_overrides() -> None:
    cfg = load_config(None, ["trainer.lr=1e-5", "env.latency.kind=pareto", "rollout.group_size=4"])
    assert cfg.trainer.lr == pytest.approx(1e-5)
    assert cfg.env.latency.kind == "pareto"
    assert cfg.rollout.group_size == 4
    assert load_config().trainer.lr == pytest.approx(1e-3)


def test_sections_have_the_required_shape() -> None:
    names = set(RunConfig.model_fields)
    for section in (
        "model",
        "env",
        "rollout",
        "trainer",
        "algo",
        "credit",
        "orchestrator",
        "transport",
        "weights",
        "cost",
        "telemetry",
        "launcher",
    ):
        assert section in names


def _all_fields(model: type, prefix: str = "") -> list[tuple[str, object]]:
    from pydantic import BaseModel

    from asyncrl.config import variants

    out = []
    for name, f in model.model_fields.items():
        kinds = variants(f)
        if kinds:  # a variant section: the kind (documented on the common base), then every variant's fields
            base = next(iter(kinds.values())).__mro__[1]
            out.append((f"{prefix}{name}.kind", base.model_fields["kind"]))
            for cls in kinds.values():
                out.extend(p for p in _all_fields(cls, f"{prefix}{name}.") if p[0] != f"{prefix}{name}.kind")
            continue
        out.append((prefix + name, f))
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_all_fields(ann, prefix + name + "."))
    return out


def test_every_field_is_documented_and_numbers_are_constrained() -> None:
    undocumented, unconstrained = [], []
    for path, f in _all_fields(RunConfig):
        ann = f.annotation
        is_section = isinstance(ann, type) and hasattr(ann, "model_fields")
        if not is_section and not (f.description or "").strip():
            undocumented.append(path)
        if ann in (int, float) and not f.metadata:
            unconstrained.append(path)
    assert undocumented == []
    assert unconstrained == []


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("trainer.lrr=1", ["trainer.lrr", "unknown key"]),
        ("trainer.lr=-1", ["trainer.lr", "-1", "> 0"]),
        ("trainer.batch_size=lots", ["trainer.batch_size", "'lots'"]),
        ("control.mode=fast", ["control.mode", "'fast'", "async", "sync"]),
        ("env.latency={kind: pareto, alpha: 0}", ["env.latency.alpha", "> 0.1"]),
        ("algo.policy_loss.kind=dpo", ["algo.policy_loss.kind", "ppo_clip"]),
        ("env.kind=plugin", ["env.path"]),
        ("orchestrator.low_watermark=0.95", ["low_watermark", "high_watermark"]),
        ("model.device=gpu0", ["model.device", "'gpu0'", "'auto'", "'cuda:N'"]),
        ("rollout.engine.static_cache=sometimes", ["rollout.engine.static_cache", "'sometimes'", "'off'"]),
    ],
)
def test_bad_values_name_field_value_and_allowed(override: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, msg


def test_yaml_on_off_reads_as_meant() -> None:
    """YAML 1.1 reads a bare on/off as booleans; the static_cache switch takes them as written."""
    assert load_config(None, ["rollout.engine.static_cache=on"]).rollout.engine.static_cache == "on"
    assert load_config(None, ["rollout.engine.static_cache=off"]).rollout.engine.static_cache == "off"
    assert load_config(None, []).rollout.engine.static_cache == "auto"


def test_bad_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)
    with pytest.raises(ConfigError, match=r"section\.field=value"):
        load_config(None, ["trainer.lr"])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_cli_config_show_and_explain() -> None:
    out = _cli("config", "show", "configs/demo.yaml", "--set", "trainer.lr=0.5")
    assert out.returncode == 0, out.stderr
    shown = yaml.safe_load(out.stdout)
    assert shown["trainer"]["lr"] == 0.5
    assert shown["env"]["latency"]["kind"] == "pareto"
    assert RunConfig.model_validate(shown).trainer.lr == 0.5  # show output is itself a valid config

    out = _cli("config", "explain", "trainer")
    assert out.returncode == 0, out.stderr
    assert "trainer.lr" in out.stdout and "learning rate" in out.stdout
    assert "env.guard" not in out.stdout


def test_cli_bad_config_exit_code_2_no_traceback() -> None:
    out = _cli("config", "show", "configs/demo.yaml", "--set", "trainer.lr=-3")
    assert out.returncode == 2
    assert "trainer.lr" in out.stderr and "-3" in out.stderr
    assert "Traceback" not in out.stderr
    out = _cli("config", "explain", "nosuchsection")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "sections:" in out.stderr


def test_cli_missing_gpu_fails_before_any_work(tmp_path: Path) -> None:
    """model.device=cuda without a GPU: one clear line, exit 2, no warm start, no run directory."""
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [*CLI, "train", "configs/demo.yaml", "--set", "model.device=cuda", "--set", f"run_root={run_dir}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # no GPU, on any machine
    )
    assert out.returncode == 2, out.stderr
    assert "model.device is 'cuda' but no CUDA device is visible" in out.stderr
    assert "Traceback" not in out.stderr
    assert not run_dir.exists()


def test_explain_rows_cover_nested_fields() -> None:
    paths = [r[0] for r in explain(RunConfig)]
    assert "env.guard.step_timeout_s" in paths
    assert "algo.policy_loss.eps_low" in paths


def test_documented_env_options_overrides_replace_and_merge() -> None:
    """docs/configuration.md's two --set lines, split as bash splits them: the quoted dict replaces,
    the dotted key merges."""
    import shlex

    doc = (ROOT / "docs" / "configuration.md").read_text()
    lines = [
        ln.split("#")[0]
        for ln in doc.splitlines()
        if ln.startswith("--set env.options") or ln.startswith("--set 'env.options")
    ]
    assert len(lines) == 2, lines
    replace, merge = (shlex.split(ln)[1] for ln in lines)
    base = ["env.options={keep: 1}"]
    assert load_config(None, [*base, replace]).env.options == {"n": 3, "noise": 0.2}
    assert load_config(None, [*base, merge]).env.options == {"keep": 1, "n": 3}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.path=nowhere_pkg_xyz.env:Env", "module 'nowhere_pkg_xyz.env' not found"),
        ("env.options={no_such_option: 1}", "no_such_option"),
    ],
)
def test_a_start_that_fails_on_a_bad_path_or_option_leaves_no_run_directory(
    tmp_path: Path, override: str, message: str
) -> None:
    from asyncrl.errors import UserError
    from asyncrl.jobs.train import train

    kind = "plugin" if override.startswith("env.path") else "calculator"
    cfg = load_config(None, [f"env.kind={kind}", override, f"run_root={tmp_path / 'runs'}"])
    with pytest.raises(UserError, match=message):
        train(cfg, display=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# ---- variant sections: one model per kind ------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "field", "owner", "kind"),
    [
        (["transport.redis_url=redis://h:6379/0"], "transport.redis_url", "'redis'", "'embedded'"),
        (["weights.path=/shared/w"], "weights.path", "'shared'", "'local'"),
        (
            ["rollout.engine.kind=vllm", "rollout.engine.static_cache=on"],
            "rollout.engine.static_cache",
            "'hf'",
            "'vllm'",
        ),
        (["env.latency.kind=pareto", "env.latency.sigma=2"], "env.latency.sigma", "'lognormal'", "'pareto'"),
        (
            ["env.latency.seconds=0.1"],
            "env.latency.seconds",
            "'constant' or 'lognormal' or 'pareto'",
            "'none'",
        ),
        (["credit.value.num_layers=2"], "credit.value.num_layers", "'separate'", "'head'"),
        (["launcher.heartbeat_timeout_s=5"], "launcher.heartbeat_timeout_s", "'external'", "'local'"),
        (
            ["launcher.kind=external", "launcher.trainer_gpus=1"],
            "launcher.trainer_gpus",
            "'ray'",
            "'external'",
        ),
        (["control.state.prefix=run-a"], "control.state.prefix", "'redis'", "'sqlite'"),
    ],
)
def test_a_field_of_another_kind_is_refused_naming_field_and_kind(
    overrides: list[str], field: str, owner: str, kind: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    section = field.rsplit(".", 1)[0]
    line = f"  {field}: only for {section}.kind {owner}, not for {section}.kind {kind}"
    assert line in str(info.value).splitlines()[1], str(info.value)


def test_a_wrong_kind_field_in_a_yaml_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("transport: {kind: embedded, capacity: 2048, redis_url: 'redis://:secret@h:6379/0'}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "transport.redis_url: only for transport.kind 'redis'" in msg and "secret" not in msg


def test_variant_sections_pick_their_model_by_kind() -> None:
    from asyncrl.config import (
        HeadValueModelConfig,
        HFEngineConfig,
        LocalWeightsConfig,
        NoLatencyConfig,
        ParetoLatencyConfig,
        RedisTransportConfig,
        SeparateValueModelConfig,
        SharedWeightsConfig,
        VLLMEngineConfig,
    )

    d = load_config()
    assert isinstance(d.rollout.engine, HFEngineConfig) and isinstance(d.weights, LocalWeightsConfig)
    assert isinstance(d.env.latency, NoLatencyConfig) and isinstance(d.credit.value, HeadValueModelConfig)
    cfg = load_config(
        None,
        [
            "transport.kind=redis",
            "transport.redis_url=redis://h:6379/1",
            "weights.kind=shared",
            "weights.path=/shared/w",
            "rollout.engine.kind=vllm",
            "rollout.engine.vllm_kv_cache_gb=2",
            "env.latency.kind=pareto",
            "env.latency.alpha=1.2",
            "credit.value.kind=separate",
            "credit.value.num_layers=2",
        ],
    )
    assert isinstance(cfg.transport, RedisTransportConfig) and cfg.transport.redis_url == "redis://h:6379/1"
    assert isinstance(cfg.weights, SharedWeightsConfig) and cfg.weights.path == "/shared/w"
    assert isinstance(cfg.rollout.engine, VLLMEngineConfig) and cfg.rollout.engine.vllm_kv_cache_gb == 2
    assert isinstance(cfg.env.latency, ParetoLatencyConfig) and cfg.env.latency.alpha == 1.2
    assert isinstance(cfg.credit.value, SeparateValueModelConfig) and cfg.credit.value.num_layers == 2
    assert RunConfig.model_validate(yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json")))) == cfg
    from asyncrl.config import (
        ExternalLauncherConfig,
        LocalLauncherConfig,
        RayLauncherConfig,
        RedisStateConfig,
    )

    assert isinstance(d.launcher, LocalLauncherConfig)
    ray = load_config(None, ["launcher.kind=ray", "launcher.trainer_gpus=1"]).launcher
    assert isinstance(ray, RayLauncherConfig) and ray.trainer_gpus == 1
    assert isinstance(load_config(None, ["launcher.kind=external"]).launcher, ExternalLauncherConfig)
    state = load_config(
        None,
        ["control.state.kind=redis", "control.state.redis_url=redis://h:6379/2", "control.state.prefix=a"],
    ).control.state
    assert isinstance(state, RedisStateConfig) and state.prefix == "a"
    with pytest.raises(ConfigError, match=r"transport\.kind = 'kafka': allowed values: 'embedded', 'redis'"):
        load_config(None, ["transport.kind=kafka"])


def test_explain_lists_every_kind_and_marks_kind_only_fields() -> None:
    rows = {r[0]: r for r in explain(RunConfig)}
    assert rows["transport.kind"][1] == "Literal['embedded', 'redis']"
    assert rows["transport.kind"][2] == "'embedded'"
    assert rows["transport.redis_url"][3].startswith("kind: redis — ")
    assert not rows["transport.capacity"][3].startswith("kind:")
    assert rows["env.latency.max_seconds"][3].startswith("kind: constant, lognormal, pareto — ")
    assert rows["rollout.engine.vllm_dtype"][3].startswith("kind: vllm — ")
    assert rows["credit.value.num_layers"][3].startswith("kind: separate — ")
    assert rows["env.sandbox"][1] == "section" and "env.sandbox.wall_seconds" in rows
    assert rows["cost.assumptions.trajectories"][3].startswith("N: trajectories generated.")


def test_a_resolved_config_written_before_variant_sections_still_loads(tmp_path: Path) -> None:
    """Old run directories hold every field of every kind at its default; those are dropped."""
    old = {
        "transport": {
            "kind": "embedded",
            "capacity": 2048,
            "redis_url": "redis://127.0.0.1:6379/0",
            "lease_seconds": 60.0,
        },
        "weights": {"kind": "local", "keep": 3, "path": None, "redis_url": "redis://127.0.0.1:6379/0"},
        "env": {"latency": {"kind": "none", "seconds": 0.0, "sigma": 1.0, "alpha": 1.5, "max_seconds": 60.0}},
        "rollout": {"engine": {"kind": "hf", "max_batch": 8, "vllm_dtype": "float32", "vllm_kv_cache_gb": 1}},
        "credit": {"value": {"kind": "head", "num_layers": 1}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    cfg = load_config(path)
    assert cfg.transport.capacity == 2048 and cfg.rollout.engine.max_batch == 8
    old["weights"]["path"] = "/shared/w"  # a value that means something: still refused
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match=r"weights\.path: only for weights\.kind 'shared'"):
        load_config(path)


def test_setting_a_kind_switches_the_section_and_drops_the_old_kinds_fields() -> None:
    c = load_config(
        ROOT / "configs" / "demo.yaml", ["env.latency.kind=none"]
    )  # the file's Pareto latency is off
    assert c.env.latency.kind == "none"
    c = load_config(
        None, ["env.latency.kind=constant", "env.latency.seconds=0.05", "env.latency.kind=lognormal"]
    )
    assert (
        c.env.latency.kind == "lognormal" and c.env.latency.seconds == 0.05
    )  # a field both kinds have stays
    with pytest.raises(ConfigError, match=r"env\.latency\.seconds: only for env\.latency\.kind"):
        load_config(
            None, ["env.latency.kind=none", "env.latency.seconds=0.05"]
        )  # given after the switch: refused


@pytest.mark.parametrize(
    "path",
    [
        "rollout.engine.compile_decode",
        "rollout.engine.shared_prefix_attention",
        "rollout.engine.continuous_batching",
    ],
)
def test_a_retired_field_at_its_old_default_is_dropped_and_set_otherwise_refused(
    tmp_path: Path, path: str
) -> None:
    """A resolved config.yaml of an older run holds a retired field at its old default: it loads (and
    resumes); the field set to anything else is refused, naming it and why it went."""
    from asyncrl.config.aliases import RETIRED

    assert path in RETIRED
    cfg = RunConfig.model_validate(_nested(path, False))
    assert path.rsplit(".", 1)[1] not in type(cfg.rollout.engine).model_fields
    file = tmp_path / "old.yaml"
    file.write_text(yaml.safe_dump(_nested(path, True)))
    with pytest.raises(ConfigError, match=rf"{re.escape(path)} was retired: .*remove it"):
        load_config(file)
    with pytest.raises(ConfigError, match="was retired"):
        load_config(None, [f"{path}=true"])


# -- renamed paths (docs/configuration.md#renamed-fields): old names work for one release, with a warning
RENAME_CASES = [  # (old path, new path, a value other than the default)
    ("orchestrator.mode", "control.mode", "one_step_off"),
    ("orchestrator.max_staleness", "control.max_staleness", 1),
    ("orchestrator.stale_policy", "control.stale_policy", "downweight"),
    ("orchestrator.governor_window", "orchestrator.governor.window", 7),
    ("orchestrator.governor_fill_window", "orchestrator.governor.fill_window", 3),
    ("orchestrator.governor_low_fill", "orchestrator.governor.low_fill", 0.2),
    ("control.curriculum.window", "orchestrator.curriculum.window", 9),
    ("control.breaker.probes", "orchestrator.breaker.probes", 5),
    ("control.drift.k", "orchestrator.drift.k", 0.5),
    ("control.exploration.window", "orchestrator.exploration.window", 4),
    ("control.elastic.max_workers", "orchestrator.elastic.max_workers", 3),
]


def _nested(path: str, value: object) -> dict[str, object]:
    out: dict[str, object] = {}
    node = out
    *head, last = path.split(".")
    for part in head:
        node = node.setdefault(part, {})  # type: ignore[assignment]
    node[last] = value
    return out


def _at(cfg: RunConfig, path: str) -> object:
    node: object = cfg
    for part in path.split("."):
        node = getattr(node, part)
    return node


def test_every_renamed_path_has_a_case() -> None:
    from asyncrl.config import RENAMED

    covered = {old for old, _, _ in RENAME_CASES}
    assert all(any(c == old or c.startswith(old + ".") for c in covered) for old in RENAMED)


@pytest.mark.parametrize(("old", "new", "value"), RENAME_CASES, ids=[c[0] for c in RENAME_CASES])
def test_an_old_name_is_accepted_with_a_warning_naming_the_new_path(
    old: str, new: str, value: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = load_config(None, [f"{new}={value}"])
    assert _at(expected, new) == value and not caplog.records  # the new name: no warning
    assert load_config(None, [f"{old}={value}"]).model_dump() == expected.model_dump()  # --set
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(_nested(old, value)))
    assert load_config(path).model_dump() == expected.model_dump()  # a YAML key
    warnings = [
        re.fullmatch(r"config: (\S+) is deprecated, use (\S+) \(.*\)", r.getMessage()) for r in caplog.records
    ]
    assert len(warnings) == 2  # one line each: the --set, the YAML key (a renamed section is named whole)
    for w in warnings:
        assert w is not None and old.startswith(w[1]) and new.startswith(w[2])


@pytest.mark.parametrize(("old", "new", "value"), RENAME_CASES, ids=[c[0] for c in RENAME_CASES])
def test_a_field_under_both_names_is_a_clear_error(old: str, new: str, value: object, tmp_path: Path) -> None:
    data = _nested(old, value)
    (node := data)  # merge the new path into the same mapping
    for part in new.split(".")[:-1]:
        node = node.setdefault(part, {})  # type: ignore[assignment]
    node[new.split(".")[-1]] = value  # type: ignore[index]
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError, match=rf"{re.escape(new)} is given twice, also under its old name {re.escape(old)}"
    ):
        load_config(path)


def test_a_section_under_both_names_is_merged(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text("control: {breaker: {probes: 4}}\norchestrator: {breaker: {consecutive: 7}}\n")
    breaker = load_config(path).orchestrator.breaker
    assert (breaker.probes, breaker.consecutive) == (4, 7)


def test_an_override_with_the_old_name_overrides_the_files_new_name() -> None:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml", ["orchestrator.max_staleness=0"]
    )  # the file says control:
    assert cfg.control.max_staleness == 0


def test_a_resolved_config_of_a_run_before_the_rename_still_loads(tmp_path: Path) -> None:
    """A ``config.yaml`` written by the last release (whole sections under their old names) resumes."""
    new = load_config(
        None, ["control.mode=sync", "orchestrator.breaker.probes=4", "orchestrator.governor.window=2"]
    )
    old = new.model_dump(mode="json")
    orch, ctl = old["orchestrator"], old["control"]
    for key in ("mode", "max_staleness", "stale_policy"):
        orch[key] = ctl.pop(key)
    for key in ("curriculum", "breaker", "drift", "exploration", "elastic"):
        ctl[key] = orch.pop(key)
    for key, value in orch.pop("governor").items():
        orch[f"governor_{key}"] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert load_config(path).model_dump() == new.model_dump()


def test_cli_warns_once_on_one_line_for_an_old_name() -> None:
    out = _cli("config", "show", "configs/demo.yaml", "--set", "orchestrator.max_staleness=1")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["control"]["max_staleness"] == 1
    lines = [ln for ln in out.stderr.splitlines() if "deprecated" in ln]
    assert lines == [
        "config: orchestrator.max_staleness is deprecated, use control.max_staleness "
        "(the old name goes in the next release)"
    ]


def test_each_role_gets_its_settings_from_the_run_config() -> None:
    """The values other sections decide for a role arrive in its settings; evaluation's are quiet, on the
    built-in engine with the run's batching, and play every episode to its end."""
    cfg = load_config(
        None,
        [
            "orchestrator.exploration.early_stop_invalid=3",
            "orchestrator.breaker.reward_min=-2",
            "orchestrator.breaker.reward_max=5",
            "orchestrator.curriculum.enabled=false",
            "orchestrator.curriculum.steer_buffer=true",
            "rollout.engine.kind=vllm",
            "rollout.engine.max_batch=7",
            "env.latency.kind=constant",
            "env.faults.exception_rate=0.5",
        ],
    )
    worker, ev = cfg.rollout_settings(), cfg.eval_settings()
    assert (worker.early_stop_invalid, worker.reward_bounds, worker.curriculum) == (3, (-2.0, 5.0), False)
    assert worker.engine.kind == "vllm" and worker.env.faults.exception_rate == 0.5
    assert ev.engine.kind == "hf" and ev.engine.max_batch == 7 and ev.early_stop_invalid == 0
    assert ev.env.latency.kind == "none" and ev.env.faults.exception_rate == 0.0
    assert (ev.reward_bounds, ev.curriculum, ev.sampling) == (worker.reward_bounds, False, worker.sampling)
    assert cfg.trainer_settings().steer_buffer is True
