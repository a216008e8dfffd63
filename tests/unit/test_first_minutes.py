"""A newcomer's first minutes (issue 43): `klsweep plan` answers without importing TRL, transformers or torch
(GRPOConfig's fields come from a table generated from the locked TRL; composed configs are kept by a hash of
what Hydra reads); the documentation ships with klsweep (`klsweep docs`); `klsweep env` says what a bug report
needs; tab completion works; the audit table says what its columns are; the README's first screen."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from clitools import cli, render
from gridfiles import write

from klsweep import environment, grid, manual, trlargs
from klsweep.errors import UserError
from klsweep.grid import compose

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "trl", "transformers", "lm_eval", "vllm", "matplotlib", "pandas", "datasets")


def _modules_after(args: list[str], env: dict[str, str] | None = None) -> tuple[int, set[str], str]:
    """Run `klsweep ARGS` in a fresh interpreter; (exit code, the heavy modules it imported, its output:
    stdout then stderr)."""
    code = (
        "import sys, atexit, json\n"
        f"atexit.register(lambda: print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr))\n"
        f"sys.argv = ['klsweep', *{args!r}]\n"
        "from klsweep.cli import main\nmain()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    return done.returncode, set(json.loads(done.stderr.strip().splitlines()[-1])), done.stdout + done.stderr


def test_plan_of_the_paper_sweep_imports_neither_trl_nor_transformers_nor_torch(tmp_path):
    """The paper's grid passes TRL options (train.trl): they are checked against GRPOConfig's fields and types
    without importing TRL (it took 7.5 of 12.4 s of `klsweep plan sweeps/paper.yaml`)."""
    online = {"HF_HUB_OFFLINE": "0"}
    for args in (["plan", "paper", "cluster.offline=false"], ["plan", "tiny"], ["keys", "train"]):
        code, heavy, err = _modules_after(
            [*args, "--out", str(tmp_path)] if args[0] == "plan" else args, online
        )
        assert code == 0 and heavy == set(), (args, heavy, err[-2000:])
    # offline, with nothing cached: the plan, then every model and dataset said missing (what run would
    # refuse), without importing datasets either
    empty = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    code, heavy, err = _modules_after(["plan", "paper", "--out", str(tmp_path)], empty)
    assert code == 0 and "run would refuse" in err, err[-2000:]
    assert "train data DigitalLearningGmbH/MATH-lighteval train: not in the cache" in " ".join(err.split())
    assert heavy == set(), heavy


def test_the_shipped_trl_table_is_grpo_configs_fields():
    """klsweep/trl_fields.json is what the locked TRL's GRPOConfig says (./dev.sh lock writes it)."""
    shipped = json.loads(trlargs.FIELDS_FILE.read_text())
    assert shipped["trl"] == trlargs.trl_version(), (
        "regenerate: ./dev.sh lock (or trlargs.write_fields_file())"
    )
    assert shipped == trlargs.fields_table()
    fields = shipped["fields"]
    assert trlargs.type_name(fields["top_k"]) == "int" and trlargs.accepts(fields["top_k"], 5)
    assert not trlargs.accepts(fields["top_k"], "abc") and trlargs.accepts(fields["weight_decay"], 0)
    assert trlargs.type_name(fields["parallelism_config"]) == "ParallelismConfig | None"


def test_another_trl_gets_its_own_table_generated_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(trlargs, "trl_version", lambda: "9.9.9")
    trlargs.grpo_fields.cache_clear()
    try:
        fields = trlargs.grpo_fields()
        cached = tmp_path / "trl" / "grpo-fields-9.9.9.json"
        assert json.loads(cached.read_text())["fields"] == fields == trlargs.fields_table()["fields"]
        cached.write_text(json.dumps({"trl": "9.9.9", "fields": {"only_this": "int"}}))
        trlargs.grpo_fields.cache_clear()
        assert trlargs.grpo_fields() == {"only_this": "int"}  # read back, not generated again
    finally:
        trlargs.grpo_fields.cache_clear()


def test_group_options_are_hydras(tmp_path):
    """The options of each config group, listed from the folders, are what Hydra's own loader lists."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    extra = tmp_path / "conf"
    (extra / "model").mkdir(parents=True)
    (extra / "model" / "mine.yaml").write_text("name: mine\n")
    c = compose.Composer([str(extra)], grid.schema.Schema(), [])
    with initialize_config_dir(config_dir=str(compose.CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for group in grid.schema.GROUPS:
            hydra = loader.get_group_options(group, config_name="config", overrides=c._sp())
            assert c.group_options(group) == hydra, group
    assert "mine" in c.group_options("model")


def test_a_composed_config_is_kept_and_composed_again_when_a_config_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path / "cache"))
    conf = tmp_path / "conf"
    (conf / "model").mkdir(parents=True)
    text = (compose.CONF_DIR / "model" / "tiny.yaml").read_text()
    (conf / "model" / "mine.yaml").write_text(text)
    g = write(tmp_path, f"name: c\nsearchpath: {conf}\nbase:\n  model: mine\ngrid:\n  seed: 0,1\n")
    first = grid.load_plan(g, out=tmp_path)
    hydra_composed = []
    original = compose.Composer._hydra_compose
    monkeypatch.setattr(
        compose.Composer, "_hydra_compose", lambda self, o: hydra_composed.append(o) or original(self, o)
    )
    again = grid.load_plan(g, out=tmp_path)
    assert hydra_composed == [] and [r.config for r in again.runs] == [r.config for r in first.runs]
    (conf / "model" / "mine.yaml").write_text(text.replace("name: tiny", "name: mine-renamed"))
    changed = grid.load_plan(g, out=tmp_path)
    assert len(hydra_composed) == 1 and changed.runs[0].config["model"]["name"] == "mine-renamed"
    (conf / "model" / "mine.yaml").write_text(text.replace("name: tiny", 'name: "${oc.env:SOME_NAME,mine}"'))
    grid.load_plan(g, out=tmp_path)
    grid.load_plan(g, out=tmp_path)
    assert len(hydra_composed) == 3  # a file that interpolates is composed every time


def test_hydras_parse_of_an_override_is_kept_and_read_back_the_same(tmp_path, monkeypatch):
    """Each axis and override string is parsed by Hydra's ANTLR grammar once: later plans read what it gave
    back without Hydra (the same runs), a damaged kept file is parsed again, and a string Hydra refuses is
    never kept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    monkeypatch.setenv("KLSWEEP_CACHE", str(tmp_path / "cache"))
    g = write(
        tmp_path,
        "name: c\nbase:\n  model: tiny\n  kl.beta: 0.1\ngrid:\n  kl.estimator: k1,k3\n  seed: range(2)\n",
    )
    first = grid.load_plan(g, ["train.steps=7"], out=tmp_path)
    kept = sorted((tmp_path / "cache" / "compose").glob("override-*.json"))
    # kl.estimator=k1,k3, seed=range(2), train.steps=7: each counted and read
    assert len(kept) == 6
    parsed = []
    original = OverridesParser.parse_override
    monkeypatch.setattr(
        OverridesParser, "parse_override", lambda self, s: parsed.append(s) or original(self, s)
    )
    again = grid.load_plan(g, ["train.steps=7"], out=tmp_path)
    assert parsed == [] and [r.config for r in again.runs] == [r.config for r in first.runs]
    assert len(again.runs) == 4 and {r.config["train"]["steps"] for r in again.runs} == {7}
    kept[0].write_bytes(b"{not json")
    grid.load_plan(g, ["train.steps=7"], out=tmp_path)
    assert len(parsed) == 1  # the damaged one, parsed again (and kept whole again)
    bad = write(tmp_path, "name: b\nbase:\n  model: tiny\ngrid:\n  seed: range(2\n")
    with pytest.raises(UserError, match="bad override grammar"):
        grid.load_plan(bad, out=tmp_path)
    assert len(list((tmp_path / "cache" / "compose").glob("override-*.json"))) == 6


def test_the_docs_ship_in_the_package_and_klsweep_docs_prints_them(monkeypatch, capsys):
    linked = {p.name: p.resolve() for p in manual.DOCS_DIR.glob("*.md")}
    want = {p.name: p.resolve() for p in (REPO / "docs").glob("*.md")}
    want |= {
        "SLURM.md": (REPO / "slurm" / "README.md").resolve(),
        "README.md": (REPO / "README.md").resolve(),
    }
    assert linked == want  # every page of docs/, slurm/README.md and the README, linked in a checkout
    for page in ("KL", "kl", "docs/KL.md", "KL.md"):
        code, out, _ = cli(["docs", page], monkeypatch, capsys)
        assert code == 0 and out == (REPO / "docs" / "KL.md").read_text(), page
    code, out, _ = cli(["docs", "slurm/README.md"], monkeypatch, capsys)
    assert code == 0 and out == (REPO / "slurm" / "README.md").read_text()
    code, out, _ = cli(["docs"], monkeypatch, capsys)
    assert code == 0 and re.search(r"^KL\s+KL regularisation in klsweep", out, re.M) and "SLURM" in out
    code, _, err = cli(["docs", "nope"], monkeypatch, capsys)
    assert code == 2 and "no such page" in err and "USAGE" in err


def test_messages_point_to_pages_klsweep_docs_has(tmp_path, monkeypatch, capsys):
    """What klsweep prints names `klsweep docs PAGE`, never a repository file a wheel does not have."""
    code, out, _ = cli(["plan", "tiny", "--out", tmp_path], monkeypatch, capsys)
    assert code == 0 and "slurm/README.md" not in out and "klsweep docs slurm" in out
    code, out, _ = cli(["keys"], monkeypatch, capsys)
    assert code == 0 and not re.search(r"docs/\w+\.md|slurm/README", out)
    for page in set(re.findall(r"klsweep docs (\w+)", out)):
        manual.find(page)


def test_env_says_what_a_bug_report_needs(monkeypatch, capsys):
    code, out, _ = cli(["env"], monkeypatch, capsys)
    assert code == 0 and out.startswith("Copy-paste this into a bug report:")
    for key in ("python", "torch", "trl", "transformers", "lm-eval", "vllm", "cpu", "cpu vendor", "gpu"):
        assert f"\n- {key}: " in out, key
    for key in ("klsweep", "git commit", "klsweep location", "not at the locked version"):
        assert f"\n- {key}: " in out, key
    code, out, _ = cli(["env", "--json"], monkeypatch, capsys)
    env = json.loads(out)
    assert env["trl"] == trlargs.trl_version() and "hostname" not in env
    assert env["git commit"] == environment._git_commit()  # the checkout's, as env.json records it


def test_the_lock_drift_names_a_package_at_another_version(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# a lock\nrich==0.0.1\nnot-installed-here==1.0\n" + f"typer=={environment._version('typer')}\n"
    )
    assert environment.lock_drift(lock) == [("rich", environment._version("rich"), "0.0.1")]
    assert environment.lock_drift() == [] or all(have for _, have, _ in environment.lock_drift())


def test_tab_completion_completes_commands_and_options():
    env = {**os.environ, "_KLSWEEP_COMPLETE": "complete_bash", "COMP_CWORD": "1", "COMP_WORDS": "klsweep pl"}
    script = [str(Path(sys.executable).parent / "klsweep")]  # the console script, as a shell runs it
    done = subprocess.run(script, env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["plan"], done.stderr
    env |= {"COMP_CWORD": "2", "COMP_WORDS": "klsweep plan --ru"}
    done = subprocess.run(script, env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["--runs"], done.stderr


def test_help_names_install_completion(monkeypatch, capsys):
    code, out, _ = cli(["--help"], monkeypatch, capsys)
    assert code == 0 and "--install-completion" in out and "env" in out and "docs" in out


def test_the_audit_table_says_what_its_columns_are():
    from klsweep import audit
    from klsweep.console import audit_tables

    rows = audit.audit(vocab=3, length=2)
    text = " ".join(render(*audit_tables(rows), width=80).split())
    for said in ("err rev, err fwd: |E g - grad KL| / |grad KL|", "|E g|: the expected gradient's norm"):
        assert said in text


@pytest.fixture(scope="module")
def readme() -> list[str]:
    return (REPO / "README.md").read_text(encoding="utf-8").splitlines()


def test_the_readmes_first_screen(readme):
    """Title, a one-line description, what it is for, then the two commands; the one-minute tier named; how to
    get the klsweep command; no jargon before the first section; lines of at most 100 characters (a table's
    rows aside)."""
    assert readme[0] == "# klsweep" and readme[1] == "" and readme[2] and readme[3] == ""
    text = "\n".join(readme)
    assert text.index("**What it is for.**") < text.index("./dev.sh study") < text.index("./dev.sh test")
    first = text.split("\n## ")[0]
    assert "./dev.sh quick" in first and "source .venv/bin/activate" in first
    for word in ("colocate", "weight sync", "gloo", "NCCL", "sleep mode", "tensor parallel"):
        assert word not in first, word
    assert [line for line in readme if len(line) > 100 and not line.startswith("|")] == []


def test_the_cache_folders_plan_looks_for_are_the_libraries(tmp_path, monkeypatch):
    """Offline, `plan` says a model or a dataset missing from the folder the library would keep it in, without
    importing the library's download code: the same folder names as huggingface_hub's and datasets' own."""
    from datasets.naming import camelcase_to_snakecase
    from huggingface_hub.file_download import repo_folder_name

    from klsweep import fetch
    from klsweep.fetch import caches

    for repo in ("Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-4B-Instruct-2507"):
        assert fetch.hub_folder(repo) == repo_folder_name(repo_id=repo, repo_type="model")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))
    repos = ("DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "cais/mmlu")
    for repo in repos:
        assert not caches._may_be_cached(repo)
        *ns, name = repo.split("/")
        (tmp_path / "___".join([*ns, camelcase_to_snakecase(name)])).mkdir()  # datasets' folder of the repo
        assert caches._may_be_cached(repo)
    assert not caches._may_be_cached("cais/mmlu-pro")
