"""Commands that help a user: env (what a bug report needs: klsweep/environment.py), docs (the
documentation shipped in the package: klsweep/docs/)."""

from __future__ import annotations

from typing import Annotated

import typer

from klsweep.cli.app import app, terminal


@app.command("env")
def env_command(
    as_json: Annotated[bool, typer.Option("--json", help="print it as JSON")] = False,
) -> None:
    """What a bug report needs, to copy into it: Python, the OS, the versions of torch, TRL, transformers,
    lm-eval, vLLM ..., the CPU (model, vendor, the kernels torch uses), the GPU, klsweep's version and git
    commit, where klsweep is installed."""
    from klsweep.environment import bug_report

    env = bug_report()
    if as_json:
        import json

        print(json.dumps(env, indent=2))
        return
    console = terminal()
    console.print("Copy-paste this into a bug report:\n", highlight=False)
    for key, value in env.items():
        console.print(
            f"- {key}: {'—' if value is None else value}", highlight=False, markup=False, soft_wrap=True
        )


@app.command("docs")
def docs_command(
    page: Annotated[
        str | None,
        typer.Argument(
            help="a page (KL, USAGE, SLURM, ...; docs/KL.md as a message writes it); none: the list"
        ),
    ] = None,
    path: Annotated[bool, typer.Option("--path", help="print where the page is, not its text")] = False,
) -> None:
    """klsweep's documentation, shipped with it: the pages (no PAGE), or one page's Markdown (a message's
    "docs/KL.md" or "klsweep docs KL" is the page KL)."""
    from klsweep import manual

    console = terminal()
    if page is None:
        from klsweep.console import docs_table, table_width

        console.print(docs_table(manual.pages(), width=table_width(console)))
        return
    found = manual.find(page)
    if path:
        print(found)
    else:
        print(found.read_text(encoding="utf-8"), end="")
