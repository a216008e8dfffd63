"""The grids klsweep ships (sweeps/, inside the package as klsweep/sweeps): a bare name that is no file plans
the shipped grid from anywhere, `klsweep grids` lists them and `klsweep grids cp` copies one; the wheel
carries them (planned from outside the repository with nothing but the unpacked wheel), with the documentation,
the lock and GRPOConfig's fields, and its package page opens with the pip install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from clitools import cli

from klsweep import grid
from klsweep.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def test_a_bare_name_plans_the_shipped_grid_anywhere(tmp_path, monkeypatch):
    want = [r.id for r in grid.load_plan(REPO / "sweeps" / "tiny.yaml", out=tmp_path).runs]
    monkeypatch.chdir(tmp_path)
    assert [r.id for r in grid.load_plan("tiny", out=tmp_path).runs] == want
    assert [r.id for r in grid.load_plan("tiny.yaml", out=tmp_path).runs] == want


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("tiny").write_text("name: mine\nbase: {model: tiny, task: tiny}\ngrid: {seed: range(2)}\n")
    plan = grid.load_plan("tiny", out=tmp_path)
    assert plan.name == "mine" and len(plan.runs) == 2


def test_neither_a_file_nor_a_shipped_name_lists_the_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        grid.load_plan("tinny", out=tmp_path)
    assert "no such file, nor a shipped grid" in str(e.value) and "tiny-full" in str(e.value)
    with pytest.raises(UserError) as e:  # a path with a folder is a path: no shipped grid is looked for
        grid.load_plan("sweeps/nothing.yaml", out=tmp_path)
    assert "shipped" not in str(e.value)


def test_a_missing_path_names_the_shipped_grid_it_resembles(tmp_path, monkeypatch, capsys):
    """`klsweep plan sweeps/tiny.yaml` where there is no sweeps/ (a wheel install: the README's clone command)
    says which shipped name it is, exit 2."""
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(["plan", "sweeps/tiny.yaml"], monkeypatch, capsys)
    assert code == 2, err
    assert "no file sweeps/tiny.yaml here; the shipped grid `tiny` is `klsweep plan tiny`" in " ".join(
        err.split()
    )


def test_grids_lists_and_copies(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(["grids"], monkeypatch, capsys)
    assert code == 0
    for name in ("tiny", "tiny-full", "paper", "presets", "starter", "baseline"):
        assert f"\n{name} " in out
    code, out, _ = cli(["grids", "cp", "starter", "mine.yaml"], monkeypatch, capsys)
    shipped = (REPO / "sweeps" / "starter.yaml").read_text()
    copied = (tmp_path / "mine.yaml").read_text()
    assert code == 0 and copied[copied.index("\nbase:") :] == shipped[shipped.index("\nbase:") :]
    (tmp_path / "mine.yaml").write_text("edited")
    code, _, err = cli(["grids", "cp", "starter", "mine.yaml"], monkeypatch, capsys)
    assert code == 2 and "exists already" in err and (tmp_path / "mine.yaml").read_text() == "edited"
    code, _, err = cli(["grids", "cp", "nope"], monkeypatch, capsys)
    assert code == 2 and "is no shipped grid" in err
    code, _, _ = cli(["grids", "cp", "tiny"], monkeypatch, capsys)  # into the current folder
    assert code == 0 and (tmp_path / "tiny.yaml").is_file()


def test_the_wheel_carries_the_grids_and_plans_tiny_outside_the_repository(tmp_path):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside its sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.lock"):
        shutil.copy(REPO / name, src / name)
    (src / "slurm").mkdir()
    shutil.copy(REPO / "slurm" / "README.md", src / "slurm" / "README.md")
    for folder in ("sweeps", "docs"):
        shutil.copytree(REPO / folder, src / folder)
    shutil.copytree(
        REPO / "klsweep", src / "klsweep", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, src],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("klsweep-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("klsweep/sweeps/")}
    assert shipped == {p.name for p in (REPO / "sweeps").glob("*.yaml")}
    # the documentation (klsweep docs), the lock pip users pin with -c, GRPOConfig's fields (plan without TRL)
    docs = {Path(n).name for n in names if n.startswith("klsweep/docs/")}
    assert docs == {p.name for p in (REPO / "docs").glob("*.md")} | {"SLURM.md", "README.md"}
    with zipfile.ZipFile(wheel) as z:
        assert z.read("klsweep/requirements.lock") == (REPO / "requirements.lock").read_bytes()
        assert z.read("klsweep/docs/SLURM.md") == (REPO / "slurm" / "README.md").read_bytes()
        assert z.read("klsweep/trl_fields.json") == (REPO / "klsweep" / "trl_fields.json").read_bytes()
        meta = z.read("klsweep-0.1.0.dist-info/METADATA").decode()
    # the package page opens with what a wheel user runs: pip, then klsweep's commands; not ./dev.sh
    description = meta.split("\n\n", 1)[1]
    opening = description.split("## The first commands")[0]
    assert description.startswith("# Installing klsweep with pip") and "./dev.sh" not in opening
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in opening
    assert "-r requirements.lock" in opening and "klsweep plan tiny" in description
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import klsweep; print(klsweep.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(site))
    done = subprocess.run(
        [sys.executable, "-m", "klsweep", "plan", "tiny", "--json", "--out", tmp_path / "results"],
        cwd=elsewhere, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    want = [r.id for r in grid.load_plan(REPO / "sweeps" / "tiny.yaml", out=tmp_path).table_order()]
    assert [r["id"] for r in json.loads(done.stdout)["runs"]] == want


def test_grids_cp_names_the_copy_after_dest(tmp_path, monkeypatch, capsys):
    """Issue 51: `grids cp starter mine.yaml` kept `name: starter` and the header's `klsweep study
    starter.yaml`: the copy's runs went into the shipped grid's folder (results/starter/). The copy is named
    after DEST, its header's commands name DEST, and it plans as a sweep of that name; a folder as DEST keeps
    the shipped name (the file is NAME.yaml)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    for name, dest in (("starter", "mine.yaml"), ("tiny", "sub/2024.yaml"), ("tiny-full", "sub")):
        code, _, _ = cli(["grids", "cp", name, dest], monkeypatch, capsys)
        assert code == 0
    text = (tmp_path / "mine.yaml").read_text()
    header = text[: text.index("\nname:")]
    assert "klsweep study mine.yaml" in header and "klsweep plan mine.yaml" in header
    assert "klsweep study starter" not in header and "klsweep plan starter" not in header
    assert grid.load_plan("mine.yaml", out=tmp_path).name == "mine"
    assert grid.load_plan("sub/2024.yaml", out=tmp_path).name == "2024"  # quoted: YAML reads 2024 as a number
    assert "klsweep run sub/2024.yaml" in (tmp_path / "sub" / "2024.yaml").read_text()
    assert grid.load_plan("sub/tiny-full.yaml", out=tmp_path).name == "tiny-full"


def test_grids_cp_never_writes_through_a_planted_link(tmp_path, monkeypatch, capsys):
    """Issue 44 D2: a link planted at the fixed temporary name `.new.yaml.tmp` had its target overwritten and
    made `new.yaml` a link. The copy goes through an unpredictable temporary file created anew (O_EXCL,
    O_NOFOLLOW): the link's target is untouched, and so is the link; new.yaml is a regular file."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / ".new.yaml.tmp").symlink_to(victim)
    code, _, err = cli(["grids", "cp", "starter", "new.yaml"], monkeypatch, capsys)
    assert code == 0, err
    assert victim.read_text() == "precious"
    new = tmp_path / "new.yaml"
    assert not new.is_symlink() and "name: new" in new.read_text()
    assert (tmp_path / ".new.yaml.tmp").is_symlink()  # left as it was
    # --force over a link: the link is replaced by the file, its target untouched
    (tmp_path / "linked.yaml").symlink_to(victim)
    code, _, err = cli(["grids", "cp", "tiny", "linked.yaml", "--force"], monkeypatch, capsys)
    assert code == 0, err
    assert victim.read_text() == "precious" and not (tmp_path / "linked.yaml").is_symlink()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


@pytest.mark.parametrize("name", ["{tmp}/g1", "{up}/g1", "../../../g1", "./tiny", "sweeps/tiny"])
def test_grids_cp_copies_only_a_shipped_name(tmp_path, monkeypatch, capsys, name):
    """Issue 44 D3: `grids cp /any/path/g1 o.yaml` and `grids cp ../../../x/g1 o.yaml` copied any YAML. A
    shipped grid is a name `klsweep grids` lists, nothing else: exit 2 with the names allowed, nothing
    written."""
    (tmp_path / "g1.yaml").write_text("name: secret\n")
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    from klsweep.grid.shipped import SHIPPED_DIR

    name = name.format(tmp=tmp_path, up=os.path.relpath(tmp_path, SHIPPED_DIR))  # up: ../../../tmp/...
    code, _, err = cli(["grids", "cp", name, "o.yaml"], monkeypatch, capsys)
    assert code == 2 and "is no shipped grid" in err, err
    text = " ".join(err.split())
    assert "starter" in text and "tiny" in text and "Traceback" not in err  # the names allowed
    assert not (work / "o.yaml").exists()


def test_each_shipped_grid_is_described_by_its_description_not_a_command_line():
    """`klsweep grids` described presets as "audit" (its `# audit: klsweep audit ...` line)."""
    from klsweep.grid.shipped import shipped

    said = {g.name: g.summary for g in shipped()}
    assert said["presets"].startswith("Each framework's KL configuration"), said["presets"]
    assert all(len(s.split()) >= 3 and "klsweep " not in s for s in said.values()), said
