"""A grid file -> a validated ``Plan`` of runs, each with a stable id.

A grid file (see ``sweeps/*.yaml``)::

    name: tiny                  # the sweep: results/<name>/
    searchpath: [my_conf]       # optional: more config folders (model/, task/, ... options), relative to this file
    base:                       # what every run starts from: config-group choices and values (dotted or nested)
      model: tiny
      train.steps: 50
    grid:                       # every key is an axis: Hydra's override grammar, or a YAML list
      kl.estimator: k1,k3
      kl.beta: 0.05,0.1
      seed: range(3)
    exclude:                    # partial assignments of axis values; the runs matching one are dropped
      - {kl.estimator: k1, kl.beta: 0.1}
    claims:                     # optional: hypotheses the report tests (claims.py; docs/REPORT.md)
      - {name: k3 beats k1, metric: in_domain, test: welch, direction: greater,
         a: {kl.estimator: k3}, b: {kl.estimator: k1}}
    labels:                     # optional: the report's names of configurations (labels.py; docs/REPORT.md)
      - {kl.estimator: k1, kl.placement: reward, label: k1-R}

``grid:`` may also be a list of such mappings: the plan is the union of their products, deduplicated by run
id (e.g. the full product plus a no-KL baseline ``{kl.beta: 0, seed: range(3)}``). Precedence, lowest first:
the config groups' contents, ``base:``, the grid's axes, command-line overrides. A command-line ``key=a,b``
makes ``key`` an axis of every sub-grid (replacing it where it was one); ``key=a`` sets it for every run.
An exclude applies to the runs of the sub-grids that have all its keys as axes (so a no-KL baseline
sub-grid without the estimator axis is never dropped by ``{kl.estimator: k3}``).

Keys are the dotted keys of ``klsweep.config.RunConfig`` plus the config groups (``model``, ``task``,
``cluster``, ``eval``, ``preset``: folders of ``klsweep/conf``). On the command line, Hydra's ``+key=v`` adds a
key inside an open mapping (``train.trl``, ``cluster.additional_parameters``; elsewhere the schema is closed),
``++key=v`` sets or adds, ``~key`` drops the grid's values of ``key`` and of the keys inside it (its default
applies; an entry of an open mapping is removed, even one a config group set). Composition is Hydra's: once per distinct
combination of group choices; values are then set on plain dicts, each distinct value validated once.
Every problem found is reported at once (``UserError``); nothing is written here.

One question per module:

    plan.py       what a grid becomes: ``Plan`` (``find`` one run), ``PlannedRun``, ``run_id``
    load.py       the entry points ``load_plan`` and ``compose_run_config``; they only orchestrate the rest
    parse.py      the file: YAML (duplicate keys), top-level keys, name, searchpath, sub-grids, excludes
    schema.py     which keys exist: RunConfig's dotted leaves and sections, the config groups; did-you-mean
    validate.py   which values are valid: bounds and choices, types, KL values, group options
    overrides.py  how values are written: Hydra's override grammar, axes, base mappings, the command line
    compose.py    how a run's config is made: Hydra composition once per group choice, values set on top
    claims.py     the ``claims:`` a report tests: read and checked up front (``Claim``)
    labels.py     the ``labels:`` the report names configurations by: read and checked up front
    expand.py     which runs: each sub-grid's product minus excludes, deduplicated by id; the varying axes
    shipped.py    the grids klsweep ships (sweeps/): listed, copied, found by a bare name
    keys.py       every key described (``klsweep keys``): default, type, values allowed, help

Resource estimates of a plan live in ``klsweep.planner``, its table in ``klsweep.console``.
"""

from klsweep.errors import UserError  # what load_plan and compose_run_config raise
from klsweep.grid.compose import CONF_DIR
from klsweep.grid.load import DEFAULT_OUT, compose_run_config, load_plan
from klsweep.grid.plan import Plan, PlannedRun, run_id
from klsweep.grid.shipped import grid_file

__all__ = [
    "CONF_DIR",
    "DEFAULT_OUT",
    "Plan",
    "PlannedRun",
    "grid_file",
    "UserError",
    "compose_run_config",
    "load_plan",
    "run_id",
]
