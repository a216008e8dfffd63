"""`klsweep audit --framework NAME --config FILE` (klsweep.audit.frameworks): the frameworks' own configs, as
their repositories' examples write them (tests/fixtures/frameworks/, copied from the commits the presets cite),
mapped onto klsweep's KL keys; a config written to train what a preset trains maps onto that preset (which the
peer tier proves equal to the framework's code: tests/peer/); a hand-made config for each warning; the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit import run_cli  # tests/unit is on sys.path under pytest

from klsweep import presets
from klsweep.audit import frameworks
from klsweep.errors import UserError

EXAMPLES = Path(__file__).parents[1] / "fixtures" / "frameworks"


def read_text(tmp_path: Path, framework: str, text: str, suffix: str = ".yaml") -> frameworks.FrameworkKL:
    path = tmp_path / f"config{suffix}"
    path.write_text(text)
    return frameworks.read(framework, path)


def only(found: frameworks.FrameworkKL):
    (term,) = found.terms
    return term[1]


@pytest.mark.parametrize(
    ("framework", "example", "preset", "grpo"),
    [
        (
            "verl",
            "corpus/verl/files/examples/grpo_trainer/run_qwen2-7b.sh",
            "verl",
            True,
        ),  # examples/grpo_trainer/run_qwen2-7b.sh
        (
            "nemo-rl",
            "corpus/nemo-rl/files/examples/configs/grpo_math_1B.yaml",
            "nemo",
            True,
        ),  # examples/configs/grpo_math_1B.yaml
        ("pipelinerl", "corpus/pipelinerl/files/conf/deepscaler15b.yaml", "pipelinerl", True),  # in its tree
    ],
)
def test_the_frameworks_examples_map_onto_their_presets(framework, example, preset, grpo):
    found = frameworks.read(framework, EXAMPLES / example)
    assert only(found) == presets.kl_config(preset)
    assert found.grpo is grpo


def test_examples_without_a_kl_say_so(tmp_path):
    """slime's run-qwen3-4B.sh (--use-kl-loss --kl-loss-coef 0.00), SkyRL's CISPO example (use_kl_loss=false
    through a shell variable), AReaL's gsm8k_grpo.yaml (kl_ctl 0.0), PipelineRL's base (kl_coef 0.0): no KL
    at all, nothing audited; OpenRLHF's ProRL v2 script: k2 in the loss at 1e-4 (GRPO-like)."""
    for framework, example in (
        ("slime", "slime_run-qwen3-4B.sh"),
        ("skyrl", "corpus/skyrl/files/examples/train/algorithms/cispo/run_cispo_gsm8k.sh"),
        ("areal", "corpus/areal/files/examples/math/gsm8k_grpo.yaml"),
        ("pipelinerl", "pipelinerl_finetune_base.yaml"),
    ):
        found, rows = frameworks.audit_config(framework, EXAMPLES / example)
        assert found["kl"] == {} and rows == [] and found["audit"] == [], example
        assert any("no KL at all" in w for w in found["warnings"]), example
    # verl 0.9.1's whole default config (verl/trainer/config/_generated_ppo_trainer.yaml, from its wheel): every
    # KL key known, none on
    full = frameworks.read("verl", EXAMPLES / "verl_0.9.1_generated_ppo_trainer.yaml")
    assert full.terms == () and full.warnings == (
        "no KL at all (beta 0 or off, as verl 0.9.1 reads this config): nothing to audit",
    )
    # OpenRLHF's ProRL v2 script (its 0.11.0 examples): 0.11.2's parser refuses --algo.advantage.is_correction_*
    # (argparse: unrecognized arguments), so klsweep refuses it too; without them, k2 in the loss at 1e-4
    prorl = EXAMPLES / "corpus/openrlhf/files/examples/scripts/train_prorlv2_math_hybrid_engine.sh"
    with pytest.raises(UserError, match="is_correction_enable.*not a flag of openrlhf 0.11.2"):
        frameworks.read("openrlhf", prorl)
    text = "\n".join(line for line in prorl.read_text().splitlines() if "is_correction" not in line)
    found = read_text(tmp_path, "openrlhf", text, ".sh")
    config = only(found)
    assert (config.estimator, config.placement, config.beta, found.grpo) == ("k2", "loss", 1e-4, True)


CONFIGS = [  # (framework, the config as its users write it, the preset it trains)
    ("trl", "beta: 0.04\nloss_type: dapo\n", "trl"),
    ("trl", '{"beta": 0.04, "importance_sampling_level": "sequence"}', "trl-sequence"),
    ("verl", "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_type=low_var_kl+", "verl-k3plus"),
    ("openrlhf", "python3 -m openrlhf.cli.train_ppo_ray --algo.kl.init_coef 0.01", "openrlhf"),
    ("openrlhf", "python3 -m openrlhf.cli.train_ppo_ray --algo.kl.use_loss --algo.kl.unbiased_gradient "
     "--algo.kl.init_coef=0.01", "openrlhf-unbiased"),
    ("slime", "python3 train.py --use-kl-loss --kl-loss-coef 0.01", "slime"),
    ("slime", "python3 train.py --use-kl-loss --kl-loss-coef 0.01 --use-unbiased-kl", "slime-unbiased"),
    ("skyrl", "trainer:\n  algorithm:\n    kl_loss_coef: 0.001\n", "skyrl"),
    ("nemo-rl", "loss_fn:\n  use_on_policy_kl_approximation: true\n", "nemo-onpolicy"),
    ("areal", "actor:\n  kl_ctl: 0.1\nref:\n  path: ref-model\nrollout:\n  backend: sglang:d1\n", "areal"),
]  # fmt: skip


@pytest.mark.parametrize(("framework", "text", "preset"), CONFIGS)
def test_a_config_that_trains_a_preset_maps_onto_it(tmp_path, framework, text, preset):
    assert only(read_text(tmp_path, framework, text, ".sh" if "python3" in text else ".yaml")) == (
        presets.kl_config(preset)
    )


def test_verl_with_kl_in_reward_and_loss_warns_twice_and_audits_both_terms(tmp_path, capsys):
    """The issue's Done-when: verl's defaults put k1 (kl) in the reward and k3 (low_var_kl) in the loss; both
    are audited, one row each, and the KL is said to be counted twice. The same estimate at the same
    coefficient in both is one configuration with placement both."""
    text = (
        "algorithm:\n  adv_estimator: grpo\n  use_kl_in_reward: true\n"
        "actor_rollout_ref:\n  actor:\n    use_kl_loss: true\n"
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    out = run_cli("--framework", "verl", "--config", str(path), "--json")
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert set(result) == {"kl", "warnings", "audit"}
    assert result["kl"]["reward"]["estimator"] == "k1" and result["kl"]["loss"]["estimator"] == "k3"
    assert "counted twice" in result["warnings"][0]
    assert [(r["preset"], r["placement"]) for r in result["audit"]] == [
        ("verl reward", "reward"),
        ("verl loss", "loss"),
    ]
    assert all("effective_scale" in r for r in result["audit"])  # GRPO: the GRPO audit
    same = text + "    kl_loss_type: kl\n"
    found = read_text(tmp_path, "verl", same)
    assert only(found).placement == "both" and "counted twice" in found.warnings[0]
    # as a table: the terms, the warnings (stderr), the rows
    out = run_cli("--framework", "verl", "--config", str(path))
    assert out.exit_code == 0 and "counted twice" in out.stderr
    assert "verl reward" in out.stdout and "verl loss" in out.stdout and "kl.estimator=k1" in out.stdout


def test_slime_kl_coef_under_grpo_is_named_as_ignored(tmp_path):
    found = read_text(tmp_path, "slime", "python3 train.py --advantage-estimator grpo --kl-coef 0.05", ".sh")
    assert found.terms == ()
    assert any("--kl-coef 0.05 is ignored under --advantage-estimator grpo" in w for w in found.warnings)
    ppo = read_text(tmp_path, "slime", "python3 train.py --advantage-estimator ppo --kl-coef 0.05", ".sh")
    assert only(ppo).placement == "reward" and not ppo.grpo
    # slime_validate_args refuses both coefficients, and reinforce++ without --normalize-advantages
    with pytest.raises(UserError, match="Only one of kl_coef and kl_loss_coef"):
        read_text(tmp_path, "slime", "train.py --kl-coef 0.1 --use-kl-loss --kl-loss-coef 0.1", ".sh")
    with pytest.raises(UserError, match="add --normalize-advantages"):
        read_text(
            tmp_path, "slime", "train.py --advantage-estimator reinforce_plus_plus --kl-coef 0.1", ".sh"
        )
    rpp = "train.py --advantage-estimator reinforce_plus_plus --kl-coef 0.1 --normalize-advantages"
    assert only(read_text(tmp_path, "slime", rpp, ".sh")).placement == "reward"
    # slime's low_var_kl with --use-unbiased-kl: the product weight x k3 clamped (tests/peer checks the form)
    lv = read_text(tmp_path, "slime", "t.py --use-kl-loss --kl-loss-coef 0.1 --kl-loss-type low_var_kl "
                   "--use-unbiased-kl", ".sh")  # fmt: skip
    assert only(lv).clamp_weighted and only(lv).value_clamp == 10.0


def test_each_warning(tmp_path):
    trl = read_text(tmp_path, "trl", "learning_rate: 1.0e-6\n")  # TRL's default beta 0
    assert trl.terms == () and any("no KL at all" in w for w in trl.warnings)
    found, rows = frameworks.audit_config("trl", tmp_path / "config.yaml")
    assert rows == [] and found["kl"] == {}
    seq = read_text(tmp_path, "trl", "beta: 0.1\nimportance_sampling_level: sequence\n")
    assert any(w.startswith("TRL #6586") for w in seq.warnings)
    # a key verl 0.9.1's config does not have: refused, as its Hydra refuses it (was a warning and an audit)
    with pytest.raises(UserError, match="algorithm.kl_ctrl.kl_coeff: not a key of verl 0.9.1's ppo_trainer"):
        read_text(tmp_path, "verl", "algorithm:\n  use_kl_in_reward: true\n  kl_ctrl:\n    kl_coeff: 0.1\n")
    added = read_text(
        tmp_path, "verl", "python3 -m verl.trainer.main_ppo +algorithm.kl_ctrl.kl_coeff=0.1\n", ".sh"
    )
    assert any(
        w.startswith("algorithm.kl_ctrl.kl_coeff: touches the KL but is not a key") for w in added.warnings
    )
    old_flag = read_text(
        tmp_path, "openrlhf", "python -m openrlhf.cli.train_ppo_ray --init_kl_coef 0.05", ".sh"
    )
    assert old_flag.warnings[0].startswith(
        "flags of openrlhf 0.9.x (--init_kl_coef): openrlhf 0.11.2 refuses"
    )
    assert only(old_flag).beta == 0.05  # as 0.9.10 reads it (tests/peer/test_versions.py)
    gspo = read_text(tmp_path, "pipelinerl", "finetune:\n  rl:\n    kl_coef: 0.01\n    policy_loss: gspo\n")
    assert gspo.terms == () and any("ignored under policy_loss gspo" in w for w in gspo.warnings)
    exclusive = read_text(tmp_path, "skyrl", "trainer.algorithm.use_kl_in_reward=true", ".sh")
    assert any("SkyRL refuses them" in w for w in exclusive.warnings)
    found, _ = frameworks.audit_config("slime", _write(tmp_path, "t.py --use-kl-loss --kl-loss-coef 0.01"))
    assert any("k1 in the loss is zero in expectation" in w for w in found["warnings"])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(text)
    return path


def test_csv_rows_on_stdout_warnings_on_stderr(tmp_path):
    out = run_cli(
        "--framework",
        "slime",
        "--config",
        str(_write(tmp_path, "t.py --use-kl-loss --kl-loss-coef 0.01")),
        "--csv",
    )
    assert out.exit_code == 0, out.output
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("estimator,") and len(lines) == 2 and "slime loss" in lines[1]
    assert "zero in expectation" in out.stderr and "zero in expectation" not in lines[0]


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--framework", "verl"], ["--config"]),
        (["--config", "x.yaml"], ["--framework"]),
        (["--framework", "verl", "--config", "x.yaml", "--preset", "verl"], ["--preset, --framework"]),
        (["--framework", "verl", "--config", "x.yaml", "--importance", "token"], ["--importance"]),
        (
            ["--framework", "verl", "--config", "x.yaml", "--grpo", "--reward-mode", "separate"],
            ["--reward-mode"],
        ),
    ],
)
def test_refusals(args, where):
    out = run_cli(*args)
    assert isinstance(out.exception, UserError), out.output  # klsweep's entry point: exit code 2
    assert [p.where for p in out.exception.problems] == where


def test_bad_files_and_values_are_refused(tmp_path):
    for framework, path, where in (
        ("megatron", tmp_path / "x.yaml", "--framework"),
        ("verl", tmp_path / "missing.yaml", str(tmp_path / "missing.yaml")),
    ):
        with pytest.raises(UserError) as info:
            frameworks.read(framework, path)
        assert info.value.problems[0].where == where
    with pytest.raises(UserError) as info:
        read_text(
            tmp_path,
            "verl",
            "actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_type=k5",
        )
    assert [p.where for p in info.value.problems] == ["actor_rollout_ref.actor.kl_loss_type"]
    with pytest.raises(UserError) as info:
        read_text(tmp_path, "trl", "beta: lots\n")
    assert [p.where for p in info.value.problems] == ["beta"]
    with pytest.raises(UserError):
        read_text(tmp_path, "openrlhf", "nothing here", ".sh")


def test_preset_audit_says_how_each_preset_was_proven():
    """`klsweep audit --preset all` ends with, per preset, executed (its framework's own code run: tests/peer,
    TRL's in tests/integration) or transcribed (its lines copied: tests/peer/test_transcribed.py)."""
    out = run_cli("--preset", "all")
    assert out.exit_code == 0, out.output
    text = out.stdout[out.stdout.index("proven against") :]
    said = {how: line for how in presets.CHECKED for line in text.splitlines() if f"{how}:" in line}
    assert "verl-k3plus" in text and "nemo-onpolicy" in said["transcribed"] and "paper" in said["own"]
    assert {presets.checked(n) for n in ("nemo", "slime", "pipelinerl")} == {"transcribed"}
    assert {presets.checked(n) for n in ("trl", "verl", "openrlhf", "skyrl", "areal")} == {"executed"}
