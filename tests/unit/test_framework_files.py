"""The files `klsweep audit --framework` opens: one shell reader (bash's default idioms, nothing executed), one
guarded reader for every file (the config, each parent of a NeMo-RL defaults: chain), NeMo-RL's inheritance and
Optional clamps, AReaL without a reference, and `--json` on a refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_audit import run_cli  # tests/unit is on sys.path under pytest

from klsweep.audit import frameworks
from klsweep.audit.frameworks import shell
from klsweep.errors import UserError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_shell_default_idioms_are_read_as_bash_runs_them(tmp_path):
    """SkyRL thunder_agent r2egym_32b run_trainer.sh's ${VAR:-default} and maxrl run_maxrl_gsm8k.sh's
    : "${VAR:=default}" (#50): the script's defaults, not klsweep's."""
    script = write(
        tmp_path / "run.sh",
        """\
        : "${USE_KL:=false}"
        COEF=${KL_COEF:-0.05}
        python -m skyrl.train.entrypoints.main_base \\
          trainer.algorithm.use_kl_loss=$USE_KL \\
          trainer.algorithm.kl_loss_coef=${COEF} \\
          trainer.algorithm.use_kl_in_reward=${IN_REWARD:-true}
        """,
    )
    found = frameworks.read("skyrl", script)
    ((place, config),) = found.terms
    assert place == "skyrl reward" and config.beta == 0.05
    env: dict[str, str] = {}
    assert shell.expand("${A:=x} ${A:-y} ${B-z} ${B} '${A}'", env) == "x x z ${B} '${A}'"
    assert env == {"A": "x"}
    deep = "${A:-" * 5000 + "x" + "}" * 5000  # nested defaults: bounded, the value said unreadable
    assert shell.unreadable(shell.expand(deep, {}))


def test_a_command_substitution_is_never_run_and_said_unreadable(tmp_path):
    marker = tmp_path / "ran"
    script = write(
        tmp_path / "run.sh",
        f"""\
        USE=$(touch {marker}; echo true)
        python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=$USE \\
          actor_rollout_ref.actor.kl_loss_coef=`touch {marker}; echo 0.5`
        """,
    )
    found = frameworks.read("verl", script)
    assert not marker.exists() and found.terms == ()
    said = [w for w in found.warnings if "cannot be resolved from this file" in w]
    assert len(said) == 2 and "$(touch" in said[0], found.warnings


def test_nemo_defaults_chain_and_null_clamps(tmp_path):
    """examples/configs/ppo_math_1B_megatron.yaml's shape: the parent's reference_policy_kl_penalty 0.0 wins
    over klsweep's default; kl_*_clamp_value null is NeMo-RL's Optional: no clamp."""
    (tmp_path / "pyproject.toml").write_text("")  # the config tree
    write(tmp_path / "base.yaml", "grpo: {}\nloss_fn:\n  reference_policy_kl_penalty: 0.0\n")
    child = write(
        tmp_path / "recipes" / "child.yaml", "defaults: ../base.yaml\nloss_fn:\n  ratio_clip_min: 0.1\n"
    )
    found = frameworks.read("nemo-rl", child)
    assert found.terms == () and any("no KL at all" in w for w in found.warnings)
    nulls = write(
        tmp_path / "nulls.yaml",
        "grpo: {}\nloss_fn:\n  kl_input_clamp_value: null\n  kl_output_clamp_value: null\n",
    )
    ((_, config),) = frameworks.read("nemo-rl", nulls).terms
    assert config.log_ratio_clamp == 0.0 and config.value_clamp == 0.0 and not config.clamp_weighted
    in_reward = write(tmp_path / "r.yaml", "grpo: {}\nloss_fn:\n  use_kl_in_reward: true\n")
    found = frameworks.read("nemo-rl", in_reward)
    assert found.terms == () and any("only the reinforce_plus_plus and gae" in w for w in found.warnings)
    rpp = write(
        tmp_path / "rpp.yaml",
        "grpo:\n  adv_estimator:\n    name: reinforce_plus_plus\nloss_fn:\n  use_kl_in_reward: true\n",
    )
    assert [p for p, _ in frameworks.read("nemo-rl", rpp).terms] == ["nemo-rl reward"]
    sft = write(tmp_path / "sft.yaml", "sft:\n  max_num_epochs: 1\npolicy:\n  model_name: m\n")
    assert any("no KL against a reference" in w for w in frameworks.read("nemo-rl", sft).warnings)


def test_areal_without_a_reference_is_no_kl_against_a_reference(tmp_path):
    """AReaL's SFT/DPO/reward-model files (no rollout:/gconfig:) and an RL file without ref: (rl_trainer.py
    builds the reference only from it) get no KL verdict; keys of an older AReaL are refused as 1.0.4 does."""
    sft = write(tmp_path / "sft.yaml", "actor:\n  kl_ctl: 0.1\n  path: m\n")
    found = frameworks.read("areal", sft)
    assert found.terms == () and any(
        w.startswith("no KL against a reference: no rollout:") for w in found.warnings
    )
    dpo = write(tmp_path / "dpo.yaml", "actor:\n  beta: 0.1\nref:\n  path: m\n")
    assert frameworks.read("areal", dpo).terms == ()
    rollout = "rollout:\n  backend: sglang:d1\n"
    no_ref = write(tmp_path / "rl.yaml", rollout + "actor:\n  kl_ctl: 0.1\n")
    found = frameworks.read("areal", no_ref)
    assert found.terms == () and any(
        w.startswith("no KL against a reference: no ref:") for w in found.warnings
    )
    old = write(
        tmp_path / "old.yaml", rollout + "ref: {path: m}\nactor:\n  kl_ctl: 0.1\n  behave_imp_weight_cap: 5\n"
    )
    with pytest.raises(UserError, match="a key of an older AReaL"):
        frameworks.read("areal", old)


def test_json_on_a_refusal_is_an_error_object_on_stdout(tmp_path):
    config = write(tmp_path / "c.yaml", "grpo: {}\nloss_fn:\n  reference_policy_kl_penalty: null\n")
    out = run_cli("--framework", "nemo-rl", "--config", str(config), "--json")
    assert out.exit_code == 2
    assert "reference_policy_kl_penalty" in json.loads(out.stdout)["error"]


HOSTILE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from klsweep.audit import frameworks
from klsweep.errors import UserError
try:
    frameworks.read(sys.argv[1], sys.argv[2])
except UserError as e:
    print(e)
    sys.exit(2)
"""


def refused(framework: str, path: Path) -> str:
    """The audit's refusal of ``path``, in a subprocess under 2 GiB of address space and a 60 s timeout."""
    done = subprocess.run(
        [sys.executable, "-c", HOSTILE, framework, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done.stdout


def test_hostile_files_are_refused_quickly_parents_included(tmp_path):
    """#47 item 8: alias bombs, recursive aliases, 5000-deep nesting, FIFOs, /dev/zero, ../ and links out of
    the config tree: exit 2 with a message, for the config and for a parent of its defaults: chain."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdefg", "bcdefgh", strict=False)]
    tree = tmp_path / "tree"
    (tree / "pyproject.toml").parent.mkdir()
    (tree / "pyproject.toml").write_text("")
    bomb = write(tree / "bomb.yaml", "\n".join(levels) + "\nloss_fn: *h\n")
    loop = write(tree / "loop.yaml", "a: &a {b: *a}\n")
    deep = write(tree / "deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    fifo = tree / "fifo.yaml"
    os.mkfifo(fifo)
    outside = write(tmp_path / "outside.yaml", "loss_fn: {reference_policy_kl_penalty: 0.5}\n")
    (tree / "link.yaml").symlink_to(outside)
    for path, said in (
        (bomb, "alias bomb"),
        (loop, "expands without end"),
        (deep, "levels deep"),
        (fifo, "FIFO"),
        (Path("/dev/zero"), "a device"),
    ):
        assert said in refused("nemo-rl", path), path
        parent = write(tree / f"child-{path.name}", f"defaults: {path}\ngrpo: {{}}\n")
        out = refused("nemo-rl", parent)
        assert said in out or "outside the config tree" in out, (path, out)
    for parent in ("../outside.yaml", "link.yaml", "child-loop.yaml"):
        out = refused("nemo-rl", write(tree / "c.yaml", f"defaults: {parent}\ngrpo: {{}}\n"))
        assert "outside the config tree" in out or "expands without end" in out, (parent, out)
    cycle = write(tree / "cycle.yaml", "defaults: cycle.yaml\ngrpo: {}\n")
    assert "is a cycle" in refused("nemo-rl", cycle)
    write(tree / "p.yaml", "grpo: {}\n")
    wide = write(tree / "wide.yaml", "defaults: [" + ", ".join(["p.yaml"] * 10_000) + "]\n")
    assert "more than 64 parent files" in refused("nemo-rl", wide)
    big = tree / "big.yaml"
    big.write_bytes(b"a: 1\n" * 300_000)
    assert "too large" in refused("areal", big)


def test_skyrl_kl_ctrl_is_read_and_trl_sequence_token_refused(tmp_path):
    """#50 item 7: SkyRL's trainer.algorithm.kl_ctrl.* (KLCtrlConfig, get_kl_controller) is read, not called
    unread; TRL 1.16's _compute_loss refuses importance_sampling_level sequence_token."""
    skyrl = write(
        tmp_path / "s.yaml",
        """\
        trainer:
          algorithm:
            use_kl_loss: false
            use_kl_in_reward: true
            kl_ctrl: {type: adaptive, kl_target: 0.2, horizon: 500}
        """,
    )
    warnings = frameworks.read("skyrl", skyrl).warnings
    assert not any("kl_ctrl" in w and "not a key" in w for w in warnings), warnings
    assert any("kl_ctrl.type adaptive" in w for w in warnings)
    trl = write(tmp_path / "t.yaml", "beta: 0.1\nimportance_sampling_level: sequence_token\n")
    with pytest.raises(UserError, match="importance_sampling_level"):
        frameworks.read("trl", trl)


SECOND = """
import json, sys
from klsweep.audit import frameworks
found, _ = frameworks.audit_config(sys.argv[1], sys.argv[2])
print(json.dumps({"found": found, "torch": "torch" in sys.modules}))
"""


def test_a_second_audit_of_the_same_file_needs_no_torch_nor_hydra(tmp_path):
    """The exact audit is kept by configuration (audit/cache.py), a script's parsed overrides by its words: a
    second `audit --framework` of a file imports neither torch nor Hydra and answers the same; a damaged kept
    audit is computed again."""
    env = {**os.environ, "KLSWEEP_CACHE": str(tmp_path / "cache")}
    fixtures = Path(__file__).parents[1] / "fixtures" / "frameworks"

    def audit(framework: str, name: str) -> dict:
        cmd = [
            sys.executable,
            "-c",
            SECOND + "print('hydra' in sys.modules)",
            framework,
            str(fixtures / name),
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
        found, hydra = done.stdout.strip().splitlines()[-2:]
        return json.loads(found) | {"hydra": hydra == "True"}

    firsts = {}
    for framework, name in (
        ("nemo-rl", "corpus/nemo-rl/files/examples/configs/grpo_math_1B.yaml"),
        ("verl", "corpus/verl/files/examples/grpo_trainer/run_qwen2-7b.sh"),
    ):
        first, second = audit(framework, name), audit(framework, name)
        assert first["torch"] and not second["torch"] and not second["hydra"], (first, second)
        assert first["found"] == second["found"] and second["found"]["audit"]
        firsts[framework] = first
    for kept in (tmp_path / "cache" / "audit").glob("*.json"):
        kept.write_text("[{}]")
    again = audit("nemo-rl", "corpus/nemo-rl/files/examples/configs/grpo_math_1B.yaml")
    assert again["torch"] and again["found"] == firsts["nemo-rl"]["found"]


def pipelinerl_tree(tmp_path: Path) -> Path:
    """A PipelineRL conf/ tree as its authors lay it out (base, finetune: base, override finetune: ppo)."""
    tree = tmp_path / "tree"
    write(tree / "pyproject.toml", "")
    conf = tree / "conf"
    write(conf / "base.yaml", "defaults:\n  - finetune: base\n  - _self_\nseed: 1\n")
    write(conf / "finetune" / "base.yaml", "rl:\n  policy_loss: reinforce\n  kl_coef: 0.0\n")
    write(conf / "finetune" / "ppo.yaml", "defaults:\n  - base\n  - _self_\nrl:\n  policy_loss: ppo\n")
    write(conf / "finetune" / "grpo.yaml", "defaults:\n  - base\n  - _self_\nrl:\n  kl_coef: 0.05\n")
    return conf


def test_pipelinerl_defaults_are_composed_as_its_hydra_tree_composes_them(tmp_path):
    """#50 gap: PipelineRL's miniwob*.yaml (override finetune: ppo / grpo) were read without their defaults:
    (policy_loss reinforce, kl_coef 0); Hydra composes the tree, the closest override winning."""
    conf = pipelinerl_tree(tmp_path)
    ppo = write(conf / "exp.yaml", "defaults:\n  - base\n  - override finetune: ppo\n  - _self_\n")
    grpo = write(
        conf / "exp_grpo.yaml",
        "defaults:\n  - exp\n  - override finetune: grpo\n  - _self_\nfinetune:\n  rl:\n    final_kl_coef: 0.0\n",
    )
    reading, _ = frameworks.read_terms("pipelinerl", ppo)
    assert reading.values["finetune.rl.policy_loss"] == "ppo"
    reading, _ = frameworks.read_terms("pipelinerl", grpo)
    assert reading.values["finetune.rl.policy_loss"] == "reinforce"
    assert (
        reading.values["finetune.rl.kl_coef"] == 0.05 and reading.values["finetune.rl.final_kl_coef"] == 0.0
    )
    with pytest.raises(UserError, match="Could not find 'finetune/missing'"):
        frameworks.read(
            "pipelinerl", write(conf / "bad.yaml", "defaults:\n  - base\n  - override finetune: missing\n")
        )
    with pytest.raises(UserError, match="no finetune: section"):
        frameworks.read("pipelinerl", write(conf / "streams" / "redis.yaml", "backend: redis\n"))


def test_pipelinerl_defaults_files_are_guarded(tmp_path):
    """Every file a PipelineRL defaults: tree names is read by the guarded reader (Hydra opens none): a link out
    of the tree, a FIFO, an alias bomb, more than 64 files: exit 2 with a message."""
    conf = pipelinerl_tree(tmp_path)
    outside = write(tmp_path / "outside.yaml", "rl: {kl_coef: 0.5}\n")
    (conf / "finetune" / "link.yaml").symlink_to(outside)
    os.mkfifo(conf / "finetune" / "fifo.yaml")
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdefg", "bcdefgh", strict=False)]
    write(conf / "finetune" / "bomb.yaml", "\n".join(levels) + "\nrl: *h\n")
    for option, said in (("link", "outside the config tree"), ("fifo", "FIFO"), ("bomb", "alias bomb")):
        child = write(conf / f"c_{option}.yaml", f"defaults:\n  - base\n  - override finetune: {option}\n")
        assert said in refused("pipelinerl", child), option
    for i in range(70):
        write(conf / "g" / f"o{i}.yaml", "x: 1\n")
    wide = write(conf / "wide.yaml", "defaults:\n  - base\n" + "".join(f"  - g: o{i}\n" for i in range(70)))
    assert "more than 64 parent files" in refused("pipelinerl", wide)


def test_skyrl_train_keys_and_scripts_are_refused_naming_the_version(tmp_path):
    """#50 gap 2: skyrl-train 0.3's use_kl_estimator_k3 / use_abs_kl (kl_estimator_type in 0.4.0) and its entry
    point skyrl_train.entrypoints.main_base: refused naming skyrl-train 0.3, not an audit of 0.4.0's defaults."""
    old_key = write(
        tmp_path / "a.sh",
        "python -m skyrl.train.entrypoints.main_base trainer.algorithm.use_kl_estimator_k3=true "
        "trainer.algorithm.kl_loss_coef=0.01\n",
    )
    with pytest.raises(UserError, match="use_kl_estimator_k3: a key of skyrl-train 0.3.x"):
        frameworks.read("skyrl", old_key)
    old_entry = write(
        tmp_path / "b.sh", "uv run -m skyrl_train.entrypoints.main_base trainer.algorithm.use_kl_loss=true\n"
    )
    with pytest.raises(UserError, match="a skyrl-train 0.3.x .or older. launch command"):
        frameworks.read("skyrl", old_entry)
