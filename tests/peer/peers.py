"""The peer tier's tools: the frameworks' own KL functions, run beside klsweep's presets.

A framework published on PyPI at (or near) the version its preset cites is *executed*: ``wheel_source``
downloads its wheel by pinned version and sha256 (``pip download --no-deps``, cached under klsweep's cache,
``$KLSWEEP_CACHE/peer-wheels/``) and reads one module's text out of it; ``load`` parses that text and executes
only the named definitions (the KL function and the few helpers it needs) with torch, never importing the
package (whose imports pull Ray, vLLM, Megatron, DeepSpeed). A framework with no wheel at the cited commit is
*transcribed*: its test holds the lines verbatim, cited by file, lines and commit, and runs them the same way.

``terms`` builds the inputs every comparison uses: float64 log-probabilities whose log-ratios reach +-40 (so
every clamp of every framework is hit, on both sides), random masks, a behaviour policy that is the current
one (on-policy) or another (off-policy); ``assert_same`` compares value and gradient within 1e-6 relative
(absolute where the magnitude is below 1)."""

from __future__ import annotations
import __future__

import ast
import contextlib
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# value and gradient: |a - b| <= RTOL * max(1, |b|) (relative, absolute below 1)
RTOL = 1e-6


@dataclass(frozen=True)
class Wheel:
    """A framework's wheel on PyPI, pinned: ``pip download`` options select the one file whose sha256 is this."""

    name: str  # the distribution, as pip knows it
    version: str
    sha256: str
    filename: str
    pip_options: tuple[str, ...] = ("--python-version", "3.12")  # the wheel's own tag (pip's resolver)

    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def cache_dir() -> Path:
    """Where the wheels are kept: ``$KLSWEEP_CACHE/peer-wheels`` (klsweep.store's cache)."""
    from klsweep import store

    return store.cache_dir() / "peer-wheels"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel_path(wheel: Wheel) -> Path:
    """The wheel's file, downloaded once (``pip download --no-deps --only-binary=:all:``) and checked against its
    pinned sha256 every time (a file that differs is removed, so the next run downloads it again)."""
    folder = cache_dir()
    path = folder / wheel.filename
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *wheel.pip_options,
            "--dest", str(folder), "--disable-pip-version-check", "-q", wheel.spec(),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not path.exists():
            said = f"pip download {wheel.spec()} did not give {wheel.filename}:\n{done.stdout}{done.stderr}"
            if os.environ.get("CI") != "true":  # offline here: skipped; under CI the tier must run
                import pytest

                pytest.skip(said)
            raise RuntimeError(said)
    got = sha256(path)
    if got != wheel.sha256:
        path.unlink()
        raise RuntimeError(f"{wheel.filename}: sha256 {got}, pinned {wheel.sha256} (removed from the cache)")
    return path


def wheel_source(wheel: Wheel, module: str) -> str:
    """The text of ``module`` (its path inside the package, e.g. ``verl/trainer/ppo/core_algos.py``) in the
    wheel; a purelib file under ``NAME-VERSION.data/purelib/`` is found too."""
    with zipfile.ZipFile(wheel_path(wheel)) as archive:
        for name in archive.namelist():
            if name == module or name.endswith(f".data/purelib/{module}"):
                return archive.read(name).decode()
    raise FileNotFoundError(f"{module} is not in {wheel.filename}")


def load(source: str, names: tuple[str, ...], filename: str = "<peer>", **namespace: Any) -> dict[str, Any]:
    """Execute only the top-level definitions ``names`` (functions, classes, assignments) of ``source``, parsed
    with ``ast``, in a namespace holding torch (and ``namespace``); annotations are not evaluated (the
    modules' typing imports are not executed). Returns the namespace: ``load(...)[name]``."""
    tree = ast.parse(source, filename=filename)
    found: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            found[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in names:
                    found[target.id] = node
    missing = [n for n in names if n not in found]
    if missing:
        raise LookupError(f"{filename} has no top-level {', '.join(missing)}")
    body = [found[n] for n in names]
    code = compile(
        ast.Module(body=body, type_ignores=[]), filename, "exec", flags=__future__.annotations.compiler_flag
    )
    scope: dict[str, Any] = {"torch": torch, "__name__": "peer", **namespace}
    exec(code, scope)  # noqa: S102 (the framework's own definitions, nothing else: the point of this tier)
    return scope


def lines(source: str, first: int, last: int) -> str:
    """Lines ``first``..``last`` (1-based, inclusive) of a file's text."""
    return "\n".join(source.splitlines()[first - 1 : last]) + "\n"


@dataclass
class Inputs:
    """One batch of per-token log-probabilities [B, T] (float64): ``logp`` the current policy's (a leaf: the
    gradient is taken with respect to it), ``ref`` the reference's, ``old`` the behaviour (generating) policy's
    (``logp``'s values on-policy), ``mask`` the completion tokens."""

    logp: torch.Tensor
    ref: torch.Tensor
    old: torch.Tensor
    mask: torch.Tensor

    def fresh(self) -> torch.Tensor:
        """A new leaf with ``logp``'s values (one per side of a comparison)."""
        return self.logp.detach().clone().requires_grad_()


def inputs(off_policy: bool, seed: int = 0, batch: int = 6, length: int = 40, span: float = 40.0) -> Inputs:
    """Log-ratios log pi - log pi_ref spread over [-span, span] (the tails beyond every framework's clamps, 5,
    10 and 20, and the middle where none bites), random masks (each row keeps at least one token); off-policy,
    log pi - log mu spread over [-3, 3], else mu = pi. Every value is a multiple of 2**-10 below 2**13, so a
    framework that computes in float32 (``.float()``) casts and subtracts them exactly: what is left is float32's
    rounding of the estimator, far below the tolerance."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 5
    delta = torch.linspace(-span, span, batch * length, dtype=torch.float64)
    delta = delta[torch.randperm(batch * length, generator=g)].reshape(batch, length)
    ref = logp - delta
    old = logp - (torch.rand(batch, length, generator=g, dtype=torch.float64) * 6 - 3) if off_policy else logp
    mask = torch.rand(batch, length, generator=g) < 0.8
    mask[:, 0] = True
    grid = [torch.round(x * 1024) / 1024 for x in (logp, ref, old)]
    return Inputs(grid[0], grid[1], grid[2], mask)


def masked_sum(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per sequence [B], the sum of the unmasked tokens' terms (masked ones removed with where, never by
    multiplication: a masked position may hold inf)."""
    return torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype)).sum(-1)


@contextlib.contextmanager
def float_is_float64():
    """``Tensor.float()`` returns float64 meanwhile. The frameworks call it to upcast bf16 log-probs before the
    estimator; run on float64 inputs it would round them to float32, and float32 cancels catastrophically in
    some gradients (w x k3's on-policy gradient is exactly the log-ratio, computed as a difference of terms of
    size exp(|log-ratio|)): the comparison is of the math, in float64 on both sides."""
    original = torch.Tensor.float
    torch.Tensor.float = lambda self, *args, **kwargs: self.to(torch.float64)  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.float = original  # type: ignore[method-assign]


def value_and_gradient(term_of, x: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``term_of(logp)`` -> per-sequence term [B]: its value and the gradient of its sum w.r.t. ``logp``, in
    float64 (``float_is_float64``)."""
    logp = x.fresh()
    with float_is_float64():
        value = term_of(logp)
        (grad,) = torch.autograd.grad(value.sum(), logp, allow_unused=True)
    assert value.dtype == torch.float64, value.dtype
    return value.detach(), torch.zeros_like(logp) if grad is None else grad


def assert_same(
    ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor], what: str
):
    """Value and gradient equal within ``RTOL`` relative (absolute below 1), every element; where they differ
    the message names the first few elements."""
    for kind, a, b in (("value", ours[0], theirs[0]), ("gradient", ours[1], theirs[1])):
        assert torch.isfinite(b).all(), f"{what}: the framework's {kind} is not finite"
        bad = (a - b).abs() > RTOL * b.abs().clamp(min=1)
        if bad.any():
            where = bad.nonzero()[:4].tolist()
            pairs = [(tuple(i), a[tuple(i)].item(), b[tuple(i)].item()) for i in where]
            raise AssertionError(
                f"{what}: {kind} differs at {int(bad.sum())} of {bad.numel()} elements "
                f"(index, klsweep, framework): {pairs}"
            )


def run_block(text: str, filename: str, **names: Any) -> dict[str, Any]:
    """Execute a block of a framework's statements (lines cut from a function's body, dedented) in a namespace
    holding torch and ``names`` (the variables the block reads); returns the namespace (what it assigned)."""
    import textwrap

    code = compile(textwrap.dedent(text), filename, "exec")
    scope: dict[str, Any] = {"torch": torch, **names}
    exec(code, scope)  # noqa: S102 (the framework's own lines)
    return scope
