"""TRL pass-through (``train.trl``), TRL's names of klsweep's keys, and Hydra's ``+key`` / ``++key`` / ``~key``
in grids, run files and command-line overrides."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from clitools import cli
from gridfiles import TINY, nothing_under, write

from klsweep import grid

# The ids of TINY's first and last two runs as they were before train.trl existed: a run that passes nothing
# to TRL keeps its id (its results folder).
TINY_IDS = (["fb30705abf", "dbd5d3c1f0"], ["108cc47c4f", "98b385d21e"])
# ... at the training defaults of those days: the global ones (the tiny model's group now sets its own, and a
# grid that does not write them plans new ids: docs/USAGE.md, "Model defaults")
GLOBAL_LR = ["train.learning_rate=1e-5", "train.lr_scheduler_type=linear"]

ONE = "name: one\nbase:\n  kl.beta: 0.1\ngrid:\n  kl.estimator: k1,k3\n"


def test_ids_without_train_trl_are_unchanged(tmp_path):
    # TINY's last runs are off-policy (lag 10, k3 in both): with kl.reward_logp's default, current, they train
    # otherwise than before the key and have new ids; with behavior, what they trained with, their old ones.
    old = grid.load_plan(write(tmp_path, TINY), ["kl.reward_logp=behavior", *GLOBAL_LR])
    assert ([r.id for r in old.runs[:2]], [r.id for r in old.runs[-2:]]) == TINY_IDS
    plan = grid.load_plan(write(tmp_path, TINY), GLOBAL_LR)
    assert [r.id for r in plan.runs[:2]] == TINY_IDS[0]  # on-policy: the same computation, the same id
    assert not {r.id for r in plan.runs[-2:]} & set(TINY_IDS[1])
    config = plan.runs[0].config
    assert config["train"]["trl"] == {}
    without = json.loads(json.dumps(config))
    del without["train"]["trl"]  # a config.yaml written before the key existed
    assert grid.run_id(without) == grid.run_id(config)
    config_with = json.loads(json.dumps(config))
    config_with["train"]["trl"] = {"top_k": 5}
    assert grid.run_id(config_with) != grid.run_id(config)


def test_train_trl_from_the_grid_file_and_the_command_line(tmp_path):
    text = (
        "name: t\nbase:\n  kl.beta: 0.1\n  train:\n    trl: {weight_decay: 0.01}\n"
        "grid:\n  train.trl.top_k: 1,5\n"
    )
    plan = grid.load_plan(write(tmp_path, text), ["+train.trl.top_p=0.9", "train.trl.min_p=0"])
    assert len(plan.runs) == 2 and len({r.id for r in plan.runs}) == 2
    assert plan.axes == ["train.trl.top_k"]
    assert [r.config["train"]["trl"] for r in plan.runs] == [
        {"weight_decay": 0.01, "top_k": k, "top_p": 0.9, "min_p": 0.0} for k in (1, 5)
    ]
    assert isinstance(plan.runs[0].config["train"]["trl"]["min_p"], float)  # 0 given for a float option
    # the whole mapping as an axis: one value per run
    axis = grid.load_plan(write(tmp_path, ONE + "  train.trl: [{top_k: 2}, {top_k: 2, top_p: 0.5}]\n"))
    assert len(axis.runs) == 4 and "train.trl" in axis.axes
    # the same value written two ways is the same run
    a = grid.load_plan(write(tmp_path, ONE), ["train.trl.top_p=1"])
    b = grid.load_plan(write(tmp_path, ONE), ["++train.trl.top_p=1.0"])
    assert [r.id for r in a.runs] == [r.id for r in b.runs]


def test_train_trl_problems_and_trls_names_exit_2_all_at_once(tmp_path, monkeypatch, capsys):
    text = ONE.replace("  kl.beta: 0.1\n", "  kl.beta: 0.1\n  train.trl: {beta: 0.2, topk: 3}\n")
    out = tmp_path / "res"
    args = [
        "plan",
        write(tmp_path, text),
        "train.trl.temprature=0.9",
        "+train.trl.num_generations=8",
        "train.trl.top_k=abc",
        "train.trl.output_dir=/tmp/x",
        "train.num_generations=8",
        "train.top_k=3",
        "--out",
        out,
    ]
    code, _, err = cli(args, monkeypatch, capsys)
    flat = " ".join(err.split())
    assert code == 2, err
    assert "8 problems" in flat
    for s in (
        "train.trl.beta: 'beta' is set by klsweep from kl.beta (allowed: use kl.beta)",
        "train.trl.topk: 'topk' is not a GRPOConfig option; did you mean 'top_k'?",
        "train.trl.temprature=0.9: 'temprature' is not a GRPOConfig option; did you mean 'temperature'?",
        "+train.trl.num_generations=8: 'num_generations' is set by klsweep from train.group_size "
        "(allowed: use train.group_size)",
        "train.trl.top_k=abc: 'abc' is not a valid value (allowed: int)",
        "'output_dir' is set by klsweep (the run folder's checkpoints/)",
        "train.num_generations=8: 'train.num_generations' is not a klsweep key: TRL's 'num_generations' is set "
        "from train.group_size (allowed: use train.group_size)",
        "train.top_k=3: 'train.top_k' is not a klsweep key: TRL's GRPOConfig option 'top_k' is passed through "
        "train.trl (allowed: use train.trl.top_k",
    ):
        assert s in flat, f"{s!r} not in {flat}"
    assert nothing_under(out)


def test_every_option_klsweep_sets_is_a_grpo_config_field():
    from klsweep import trlargs

    fields = trlargs.grpo_fields()
    assert set(trlargs.KLSWEEP_SETS) <= set(fields)
    schema_keys = grid.load.Schema().leaves
    for name, source in trlargs.KLSWEEP_SETS.items():  # a key, or several named in a sentence
        keys = {source} if source in schema_keys else set(re.findall(r"[a-z_]+(?:\.[a-z_]+)+", source))
        assert source.startswith("(") or (keys and keys <= set(schema_keys)), (name, source)


def test_plus_adds_only_inside_open_mappings(tmp_path, monkeypatch, capsys):
    g = write(tmp_path, ONE)
    plan = grid.load_plan(g, ["+cluster.additional_parameters.comment=klsweep", "++train.steps=3"])
    assert {r.config["cluster"]["additional_parameters"]["comment"] for r in plan.runs} == {"klsweep"}
    assert {r.config["train"]["steps"] for r in plan.runs} == {3}
    code, _, err = cli(
        [
            *(
                "plan",
                g,
                "+train.steps=3",
                "+preset=trl",
                "+kl.foo=1",
                "++kl.bar=1",
                "~seed=1",
                "kl.beta@x=1",
            ),
            *("~train.trl.top_kk", "~name"),
        ],
        monkeypatch,
        capsys,
    )
    flat = " ".join(err.split())
    assert code == 2 and "8 problems" in flat
    for s in (
        "+train.steps=3: +train.steps adds a key, but 'train.steps' exists already; klsweep's schema is closed: "
        "+ adds keys only inside cluster.additional_parameters, train.trl (allowed: train.steps=3)",
        "+preset=trl: +preset adds a key, but config group 'preset' is in the defaults already",
        "(allowed: preset=trl)",
        "+kl.foo=1: unknown key 'kl.foo'; klsweep's schema is closed",
        "++kl.bar=1: unknown key 'kl.bar'",
        "~seed=1: ~key takes no value: it resets the key to its default (allowed: ~seed)",
        "kl.beta@x=1: key@package is not used by klsweep",
        "~train.trl.top_kk: 'top_kk' is not a GRPOConfig option; did you mean 'top_k'?",
        "~name: the sweep's name cannot be removed",
    ):
        assert s in flat, f"{s!r} not in {flat}"


def test_sbatch_options_are_strings_or_integers(tmp_path, monkeypatch, capsys):
    g = write(tmp_path, ONE)
    plan = grid.load_plan(
        g, ["+cluster.additional_parameters.nice=10", "++cluster.additional_parameters.exclusive=true"]
    )
    assert plan.runs[0].config["cluster"]["additional_parameters"] == {"nice": 10, "exclusive": True}
    code, _, err = cli(
        [
            "plan",
            g,
            "+cluster.additional_parameters.constraint=[a,b]",
            "+cluster.additional_parameters.x=false",
        ],
        monkeypatch,
        capsys,
    )
    flat = " ".join(err.split())
    assert code == 2 and "2 problems" in flat and "sbatch option: a string or an integer" in flat


def test_tilde_removes_a_value_back_to_its_default(tmp_path):
    conf = tmp_path / "conf" / "cluster"
    conf.mkdir(parents=True)
    (conf / "site.yaml").write_text("kind: local\nadditional_parameters: {exclude: node13, comment: hi}\n")
    text = (
        "name: t\nsearchpath: [conf]\nbase:\n  cluster: site\n  kl.beta: 0.1\n  train.steps: 7\n"
        "  train.trl: {top_k: 3, top_p: 0.5}\ngrid:\n  kl.estimator: k1,k3\n  seed: range(3)\n"
    )
    g = write(tmp_path, text)
    assert len(grid.load_plan(g).runs) == 6
    plan = grid.load_plan(
        g, ["~seed", "~train.steps", "~train.trl.top_k", "~cluster.additional_parameters.exclude"]
    )
    assert len(plan.runs) == 2 and {r.config["seed"] for r in plan.runs} == {0}  # the axis is gone
    c = plan.runs[0].config
    assert c["train"]["steps"] == 50  # RunConfig's default
    assert c["train"]["trl"] == {"top_p": 0.5}
    assert c["cluster"]["additional_parameters"] == {"comment": "hi"}  # set by the config group, removed
    # ~ then + : the mapping emptied, then one entry added
    again = grid.load_plan(g, ["~train.trl", "+train.trl.top_k=9"])
    assert again.runs[0].config["train"]["trl"] == {"top_k": 9}
    # a later override sets the key again
    assert grid.load_plan(g, ["~train.steps", "train.steps=4"]).runs[0].config["train"]["steps"] == 4
    # ~section: every key of it
    reset = grid.load_plan(g, ["~train"]).runs[0].config["train"]
    assert (reset["steps"], reset["trl"]) == (50, {})
    # ~section removes the axes inside it; an exclude on them is then no mistake
    no_kl = grid.load_plan(write(tmp_path, TINY, "tiny.yaml"), ["~kl"])
    assert len(no_kl.runs) == 2 * 3 and no_kl.axes == ["offpolicy.lag", "seed"]
    assert {r.config["kl"]["beta"] for r in no_kl.runs} == {0.0}
    # ~ of a grid-file key that nothing set: no change
    assert [r.id for r in grid.load_plan(g, ["~train.trl.min_p"]).runs] == [
        r.id for r in grid.load_plan(g).runs
    ]


def test_run_file_with_plus_and_tilde(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("name: r\ntrain:\n  steps: 2\n  trl:\n    top_k: 3\n    top_p: 0.5\n")
    config = grid.compose_run_config(run, ["~train.trl.top_k", "+train.trl.min_p=0.1", "~train.steps"])
    assert config["train"]["trl"] == {"top_p": 0.5, "min_p": 0.1}
    assert config["train"]["steps"] == 50
    with pytest.raises(grid.UserError, match="use train.group_size"):
        grid.compose_run_config(run, ["+train.trl.num_generations=2"])


@pytest.mark.slurm
def test_an_sbatch_option_added_on_the_command_line_reaches_slurm(tmp_path):
    import subprocess

    import launcher_jobs as jobs

    from klsweep import submit

    g = write(tmp_path, "name: sb\nbase:\n  cluster: slurm\n  kl.beta: 0.1\ngrid:\n  seed: 0\n")
    plan = grid.load_plan(g, ["+cluster.additional_parameters.comment=klsweep-h-trl"], out=tmp_path / "res")
    res = submit.submit(plan, "slurm", train_fn=jobs.ok_train)
    scripts = list(Path(plan.sweep_dir).rglob("*_submission.sh"))
    assert scripts and any("#SBATCH --comment=klsweep-h-trl" in s.read_text() for s in scripts)
    runs = submit.wait_until_final(plan.sweep_dir, poll_s=0.5, timeout_s=180)
    assert {r.state for r in runs} == {"done"}
    job_id = res.jobs[0]["job_id"]
    # what Slurm holds for the job (kept MinJobAge after it ended; sacct stores comments only on request)
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert "Comment=klsweep-h-trl" in shown


def test_config_prints_the_yaml_a_run_gets_and_it_round_trips_to_its_id(tmp_path, monkeypatch, capsys):
    g = write(tmp_path, TINY)
    plan = grid.load_plan(g, ["+train.trl.top_k=2"])
    run = plan.table_order()[5]  # `config GRID 5` is row 5 of the plan table (plan --runs), from 0
    for which in (run.id, run.id[:6], "5"):
        code, out, err = cli(["config", g, which, "+train.trl.top_k=2"], monkeypatch, capsys)
        assert code == 0, err
        assert run.id in err
        assert yaml.safe_load(out) == run.config
        assert "top_k: 2" in out
    written = tmp_path / "run.yaml"
    written.write_text(out)
    assert grid.run_id(grid.compose_run_config(written, [])) == run.id
    # what a job writes as the run folder's config.yaml is this very text
    from klsweep.config import write_run

    write_run(tmp_path / "folder", run.config)
    assert (tmp_path / "folder" / "config.yaml").read_text() == out

    code, _, err = cli(["config", g, "zzzz"], monkeypatch, capsys)
    first = grid.load_plan(g).table_order()[0].id  # the ids allowed, from the plan table's first row
    assert code == 2 and "is no run id of the plan" in err and first in " ".join(err.split())


def test_config_takes_the_plan_tables_row(tmp_path, monkeypatch, capsys):
    g = write(tmp_path, TINY)
    code, out, _ = cli(["plan", g, "--runs", "--out", tmp_path], monkeypatch, capsys)
    rows = [line.split()[0] for line in out.splitlines() if re.match(r"[0-9a-f]{10} ", line)]
    assert code == 0 and len(rows) == len(grid.load_plan(g, out=tmp_path).runs)
    code, out, _ = cli(["plan", g, "--json", "--out", tmp_path], monkeypatch, capsys)
    assert [r["id"] for r in json.loads(out)["runs"]] == rows  # --json lists them in the same order
    for i, want in enumerate(rows):
        code, _, err = cli(["config", g, str(i), "--out", tmp_path], monkeypatch, capsys)
        assert code == 0 and f"run {want}:" in err, (i, err)


@pytest.mark.parametrize("width", [80, None])
def test_keys_lists_every_runconfig_field_with_default_and_help(width, monkeypatch):
    from dataclasses import is_dataclass

    from clitools import render

    from klsweep import console
    from klsweep.grid.keys import describe
    from klsweep.grid.schema import walk_fields

    docs = describe()
    by_key = {d.key: d for d in docs}
    leaves = [k for k, t, _ in walk_fields() if not is_dataclass(t)]
    assert set(leaves) <= set(by_key) and all(by_key[k].help for k in leaves)
    assert {"model", "task", "cluster", "eval", "preset"} <= set(by_key)
    assert by_key["train.group_size"].default == 4
    assert "TRL's num_generations" in by_key["train.group_size"].help
    assert by_key["train.group_size"].allowed.startswith(">= 2")
    assert by_key["kl.estimator"].allowed == "k1, k2, k3, abs"  # as klsweep.kl.KLConfig says
    assert by_key["cluster.kind"].default == "local" and "slurm" in by_key["cluster"].allowed
    out = render(console.keys_table(docs, width=width), width=width)
    lines = out.splitlines()
    if width:
        assert max(len(line) for line in lines) <= 80, out
    else:  # piped: one line per key
        for k in leaves:
            assert sum(line.startswith(k + " ") for line in lines) == 1, k
    for k in leaves:
        assert k in out  # never cut
    assert [d.key for d in describe("train")] == [k for k in leaves if k.startswith("train.")]


def test_keys_command(monkeypatch, capsys):
    code, out, _ = cli(["keys", "offpolicy"], monkeypatch, capsys)
    assert code == 0
    assert "offpolicy.lag" in out and "the batch trained at step t was generated" in out
    assert "train.steps" not in out
    code, _, err = cli(["keys", "trian"], monkeypatch, capsys)
    assert code == 2 and "no key is under it" in err


def test_an_unknown_vllm_importance_sampling_mode_exits_2_with_the_modes(tmp_path, monkeypatch, capsys):
    code, out, err = cli(
        ["plan", str(write(tmp_path, ONE)), "train.vllm_importance_sampling=seq"], monkeypatch, capsys
    )
    assert code == 2
    assert "train.vllm_importance_sampling" in out + err
    assert "sequence_mask, sequence_truncate, token_mask, token_truncate, off" in out + err
