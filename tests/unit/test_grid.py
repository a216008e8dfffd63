"""klsweep.grid: grid file -> validated plan; `klsweep plan`. Malformed grids exit with code 2, name every
problem with where it is and what is allowed, and write nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from clitools import cli
from gridfiles import TINY, nothing_under, write

from klsweep import grid, planner
from klsweep.config import COSMETIC_KEYS
from klsweep.grid import parse

# --------------------------------------------------------------------------------------------------------
# Valid grids
# --------------------------------------------------------------------------------------------------------


def test_tiny_grid_expands_to_the_product_minus_excludes(tmp_path):
    plan = grid.load_plan(write(tmp_path, TINY), out=tmp_path / "res")
    assert plan.name == "tiny"
    assert len(plan.runs) == 2 * 3 * 2 * 2 * 3 - 2 * 2 * 3
    assert plan.excluded == 12
    assert plan.axes == ["kl.estimator", "kl.placement", "kl.beta", "offpolicy.lag", "seed"]
    assert plan.sweep_dir == (tmp_path / "res" / "tiny").absolute()
    assert plan.grid_text == TINY
    assert not any(r.params["kl.estimator"] == "k1" and r.params["kl.placement"] == "both" for r in plan.runs)
    run = plan.runs[0]
    assert run.params == {
        "kl.estimator": "k1",
        "kl.placement": "reward",
        "kl.beta": 0.05,
        "offpolicy.lag": 0,
        "seed": 0,
    }
    assert run.run_dir == plan.sweep_dir / run.id
    assert len(run.id) == 10 and int(run.id, 16) >= 0
    c = run.config
    assert c["name"] == "tiny" and c["train"]["steps"] == 50 and c["model"]["path"] == "tiny"
    assert c["kl"] == {
        "estimator": "k1",
        "placement": "reward",
        "level": "token",
        "beta": 0.05,
        "importance": "none",
        "importance_cap": 0.0,
        "reward_mode": "separate",
        "reward_logp": "current",
        "importance_gradient": False,
        "straight_through": False,
        "unbiased_gradient": False,
        "log_ratio_clamp": 0.0,
        "value_clamp": 0.0,
        "clamp_weighted": False,
        "clamp_detaches_weight": False,
        "beta_final": None,
        "beta_final_at": "last",
    }
    json.dumps(c)  # JSON-able
    assert len({r.id for r in plan.runs}) == len(plan.runs)
    assert nothing_under(tmp_path / "res")


def test_ids_are_stable_and_ignore_cosmetic_keys(tmp_path):
    a = grid.load_plan(write(tmp_path, TINY))
    b = grid.load_plan(write(tmp_path, TINY.replace("name: tiny", "name: other") + "  \n"))
    assert [r.id for r in a.runs] == [r.id for r in b.runs]
    config = a.runs[0].config
    changed = json.loads(json.dumps(config))
    changed["cluster"]["kind"] = "slurm"
    changed["model"]["resources"]["gpus_per_node"] = 8
    changed["model"]["name"] = "renamed"
    changed["eval"]["suite"] = "paper"
    changed["wandb"]["mode"] = "disabled"
    assert grid.run_id(changed) == grid.run_id(config)
    assert changed["model"]["name"] == "renamed"  # run_id does not touch its argument
    changed["kl"]["beta"] = 0.5
    assert grid.run_id(changed) != grid.run_id(config)
    assert "model.resources" in COSMETIC_KEYS


REPO = Path(__file__).resolve().parents[2]


def test_ids_leave_out_how_a_run_is_computed(tmp_path, monkeypatch):
    """The generation engine, the micro-batch, the checkpoints kept and vLLM's memory options do
    not change a run's id (config.ID_HASHED_AT, COSMETIC_KEYS); what it computes does. The committed tiny
    studies keep their ids."""
    from klsweep import config as config_mod

    ids = [r.id for r in grid.load_plan(write(tmp_path, TINY)).runs]
    same = [
        "train.use_vllm=true",
        "train.micro_batch_size=2",
        "train.keep_checkpoints=5",
        "+train.trl.vllm_enable_sleep_mode=true",
        "+train.trl.vllm_gpu_memory_utilization=0.4",
        "eval=paper",
        "eval.batch_size=3",
        "cluster.max_requeues=1",
    ]
    for override in same:
        assert [r.id for r in grid.load_plan(write(tmp_path, TINY), [override]).runs] == ids, override
    changes = ["train.save_steps=10", "train.sharding=fsdp", "+train.trl.top_k=5", "kl.beta=0.3"]
    # with vLLM's importance-sampling correction off a run estimates another gradient (docs/KL.md)
    changes += ["train.vllm_importance_sampling=off", "train.vllm_importance_sampling=token_truncate"]
    for override in changes:
        changed = {r.id for r in grid.load_plan(write(tmp_path, TINY), [override]).runs}
        assert changed.isdisjoint(ids), override
    # the rule leaves the ids of the shipped tiny sweeps (the committed studies) as they were without it
    for sweep in ("tiny", "tiny-full"):
        ours = [r.id for r in grid.load_plan(REPO / "sweeps" / f"{sweep}.yaml").runs]
        monkeypatch.setattr(config_mod, "ID_HASHED_AT", {})
        assert [r.id for r in grid.load_plan(REPO / "sweeps" / f"{sweep}.yaml").runs] == ours
        monkeypatch.undo()


def test_reward_logp_is_in_the_id_only_off_policy_with_current(tmp_path):
    """Ids published before kl.reward_logp and kl.importance_cap existed stand: where the key changes nothing
    (on-policy, shaped, KL in the loss) and with behavior (what those runs trained with) it is left out;
    off-policy with current (the new default) a run gets an id of its own."""
    config = grid.load_plan(write(tmp_path, TINY)).runs[0].config

    def before_the_keys(c):
        c = json.loads(json.dumps(c))
        del c["kl"]["reward_logp"], c["kl"]["importance_cap"]
        return c

    def with_(c, lag=0, iterations=1, **kl):
        c = json.loads(json.dumps(c))
        c["offpolicy"] |= {"lag": lag, "num_iterations": iterations}
        c["kl"] |= kl
        return c

    for logp in ("current", "behavior"):
        on = with_(config, reward_logp=logp)
        assert grid.run_id(on) == grid.run_id(before_the_keys(on))
    stale = with_(config, lag=16, reward_logp="behavior")
    assert grid.run_id(stale) == grid.run_id(before_the_keys(stale))
    for lag, iterations in ((16, 1), (0, 2)):
        new = with_(config, lag, iterations, reward_logp="current")
        assert grid.run_id(new) != grid.run_id(before_the_keys(new))
        assert grid.run_id(new) != grid.run_id(with_(config, lag, iterations, reward_logp="behavior"))
    for nothing in ({"reward_mode": "shaped"}, {"placement": "loss"}):  # where the key changes nothing
        ids = {
            grid.run_id(with_(config, 16, reward_logp=logp, **nothing)) for logp in ("current", "behavior")
        }
        assert len(ids) == 1
    assert grid.run_id(with_(config, importance_cap=2.0)) != grid.run_id(config)
    # one plan's memo of shared sections does not carry an omission from one run to another
    memo: dict = {}
    ids = [grid.run_id(c, memo) for c in (with_(config, reward_logp="current"), with_(config, 16))]
    assert ids == [grid.run_id(with_(config, reward_logp="current")), grid.run_id(with_(config, 16))]


def test_reward_mode_is_a_kl_key_in_the_id_and_the_plan(tmp_path, monkeypatch, capsys):
    plan = grid.load_plan(write(tmp_path, TINY))
    assert {r.config["kl"]["reward_mode"] for r in plan.runs} == {"separate"}  # the default
    # with a KL (beta 0 makes it inert: one run)
    text = "name: m\ngrid:\n  kl.beta: 0.1\n  kl.placement: reward\n  kl.reward_mode: separate,shaped\n"
    plan = grid.load_plan(write(tmp_path, text))
    assert plan.axes == ["kl.reward_mode"]
    assert len({r.id for r in plan.runs}) == 2
    # varying through a preset, it is shown too (the kl keys that vary are columns)
    plan = grid.load_plan(write(tmp_path, "name: p\ngrid:\n  preset: trl,paper\n"))
    assert "kl.reward_mode" in plan.axes
    code, stdout, _ = cli(["plan", write(tmp_path, text)], monkeypatch, capsys)
    assert code == 0 and "reward mode" in stdout and "shaped" in stdout  # the axis, under its short header


def test_grid_list_is_a_union_deduplicated_by_id(tmp_path):
    text = """\
name: u
grid:
  - kl.estimator: k1,k3
    kl.beta: 0.1
  - kl.beta: 0.0
  - kl.estimator: k3
    kl.beta: 0.1,0.0
"""
    plan = grid.load_plan(write(tmp_path, text))
    # k1/0.1, k3/0.1, k3/0.0 (the schema's default estimator is k3): the last sub-grid adds nothing new
    assert [(r.params["kl.estimator"], r.params["kl.beta"]) for r in plan.runs] == [
        ("k1", 0.1),
        ("k3", 0.1),
        ("k3", 0.0),
    ]


def test_an_exclude_applies_to_the_sub_grids_that_have_its_keys(tmp_path):
    text = """\
name: x
grid:
  - kl.estimator: k1,k3
    kl.beta: 0.1
  - kl.beta: 0.0
exclude:
  - {kl.estimator: k3}
"""
    plan = grid.load_plan(write(tmp_path, text))
    # the baseline's estimator is the default k3, but the baseline sub-grid has no estimator axis
    assert [(r.config["kl"]["estimator"], r.config["kl"]["beta"]) for r in plan.runs] == [
        ("k1", 0.1),
        ("k3", 0.0),
    ]
    assert plan.excluded == 1


def test_command_line_adds_and_replaces_axes_and_sets_values(tmp_path):
    path = write(tmp_path, TINY)
    plan = grid.load_plan(path, ["kl.beta=0.3,1.0", "train.steps=10", "seed=0", "kl.level=token,sequence"])
    assert "seed" not in plan.axes
    assert plan.axes[-1] == "kl.level"
    assert {r.params["kl.beta"] for r in plan.runs} == {0.3, 1.0}
    assert all(r.config["train"]["steps"] == 10 and r.config["seed"] == 0 for r in plan.runs)
    assert len(plan.runs) == 2 * 3 * 2 * 2 * 2 - 1 * 1 * 2 * 2 * 2


def test_yaml_lists_and_nested_base_values(tmp_path):
    text = """\
name: nested
base:
  train: {steps: 7, learning_rate: 0.001}
  model:
    dtype: float32
  kl.beta: 0.1  # with a KL: at beta 0 the estimator does nothing, and k1, k2 are one run
grid:
  kl.estimator: [k1, k2]
  seed: choice(1, 2)
"""
    plan = grid.load_plan(write(tmp_path, text))
    assert len(plan.runs) == 4
    assert plan.runs[0].config["train"]["steps"] == 7
    assert plan.runs[0].config["model"]["dtype"] == "float32"
    assert plan.runs[0].config["model"]["path"] == "tiny"  # the group's other values stay


def test_presets_as_an_axis_set_kl(tmp_path):
    text = "name: p\ngrid:\n  preset: trl,verl,openrlhf,paper\n"
    plan = grid.load_plan(write(tmp_path, text))
    by = {r.params["preset"]: r.config["kl"] for r in plan.runs}
    assert by["trl"] == {
        "estimator": "k3",
        "placement": "loss",
        "level": "token",
        "beta": 0.04,
        "importance": "token",
        "importance_cap": 0.0,
        "reward_mode": "shaped",
        "reward_logp": "current",
        "importance_gradient": True,
        "straight_through": False,
        "unbiased_gradient": False,
        "log_ratio_clamp": 0.0,
        "value_clamp": 0.0,
        "clamp_weighted": False,
        "clamp_detaches_weight": False,
        "beta_final": None,
        "beta_final_at": "last",
    }
    assert by["verl"]["beta"] == 0.001 and by["verl"]["importance"] == "none"
    assert by["verl"]["log_ratio_clamp"] == 20.0 and by["verl"]["value_clamp"] == 10.0
    assert by["openrlhf"]["estimator"] == "k1" and by["openrlhf"]["placement"] == "reward"
    assert by["paper"]["estimator"] == "k1" and by["paper"]["placement"] == "reward"
    assert by["verl"]["reward_mode"] == "shaped" and by["paper"]["reward_mode"] == "separate"
    assert "kl.estimator" in plan.axes  # varies through the preset
    # values override a preset (Hydra: overrides beat group contents)
    plan = grid.load_plan(write(tmp_path, text), ["kl.beta=0.2"])
    assert {r.config["kl"]["beta"] for r in plan.runs} == {0.2}


def test_glob_over_group_options(tmp_path):
    plan = grid.load_plan(write(tmp_path, "name: g\ngrid:\n  model: glob(qwen*)\n"))
    assert [r.params["model"] for r in plan.runs] == ["qwen2.5-7b", "qwen3-4b-instruct-2507"]
    assert plan.runs[0].config["model"]["path"] == "Qwen/Qwen2.5-7B"


def test_user_searchpath_adds_group_options(tmp_path):
    conf = tmp_path / "myconf"
    (conf / "model").mkdir(parents=True)
    (conf / "model" / "mine.yaml").write_text("name: mine\npath: /models/mine\n")
    text = "name: s\nsearchpath: [myconf]\ngrid:\n  model: tiny,mine\n"
    plan = grid.load_plan(write(tmp_path, text))
    assert [r.config["model"]["path"] for r in plan.runs] == ["tiny", "/models/mine"]
    # the same through config_dirs (--config-dir)
    plan = grid.load_plan(write(tmp_path, "name: s\ngrid:\n  model: tiny,mine\n"), config_dirs=[str(conf)])
    assert len(plan.runs) == 2


def test_bad_preset_from_a_user_searchpath_is_reported(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "myconf"
    (conf / "preset").mkdir(parents=True)
    (conf / "preset" / "bad.yaml").write_text("# @package _global_\nkl:\n  estimator: k7\n")
    p = write(tmp_path, "name: s\ngrid:\n  preset: bad,trl\n")
    code, _, err = cli(["plan", p, "--config-dir", conf, "--out", tmp_path / "res"], monkeypatch, capsys)
    assert code == 2
    assert "kl.estimator" in err and "'k7'" in err and "k1, k2, k3" in err


def _shadowing(conf: Path) -> dict[str, tuple[str, object]]:
    """A config folder whose files have the names of shipped ones, one per config group, each changing a
    value: the key it sets and that value."""
    shipped = grid.CONF_DIR
    files = {
        "preset/trl.yaml": "# @package _global_\nkl:\n  estimator: k1\n  placement: reward\n  beta: 0.7\n",
        "model/tiny.yaml": (shipped / "model" / "tiny.yaml").read_text().replace("mem_gb: 4", "mem_gb: 5"),
        "task/tiny.yaml": (shipped / "task" / "tiny.yaml").read_text().replace("split: train", "split: mine"),
        "eval/tiny.yaml": (shipped / "eval" / "tiny.yaml").read_text().replace("limit: 64", "limit: 8"),
        "cluster/local.yaml": "kind: local\nmax_local_jobs: 1\n",
    }
    for name, text in files.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(text)
    return {
        "preset/trl.yaml": ("kl.beta", 0.7),
        "model/tiny.yaml": ("model.resources.mem_gb", 5),
        "task/tiny.yaml": ("task.split", "mine"),
        "eval/tiny.yaml": ("eval.limit", 8),
        "cluster/local.yaml": ("cluster.max_local_jobs", 1),
    }


def test_a_user_config_file_wins_over_the_shipped_one_and_plan_says_so(tmp_path, monkeypatch, capsys):
    """Issue 44 D5: a file of a config group in the user's folder (--config-dir, a grid's searchpath:) with the
    name of a shipped one is the one used (the user pointed at it; the shipped one won silently before), in
    every group, and `plan` notes each shipped file it replaces."""
    from klsweep.grid.schema import lookup

    conf = tmp_path / "myconf"
    changed = _shadowing(conf)
    text = "name: s\nbase: {model: tiny, task: tiny, eval: tiny, cluster: local}\ngrid:\n  preset: trl\n"
    for plan in (
        grid.load_plan(write(tmp_path, text), config_dirs=[str(conf)], out=tmp_path / "r"),
        grid.load_plan(write(tmp_path, "searchpath: myconf\n" + text), out=tmp_path / "r"),
    ):
        config = plan.runs[0].config
        for name, (key, value) in changed.items():
            assert lookup(config, key) == value, (name, key)
        assert config["kl"]["estimator"] == "k1" and config["kl"]["placement"] == "reward"
        assert len(plan.shadowed) == 5
        for name in changed:
            group, option = name.removesuffix(".yaml").split("/")
            line = f"{conf / name} replaces the shipped {group} {option} (klsweep/conf/{name})"
            assert any(note.startswith(line) for note in plan.shadowed), (line, plan.shadowed)
    plain = grid.load_plan(write(tmp_path, text), out=tmp_path / "r")  # without the folder: the shipped ones
    assert plain.runs[0].config["kl"]["beta"] == 0.04 and plain.shadowed == []
    g = write(tmp_path, text)
    code, out, err = cli(["plan", g, "--config-dir", conf, "--out", tmp_path / "r"], monkeypatch, capsys)
    assert code == 0, err
    assert f"note: {conf / 'preset' / 'trl.yaml'} replaces the shipped preset trl" in out, out
    code, out, err = cli(["plan", g, "--config-dir", conf, "--json"], monkeypatch, capsys)
    assert len(json.loads(out)["notes"]) == 5
    code, out, err = cli(["config", g, "0", "--config-dir", conf], monkeypatch, capsys)
    kl = yaml.safe_load(out)["kl"]
    assert code == 0 and (kl["estimator"], kl["placement"], kl["beta"]) == ("k1", "reward", 0.7), out


def test_compose_run_config_round_trips_a_planned_config(tmp_path):
    plan = grid.load_plan(write(tmp_path, TINY))
    run = plan.runs[5]
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(run.config))
    assert grid.compose_run_config(f, []) == run.config
    changed = grid.compose_run_config(f, ["train.steps=3", "kl.beta=0.5"])
    assert changed["train"]["steps"] == 3 and changed["kl"]["beta"] == 0.5
    assert grid.run_id(changed) != run.id
    # a file's values beat its groups' contents: a complete config.yaml keeps its model.path
    assert grid.compose_run_config(f, ["model=qwen2.5-7b"])["model"]["path"] == "tiny"
    assert grid.compose_run_config(None, ["model=qwen2.5-7b"])["model"]["path"] == "Qwen/Qwen2.5-7B"
    assert grid.compose_run_config(None, ["kl.estimator=k1"])["kl"]["estimator"] == "k1"
    with pytest.raises(grid.UserError, match="one run takes one value"):
        grid.compose_run_config(None, ["seed=1,2"])
    with pytest.raises(grid.UserError, match="kl.placement"):
        grid.compose_run_config(None, ["kl.placement=nowhere"])


def test_plan_command_table_json_and_done_counts(tmp_path, monkeypatch, capsys):
    from klsweep import store

    p = write(tmp_path, TINY)
    out = tmp_path / "res"
    code, stdout, _ = cli(["plan", p, "--out", out, "--json"], monkeypatch, capsys)
    assert code == 0
    data = json.loads(stdout)
    assert data["name"] == "tiny" and len(data["runs"]) == 60
    assert set(data["runs"][0]) == {"id", "params", "estimate", "limit"}
    assert set(data["runs"][0]["params"]) == {
        "kl.estimator",
        "kl.placement",
        "kl.beta",
        "offpolicy.lag",
        "seed",
    }
    assert data["to_submit"] == 60 and data["done"] == 0 and data["excluded"] == 12
    assert nothing_under(out)

    store.write_status(out / "tiny" / data["runs"][0]["id"], "done")
    store.write_status(out / "tiny" / data["runs"][1]["id"], "failed")
    code, stdout, _ = cli(["plan", p, "--out", out], monkeypatch, capsys)
    assert code == 0
    flat = " ".join(stdout.split())  # the caption wraps at the test's terminal width
    assert (
        "60 runs, 12 excluded, 1 already done (or diverged), 1 failed or cancelled (run: --retry-failed), 58 to submit"
        in flat
    )
    # a local CPU sweep: no GPU-hours line (it read "at most 0.0 GPU-hours"), its checkpoints' storage
    assert "GPU-hours" not in flat and "checkpoints kept" in flat
    # `klsweep run` skips a diverged run as it skips a done one: the plan counts it so (#37)
    store.write_status(out / "tiny" / data["runs"][2]["id"], "diverged")
    code, stdout, _ = cli(["plan", p, "--out", out, "--json"], monkeypatch, capsys)
    counts = json.loads(stdout)
    assert (counts["done"], counts["failed"], counts["to_submit"]) == (2, 1, 57)
    code, stdout, _ = cli(["plan", p, "--out", out, "--runs"], monkeypatch, capsys)  # every run, ids whole
    assert code == 0 and data["runs"][2]["id"] in stdout


def test_gpu_hours_upper_bound(tmp_path):
    plan = grid.load_plan(write(tmp_path, "name: m\ngrid:\n  model: qwen2.5-7b,qwen3-4b-instruct-2507\n"))
    tries = (
        1 + plan.runs[0].config["cluster"]["max_requeues"]
    )  # every requeue of a job at its whole time limit
    assert tries == 4
    assert planner.gpu_hours(plan.runs) == pytest.approx(tries * (8 * 1440 / 60 + 4 * 960 / 60))


# --------------------------------------------------------------------------------------------------------
# Malformed grids: exit code 2, every problem named, nothing written
# --------------------------------------------------------------------------------------------------------

G = "name: bad\ngrid:\n  kl.estimator: k1,k3\n"  # a valid start to add mistakes to

MALFORMED = {
    "unknown axis key": (
        "name: bad\ngrid:\n  kl.estimater: k1,k3\n",
        [],
        ["grid.kl.estimater", "unknown key 'kl.estimater'", "did you mean 'kl.estimator'"],
    ),
    "unknown base key": (
        "name: bad\nbase:\n  train.stepz: 3\n" + G[10:],
        [],
        ["base.train.stepz", "did you mean 'train.steps'"],
    ),
    "unknown command-line key": (G, ["kl.bta=0.1"], ["command line: kl.bta=0.1", "did you mean 'kl.beta'"]),
    "bad value type in the file": (
        "name: bad\nbase:\n  train.steps: abc\n" + G[10:],
        [],
        ["base.train.steps", "'abc' is not a valid value"],
    ),
    "bad value type on the command line": (
        G,
        ["train.steps=abc"],
        ["command line: train.steps=abc", "'abc'", "int"],
    ),
    "invalid KL estimator": (
        "name: bad\ngrid:\n  kl.estimator: k1,k9\n",
        [],
        ["grid.kl.estimator", "'k9' is not valid", "k1, k2, k3"],
    ),
    "invalid KL placement": (
        G,
        ["kl.placement=rewards"],
        ["command line: kl.placement=rewards", "reward, loss, both"],
    ),
    "invalid KL reward mode": (
        G,
        ["kl.reward_mode=shapd"],
        ["command line: kl.reward_mode=shapd", "'shapd' is not valid", "separate, shaped"],
    ),
    "invalid KL reward mode in the file": (
        "name: bad\ngrid:\n  kl.reward_mode: separate,normalised\n",
        [],
        ["grid.kl.reward_mode", "'normalised' is not valid", "separate, shaped"],
    ),
    "negative beta": ("name: bad\ngrid:\n  kl.beta: 0.1,-1\n", [], ["grid.kl.beta", "-1.0", ">= 0"]),
    "bad override grammar": (
        "name: bad\ngrid:\n  kl.beta: 'choice(0.1'\n",
        [],
        ["grid.kl.beta", "bad override grammar"],
    ),
    "interval is not enumerable": (
        "name: bad\ngrid:\n  kl.beta: interval(0, 1)\n",
        [],
        ["interval(...) is not enumerable"],
    ),
    "unknown group option": (
        "name: bad\ngrid:\n  model: tiny,gpt5\n",
        [],
        [
            "grid.model",
            "'gpt5' is not an option of config group 'model'",
            "qwen2.5-7b",
            "llama-3.1-8b-instruct",
        ],
    ),
    "unknown group option on the command line": (
        G,
        ["task=mathh"],
        ["command line: task=mathh", "did you mean 'math'", "tiny"],
    ),
    "glob over values": (
        "name: bad\ngrid:\n  seed: glob(*)\n",
        [],
        ["glob(...) selects config-group options"],
    ),
    "exclude matches nothing": (
        G + "exclude:\n  - {kl.estimator: k2}\n",
        [],
        ["exclude[0]", "matches no run"],
    ),
    "exclude names a non-axis key": (
        G + "exclude:\n  - {kl.level: token}\n",
        [],
        ["exclude[0].kl.level", "not an axis", "kl.estimator"],
    ),
    "exclude is not a list": (
        G + "exclude: {kl.estimator: k1}\n",
        [],
        ["exclude", "list of partial assignments"],
    ),
    "every run excluded": (
        G + "exclude:\n  - {kl.estimator: k1}\n  - {kl.estimator: k3}\n",
        [],
        ["every run is excluded"],
    ),
    "no grid": ("name: bad\nbase:\n  seed: 1\n", [], ["grid", "missing"]),
    "empty grid list": ("name: bad\ngrid: []\n", [], ["grid", "non-empty list"]),
    "duplicate axis": (
        "name: bad\ngrid:\n  kl.beta: 0.1\n  seed: 1\n  kl.beta: 0.2\n",
        [],
        ["g.yaml:5: kl.beta", "duplicate key"],
    ),
    "missing name": ("grid:\n  seed: 1,2\n", [], ["name", "missing"]),
    "bad name characters": (
        "name: my sweep/1\ngrid:\n  seed: 1,2\n",
        [],
        ["'my sweep/1' is not a valid sweep name", "' ', '/' not allowed", "ASCII letters"],
    ),
    "non-ASCII letters in the name": (  # the message says which characters, and that letters means ASCII
        "name: tïny-実験\ngrid:\n  seed: 1,2\n",
        [],
        ["'tïny-実験' is not a valid sweep name", "'ï', '実', '験' not allowed", "ASCII letters A-Z a-z"],
    ),
    "name that YAML reads as a boolean": (  # issue 32 D26: say to quote it
        "name: off\ngrid:\n  seed: 1,2\n",
        [],
        ["False is not a valid sweep name", "unquoted off, no or false", 'quote it (name: "off")'],
    ),
    "name that YAML reads as a number": (
        "name: 2024\ngrid:\n  seed: 1,2\n",
        [],
        ["2024 is not a valid sweep name", "unquoted number", "quote it"],
    ),
    "unknown top-level key": (
        "name: bad\ngrids:\n  seed: 1,2\n",
        [],
        ["unknown top-level key 'grids'", "did you mean 'grid'"],
    ),
    "YAML syntax error": (
        "name: bad\ngrid:\n  seed: [1, 2\n  kl.beta: 0.1\n",
        [],
        ["g.yaml:4", "YAML syntax error"],
    ),
    "not a mapping": ("- a\n- b\n", [], ["a grid file is a mapping"]),
    "negative lag": (
        "name: bad\ngrid:\n  offpolicy.lag: 0,-10\n",
        [],
        ["grid.offpolicy.lag", "-10 is out of range", ">= 0"],
    ),
    "zero steps": (G, ["train.steps=0"], ["train.steps", "0 is out of range", "> 0"]),
    "unknown sharding": (
        G,
        ["train.sharding=zero3"],
        ["train.sharding", "'zero3' is out of range", "none, fsdp"],
    ),
    "group size one": (
        "name: bad\nbase:\n  train.group_size: 1\n" + G[10:],
        [],
        ["train.group_size", ">= 2"],
    ),
    "name set in base": ("name: bad\nbase:\n  name: other\n" + G[10:], [], ["base.name", "top-level"]),
    "missing searchpath folder": (
        "name: bad\nsearchpath: nowhere\n" + G[10:],
        [],
        ["searchpath", "is not a folder"],
    ),
    "plus prefix on the command line": (
        G,
        ["+kl.foo=1"],
        [
            "command line: +kl.foo=1",
            "unknown key 'kl.foo'",
            "schema is closed",
            "inside cluster.additional_parameters",
        ],
    ),
    "sbatch option name holding a newline": (
        'name: bad\nbase:\n  cluster.additional_parameters: {"comment=ok\\ntouch pwned\\n#": "1"}\n' + G[10:],
        [],
        [
            "base.cluster.additional_parameters",
            "'comment=ok\\ntouch pwned\\n#' is not an sbatch option name",
            "a-z, then a-z 0-9 - _",
        ],
    ),
    "axis value is a mapping": (
        "name: bad\ngrid:\n  kl.beta: {a: 1}\n",
        [],
        ["grid.kl.beta", "list of values or a sweep"],
    ),
    "a key YAML reads as a boolean under grid": (  # issue 44 D8: an AttributeError before
        "name: bad\ngrid: {true: 1}\n",
        [],
        ["grid: True", "a key YAML reads as bool True, not a config key", "klsweep keys"],
    ),
    "a sweep written inside {...} under grid": (  # {seed: 0,1} is {seed: 0, 1: null}
        "name: bad\ngrid: {seed: 0,1}\n",
        [],
        ["grid: 1", "a key YAML reads as int 1", "quote a sweep: {seed: '0,1'}"],
    ),
    "unknown key inside a list of grids": (
        "name: bad\ngrid:\n  - seed: 1\n  - sed: 2\n",
        [],
        ["grid[1].sed", "did you mean 'seed'"],
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_malformed_grid_exits_2_with_the_problem_and_writes_nothing(case, tmp_path, monkeypatch, capsys):
    text, extra, expected = MALFORMED[case]
    p = write(tmp_path, text)
    out = tmp_path / "res"
    code, stdout, err = cli(["plan", p, *extra, "--out", out], monkeypatch, capsys)
    assert code == 2, (stdout, err)
    assert "Traceback" not in err
    flat = " ".join(err.split())
    for s in expected:
        assert s in flat, f"{s!r} not in:\n{err}"
    assert not out.exists()


def test_every_problem_is_reported_at_once(tmp_path, monkeypatch, capsys):
    text = """\
name: bad
base:
  train.steps: abc
  offpolicy.lag: -1
grid:
  kl.estimater: k1,k3
  kl.placement: reward,sideways
  model: tiny,nope
"""
    code, _, err = cli(["plan", write(tmp_path, text), "seed=x"], monkeypatch, capsys)
    assert code == 2
    flat = " ".join(err.split())
    assert "6 problems" in flat
    for s in ("train.steps", "offpolicy.lag", "kl.estimater", "'sideways'", "'nope'", "command line: seed=x"):
        assert s in flat


def test_missing_grid_file(tmp_path, monkeypatch, capsys):
    code, _, err = cli(["plan", tmp_path / "nope.yaml"], monkeypatch, capsys)
    assert code == 2 and "cannot read the grid file" in err


def test_a_grid_or_claims_file_that_is_not_a_regular_file_or_too_large_is_refused(
    tmp_path, monkeypatch, capsys
):
    """Issue 32 D16: /dev/zero was read until memory ran out, a FIFO waited for a writer for ever. Each in a
    child process with a timeout (a hang fails the test instead of hanging it); a located message, exit 2."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.truncate(parse.MAX_FILE_BYTES + 1)  # sparse: no disk used
    for path, said in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device"), (big, "larger than 16 MiB")):
        for args in (["plan", path], ["report", tmp_path, "--claims", path]):
            args = [sys.executable, "-m", "klsweep", *map(str, args)]
            proc = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path)
            what = "grid file" if args[3] == "plan" else "claims file"
            assert proc.returncode == 2, (args, proc.stdout + proc.stderr)
            flat = " ".join(proc.stderr.split())
            assert f"{path}: " in flat and said in flat and f"is this the {what}?" in flat, flat
            assert "Traceback" not in proc.stderr


def test_claims_are_validated_up_front(tmp_path):
    """A grid's ``claims:`` are checked with the rest of the grid: every bad claim located, all at once."""
    base = "name: c\nbase: {model: tiny, task: tiny}\ngrid: {seed: range(2), kl.beta: [0, 0.1]}\n"
    good = write(
        tmp_path,
        base + "claims:\n  - {name: k3 wins, metric: in_domain, test: welch, direction: greater,\n"
        "     a: {kl.estimator: k3, unbiased: true}, b: {kl.beta: [0, 0.1]}}\n",
    )
    assert len(grid.load_plan(good, out=tmp_path / "r").runs) == 4
    bad = write(
        tmp_path,
        base + "claims:\n"
        "  - {name: a, metric: ood, test: welsh, direction: greater, a: {kl.estimatr: k3}, b: {kl.beta: 0}}\n"
        "  - {name: a, metric: unstable, test: fisher, direction: equivalent, a: {seed: 0}}\n"
        "  - {name: t, metric: ood, test: tost, direction: equivalent, a: {seed: 0}, b: {seed: 1}, size: 3}\n",
        "bad.yaml",
    )
    with pytest.raises(grid.UserError) as e:
        grid.load_plan(bad, out=tmp_path / "r")
    text = str(e.value)
    for where, what in [
        ("claims[0] (a).test", "did you mean 'welch'"),
        ("claims[0] (a).a.kl.estimatr", "did you mean 'kl.estimator'"),
        ("claims[1].name", "'a' twice"),
        ("claims[1] (a).direction", "fisher tests a direction"),
        ("claims[1] (a).b", "missing"),
        ("claims[2] (t).size", "unknown claim key"),
        ("claims[2] (t).margin", "missing"),
    ]:
        assert f"{where}: {what}" in text or (where in text and what in text), (where, text)
    # issue 44 D13: an item that is not a mapping is named, the others checked beside it
    mixed = write(tmp_path, base + "claims:\n  - just a string\n  - {name: x, metric: ood}\n", "mixed.yaml")
    with pytest.raises(grid.UserError) as e:
        grid.load_plan(mixed, out=tmp_path / "r")
    assert "claims[0]: 'just a string' (str): a claim must be a mapping" in str(e.value)
    assert "must be a list of claims" not in str(e.value) and "claims[1] (x).test" in str(e.value)


def test_claim_sides_are_checked_against_the_grid(tmp_path):
    """A filter's values are converted as the grid's (``1e-5``, a string in YAML, is a float), must be values
    the key can take (k9, K1 are not) and values the grid gives it; a = b is a problem; all at once, located."""
    base = "name: c\nbase: {model: tiny, task: tiny, train.learning_rate: 1e-5}\ngrid: {kl.beta: [0, 0.1]}\n"
    claim = "  - {{name: {}, metric: in_domain, test: welch, direction: greater, a: {}, b: {}}}\n"
    good = claim.format("lr", "{train.learning_rate: 1e-5, kl.beta: 0.1}", "{kl.beta: 0}")
    assert len(grid.load_plan(write(tmp_path, base + "claims:\n" + good), out=tmp_path / "r").runs) == 2
    bad = [
        claim.format("k9", "{kl.estimator: k9}", "{kl.beta: 0}"),
        claim.format("upper", "{kl.estimator: K1}", "{kl.beta: 0}"),
        claim.format("beta", "{kl.beta: 0.2}", "{kl.beta: 0}"),
        claim.format("same", "{kl.beta: 0}", "{kl.beta: 0.0}"),
        claim.format("lr", "{train.learning_rate: 2e-5}", "{kl.beta: 0}"),
    ]
    with pytest.raises(grid.UserError) as e:
        grid.load_plan(write(tmp_path, base + "claims:\n" + "".join(bad), "bad.yaml"), out=tmp_path / "r")
    text = str(e.value)
    for where, what in [
        ("claims[0] (k9).a.kl.estimator", "'k9' is not valid (allowed: k1, k2, k3, abs)"),
        ("claims[1] (upper).a.kl.estimator", "'K1' is not valid"),
        ("claims[3] (same).b", "the same filters as a"),
    ]:
        assert f"{where}: {what}" in text, (where, text)
    # values the key can take but no run of the grid has: found with the other problems, in the same error
    assert "claims (beta).a.kl.beta: 0.2: no run of this grid has it (allowed: 0.0, 0.1)" in text, text
    assert "claims (lr).a.train.learning_rate: 2e-05: no run of this grid has it (allowed: 1e-05)" in text, (
        text
    )


BETA_CROSS = """\
name: cross
base:
  model: tiny
  train.steps: 50
grid:
  kl.beta: 0,0.3
  kl.estimator: k1,k3
  kl.placement: reward,loss
  kl.level: token,sequence
  seed: range(2)
"""


def test_a_beta_0_cross_gives_one_no_kl_run_per_seed(tmp_path, monkeypatch, capsys):
    """beta 0 makes the KL-only keys inert: the no-KL runs of a cross with estimators, placements and levels
    are one run per seed (the id the KL keys' defaults give), the plan says how many were merged, and the ids
    they had before (their folders: trained under them) are the merged run's aliases."""
    plan = grid.load_plan(write(tmp_path, BETA_CROSS))
    no_kl = [r for r in plan.runs if r.config["kl"]["beta"] == 0]
    assert sorted(r.config["seed"] for r in no_kl) == [0, 1]
    assert len(plan.runs) == 2 * 2 * 2 * 2 + 2 and plan.merged == 2 * 7
    # the id a merged run keeps: the one with every KL-only key at its default (k3, loss, token, ...)
    default = grid.load_plan(
        write(tmp_path, "name: d\nbase:\n  model: tiny\n  train.steps: 50\ngrid:\n  seed: 0,1\n")
    )
    assert {r.id for r in no_kl} == {r.id for r in default.runs}
    for run in no_kl:
        assert len(run.aliases) == 7 and run.id not in run.aliases  # the 8 combinations but the default one
    assert all(not r.aliases for r in plan.runs if r.config["kl"]["beta"])
    code, stdout, _ = cli(["plan", write(tmp_path, BETA_CROSS)], monkeypatch, capsys)
    assert code == 0 and "14 merged" in " ".join(stdout.split())
    # with a beta, the same keys are in the id
    assert len({r.id for r in plan.runs if r.config["kl"]["beta"]}) == 16


def test_runs_trained_under_a_merged_id_are_moved_to_it(tmp_path):
    """A run folder written under an id from before the merge is moved to the run's id (it resumes there);
    further ones, the same training again, go to <sweep>/merged/ where the report does not count them."""
    from klsweep import store
    from klsweep.submit.sweep import MERGED_DIR, adopt_merged

    plan = grid.load_plan(write(tmp_path, BETA_CROSS), out=tmp_path / "res")
    run = next(r for r in plan.runs if r.config["kl"]["beta"] == 0)
    first, second = run.aliases[:2]
    for old in (first, second):
        (plan.sweep_dir / old).mkdir(parents=True)
        (plan.sweep_dir / old / store.CONFIG_FILE).write_text(f"seed: 0\n# {old}\n")
    adopt_merged(plan, set())
    assert (run.run_dir / store.CONFIG_FILE).read_text().endswith(f"# {first}\n")
    assert (plan.sweep_dir / MERGED_DIR / second / store.CONFIG_FILE).exists()
    assert [p.name for p in store.run_dirs(plan.sweep_dir)] == [run.id]
